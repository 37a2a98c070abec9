"""What the config refuses in its ``episodes`` section beyond the settings' own ranges, and the
metric names an episode evaluation logs. It reads the config's values, and imports nothing of it."""

from __future__ import annotations

from typing import Any

from areal_lightning.rl.episodes.settings import EnvName, EpisodeSettings


def episode_config_problem(cfg: Any) -> str | None:
    """Why the config's (checked) episode settings cannot run, or None: episodes with the in-process
    vLLM engine; for the tiny arithmetic policy, a feedback message outside its alphabet or a last
    turn that cannot fit ``policy.max_len``."""
    episodes: EpisodeSettings = cfg.episodes
    if cfg.policy.eval_engine.value == "vllm":
        return (
            "episodes need policy.eval_engine: policy or server (the in-process vllm engine generates single turns "
            "only); got vllm"
        )
    if cfg.policy.kind.value != "tiny" or cfg.task.name.value != "arithmetic":
        return None
    from areal_lightning.tasks.arithmetic import ALPHABET, ArithmeticTask, operand_range

    feedback = episodes.feedback or ArithmeticTask.retry_feedback
    outside = sorted(set(feedback) - set(ALPHABET))
    if outside:
        return (
            f"episodes.feedback must be written in the arithmetic alphabet {ALPHABET!r} (the tiny policy reads no "
            f"other characters), got {feedback!r} with {outside}"
        )
    if episodes.env is not EnvName.RETRY:
        return None  # tool output varies: each turn's length is checked when it runs
    digits = max([cfg.task.train_digits, *[es.digits or 1 for es in cfg.eval_sets.values()]])
    new_tokens = max([cfg.grpo.max_new_tokens, *[es.max_new_tokens or 0 for es in cfg.eval_sets.values()]])
    high = operand_range(digits)[1]
    prompt = len(ArithmeticTask().tokenizer.encode(f"{high}+{high}="))
    turns = episodes.max_turns
    # Each earlier turn: its completion, an EOS added when it was cut, the feedback.
    needed = prompt + turns * new_tokens + (turns - 1) * (1 + len(feedback))
    if needed > cfg.policy.max_len:
        return (
            f"policy.max_len must be at least {needed} for episodes.max_turns={turns} with {digits}-digit operands "
            f"and max_new_tokens={new_tokens} (the last turn's context plus its completion, in tokens), got "
            f"{cfg.policy.max_len}"
        )
    return None


def logged_episode_metrics(episodes: EpisodeSettings, n_samples: int) -> list[str]:
    """The names an episode evaluation logs for an eval set of `n_samples` episodes per prompt."""
    from areal_lightning.rl.episodes.metrics import episode_metric_names

    return episode_metric_names(n_samples, episodes.max_turns, EnvName(episodes.env) is EnvName.PYTHON_TOOL)
