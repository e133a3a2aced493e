"""Anonymous memory of a fresh Python process running a measurement script (Linux /proc).

A test's script starts with PRELUDE: the package on sys.path (argv[1]) and this file's
`status_kb(field)`, a field of this process's /proc status in kB, `anon_kb()`, its RssAnon, and
`peak_anon_kb(call)`, the most anonymous memory `call()` added at any moment (sampled every 2 ms);
the test's own arguments follow from argv[2]. The script prints one JSON line last, which `run`
returns. A fresh process, so nothing the test process already holds counts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

WORKFLOW = Path(__file__).resolve().parents[1] / "workflow"


def status_kb(field: str) -> int:
    """A field of this process's /proc status in kB: VmRSS, VmHWM (peak RSS), RssAnon, ..."""
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def anon_kb() -> int:
    return status_kb("RssAnon")


def peak_anon_kb(call):
    """(the most RssAnon `call()` added while it ran, sampled every 2 ms, in kB; its result)"""
    import threading
    import time

    peak, done = [anon_kb()], threading.Event()

    def sample():
        while not done.is_set():
            peak.append(anon_kb())
            time.sleep(0.002)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    try:
        result = call()
        peak.append(anon_kb())
    finally:
        done.set()
        watcher.join()
    return max(peak) - peak[0], result


# A measurement script's first lines: the package on sys.path, and the functions above (imported
# from this file, which imports nothing beyond the standard library; also benchmarks' own probes).
PRELUDE = f"""
import json, sys
from pathlib import Path
sys.path[:0] = [sys.argv[1], {str(Path(__file__).resolve().parent)!r}]
from memory_probe import anon_kb, peak_anon_kb, status_kb
"""


# Polars' jemalloc keeps freed pages for ~10 s before returning them; told to return them at once,
# RssAnon after a call is what the process still holds, not what the call briefly used.
HELD_ONLY = {"_RJEM_MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"}


def run(script: str, *args, env: dict[str, str] | None = None) -> dict:
    """PRELUDE + `script` in a new interpreter with `args` (and `env` added to the environment);
    its last stdout line as JSON."""
    out = subprocess.run(
        [sys.executable, "-c", PRELUDE + script, str(WORKFLOW), *map(str, args)],
        capture_output=True, text=True, check=True, env={**os.environ, **(env or {})},
    ).stdout
    return json.loads(out.splitlines()[-1])
