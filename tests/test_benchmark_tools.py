"""The arithmetic the GPU benchmarks report with, which a lent GPU's minutes cannot afford to find
wrong: the GPU's busy time of a profiled step (benchmarks/pretrain_step_time.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import pretrain_step_time  # noqa: E402


def test_busy_time_counts_overlapping_device_work_once_and_ignores_host_events():
    events = [
        {"cat": "kernel", "name": "gemm", "ts": 0.0, "dur": 10.0},
        {"cat": "kernel", "name": "softmax", "ts": 5.0, "dur": 15.0},  # overlaps: 0-20 busy
        {"cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 100.0},  # the host's
        {"cat": "gpu_memcpy", "name": "copy", "ts": 30.0, "dur": 10.0},
        {"cat": "kernel", "name": "gemm", "ts": 32.0, "dur": 2.0},  # inside the copy's interval
        {"cat": "kernel", "name": "marker", "ts": 50.0},  # no duration
    ]
    count, busy, by_name = pretrain_step_time.busy_time(events)
    assert (count, busy) == (4, 30.0)
    assert by_name == [("softmax", 15.0), ("gemm", 12.0), ("copy", 10.0)]
