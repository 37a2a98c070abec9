"""No test leaves a file behind in the temporary directory: a pytest plugin (tests/conftest.py).

Each test process (the xdist workers, or pytest itself without them) gets a temporary directory of
its own, ``TMPDIR`` for it and for every process its tests start; pytest's `tmp_path` and torch's
compile cache stay where they are kept (``PYTEST_DEBUG_TEMPROOT``, ``TORCHINDUCTOR_CACHE_DIR``).
After each test the directory's new entries are noted with the test that made them; when the run
ends, whatever is still there (sockets of killed servers, a process's `pymp-*` directory, an
engine's model directory nobody closed) fails the run, each entry named with the test after which
it appeared. The directories are removed at the end, so the guard leaves nothing either.
"""

from __future__ import annotations

import gc
import getpass
import json
import multiprocessing.process
import multiprocessing.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

BASE_ENV = "AREAL_TESTS_TMP"
"""The run's directory, holding one directory per test process (``main``, ``gw0``, ``gw1``...)."""
_CACHES = ("torchinductor_",)
"""Kept across runs on purpose: torch's compile cache, where a process that sets no
``TORCHINDUCTOR_CACHE_DIR`` puts it (vLLM's engines set their own)."""
_OWNER = pytest.StashKey[bool]()
_SEEN = pytest.StashKey[dict[str, str]]()
_COLLECTED = pytest.StashKey[set[str]]()
"""What the process's own directory held once its tests were collected: made by the imports of the
process itself (``import wandb`` makes two directories there), and removed at its exit."""


def _own_dir() -> Path:
    return Path(os.environ[BASE_ENV]) / os.environ.get("PYTEST_XDIST_WORKER", "main")


def _entries(directory: Path) -> set[str]:
    """The directory's entries, less this process's own multiprocessing directory (removed at its exit)."""
    own = multiprocessing.process.current_process()._config.get("tempdir")  # type: ignore[attr-defined]
    try:
        names = set(os.listdir(directory))
    except FileNotFoundError:
        return set()
    return {n for n in names if str(directory / n) != own and not n.startswith(_CACHES)}


def pytest_configure(config: pytest.Config) -> None:
    if BASE_ENV not in os.environ:  # the controller, or pytest without workers
        os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
        # torch's compile cache is a cache on purpose, kept where torch keeps it (torch._inductor's default)
        os.environ.setdefault(
            "TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
        )
        os.environ[BASE_ENV] = tempfile.mkdtemp(prefix="areal-tests-")
        os.chmod(os.environ[BASE_ENV], 0o755)  # as /tmp: the sandbox's programs run as another user
        config.stash[_OWNER] = True
    mine = _own_dir()
    mine.mkdir(mode=0o755, exist_ok=True)
    os.environ["TMPDIR"] = str(mine)
    tempfile.tempdir = None  # read TMPDIR again
    config.stash[_SEEN] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    session.config.stash[_COLLECTED] = _entries(_own_dir())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    before = _entries(_own_dir())
    yield
    seen = item.config.stash[_SEEN]
    for name in _entries(_own_dir()) - before:
        seen.setdefault(name, item.nodeid)


@pytest.fixture(scope="session", autouse=True)
def _sandboxes_end_with_the_session() -> Iterator[None]:
    """The sandboxes the tests started stop as the session ends, as a command's stop before it
    returns (`close_all`), not at the interpreter's exit, after the check."""
    yield
    pool = sys.modules.get("areal_lightning.scoring.sandbox.pool")
    if pool is not None:
        pool.close_all()


def _end_what_the_exit_ends() -> None:
    """What this process's exit removes, removed now, so that pytest without workers (whose own
    directory is checked before its exit) sees what the check of an xdist worker (after its exit)
    sees: W&B's service and its directory, and the `tempfile.TemporaryDirectory` objects still alive
    (whose finalizers remove them at exit): W&B keeps every artifact it made, one for each table a
    run logs, each with a temporary directory, for the process's lifetime."""
    wandb = sys.modules.get("wandb")
    if wandb is not None:
        wandb.teardown()
    gc.collect()
    own = _own_dir()
    for obj in gc.get_objects():
        if type(obj) is tempfile.TemporaryDirectory and Path(obj.name).parent == own:
            obj.cleanup()


def _report(config: pytest.Config) -> None:
    """Writes this process's entries still there, each with the test after which it appeared."""
    mine = _own_dir()
    seen = config.stash[_SEEN]
    left = {name: seen.get(name, "(no test: the run's own start or end)") for name in sorted(_entries(mine))}
    (mine.parent / f"{mine.name}.json").write_text(json.dumps(left))


def _gather(base: Path, own: Path, own_imports: set[str]) -> list[str]:
    """Every test process's report, and what is in its directory now that it has exited. This
    process has not exited: in its own directory `own`, what its imports made before the first
    test (`own_imports`) is left for its exit to remove."""
    lines = []
    for report in sorted(base.glob("*.json")):
        noted = json.loads(report.read_text())
        directory = base / report.stem
        for name in sorted(_entries(directory) - (own_imports if directory == own else set())):
            lines.append(f"{directory / name}: after {noted.get(name, '(the test process ending)')}")
    return lines


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    _end_what_the_exit_ends()
    _report(config)
    if not config.stash.get(_OWNER, False):
        return
    base = Path(os.environ[BASE_ENV])
    lines = _gather(base, _own_dir(), config.stash.get(_COLLECTED, set()))
    if lines:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        text = "\n".join(["files left in the temporary directory by the tests (each must leave none):", *lines])
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_sep("=", "leftovers", red=True)
            reporter.write_line(text)
        else:
            print(text)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    # Removed as the process exits, after multiprocessing removes its own directory in it (-100).
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(base,), kwargs={"ignore_errors": True}, exitpriority=-101)
