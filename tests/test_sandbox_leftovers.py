"""A sandbox whose process was killed (SIGKILL: no finalizer runs) leaves its directory; the next
sandbox to start removes it, and never the directory of a sandbox whose process still runs."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import run_in_group

from areal_lightning.scoring import Sandbox

pytestmark = pytest.mark.process

_KILLED = """
import os, signal, sys
from areal_lightning.scoring import Sandbox
box = Sandbox(directory=sys.argv[1])
assert box.run("print(1)").passed
print(box._base, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
_ALIVE = """
import sys
from areal_lightning.scoring import Sandbox
box = Sandbox(directory=sys.argv[1])
assert box.run("print(1)").passed
print(box._base, flush=True)
sys.stdin.readline()
box.close()
"""


@pytest.fixture
def parent() -> Iterator[Path]:
    """The sandboxes' directory: outside pytest's own (0700), which the workers' user cannot pass."""
    path = Path(tempfile.mkdtemp(prefix="leftover-parent-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_killed_processs_sandbox_directory_is_removed_by_the_next_sandbox_and_a_live_ones_is_kept(
    parent: Path,
) -> None:
    killed = run_in_group([sys.executable, "-c", _KILLED, str(parent)], timeout=120)
    assert killed.returncode == -signal.SIGKILL
    leftover = Path(killed.stdout.strip())
    assert leftover.parent == parent and leftover.is_dir()  # no finalizer ran: the directory stayed
    alive = subprocess.Popen(
        [sys.executable, "-c", _ALIVE, str(parent)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert alive.stdout is not None
        live = Path(alive.stdout.readline().strip())
        assert live.is_dir()
        box = Sandbox(directory=parent)
        try:
            assert box.run("print(2)").passed
            assert not leftover.exists()  # its owner is gone
            assert live.is_dir()  # its owner runs
            assert sorted(parent.iterdir()) == sorted([live, Path(box._base or "")])
        finally:
            box.close()
    finally:
        alive.communicate("\n", timeout=60)
    assert alive.returncode == 0 and list(parent.iterdir()) == []
