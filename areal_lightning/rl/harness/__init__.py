"""lm-evaluation-harness tasks as eval sets (docs/harness.md): the task's documents are the samples,
its prompts, generation arguments, filters and metrics are the harness's own, the generation ours."""

from areal_lightning.rl.harness.evaluation import HARNESS_OPTION, harness_evaluate, harness_spec
from areal_lightning.rl.harness.tasks import HarnessDoc, HarnessSpec, HarnessTaskError, load_task

__all__ = [
    "HARNESS_OPTION",
    "HarnessDoc",
    "HarnessSpec",
    "HarnessTaskError",
    "harness_evaluate",
    "harness_spec",
    "load_task",
]
