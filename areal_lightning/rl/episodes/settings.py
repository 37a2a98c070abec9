"""`EpisodeSettings`: multi-turn episodes, the YAML ``episodes`` section and `GRPOModule(episodes=...)`.

Pure Python (no torch): the config loads it before anything heavy. docs/multi_turn.md explains
the protocol and the two built-in environments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Optional

from areal_lightning.errors import ArgumentError

DEFAULT_MAX_TURNS = 2
DEFAULT_TURN_DISCOUNT = 0.9
"""A right answer at turn t (counting from 1) earns ``turn_discount ** (t - 1)``: 1, 0.9, 0.81, ..."""
DEFAULT_TOOL_TIMEOUT_S = 5.0
DEFAULT_TOOL_OUTPUT_CHARS = 512


class EnvName(str, Enum):
    """``retry``: a wrong answer gets a short feedback message and another attempt; ``python_tool``:
    a completion that ends with a code block runs in the sandbox and its output is the next turn's
    observation, one without a code block is the final answer."""

    RETRY = "retry"
    PYTHON_TOOL = "python_tool"


@dataclass
class EpisodeSettings:
    """How an episode runs: the environment, the turn limit and the discount of later turns."""

    env: EnvName = EnvName.RETRY
    """retry (a wrong answer gets feedback and another attempt) or python_tool (code runs in the sandbox)."""
    max_turns: int = DEFAULT_MAX_TURNS
    """Completions the policy writes at most per episode (MT2: 2, MT4: 4)."""
    turn_discount: float = DEFAULT_TURN_DISCOUNT
    """In (0, 1]: a turn's reward is multiplied by turn_discount ** (turn - 1); 1 makes every turn worth the same."""
    feedback: Optional[str] = None  # noqa: UP045 - the OmegaConf schema keeps Optional (see config.py)
    """retry: the message after a wrong answer; null: the task's own (arithmetic: "="), else AReaL's message."""
    tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S
    """python_tool: wall-clock limit of one program, in seconds."""
    tool_output_chars: int = DEFAULT_TOOL_OUTPUT_CHARS
    """python_tool: the program's output is cut to this many characters before it is shown."""

    def validate(self) -> None:
        """Refuses impossible values, naming the argument, the value and what is accepted.

        Raises:
            ArgumentError: a non-positive `max_turns`, a `turn_discount` outside (0, 1], an empty
                `feedback`, a non-positive tool timeout or output cap.

        Example:
            >>> EpisodeSettings(max_turns=0).validate()
            Traceback (most recent call last):
            ...
            areal_lightning.errors.ArgumentError: `EpisodeSettings(max_turns=...)` must be a positive integer, got 0
        """
        owner = "EpisodeSettings"
        if isinstance(self.max_turns, bool) or not isinstance(self.max_turns, int) or self.max_turns < 1:
            raise ArgumentError(owner, "max_turns", self.max_turns, "a positive integer")
        if not (isinstance(self.turn_discount, (int, float)) and 0 < self.turn_discount <= 1):
            raise ArgumentError(owner, "turn_discount", self.turn_discount, "a number in (0, 1]")
        if self.feedback is not None and not self.feedback:
            raise ArgumentError(owner, "feedback", self.feedback, "a non-empty string or None (the task's own)")
        if not (math.isfinite(self.tool_timeout_s) and self.tool_timeout_s > 0):
            raise ArgumentError(owner, "tool_timeout_s", self.tool_timeout_s, "a positive number of seconds")
        if isinstance(self.tool_output_chars, bool) or self.tool_output_chars < 1:
            raise ArgumentError(owner, "tool_output_chars", self.tool_output_chars, "a positive integer")
        if self.env not in set(EnvName):  # a plain string from Python code
            raise ArgumentError(owner, "env", self.env, "one of " + ", ".join(e.value for e in EnvName))

    def discount(self, turn: int) -> float:
        """The weight of a reward earned at `turn` (counting from 0).

        Example:
            >>> [EpisodeSettings(turn_discount=0.5).discount(t) for t in range(3)]
            [1.0, 0.5, 0.25]
        """
        return float(self.turn_discount) ** turn
