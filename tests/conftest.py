"""Doctests run for the package (`--doctest-modules`); under tests/ only test modules are collected:
the other files are test tooling and the entry points of the processes that tests start."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.suffix == ".py" and not collection_path.name.startswith(("test_", "conftest")):
        return True
    return None
