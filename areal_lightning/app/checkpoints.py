"""Reading a Lightning checkpoint for `evaluate`, `evaluate --watch` and a resumed `fit`: safely
(tensors and plain containers only, unless trusted), and into the config's model strictly, with
one-line errors that name what is wrong."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from areal_lightning.rl.grpo.module import GRPOModule

STATE_DICT_KEY = "state_dict"
"""Where a Lightning checkpoint keeps the module's weights."""
# Keys shown when a file is not a checkpoint, and characters per line of torch's key-mismatch report.
MAX_KEYS_SHOWN = 5
MAX_PROBLEM_CHARS = 240


class CheckpointError(ValueError):
    """The ``--ckpt`` file is missing, unreadable, not a Lightning checkpoint, or of another model."""


def _first_words(err: Exception) -> str:
    """The gist of a `torch.load` failure: its first line."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def _unsafe_globals(path: Path) -> list[str]:
    """The classes and functions a checkpoint pickles that `weights_only=True` refuses; [] when
    the file is not a torch zip archive (the loader's own error then says what is wrong)."""
    from torch.serialization import get_unsafe_globals_in_checkpoint

    try:
        return list(get_unsafe_globals_in_checkpoint(path))
    except Exception:  # noqa: BLE001 - not a zip checkpoint: torch.load's message is the better one
        return []


def load_checkpoint(path: str | Path, *, trust: bool = False) -> dict[str, Any]:
    """Reads a Lightning checkpoint onto the CPU.

    Args:
        path: a file written by ``Trainer.save_checkpoint`` or ``ModelCheckpoint``.
        trust: unpickle arbitrary objects (``weights_only=False``); the default loader accepts
            tensors and plain Python containers only, which is all our checkpoints hold.

    Raises:
        CheckpointError: the file does not exist, cannot be read by ``torch.load``, or is not a
            Lightning checkpoint (no ``state_dict`` / ``global_step`` entry).

    Example:
        >>> load_checkpoint("missing.ckpt")
        Traceback (most recent call last):
        ...
        areal_lightning.app.checkpoints.CheckpointError: --ckpt 'missing.ckpt' does not exist; ...
    """
    import torch

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"--ckpt {str(path)!r} does not exist; pass a Lightning checkpoint file, "
            "e.g. <output_dir>/checkpoints/last.ckpt"
        )
    refused = [] if trust else _unsafe_globals(path)
    if refused:
        raise CheckpointError(
            f"--ckpt {str(path)!r} holds objects the safe loader refuses ({', '.join(refused)}); "
            "pass --trust-checkpoint if you trust this file"
        )
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=not trust)
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same one-line answer
        raise CheckpointError(
            f"--ckpt {str(path)!r} is not a Lightning checkpoint: torch.load failed ({_first_words(err)})"
        ) from None
    if not isinstance(ckpt, Mapping) or not isinstance(ckpt.get(STATE_DICT_KEY), Mapping) or "global_step" not in ckpt:
        found = sorted(map(str, ckpt))[:MAX_KEYS_SHOWN] if isinstance(ckpt, Mapping) else type(ckpt).__name__
        raise CheckpointError(
            f"--ckpt {str(path)!r} is not a Lightning checkpoint: expected a dict with "
            f"'{STATE_DICT_KEY}' and 'global_step' entries, found {found}"
        )
    return dict(ckpt)


def checkpoint_epoch(ckpt: Mapping[str, Any]) -> int:
    """The epoch of the step whose weights `ckpt` holds, as training recorded them (Lightning's own
    ``epoch`` is one more at the end of training); Lightning's for a checkpoint of another trainer.

    Example:
        >>> checkpoint_epoch({"epoch": 8, "weights_epoch": 7}), checkpoint_epoch({"epoch": 3})
        (7, 3)
    """
    from areal_lightning.callbacks.training_position import WEIGHTS_EPOCH_KEY

    return int(ckpt.get(WEIGHTS_EPOCH_KEY, ckpt.get("epoch", 0)))


GRADER_PREFIXES = ("task.reward_model.", "task.judge.")
"""Where the model graders' weights sit in a module's state dict (`GradedTask` as ``GRPOModule.task``)."""


def load_weights(module: GRPOModule, state_dict: Mapping[str, Any], ckpt_path: str | Path) -> None:
    """Loads the checkpoint's weights into the module built from the config, strictly; the model
    graders' weights are the config's (``graders``: loaded from their directories), never the
    checkpoint's, so that a checkpoint is evaluated by the graders the config names, or by none.

    Raises:
        CheckpointError: naming the missing keys, the unexpected keys and the shape mismatches
            (torch's own report, shortened), when the checkpoint holds another model.
    """
    graders = {k: v for k, v in module.state_dict().items() if k.startswith(GRADER_PREFIXES)}
    trained = {k: v for k, v in state_dict.items() if not k.startswith(GRADER_PREFIXES)}
    try:
        module.load_state_dict({**trained, **graders}, strict=True)
    except RuntimeError as err:
        # torch lists every key; the first lines name the kinds of problem, which is what a person needs.
        lines = [line.strip() for line in str(err).splitlines()[1:] if line.strip()]
        shown = "; ".join(
            line if len(line) <= MAX_PROBLEM_CHARS else line[:MAX_PROBLEM_CHARS] + " ..." for line in lines
        )
        raise CheckpointError(
            f"checkpoint {str(ckpt_path)!r} does not match the model of the config: {shown}; "
            "use the config the checkpoint was trained with (policy and grpo.kl_coef)"
        ) from None
