"""Config -> runtime objects: the eval sets, the callback, the loggers and the Trainer of a run.

The plugin's classes take plain arguments; this is the one place that reads a `Config` for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_lightning.app.config import Config, to_dict
from areal_lightning.eval_round import EvalSet, EvaluateFn

if TYPE_CHECKING:  # Lightning and W&B load only when a builder that needs them runs
    import lightning as L
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.loggers import Logger

    from areal_lightning.callbacks import EvaluationCallback
    from areal_lightning.tasks.arithmetic import ArithmeticTask
    from areal_lightning.tracking.wandb import SafeWandbLogger

CSV_DIRNAME = "csv"
"""Lightning's CSV logs go to ``<output_dir>/csv/version_<n>/metrics.csv``."""
CHECKPOINT_DIRNAME = "checkpoints"


def build_eval_sets(cfg: Config, task: ArithmeticTask) -> list[EvalSet]:
    """The config's eval sets of the arithmetic task, in config order; a sample's cost is its prompt length.

    Example:
        >>> from areal_lightning.app.config import load_config
        >>> from areal_lightning.tasks.arithmetic import ArithmeticTask
        >>> cfg = load_config(None, ["eval_sets.easy.size=5"])
        >>> [(s.name, len(s.samples), s.options["n_samples"]) for s in build_eval_sets(cfg, ArithmeticTask())]
        [('easy', 5, 4)]
    """
    out = []
    for name, es in cfg.eval_sets.items():
        options = {"n_samples": es.n_samples, "temperature": es.temperature,
                   "max_new_tokens": es.max_new_tokens or cfg.grpo.max_new_tokens}
        out.append(EvalSet(name=name, samples=task.make_samples(name, es.digits, es.size), batch_size=es.batch_size,
                           cost_fn=lambda s: float(len(s.prompt)), key_fn=lambda s: s.key,
                           max_batch_cost=es.max_batch_cost, options=options))
    return out


def build_callback(cfg: Config, eval_sets: Mapping[str, Sequence[Any]] | Sequence[EvalSet] | None = None,
                   evaluate_fn: EvaluateFn | None = None, **overrides: Any) -> EvaluationCallback:
    """`EvaluationCallback` from the config's `evaluator` block, `output_dir` and `seed`; unless
    `eval_sets` is given, the `eval_sets` block's sets of the arithmetic task (as the main job uses).
    Keyword `overrides` replace single arguments.

    Example:
        >>> from areal_lightning.app.config import load_config
        >>> cfg = load_config(None, ["eval_sets.easy.size=5", "eval_sets.hard.digits=2", "evaluator.freq_steps=50"])
        >>> cb = build_callback(cfg)
        >>> [s.name for s in cb.eval_sets], [len(s.samples) for s in cb.eval_sets], cb.trigger.describe()
        (['easy', 'hard'], [5, 200], 'evaluate every 50 steps, at the end')
    """
    from areal_lightning.callbacks import EvaluationCallback
    from areal_lightning.tasks.arithmetic import ArithmeticTask

    if eval_sets is None:
        eval_sets = build_eval_sets(cfg, ArithmeticTask(cfg.task.train_digits, cfg.task.train_size, cfg.seed))
    ev = cfg.evaluator
    options: dict[str, Any] = dict(
        freq_epochs=ev.freq_epochs, freq_steps=ev.freq_steps, freq_secs=ev.freq_secs,
        eval_before_train=ev.eval_before_train, eval_at_end=ev.eval_at_end, metric_thresholds=dict(ev.metric_thresholds),
        threshold_action=ev.threshold_action, on_error=ev.on_error, output_dir=cfg.output_dir, seed=cfg.seed,
        max_table_rows=ev.max_table_rows, mode=ev.mode, on_busy=ev.on_busy, async_device=ev.async_device,
        async_threads=ev.async_threads, max_snapshot_mb=ev.max_snapshot_mb,
    )
    options.update(overrides)
    return EvaluationCallback(eval_sets, evaluate_fn, **options)


def build_wandb_logger(cfg: Config, output_dir: str | Path) -> SafeWandbLogger | None:
    """The W&B logger of the config's ``logger.wandb`` block, or None when its mode is disabled.

    The run starts lazily (on the first log), so building it costs nothing and cannot fail on W&B.
    The resolved config is the run's config; the run is named ``<experiment_name>/<trial_name>``.

    Example:
        >>> from areal_lightning.app.config import load_config
        >>> cfg = load_config(None, ["eval_sets.easy.size=4", "logger.wandb.mode=offline"])
        >>> build_wandb_logger(cfg, "runs/demo").save_dir
        'runs/demo'
    """
    from areal_lightning.app.config import WandbMode
    from areal_lightning.tracking.history import HISTORY_FILENAME
    from areal_lightning.tracking.wandb import SafeWandbLogger

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
        history_file=Path(output_dir) / HISTORY_FILENAME,
    )


def build_loggers(cfg: Config, output_dir: str | Path) -> list[Logger]:
    """The Trainer's loggers from the config's ``logger`` section: a `CSVLogger` under
    ``<output_dir>/csv`` when ``logger.csv``, then a `SafeWandbLogger` unless ``logger.wandb.mode``
    is disabled. No W&B run starts here (it starts on the first log).

    Example:
        >>> from areal_lightning.app.config import load_config
        >>> cfg = load_config(None, ["eval_sets.easy.size=4"])
        >>> [type(lg).__name__ for lg in build_loggers(cfg, "runs/demo")]
        ['CSVLogger']
    """
    from lightning.pytorch.loggers import CSVLogger

    loggers: list[Logger] = []
    if cfg.logger.csv:
        loggers.append(CSVLogger(save_dir=str(output_dir), name=CSV_DIRNAME))
    wandb_logger = build_wandb_logger(cfg, output_dir)
    if wandb_logger is not None:
        loggers.append(wandb_logger)
    return loggers


def build_trainer(cfg: Config, callbacks: list[Callback]) -> L.Trainer:
    """Lightning's `Trainer` from the config's `trainer` and `logger` sections, with checkpoints
    under ``<output_dir>/checkpoints`` (``last.ckpt`` and ``step<N>.ckpt``)."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    output_dir = Path(cfg.output_dir)
    t = cfg.trainer
    checkpoints = ModelCheckpoint(dirpath=output_dir / CHECKPOINT_DIRNAME, filename="step{step}",
                                  auto_insert_metric_name=False, every_n_train_steps=t.checkpoint_every_n_steps,
                                  save_top_k=-1, save_last=True)
    return L.Trainer(
        max_steps=t.max_steps, max_epochs=t.max_epochs if t.max_epochs is not None else -1,
        accelerator=t.accelerator, devices=t.devices, strategy=t.strategy, precision=t.precision,
        log_every_n_steps=t.log_every_n_steps, enable_progress_bar=t.enable_progress_bar,
        default_root_dir=str(output_dir), logger=build_loggers(cfg, output_dir) or False,
        callbacks=[*callbacks, checkpoints], enable_model_summary=False,
    )
