"""Doctests run for the package (`--doctest-modules`); under tests/ only test modules are collected:
the other files are test tooling and the entry points of the processes that tests start."""

from __future__ import annotations

import logging
import multiprocessing.process
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from leftovers import (  # noqa: F401  (its hooks and fixture)
    _sandboxes_end_with_the_session,
    pytest_collection_finish,
    pytest_configure,
    pytest_runtest_protocol,
    pytest_sessionfinish,
)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.suffix == ".py" and not collection_path.name.startswith(("test_", "conftest")):
        return True
    return None


# One torch (OpenMP) thread per process unless the caller chose: the suite runs two test files at
# once (`-n 2`), DDP tests start two ranks each, and on a small box an OpenMP pool wider than its
# share of the cores spins while it waits. Measured beside one other busy process: 20 GRPO steps of
# the main job took 2.4 s with one thread and 14 s with two. Set before torch is imported here, and
# inherited by every process a test starts.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests that mostly wait (`waits`) first, while `make test`'s vLLM lane keeps the cores
    busy (at the end, with only the two workers left, the waits of test_sandbox_hostile and
    test_cli_server left a core idle for ~50 s: benchmarks/RESULTS.md); then the longest (slow,
    then multi-process), so that with `-n 2` the run does not end with one worker on a long test
    while the other has nothing left."""

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("waits"):
            return 0
        if item.get_closest_marker("slow"):
            return 1
        return 2 if item.get_closest_marker("ddp") or item.get_closest_marker("process") else 3

    items.sort(key=rank)


FAST_ENV = "AREAL_LIGHTNING_FAST_TESTS"
"""Set by `make test-fast`: a test that starts a process without the `process` marker fails."""


@pytest.fixture(autouse=True)
def _fast_tests_start_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under `make test-fast`, starting a process in a test not marked `process` (or `ddp`, `slow`)
    fails the test, naming the marker: the fast loop stays fast and the marker stays true."""
    if not os.environ.get(FAST_ENV) or any(request.node.get_closest_marker(m) for m in ("process", "ddp", "slow")):
        return
    message = (
        f"{request.node.nodeid} starts a process: mark it `@pytest.mark.process` (make test-fast leaves those out)"
    )

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError(message)

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)


@pytest.fixture
def watch_log() -> Iterator[list[logging.LogRecord]]:
    """Records of the package's logger (which stops propagating once a command set up its handler)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign,assignment]
    logger = logging.getLogger("areal_lightning")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(level)
