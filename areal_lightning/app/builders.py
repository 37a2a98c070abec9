"""Config -> runtime objects: the task, the policy and the module; the eval sets, the callback, the
loggers and the Trainer of a run.

The plugin's classes take plain arguments; this is the one place that reads a `Config` for them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_lightning.app.config import Config, EvalEngine, PolicyKind, TaskName, lightning_precision, to_dict
from areal_lightning.app.console import task_summary_metrics
from areal_lightning.app.eval_prompts import distinct_prompts, held_out_prompts
from areal_lightning.app.progress_bar import progress_bar
from areal_lightning.app.runs import CHECKPOINT_DIRNAME, CSV_DIRNAME, LAST_CHECKPOINT, RunIdentity
from areal_lightning.callbacks.integrity_checks import DUPLICATES_OPTION
from areal_lightning.eval_round import EvalSet, EvaluateFn
from areal_lightning.eval_round.subsample import subsample
from areal_lightning.rl.episodes.make_environment import episode_values

if TYPE_CHECKING:  # Lightning and W&B load only when a builder that needs them runs
    import lightning as L
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.loggers import Logger

    from areal_lightning.callbacks import EvaluationCallback
    from areal_lightning.rl.engines.server.evaluator import ServerEvaluator
    from areal_lightning.rl.engines.vllm.evaluator import VLLMEvaluator
    from areal_lightning.rl.grpo.module import GRPOModule
    from areal_lightning.rl.policy import Policy
    from areal_lightning.rl.protocols import RLTask
    from areal_lightning.tracking.wandb_logger import SafeWandbLogger


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

    held_out = held_out_prompts(cfg.eval_sets, t.train_digits, cfg.seed) if t.hold_out_eval else set()
    return ArithmeticTask(train_digits=t.train_digits, train_size=t.train_size, seed=cfg.seed, held_out=held_out)


def build_policy(cfg: Config, task: RLTask) -> Policy:
    """The policy of the config's ``policy`` section: a fresh `TinyPolicy` over the arithmetic
    task's tokenizer, or the `HFPolicy` saved at ``policy.path`` (chat prompts when the task's
    ``prompt_style`` is chat). Seed torch first for reproducible tiny weights."""
    p = cfg.policy
    if p.kind is PolicyKind.HF:
        from areal_lightning.rl.engines.hf.policy import HFPolicy
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
            stop=list(p.stop),
            disable_dropout=p.disable_dropout,
        )
    from areal_lightning.rl.policy import TinyPolicy

    tok = task.tokenizer  # type: ignore[attr-defined]  # the config pairs the tiny policy with arithmetic
    return TinyPolicy(tok.vocab_size, p.d_model, p.n_layers, p.n_heads, p.max_len, pad_id=tok.pad_id, eos_id=tok.eos_id)


def build_engine_evaluate_fn(cfg: Config) -> VLLMEvaluator | ServerEvaluator | None:
    """The evaluation's generation engine of ``policy.eval_engine``: a `VLLMEvaluator` for ``vllm``,
    a `ServerEvaluator` for ``server``, None (the policy's own `generate`) for ``policy``. The engine
    itself starts on the first round (the servers are started by the user: docs/servers.md).

    Example:
        >>> from areal_lightning.app.config import load_config
        >>> build_engine_evaluate_fn(load_config(None, ["eval_sets.easy.size=5"])) is None
        True
    """
    if cfg.policy.eval_engine is EvalEngine.SERVER:
        from areal_lightning.rl.engines.server.evaluator import ServerEvaluator

        return ServerEvaluator(cfg.policy.server.build())
    if cfg.policy.eval_engine is not EvalEngine.VLLM:
        return None
    from areal_lightning.rl.engines.vllm.evaluator import VLLMEvaluator

    return VLLMEvaluator(cfg.policy.vllm.build())


def build_module(cfg: Config, module_class: type[GRPOModule] | None = None) -> GRPOModule:
    """The `GRPOModule` (or a subclass, `module_class`) of the config's task (graded by the
    ``graders`` section's models, when it gives any), policy, ``grpo`` and ``episodes`` sections;
    ``seed`` seeds the tiny policy's initial weights, the warm-up and the rollouts.

    Example:
        >>> from areal_lightning.app.config import load_config
        >>> module = build_module(load_config(None, ["eval_sets.easy.size=5"]))
        >>> type(module.policy).__name__, type(module.task).__name__
        ('TinyPolicy', 'ArithmeticTask')
    """
    import torch

    from areal_lightning.rl.grpo.module import GRPOModule

    torch.manual_seed(cfg.seed)  # the policy's initial weights
    task = build_task(cfg)
    cls = module_class or GRPOModule
    return cls(
        build_policy(cfg, task),
        cfg.graders.wrap(task),  # evaluation graded by the models of the graders section, if any
        cfg.grpo,
        seed=cfg.seed,
        engine_evaluate_fn=build_engine_evaluate_fn(cfg),
        episodes=cfg.episodes,
    )


TOKEN_SCORES = "token_scores"
"""The `EvalSet.options` key the default evaluation reads (`rl.rollout_eval.TOKEN_SCORES_OPTION`)."""


def build_eval_sets(cfg: Config, task: RLTask | None = None) -> list[EvalSet]:
    """The config's eval sets, in config order: arithmetic sets made by `task` when it is an
    `ArithmeticTask` (else by the config's arithmetic task), file sets read from their ``path``
    with the task's prompt style (the first ``size`` distinct prompts, or all: a row that repeats an earlier
    prompt is dropped, and the integrity check reports it). A sample's cost is its prompt length.

    Example:
        >>> from areal_lightning.app.config import load_config
        >>> from areal_lightning.tasks.arithmetic import ArithmeticTask
        >>> cfg = load_config(None, ["eval_sets.easy.size=5"])
        >>> [(s.name, len(s.samples), s.sampling.n_samples) for s in build_eval_sets(cfg, ArithmeticTask())]
        [('easy', 5, 4)]
    """
    out = []
    samples: Sequence[Any]
    for name, es in cfg.eval_sets.items():
        if es.harness is not None:  # an lm-evaluation-harness task (docs/harness.md)
            from areal_lightning.rl.harness.tasks import harness_eval_set

            harness = harness_eval_set(name, es.harness.spec(), es.batch_size, es.max_batch_cost)
            out.append(subsample(harness, es.subsample.build(cfg.seed)) if es.subsample is not None else harness)
            continue
        dropped: list[tuple[int, int]] = []
        if es.is_file_set and cfg.task.name is TaskName.CODE:
            from areal_lightning.tasks.code import CodeTask

            assert es.path is not None
            # Only the samples are used: programs are graded by the module's task (its sandbox).
            code = CodeTask(es.path, prompt_style=cfg.task.prompt_style, prompt_template=cfg.task.prompt_template)
            samples, dropped = distinct_prompts(code.samples(), es.size)
        elif es.is_file_set:
            from areal_lightning.tasks.math import MathTask

            assert es.path is not None
            # Only the samples are used: rewards come from the module's task, one verifier for all sets.
            reader = MathTask(
                es.path,
                question_field=es.question_field,
                answer_field=es.answer_field,
                answer_format=es.answer_format,
                stratum_field=es.stratum_field,
                prompt_style=cfg.task.prompt_style,
                prompt_template=cfg.task.prompt_template,
                verifier="numeric",
            )
            samples, dropped = distinct_prompts(reader.samples(), es.size)
        else:
            from areal_lightning.tasks.arithmetic import ArithmeticTask

            if not isinstance(task, ArithmeticTask):
                task = ArithmeticTask(cfg.task.train_digits, cfg.task.train_size, cfg.seed)
            samples = task.make_samples(name, es.arithmetic_digits, es.arithmetic_size())
        eval_set = EvalSet(
            name=name,
            samples=samples,
            batch_size=es.batch_size,
            cost_fn=lambda s: float(len(s.prompt)),
            key_fn=lambda s: s.key,
            max_batch_cost=es.max_batch_cost,
            sampling=es.sampling(cfg.grpo.max_new_tokens),
            # Episode settings change every result: in the fingerprint, the result cache keys them.
            options={
                **({} if es.token_scores else {TOKEN_SCORES: False}),
                **({DUPLICATES_OPTION: dropped} if dropped else {}),  # the integrity check reports them
                **({"episodes": episode_values(cfg.episodes)} if cfg.episodes is not None else {}),
            },
        )
        if es.subsample is not None:  # chosen before the deal: the same subset on any number of devices
            eval_set = subsample(eval_set, es.subsample.build(cfg.seed))
        out.append(eval_set)
    return out


def build_callback(
    cfg: Config,
    eval_sets: Mapping[str, Sequence[Any]] | Sequence[EvalSet] | None = None,
    evaluate_fn: EvaluateFn | None = None,
    **overrides: Any,
) -> EvaluationCallback:
    """`EvaluationCallback` from the config's `evaluator` block, `output_dir` and `seed`; unless
    `eval_sets` is given, the `eval_sets` block's sets (`build_eval_sets`).
    Keyword `overrides` replace single arguments (a whole group, e.g. ``schedule=...``, or ``clock``).

    Example:
        >>> from areal_lightning.app.config import load_config
        >>> cfg = load_config(None, ["eval_sets.easy.size=5", "eval_sets.hard.digits=2", "evaluator.freq_steps=50"])
        >>> cb = build_callback(cfg)
        >>> [s.name for s in cb.eval_sets], [len(s.samples) for s in cb.eval_sets], cb.trigger.describe()
        (['easy', 'hard'], [5, 200], 'evaluate every 50 steps, at the end')
    """
    from areal_lightning.callbacks import EvaluationCallback

    if eval_sets is None:
        eval_sets = build_eval_sets(cfg)
    ev = cfg.evaluator
    groups = {"schedule": ev.schedule, "execution": ev.execution, "rounds": ev.rounds, "decisions": ev.decisions}
    run = {"output_dir": cfg.output_dir, "seed": cfg.seed, "run_id": cfg.run_id}
    callback = EvaluationCallback(eval_sets, evaluate_fn, **{**groups, **run, **overrides})
    callback.recorder.summary_metrics = task_summary_metrics(cfg)  # the task's metrics on the console
    return callback


def build_wandb_logger(
    cfg: Config,
    output_dir: str | Path,
    *,
    rewind_to: int | None = None,
    logged_eval_through: int | None = None,
) -> SafeWandbLogger | None:
    """The W&B logger of the config's ``logger.wandb`` block, or None when its mode is disabled.

    The run starts lazily (on the first log), so building it costs nothing and cannot fail on W&B.
    The resolved config is the run's config; the run is named ``<experiment_name>/<trial_name>``.
    Its W&B id is ``cfg.run_id``, so a resumed run continues its W&B run: rewound to the row
    ``_step == rewind_to`` (the checkpoint's), or, without one, appended to (W&B's
    ``resume="allow"``, which Lightning passes) with `logged_eval_through` the last eval step that
    W&B run already holds.

    Example:
        >>> from areal_lightning.app.config import load_config
        >>> cfg = load_config(None, ["eval_sets.easy.size=4", "logger.wandb.mode=offline"])
        >>> build_wandb_logger(cfg, "runs/demo").save_dir
        'runs/demo'
    """
    from areal_lightning.app.config import WandbMode
    from areal_lightning.tracking.history import HISTORY_FILENAME
    from areal_lightning.tracking.wandb_logger import SafeWandbLogger

    w = cfg.logger.wandb
    if w.mode is WandbMode.DISABLED:
        return None
    offline = w.mode is WandbMode.OFFLINE
    return SafeWandbLogger(
        project=w.project,
        entity=w.entity,
        name=w.name or f"{cfg.experiment_name}/{cfg.trial_name}",
        group=w.group,
        tags=list(w.tags),
        save_dir=w.save_dir or str(output_dir),
        offline=offline,
        # Lightning asks for offline through WANDB_MODE, which wandb reads once per process (its
        # settings singleton); the init argument always counts. Online is not forced, so that
        # WANDB_MODE=offline or disabled in the environment still wins.
        **({"mode": "offline"} if offline else {}),
        config=to_dict(cfg),
        id=cfg.run_id,
        history_file=Path(output_dir) / HISTORY_FILENAME,
        rewind_to=rewind_to,
        logged_eval_through=logged_eval_through,
    )


def build_loggers(
    cfg: Config,
    output_dir: str | Path,
    *,
    csv_version: int | None = None,
    rewind_wandb_to: int | None = None,
    logged_eval_through: int | None = None,
) -> list[Logger]:
    """The Trainer's loggers from the config's ``logger`` section: a CSV logger under
    ``<output_dir>/csv`` when ``logger.csv``, then a `SafeWandbLogger` unless ``logger.wandb.mode``
    is disabled. No W&B run starts here (it starts on the first log). A resumed run passes the
    CSV `csv_version` to continue and the W&B rewind point and `logged_eval_through` (see
    `build_wandb_logger`).

    Example:
        >>> from areal_lightning.app.config import load_config
        >>> cfg = load_config(None, ["eval_sets.easy.size=4"])
        >>> [type(lg).__name__ for lg in build_loggers(cfg, "runs/demo")]
        ['ContinuingCSVLogger']
    """
    from areal_lightning.tracking.csv_logger import ContinuingCSVLogger

    loggers: list[Logger] = []
    if cfg.logger.csv:
        loggers.append(ContinuingCSVLogger(save_dir=str(output_dir), name=CSV_DIRNAME, version=csv_version))
    wandb_logger = build_wandb_logger(
        cfg, output_dir, rewind_to=rewind_wandb_to, logged_eval_through=logged_eval_through
    )
    if wandb_logger is not None:
        loggers.append(wandb_logger)
    return loggers


def build_trainer(
    cfg: Config, callbacks: list[Callback], *, last_callbacks: Sequence[Callback] = (), **logger_options: Any
) -> L.Trainer:
    """Lightning's `Trainer` from the config's `trainer` and `logger` sections, with checkpoints
    under ``<output_dir>/checkpoints`` (``step<N>.ckpt``, and ``last.ckpt``, which holds the step
    training ended at: `FinalCheckpoint`) that carry ``cfg.run_id``. `last_callbacks` come after
    the `ModelCheckpoint` (e.g. `StopOnSignal`, which must save after it). `logger_options` go to
    `build_loggers`."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from areal_lightning.app.final_checkpoint import FinalCheckpoint

    output_dir = Path(cfg.output_dir)
    t = cfg.trainer
    checkpoints = ModelCheckpoint(
        dirpath=output_dir / CHECKPOINT_DIRNAME,
        filename="step{step}",
        auto_insert_metric_name=False,
        every_n_train_steps=t.checkpoint_every_n_steps,
        save_top_k=-1,
        save_last=True,
    )
    return L.Trainer(
        max_steps=t.max_steps,
        max_epochs=t.max_epochs if t.max_epochs is not None else -1,
        accelerator=t.accelerator,
        devices=t.devices,
        num_nodes=t.num_nodes,
        strategy=t.strategy,
        precision=lightning_precision(t.precision),
        log_every_n_steps=t.log_every_n_steps,
        enable_progress_bar=t.enable_progress_bar,
        default_root_dir=str(output_dir),
        logger=build_loggers(cfg, output_dir, **logger_options) or False,
        callbacks=[
            *callbacks,
            *([RunIdentity(cfg.run_id)] if cfg.run_id else []),
            checkpoints,
            *progress_bar(t.enable_progress_bar),
            FinalCheckpoint(output_dir / CHECKPOINT_DIRNAME / LAST_CHECKPOINT),
            *last_callbacks,
        ],
        enable_model_summary=False,
    )
