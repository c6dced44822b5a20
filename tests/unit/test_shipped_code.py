"""The directories of shipped code a killed worker leaves behind are removed by the next
worker's (spark_workers/shipped_code.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_workers import shipped_code


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_sweep_removes_only_the_directories_of_gone_processes(tmp_path: Path) -> None:
    gone = tmp_path / f"{shipped_code.DIR_PREFIX}{_dead_pid()}-abc"
    mine = tmp_path / f"{shipped_code.DIR_PREFIX}{os.getpid()}-def"
    unnamed = tmp_path / f"{shipped_code.DIR_PREFIX}xyz"  # no pid: not ours to judge
    other = tmp_path / "something-else"
    for d in (gone, mine, unnamed, other):
        d.mkdir()
        (d / shipped_code.ZIP_NAME).write_bytes(b"zip")
    assert shipped_code.sweep_orphans(str(tmp_path)) == [str(gone)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        d.name for d in (mine, unnamed, other)
    )


def test_sweep_leaves_another_users_directories(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    theirs = tmp_path / f"{shipped_code.DIR_PREFIX}{_dead_pid()}-abc"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    assert shipped_code.sweep_orphans(str(tmp_path)) == []
    assert theirs.exists()
