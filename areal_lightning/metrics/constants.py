"""The metrics' fixed choices and constants (pure Python: the app's config uses them without torch)."""

from __future__ import annotations

from enum import Enum

NO_ANSWER: int = -1
"""``answer_ids`` value of a sample without a parsable final answer; it never wins a vote."""


class AdvantageStd(str, Enum):
    """Which std divides group advantages (``group_advantages(std=...)``); a plain string works too."""

    SAMPLE = "sample"
    """Divide the squared deviations by ``n - 1`` (``torch.std``), as TRL's ``GRPOTrainer`` and
    verl's ``compute_grpo_outcome_advantage`` do."""

    POPULATION = "population"
    """Divide by ``n`` (``torch.std(unbiased=False)``): the spread of the group itself."""
