"""The span audits on a synthetic paper-scale span shard: rule audit_spans (span_audit.py:
lengths.png, sample.md) and `python -m retrieval_pretraining.audit SHARD` (contracts/spans/audit.py:
each span checked against its chunk); wall and CPU seconds, and hashes of what each writes.

    .venv/bin/python benchmarks/span_audit.py --checkpoint <staged minilm-l2> [--rows 190000]

A paper-scale shard: English Wikipedia's ~12M chunks over 64 shards is ~190k chunks a shard, each
of 512 tokens with 5 spans of each of the 4 granularities (paper.yaml's costa entry). The spans
are drawn at random (a fixed seed) inside the config's bounds, the chunks' tokens likewise; the
audit reads the first `max_chunks` (200,000) rows of the span shards and 3 rows of the chunks.
Printed: seconds for each (best of `--repeat`), the sha256 of the plot's histogram data, of
sample.md and of the audit command's printout, so that two versions of the code can be compared.
"""

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

COSTA = {
    "name": "costa",
    "seed": 42,
    "spans_per_granularity": 5,
    "beta_alpha": 4.0,
    "beta_beta": 2.0,
    "short_chunk": "clip",
    "granularities": {
        "word": {"enabled": True},
        "phrase": {"enabled": True, "min_len": 4, "max_len": 16},
        "sentence": {"enabled": True, "min_len": 16, "max_len": 64},
        "paragraph": {"enabled": True, "min_len": 64, "max_len": 128},
    },
}


def synthetic_shards(folder: Path, rows: int, tokens: int, per: int, seed: int = 0):
    """A chunks shard and its span shard of `rows` chunks, written as the stages write them."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from retrieval_pretraining.contracts import spans as contract

    rng = np.random.default_rng(seed)
    chunk_ids = pa.array(np.arange(rows, dtype=np.int64) << 16)
    offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * tokens)
    ids = pa.ListArray.from_arrays(
        offsets, pa.array(rng.integers(1000, 30000, rows * tokens, dtype=np.int32)))
    chunks = pa.table({"chunk_id": chunk_ids, "page_id": pa.array(np.arange(rows)),
                       "chunk_index": pa.array(np.zeros(rows, np.int32)), "input_ids": ids,
                       "word_starts": ids})
    (folder / "chunks").mkdir(parents=True, exist_ok=True)
    (folder / "spans/costa").mkdir(parents=True, exist_ok=True)
    pq.write_table(chunks, folder / "chunks/shard-0000.parquet", row_group_size=8192)
    bounds = [(1, 3), (4, 16), (16, 64), (64, 128)]
    length = np.concatenate(
        [rng.integers(lo, hi + 1, (rows, per)) for lo, hi in bounds], axis=1).astype(np.int32)
    start = rng.integers(1, tokens - 1 - length, dtype=np.int32)
    kinds = np.tile(np.repeat(np.arange(4, dtype=np.int8), per), (rows, 1))
    off = pa.array(np.arange(rows + 1, dtype=np.int32) * 4 * per)
    table = pa.table([chunk_ids,
                      pa.ListArray.from_arrays(off, pa.array(start.ravel())),
                      pa.ListArray.from_arrays(off, pa.array((start + length).ravel())),
                      pa.ListArray.from_arrays(off, pa.array(kinds.ravel()))],
                     schema=contract.SCHEMA)
    pq.write_table(table, folder / "spans/costa/shard-0000.parquet", row_group_size=8192)
    return folder / "chunks/shard-0000.parquet", folder / "spans/costa/shard-0000.parquet"


def plot_data(calls) -> str:
    """sha256 of every ax.hist call's (data, bins) the audit made, in order."""
    import numpy as np

    digest = hashlib.sha256()
    for data, bins in calls:
        digest.update(np.asarray(data, np.float64).tobytes())
        digest.update(np.asarray(bins, np.float64).tobytes())
    return digest.hexdigest()


def timed(repeat: int, run) -> tuple[float, float]:
    """(best wall seconds, best CPU seconds) of `repeat` calls of `run`."""
    wall, cpu = float("inf"), float("inf")
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        run()
        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    return round(wall, 2), round(cpu, 2)


def main() -> None:
    import contextlib
    import io
    import shutil

    import numpy as np
    from matplotlib.axes import Axes
    from retrieval_pretraining import audit, span_audit, spans

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=190_000)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    cfg = spans.SpanConfig.from_dict(COSTA)
    calls = []
    hist = Axes.hist

    def recording(self, x, bins=None, **kw):
        calls.append((np.asarray(x), bins))
        return hist(self, x, bins=bins, **kw)

    Axes.hist = recording
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus = tmp / "results/corpus/synthetic"  # the layout audit finds the chunks in
        chunks, span_path = synthetic_shards(corpus, args.rows, args.tokens,
                                             COSTA["spans_per_granularity"])
        shutil.copytree(args.checkpoint, tmp / "results/checkpoints/tokenizer")  # audit's decoder

        def rule():
            calls.clear()
            span_audit.audit_spans([chunks], [span_path], args.checkpoint, cfg,
                                   tmp / "lengths.png", tmp / "sample.md")

        printed = io.StringIO()

        def command():
            printed.seek(0), printed.truncate()
            with contextlib.redirect_stdout(printed):
                assert audit.main([str(span_path)]) == 0, printed.getvalue()

        rule_s, command_s = timed(args.repeat, rule), timed(args.repeat, command)
        sample = hashlib.sha256(  # sample.md names the chunks shard: the temporary folder
            (tmp / "sample.md").read_text().replace(str(tmp), "TMP").encode()).hexdigest()
        shown = hashlib.sha256(printed.getvalue().replace(str(tmp), "TMP").encode()).hexdigest()
    print(json.dumps({"rows": args.rows, "spans_per_chunk": 4 * COSTA["spans_per_granularity"],
                      "audit_spans_rule_wall_cpu_s": rule_s, "plot_data_sha256": plot_data(calls),
                      "sample_md_sha256": sample, "audit_command_wall_cpu_s": command_s,
                      "audit_command_output_sha256": shown}, indent=2))


if __name__ == "__main__":
    main()
