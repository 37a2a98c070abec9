"""`close_all`: every sandbox this process started stops and its directory goes (the commands call
it before they return), while a forked copy never closes its parent's workers."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from areal_lightning.app.cli import main
from areal_lightning.scoring import Sandbox
from areal_lightning.scoring.sandbox.pool import close_all

pytestmark = pytest.mark.process


@pytest.fixture
def parent() -> Iterator[Path]:
    """The sandboxes' directory: outside pytest's own (0700), which the workers' user cannot pass."""
    path = Path(tempfile.mkdtemp(prefix="areal-sandbox-parent-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_close_all_stops_every_started_sandbox_and_they_start_again(parent: Path) -> None:
    a, b, idle = (Sandbox(directory=parent) for _ in range(3))
    assert a.run("print(1)").passed and b.run("print(2)").passed
    assert len(list(parent.iterdir())) == 2  # one directory per started sandbox; `idle` made none
    close_all()
    assert list(parent.iterdir()) == []
    assert a.run("print(3)").passed  # the next call starts its workers again
    a.close()
    idle.close()


def test_a_command_leaves_no_sandbox_of_its_process_behind(parent: Path) -> None:
    box = Sandbox(directory=parent)
    assert box.run("print(1)").passed
    assert main(["example"]) == 0
    assert list(parent.iterdir()) == []


def test_a_forked_copy_does_not_close_its_parents_sandbox(parent: Path) -> None:
    box = Sandbox(directory=parent)
    assert box.run("print(1)").passed
    pid = os.fork()
    if pid == 0:  # the child: its copy of `box` names the parent's workers, which are not its own
        try:
            close_all()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    assert len(list(parent.iterdir())) == 1 and box.run("print(2)").passed  # still the parent's
    box.close()
    assert list(parent.iterdir()) == []
