"""The suite's own disk hygiene (tests/conftest.py): a test file's temporary folders are removed
when the file is done, unless one of its tests failed; a passing test's tmp_path goes at once.

Run as an inner pytest session in a subprocess, on a copy of the project's conftest and pytest
settings, so that the folders can be looked at after the inner files are done.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

INNER_FILE = '''
import pytest

@pytest.fixture(scope="module")
def made(tmp_path_factory):
    folder = tmp_path_factory.mktemp("{name}-module")
    (folder / "data.bin").write_bytes(b"x" * 1000)
    return folder

def test_uses_the_module_folder(made):
    assert (made / "data.bin").exists()

def test_uses_its_own_folder(tmp_path, made):
    (tmp_path / "own.txt").write_text("own")
    assert {outcome}
'''


def inner_session(tmp_path: Path, files: dict[str, bool]) -> tuple[Path, str]:
    """Runs pytest on one inner file per entry (True: its tests pass) with the project's
    conftest and pytest settings; returns the inner base folder and the session's output."""
    root = tmp_path / "inner"
    root.mkdir()
    shutil.copy(TESTS / "conftest.py", root / "conftest.py")
    shutil.copy(TESTS.parent / "pyproject.toml", root / "pyproject.toml")
    for name, passes in files.items():
        outcome = "True" if passes else "False, 'made to fail'"
        (root / f"test_{name}.py").write_text(INNER_FILE.format(name=name, outcome=outcome))
    base = tmp_path / "base"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"--basetemp={base}", "--rootdir", str(root), "-c", str(root / "pyproject.toml"),
         *sorted(str(root / f"test_{name}.py") for name in files)],
        cwd=root, capture_output=True, text=True, timeout=300, check=False,
    )
    return base, done.stdout + done.stderr


def test_a_passing_file_leaves_no_folder_and_a_failing_one_keeps_its_folders(tmp_path):
    base, output = inner_session(tmp_path, {"passes": True, "fails": False})
    assert "1 failed, 3 passed" in output, output
    # pytest's "<prefix>current" links aside: the failing file's module folder and its failed
    # test's own folder stay; its passing test's folder went when that test ended; the passing
    # file left nothing.
    left = sorted(path.name for path in base.iterdir() if not path.is_symlink())
    assert left == ["fails-module0", "test_uses_its_own_folder0"], left
    assert (base / "fails-module0" / "data.bin").exists()
    assert (base / "test_uses_its_own_folder0" / "own.txt").exists()
