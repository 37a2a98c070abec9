"""lm-evaluation-harness tasks as eval sets (docs/harness.md): the task's documents are the samples,
its prompts, generation arguments, filters and metrics are the harness's own, the generation ours.

The task spec and loader are pure Python; the evaluation (and torch) loads on first use (PEP 562),
so a config naming a harness task is checked without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from areal_lightning.lazy import lazy_exports as _lazy_exports
from areal_lightning.rl.harness.tasks import HarnessDoc, HarnessSpec, HarnessTaskError, load_task

if TYPE_CHECKING:  # type checkers see these; at run time `__getattr__` loads them on first use
    from areal_lightning.rl.harness.evaluation import HARNESS_OPTION, harness_evaluate, harness_spec

__all__ = [
    "HARNESS_OPTION",
    "HarnessDoc",
    "HarnessSpec",
    "HarnessTaskError",
    "harness_evaluate",
    "harness_spec",
    "load_task",
]

__getattr__, __dir__ = _lazy_exports(
    __name__,
    dict.fromkeys(("HARNESS_OPTION", "harness_evaluate", "harness_spec"), "areal_lightning.rl.harness.evaluation"),
    globals(),
)
