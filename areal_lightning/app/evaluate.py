"""`areal-lightning evaluate -c CONFIG --ckpt PATH [key=value ...]`: evaluate a checkpoint.

The command runs the same evaluation round as training (`eval_round.run_round`) on any number of
devices: `trainer.devices=2 trainer.strategy=ddp` makes Lightning's Fabric re-run this command in
one child process per extra device (as Lightning launches training), every rank evaluates its
deal of each eval set's global batches, and the reduced metrics are the same as on one device.
Rank 0 prints a table and appends one record per eval set to the eval history (trigger
``["evaluate"]``, ``source: "standalone"``, ``step``, ``epoch`` and ``run_id`` of the checkpoint).

Everything a user can get wrong (config, checkpoint path, a checkpoint of another model) is
checked before any child process starts, and reported in one line with exit status 2.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from areal_lightning.app.checkpoints import (
    STATE_DICT_KEY,
    CheckpointError,
    checkpoint_epoch,
    load_checkpoint,
    load_weights,
)
from areal_lightning.app.config import Config, ConfigError, lightning_precision, load_config
from areal_lightning.app.console import fail, quiet_lightning, report_rounds

if TYPE_CHECKING:  # heavy imports stay out of `areal-lightning --help` and `plot`
    from lightning.fabric import Fabric

    from areal_lightning.eval_round import EvalSet, EvaluateFn, SetResult
    from areal_lightning.rl.grpo.module import GRPOModule
    from areal_lightning.tracking.history import EvalHistory

EVALUATE_TRIGGER = "evaluate"
"""The `trigger` of the command's eval-history records (training rounds say steps, epochs ...)."""
METRIC_DECIMALS = 4
SECS_DECIMALS = 2


def add_evaluate_arguments(parser: argparse.ArgumentParser) -> argparse._MutuallyExclusiveGroup:
    """Adds the options of `areal-lightning evaluate` (``-c`` and the overrides come from the CLI);
    returns the group that ``--ckpt`` is in (``--watch`` joins it: one of them is required)."""
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--ckpt", help="Lightning checkpoint to evaluate (e.g. <output_dir>/checkpoints/last.ckpt)")
    parser.add_argument(
        "--history", default=None, help="eval history file to append to; default: <output_dir>/eval_history.jsonl"
    )
    parser.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="load the checkpoint with torch.load(weights_only=False); only for files you trust, "
        "when the safe loader refuses an object inside",
    )
    return what


def missing_config_message(target: str, watch: bool) -> str:
    """What `evaluate` without ``-c`` says: the config of the run that wrote the checkpoint (or the
    watched directory), which `fit` saved beside its ``checkpoints/`` directory.

    Example:
        >>> missing_config_message("runs/a/t0/checkpoints/last.ckpt", watch=False)
        'evaluate needs the config of the run (-c): fit saved it as runs/a/t0/config.yaml; ...'
    """
    from areal_lightning.app.config import CONFIG_FILENAME

    checkpoints = Path(target) if watch else Path(target).parent
    config = checkpoints.parent / CONFIG_FILENAME
    flag = f"--watch {target}" if watch else f"--ckpt {target}"
    if config.is_file() or checkpoints.name == "checkpoints":
        return (
            f"evaluate needs the config of the run (-c): fit saved it as {config}; run "
            f"areal-lightning evaluate -c {config} {flag}"
        )
    return f"evaluate needs the config of the run (-c): fit saves it as <output_dir>/{CONFIG_FILENAME}"


def _cell(value: float, whole: bool) -> str:
    if math.isnan(value):
        return "nan"
    return str(int(value)) if whole else f"{value:.{METRIC_DECIMALS}f}"


def _whole(values: Sequence[float]) -> bool:
    """A column of counts: every value a whole number (``scoring/timeouts``, ``reward/non_finite``)."""
    return all(math.isfinite(v) and v == int(v) for v in values)


def format_table(results: Sequence[SetResult]) -> str:
    """The results as an aligned text table, as Lightning prints `validate`'s: one row per metric,
    then num_prompts, num_samples and secs, one column per eval set (so it fits a terminal however
    many metrics a round has). A metric an eval set lacks shows as ``-``; a row of whole numbers
    (counts) shows integers.

    Example:
        >>> from areal_lightning.eval_round import SetResult
        >>> print(format_table([SetResult("easy", {"accuracy": 0.5, "scoring/timeouts": 3.0}, 8, 2, 0.25, [])]))
        metric              easy
        accuracy          0.5000
        scoring/timeouts       3
        num_prompts            2
        num_samples            8
        secs                0.25
    """
    names = list(dict.fromkeys(name for r in results for name in r.metrics))
    rows = [["metric", *(r.dataset for r in results)]]
    for name in names:
        whole = _whole([r.metrics[name] for r in results if name in r.metrics])
        rows.append([name, *(_cell(r.metrics[name], whole) if name in r.metrics else "-" for r in results)])
    rows.append(["num_prompts", *(str(r.num_prompts) for r in results)])
    rows.append(["num_samples", *(str(r.num_samples) for r in results)])
    rows.append(["secs", *(f"{r.eval_secs:.{SECS_DECIMALS}f}" for r in results)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    # Names left-aligned, numbers right-aligned, so that decimal points line up.
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    )


def build_fabric(cfg: Config) -> Fabric:
    from lightning.fabric import Fabric

    t = cfg.trainer
    # "auto" lets Fabric choose as the Trainer does: one device, or DDP over several.
    return Fabric(
        accelerator=t.accelerator, devices=t.devices, strategy=t.strategy, precision=lightning_precision(t.precision)
    )


def prepare_on_rank(fabric: Fabric, cfg: Config, module: GRPOModule) -> tuple[GRPOModule, list[EvalSet]]:
    """Every rank: the module in the run's precision on the rank's device (unwrapped: the round runs no
    collective inside a forward, so ranks dealt different numbers of batches never wait on each other
    mid-round), and the config's eval sets, checked to agree across ranks."""
    from areal_lightning.app.builders import build_eval_sets
    from areal_lightning.eval_round import check_eval_sets_consistent
    from areal_lightning.rl.grpo.module import GRPOModule

    converted = fabric.strategy.precision.convert_module(module)
    assert isinstance(converted, GRPOModule)  # precision plugins convert in place, they do not wrap
    eval_sets = build_eval_sets(cfg)  # arithmetic sets from the config's task: the module's own
    check_eval_sets_consistent(eval_sets)  # every rank raises together on a mismatch
    moved = fabric.to_device(converted)  # modules move in place; Fabric returns the module
    assert isinstance(moved, GRPOModule)
    return moved, eval_sets


def _evaluate_on_rank(
    fabric: Fabric, cfg: Config, module: GRPOModule, step: int, epoch: int
) -> tuple[list[SetResult], set[str]]:
    """Every rank: check the eval sets agree, answer what the result cache holds (with
    ``evaluator.rounds.cache``), run the round on the unwrapped module for the rest; returns every set's
    result in the config's order and the names of the sets the cache answered."""
    from areal_lightning.eval_round import run_round
    from areal_lightning.eval_round.progress import terminal_progress

    module, eval_sets = prepare_on_rank(fabric, cfg, module)
    show_progress = cfg.trainer.enable_progress_bar and fabric.global_rank == 0 and sys.stderr.isatty()
    hits, keys = _cache_lookup(fabric, cfg, module, eval_sets)
    with fabric.autocast():
        fresh = run_round(
            module,
            [s for s in eval_sets if s.name not in hits],
            default_evaluate_fn(module),
            seed=cfg.seed,
            global_step=step,
            epoch=epoch,
            progress=terminal_progress() if show_progress else None,
        )
    fabric.barrier()  # every rank reaches this (run_round returns or raises on all ranks alike)
    cache_dir = cfg.evaluator.rounds.cache_path(Path(cfg.output_dir))
    if cache_dir is not None:
        from areal_lightning.eval_round.cache import ResultCache

        for r in fresh:
            if r.dataset in keys:  # rank 0 only: the keys exist there
                ResultCache(cache_dir).put(keys[r.dataset], r)
    by_name = {r.dataset: r for r in fresh} | hits
    return [by_name[s.name] for s in eval_sets], set(hits)


def default_evaluate_fn(module: GRPOModule) -> EvaluateFn:
    """What evaluates a checkpoint, as in training: the episode evaluation for a module with episodes,
    else its engine's (`policy.eval_engine`: vllm or server), else `rollout_evaluate`."""
    from areal_lightning.rl.episodes.evaluation import episode_evaluate
    from areal_lightning.rl.rollout_eval import rollout_evaluate

    if module.episodes is not None:
        return episode_evaluate
    return module.engine_evaluate_fn or rollout_evaluate


def _cache_lookup(
    fabric: Fabric, cfg: Config, module: GRPOModule, eval_sets: list[EvalSet]
) -> tuple[dict[str, SetResult], dict[str, str]]:
    """The sets the result cache answers, and rank 0's keys; nothing with ``evaluator.rounds.cache`` off."""
    from areal_lightning.eval_round.cache import cached_results

    cache_dir = cfg.evaluator.rounds.cache_path(Path(cfg.output_dir))
    if cache_dir is None:
        return {}, {}
    return cached_results(
        cache_dir,
        module,
        eval_sets,
        default_evaluate_fn(module),
        is_global_zero=fabric.global_rank == 0,
        broadcaster=fabric,
        seed=cfg.seed,
        precision=cfg.trainer.precision,
        source="standalone",
    )


def _history(cfg: Config, args: argparse.Namespace) -> EvalHistory:
    from areal_lightning.tracking.history import EvalHistory

    return EvalHistory(args.history) if args.history else EvalHistory.in_run_dir(cfg.output_dir)


def _record_failure(cfg: Config, args: argparse.Namespace, step: int, run_id: str | None, err: Exception) -> Path:
    """One ``error`` event for the failed round (as training records one), so the history says it."""
    from areal_lightning.tracking.records import event_record

    history = _history(cfg, args)
    history.append(
        event_record("error", step, run_id=run_id, message=str(err), trigger=[EVALUATE_TRIGGER], source="standalone")
    )
    return history.path


def history_problem(cfg: Config, history: str | None) -> str | None:
    """Why the eval history (``--history``, else ``<output_dir>/eval_history.jsonl``) cannot be
    appended to, or None; asked before any evaluation, so that no result is computed for nothing."""
    from areal_lightning.tracking.history import HISTORY_FILENAME
    from areal_lightning.tracking.writable import option_problem

    if history:
        problem = option_problem("--history", history, is_file=True)
        return None if problem is None else f"{problem}; pass a writable --history FILE"
    path = Path(cfg.output_dir) / HISTORY_FILENAME
    problem = option_problem("output_dir", path, is_file=True, shown=cfg.output_dir)
    return None if problem is None else f"{problem}; pass a writable output_dir=... or --history FILE"


def _record(
    cfg: Config,
    args: argparse.Namespace,
    step: int,
    epoch: int,
    run_id: str | None,
    results: Sequence[SetResult],
    world_size: int,
    cached: set[str],
) -> Path:
    from areal_lightning.tracking.records import eval_record

    history = _history(cfg, args)
    records = []
    for r in results:
        record = eval_record(
            step,
            epoch,
            r.dataset,
            r.metrics,
            trigger=[EVALUATE_TRIGGER],
            num_samples=r.num_samples,
            num_prompts=r.num_prompts,
            eval_secs=r.eval_secs,
            mode="sync",
            world_size=world_size,
            sampling=r.sampling,
            notes=r.notes,
            run_id=run_id,
            source="standalone",
        )
        if r.dataset in cached:
            record["cached"] = True  # answered from the result cache (evaluator.rounds.cache)
        records.append(record)
    history.append_many(records)
    return history.path


def evaluate_main(args: argparse.Namespace) -> int:
    """Evaluates ``args.ckpt`` on the config's eval sets; returns the exit status.

    0: evaluated (rank 0 printed the table and appended to the eval history); 2: bad input
    (config, checkpoint, eval sets that differ across ranks); 1: the evaluation failed. Ranks
    other than 0 print nothing and return 0 on errors that every rank raises alike: rank 0
    reports them, and Lightning kills the launching process when a child exits non-zero.
    """
    try:
        cfg = load_config(args.config, args.overrides)
        ckpt = load_checkpoint(args.ckpt, trust=args.trust_checkpoint)
    except (ConfigError, CheckpointError) as err:
        return fail(str(err))
    problem = history_problem(cfg, args.history)
    if problem is not None:
        return fail(problem)
    quiet_lightning()
    import torch
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from areal_lightning.app.builders import build_module
    from areal_lightning.app.runs import RUN_ID_KEY
    from areal_lightning.eval_round import EvalRoundError, EvalSetMismatchError

    try:
        module = build_module(cfg)
        load_weights(module, ckpt[STATE_DICT_KEY], args.ckpt)
        step, epoch = int(ckpt["global_step"]), checkpoint_epoch(ckpt)  # the weights' place in training
        run_id = ckpt.get(RUN_ID_KEY)  # None for a checkpoint written before run ids
        del ckpt  # optimizer states and the rest: not needed, and not to be copied to spawned ranks
    except CheckpointError as err:
        return fail(str(err))
    try:
        fabric = build_fabric(cfg)
    except (MisconfigurationException, ValueError, RuntimeError) as err:
        return fail(
            f"trainer settings (accelerator={cfg.trainer.accelerator!r}, devices={cfg.trainer.devices}, "
            f"strategy={cfg.trainer.strategy!r}, precision={cfg.trainer.precision!r}) are not usable: {err}"
        )
    try:
        # Fabric.launch passes its *args after the Fabric; its annotation says Callable[[Fabric], Any].
        results, cached = fabric.launch(_evaluate_on_rank, cfg, module, step, epoch)  # type: ignore[arg-type]
    except EvalSetMismatchError as err:
        return fail(str(err)) if fabric.global_rank == 0 else 0
    except EvalRoundError as err:
        if fabric.global_rank == 0:
            print(f"areal-lightning: evaluation failed: {err}", file=sys.stderr)
            return report_rounds(1, 1, _record_failure(cfg, args, step, run_id, err))
        return 0
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    if fabric.global_rank == 0:
        path = _record(cfg, args, step, epoch, run_id, results, fabric.world_size, cached)
        print(
            f"checkpoint {args.ckpt} (run {run_id or 'unknown'}, step {step}, epoch {epoch}), "
            f"{fabric.world_size} process(es):"
        )
        print(format_table(results))
        print(f"appended to {path}")
    return 0
