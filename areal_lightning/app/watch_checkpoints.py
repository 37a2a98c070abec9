"""`areal-lightning evaluate -c CONFIG --watch CHECKPOINT_DIR`: evaluate each new checkpoint as it appears.

Each checkpoint is evaluated once, oldest step first, with the same round as training, and recorded
in the run's eval history (``trigger: ["watch"]``) and W&B run; a restarted watcher skips what the
history holds. Rank 0 alone looks at the directory and the clock (`watch_directory`) and broadcasts
each decision (evaluate this file, wait, stop), so that no rank waits in a collective alone.
When it stops, and how partial files are avoided: docs/evaluate_watch.md.
"""

from __future__ import annotations

import argparse
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_lightning.app.config import Config
from areal_lightning.app.watch_directory import (
    DEFAULT_POLL_SECS,
    MAX_LOAD_FAILURES,
    STOP_FILENAME,
    WATCH_TRIGGER,
    Decision,
    DirectoryState,
    StopRequest,
    done_steps,
    next_checkpoint,
    read_step,
)

if TYPE_CHECKING:
    from lightning.fabric import Fabric
    from lightning.pytorch.loggers import Logger

    from areal_lightning.rl.grpo.module import GRPOModule

log = logging.getLogger("areal_lightning")

_WANDB_RUN_DIR = re.compile(r"^(?:offline-)?run-\d{8}_\d{6}-(?P<id>[A-Za-z0-9]+)$")


# ---------------------------------------------------------------------------- W&B (rank 0)


def wandb_run_id(ckpt_run_id: str | None, run_dir: Path) -> str | None:
    """The W&B run to log into: the checkpoint's run id, else ``run_id`` in ``<run_dir>/config.yaml``,
    else the id of ``<run_dir>/wandb/latest-run``; None when there is none (a new W&B run starts).

    Example:
        >>> wandb_run_id("abc123", Path("no/such/run"))
        'abc123'
    """
    if ckpt_run_id:
        return str(ckpt_run_id)
    config = run_dir / "config.yaml"
    if config.is_file():
        import yaml

        from areal_lightning.app.runs import RUN_ID_KEY

        found = (yaml.safe_load(config.read_text()) or {}).get(RUN_ID_KEY)
        if found:
            return str(found)
    latest = run_dir / "wandb" / "latest-run"
    if latest.exists():
        match = _WANDB_RUN_DIR.match(latest.resolve().name)
        if match:
            return match.group("id")
    return None


def watch_loggers(cfg: Config, run_dir: Path, run_id: str | None) -> list[Logger]:
    """The W&B logger of the config, continuing run `run_id` (W&B ``resume="allow"``); [] when W&B is off.

    The one place the watcher wires W&B: eval rows go on the run's ``eval/step`` axis.
    """
    import copy

    from areal_lightning.app.builders import build_wandb_logger

    # The W&B id is the run id (build_wandb_logger), so the watcher's rows join the training run.
    # A shallow copy, not dataclasses.replace: that would validate the config again, here on rank 0
    # alone, and validation must never reach a collective (metric names come from torchmetrics).
    with_id = copy.copy(cfg)
    with_id.run_id = run_id or cfg.run_id
    logger = build_wandb_logger(with_id, run_dir)
    return [] if logger is None else [logger]


# ---------------------------------------------------------------------------- the loop


@dataclass
class _Watch:
    cfg: Config
    directory: Path
    history_file: Path
    poll_secs: float
    idle_timeout: float | None
    trust: bool
    state: DirectoryState = field(default_factory=DirectoryState)
    last_progress: float = field(default_factory=time.monotonic)

    def decide(self, stop: StopRequest) -> Decision:
        """Rank 0: what to do next."""

        if stop.requested:
            return Decision("stop", reason="stop requested")
        sentinel = (self.directory / STOP_FILENAME).exists()  # read before the listing: no file missed
        stable, unstable = self.state.poll(self.directory) if self.directory.is_dir() else ([], [])
        for path in stable:
            sig = self.state.seen[path]
            if path in self.state.given_up or self.state.steps.get(path, ((-1, -1),))[0] == sig:
                continue
            read = read_step(path, self.trust)
            if read is None:
                self._count_load_failure(path, 0, "polls")
                continue
            if path not in self.state.steps:
                self.last_progress = time.monotonic()  # a new checkpoint
            self.state.steps[path] = (sig, *read)
        done = done_steps(self.history_file)
        # Only files whose step was read at their current, stable size and time (last.ckpt is rewritten).
        present = {
            p: (s, e)
            for p, (sig, s, e) in self.state.steps.items()
            if p in stable and sig == self.state.seen[p] and p not in self.state.given_up
        }
        found = next_checkpoint(present, done)
        if found is not None:
            path, step, epoch = found
            return Decision("eval", str(path), step, epoch)
        settling = [p for p in [*stable, *unstable] if p not in self.state.given_up and p not in present]
        if unstable:
            self.last_progress = time.monotonic()  # a file is being written
        if sentinel and not settling:
            return Decision("stop", reason=f"{STOP_FILENAME} found and every checkpoint evaluated")
        if self.idle_timeout is not None and not settling and time.monotonic() - self.last_progress > self.idle_timeout:
            return Decision("stop", reason=f"no new checkpoint for {self.idle_timeout:g} s")
        return Decision("wait")

    def load_failed(self, decision: Decision, error: str) -> None:
        """Rank 0: the checkpoint's step was read but its weights did not load (another model, or the
        file rewritten meanwhile). It is tried again at later polls, then reported and left alone, so
        that the checkpoints after it are not held up."""
        assert decision.path is not None
        self._count_load_failure(Path(decision.path), decision.step, "tries", f": {error}")

    def _count_load_failure(self, path: Path, step: int, attempts: str, detail: str = "") -> None:
        """Counts one failed load of `path`; at `MAX_LOAD_FAILURES` it is left alone, logged and
        recorded as an `error` event at `step`."""
        from areal_lightning.tracking.history import EvalHistory
        from areal_lightning.tracking.records import event_record

        failures = self.state.load_failures[path] = self.state.load_failures.get(path, 0) + 1
        if failures >= MAX_LOAD_FAILURES:
            self.state.given_up.add(path)
            message = f"checkpoint {path} did not load at {failures} {attempts}; left alone{detail}"
            log.error("%s", message)
            EvalHistory(self.history_file).append(event_record("error", step, message=message, checkpoint=str(path)))


def _load_on_every_rank(
    fabric: Fabric, module: GRPOModule, path: str, step: int, trust: bool
) -> tuple[str | None, str | None]:
    """Every rank loads the weights; all agree whether it worked: (the first rank's error or None, the run id)."""
    from areal_lightning.app.checkpoints import STATE_DICT_KEY, CheckpointError, load_checkpoint, load_weights
    from areal_lightning.app.runs import RUN_ID_KEY
    from areal_lightning.eval_round.ranks import all_gather_object

    error, run_id = None, None
    try:
        ckpt = load_checkpoint(path, trust=trust)
        if int(ckpt["global_step"]) != step:  # rewritten since rank 0 read its step (last.ckpt)
            raise CheckpointError(f"{path} now holds step {ckpt['global_step']}, not {step}")
        load_weights(module, ckpt[STATE_DICT_KEY], path)
        run_id = ckpt.get(RUN_ID_KEY)
    except CheckpointError as err:
        error = str(err)
    errors = [e for e in all_gather_object(error) if e]  # the same collective on every rank
    if errors and fabric.global_rank == 0:
        log.warning("skipping %s for now: %s", path, errors[0])
    return (errors[0] if errors else None), run_id


def _watch_on_rank(fabric: Fabric, watch: _Watch) -> int:
    from areal_lightning.app.builders import build_module
    from areal_lightning.app.console import report_rounds, wandb_where
    from areal_lightning.app.evaluate import prepare_on_rank
    from areal_lightning.tracking.history import EvalHistory
    from areal_lightning.tracking.wandb_logger import finish_wandb

    module, eval_sets = prepare_on_rank(fabric, watch.cfg, build_module(watch.cfg))

    loggers: list[Logger] | None = None  # built at the first round, under the checkpoint's run id
    history = EvalHistory(watch.history_file)
    evaluated = failed = 0
    with StopRequest() as stop:
        if fabric.global_rank == 0:  # after the handlers are in place: from here on Ctrl-C stops cleanly
            print(
                f"watching {watch.directory} for checkpoints; stop with Ctrl-C, --idle-timeout or "
                f"{watch.directory / STOP_FILENAME}",
                flush=True,
            )
        try:
            while True:
                mine = watch.decide(stop) if fabric.global_rank == 0 else None
                decision = fabric.broadcast(mine, src=0)  # one decision for every rank
                assert decision is not None  # rank 0 always decides
                if decision.action == "stop":
                    if fabric.global_rank != 0:
                        return 0  # rank 0 reports: every rank saw the same rounds fail
                    print(f"watch stopped: {decision.reason}; {evaluated} checkpoint(s) evaluated", flush=True)
                    return report_rounds(failed, evaluated + failed, watch.history_file)
                error, run_id = None, None
                if decision.action == "eval":
                    assert decision.path is not None
                    error, run_id = _load_on_every_rank(fabric, module, decision.path, decision.step, watch.trust)
                if decision.action != "eval" or error is not None:  # waiting, or this one did not load
                    if fabric.global_rank == 0:
                        if error is not None:
                            watch.load_failed(decision, error)
                        time.sleep(watch.poll_secs)
                    continue
                results = _evaluate_checkpoint(fabric, watch, module, eval_sets, decision, history)
                if results is None:
                    failed += 1
                    continue
                evaluated += 1
                if fabric.global_rank == 0:
                    loggers = _report_checkpoint(fabric, watch, decision, results, run_id, history, loggers)
        finally:
            if loggers:
                where = wandb_where(loggers)
                finish_wandb(loggers)
                if where is not None:
                    log.info("%s", where)


def _evaluate_checkpoint(
    fabric: Fabric, watch: _Watch, module: GRPOModule, eval_sets: list[Any], decision: Decision, history: Any
) -> list[Any] | None:
    """The loaded checkpoint's round on every rank; None when it failed (recorded by rank 0, so that a
    restart does not retry it forever)."""
    from areal_lightning.app.evaluate import default_evaluate_fn
    from areal_lightning.eval_round import EvalRoundError, run_round
    from areal_lightning.tracking.records import event_record

    try:
        with fabric.autocast():
            return run_round(
                module,
                eval_sets,
                default_evaluate_fn(module),
                seed=watch.cfg.seed,
                global_step=decision.step,
                epoch=decision.epoch,
            )
    except EvalRoundError as err:
        if fabric.global_rank == 0:
            log.error("evaluation of %s failed: %s", decision.path, err)
            history.append(
                event_record("error", decision.step, message=str(err), source=WATCH_TRIGGER, checkpoint=decision.path)
            )
        return None


def _report_checkpoint(
    fabric: Fabric,
    watch: _Watch,
    decision: Decision,
    results: list[Any],
    run_id: str | None,
    history: Any,
    loggers: list[Logger] | None,
) -> list[Logger]:
    """Rank 0: the round's records (with the checkpoint's path), the loggers (built at the first
    round, under the checkpoint's run id; returned) and a table on stdout."""
    from areal_lightning.app.evaluate import format_table
    from areal_lightning.tracking.loggers import log_eval_results
    from areal_lightning.tracking.records import eval_record

    cfg = watch.cfg
    watch.last_progress = time.monotonic()
    records = [
        eval_record(
            decision.step,
            decision.epoch,
            r.dataset,
            r.metrics,
            trigger=[WATCH_TRIGGER],
            num_samples=r.num_samples,
            num_prompts=r.num_prompts,
            eval_secs=r.eval_secs,
            mode="sync",
            world_size=fabric.world_size,
            sampling=r.sampling,
            notes=r.notes,
            run_id=run_id,
            source="standalone",
        )
        for r in results
    ]
    # How far the watcher is behind: the newest checkpoint step it has seen, less the one it evaluated.
    lag = max([decision.step, *(step for _, step, _ in watch.state.steps.values())]) - decision.step
    history.append_many({**rec, "lag_steps": lag, "checkpoint": decision.path} for rec in records)
    if loggers is None:
        loggers = watch_loggers(cfg, Path(cfg.output_dir), wandb_run_id(run_id, Path(cfg.output_dir)))
    log_eval_results(loggers, results, decision.step)
    print(f"checkpoint {decision.path} (step {decision.step}, epoch {decision.epoch}):", flush=True)
    print(format_table(results), flush=True)
    return loggers


def add_watch_arguments(parser: argparse.ArgumentParser, ckpt_group: argparse._MutuallyExclusiveGroup) -> None:
    """The watcher's options of `areal-lightning evaluate`; ``--watch`` goes into ``--ckpt``'s group."""
    ckpt_group.add_argument(
        "--watch",
        metavar="CHECKPOINT_DIR",
        help="evaluate each new checkpoint of this directory as it appears, oldest first, once "
        f"each; stops on Ctrl-C, --idle-timeout or a file {STOP_FILENAME} in the directory",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=None,
        metavar="SECS",
        help="with --watch: stop after SECS without a new checkpoint (default: never)",
    )
    parser.add_argument(
        "--poll-secs",
        type=float,
        default=DEFAULT_POLL_SECS,
        metavar="SECS",
        help=f"with --watch: seconds between looks at the directory (default {DEFAULT_POLL_SECS:g})",
    )


def evaluate_command(args: argparse.Namespace) -> int:
    """`areal-lightning evaluate`: one checkpoint (``--ckpt``), or every new one (``--watch``)."""
    from areal_lightning.app.console import fail
    from areal_lightning.app.evaluate import evaluate_main, missing_config_message

    if args.config is None:
        return fail(missing_config_message(args.watch or args.ckpt, watch=args.watch is not None))
    return watch_main(args) if args.watch is not None else evaluate_main(args)


def watch_main(args: argparse.Namespace) -> int:
    """Runs the watcher on every rank; returns the exit status (0 after a clean stop, 1 when rounds
    failed, 2 for bad input)."""
    from areal_lightning.app.config import ConfigError, WandbMode, load_config
    from areal_lightning.app.console import fail, quiet_lightning
    from areal_lightning.app.evaluate import build_fabric, history_problem
    from areal_lightning.tracking.history import HISTORY_FILENAME
    from areal_lightning.tracking.writable import option_problem

    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as err:
        return fail(str(err))
    quiet_lightning()

    for name in ("idle_timeout", "poll_secs"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            return fail(f"--{name.replace('_', '-')} must be a positive number of seconds, got {value}")
    directory = Path(args.watch)
    if directory.exists() and not directory.is_dir():
        return fail(
            f"--watch {args.watch!r} is a file; pass the directory the checkpoints are written to, "
            "e.g. <output_dir>/checkpoints"
        )
    problem = history_problem(cfg, args.history)
    save_dir = cfg.logger.wandb.save_dir if cfg.logger.wandb.mode is not WandbMode.DISABLED else None
    if problem is None and save_dir is not None:
        problem = option_problem("logger.wandb.save_dir", save_dir)
    if problem is not None:
        return fail(problem)
    history_file = Path(args.history) if args.history else Path(cfg.output_dir) / HISTORY_FILENAME
    watch = _Watch(cfg, directory, history_file, args.poll_secs, args.idle_timeout, args.trust_checkpoint)
    fabric = build_fabric(cfg)
    try:
        # Fabric.launch passes its *args after the Fabric; its annotation says Callable[[Fabric], Any].
        return int(fabric.launch(_watch_on_rank, watch))  # type: ignore[arg-type]
    finally:
        # As `evaluate` does: a gloo group left to the interpreter's exit can abort a rank
        # ("terminate called without an active exception") after its work is done.
        import torch.distributed

        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
