"""Config -> the task and the policy a run trains (the module itself: `GRPOModule.from_config`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from areal_lightning.app.config import Config, EvalEngine, PolicyKind, TaskName

if TYPE_CHECKING:
    from areal_lightning.rl.policy import Policy
    from areal_lightning.rl.protocols import RLTask
    from areal_lightning.rl.vllm_policy import VLLMEvaluator


def build_task(cfg: Config) -> RLTask:
    """The training task of the config's ``task`` section: `ArithmeticTask`, `MathTask` or `CodeTask`.

    Example:
        >>> from areal_lightning.app.config import load_config
        >>> type(build_task(load_config(None, ["eval_sets.easy.size=5"]))).__name__
        'ArithmeticTask'
    """
    t = cfg.task
    if t.name is TaskName.CODE:
        from areal_lightning.scoring import SandboxLimits
        from areal_lightning.tasks.code import CodeTask

        assert t.path is not None  # the config requires it
        limits = SandboxLimits(wall_s=t.sandbox_wall_s, cpu_s=max(1, math.ceil(t.sandbox_wall_s)))
        return CodeTask(
            t.path,
            prompt_style=t.prompt_style,
            prompt_template=t.prompt_template,
            workers=t.sandbox_workers,
            limits=limits,
        )
    if t.name is TaskName.MATH:
        from areal_lightning.tasks.math import MathTask

        assert t.path is not None  # the config requires it
        return MathTask(
            t.path,
            question_field=t.question_field,
            answer_field=t.answer_field,
            answer_format=t.answer_format,
            prompt_style=t.prompt_style,
            prompt_template=t.prompt_template,
            verifier=t.verifier,
        )
    from areal_lightning.tasks.arithmetic import ArithmeticTask

    return ArithmeticTask(train_digits=t.train_digits, train_size=t.train_size, seed=cfg.seed)


def build_policy(cfg: Config, task: RLTask) -> Policy:
    """The policy of the config's ``policy`` section: a fresh `TinyPolicy` over the arithmetic
    task's tokenizer, or the `HFPolicy` saved at ``policy.path`` (chat prompts when the task's
    ``prompt_style`` is chat). Seed torch first for reproducible tiny weights."""
    p = cfg.policy
    if p.kind is PolicyKind.HF:
        from areal_lightning.rl.hf_policy import HFPolicy
        from areal_lightning.tasks.math import PromptStyle

        assert p.path is not None  # the config requires it
        chat = cfg.task.name.reads_files and cfg.task.prompt_style is PromptStyle.CHAT
        return HFPolicy.from_pretrained(
            p.path,
            dtype=p.dtype.value,
            attn_implementation=p.attn_implementation,
            chat=chat,
            chat_template=p.chat_template,
            system_prompt=p.system_prompt,
            stop_strings=list(p.stop_strings),
            disable_dropout=p.disable_dropout,
        )
    from areal_lightning.rl.policy import TinyPolicy

    tok = task.tokenizer  # type: ignore[attr-defined]  # the config pairs the tiny policy with arithmetic
    return TinyPolicy(tok.vocab_size, p.d_model, p.n_layers, p.n_heads, p.max_len, pad_id=tok.pad_id, eos_id=tok.eos_id)


def build_eval_generate(cfg: Config) -> VLLMEvaluator | None:
    """The evaluation's generation engine of ``policy.eval_engine``: a `VLLMEvaluator` for ``vllm``,
    None (the policy's own `generate`) for ``policy``. The engine itself starts on the first round.

    Example:
        >>> from areal_lightning.app.config import load_config
        >>> build_eval_generate(load_config(None, ["eval_sets.easy.size=5"])) is None
        True
    """
    if cfg.policy.eval_engine is not EvalEngine.VLLM:
        return None
    from areal_lightning.rl.vllm_policy import VLLMEvaluator

    return VLLMEvaluator(cfg.policy.vllm.build())
