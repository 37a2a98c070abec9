"""Exactly one weight version per round: snapshots published on disk, loaded and checked on each server.

`publish_snapshot` writes the evaluated weights as a Hugging Face-format directory
(``save_pretrained``: ``config.json`` and safetensors) under the snapshot directory, in a temporary
name renamed into place after a completion marker (``COMPLETE``, JSON: version and step) is written
in it: a server never sees half a snapshot. Only ``keep`` snapshots stay on disk.

`load_version` makes a server hold a snapshot: vLLM reloads it in place (``/collective_rpc``
``reload_weights(weights_path=...)``), drops its prefix cache (keys of the old weights) and tags it
(``/update_weight_version``); SGLang does all three in ``/update_weights_from_disk`` with
``weight_version``. `server_version` reads the tag back (``/weight_info``, ``/get_weight_version``)
and `server_checksums` vLLM's weight checksums (``/weight_checker``), which tell two servers that
claim one version but hold different weights apart.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_lightning.rl.engines.server.client import Fleet, ServerError
from areal_lightning.rl.engines.server.options import ServerKind

MARKER = "COMPLETE"
"""The file a snapshot directory holds once it is whole (written last, before the rename)."""
PREFIX = "step-"
ADMIN_TIMEOUT_S = 60.0


class VersionError(ServerError):
    """The servers did not all hold the expected weight version (each named with what it holds)."""


@dataclass(frozen=True)
class Snapshot:
    """A published snapshot: its directory (absolute) and the version tag the servers get."""

    path: str
    version: str
    step: int


FINGERPRINT_ELEMENTS = 4096
"""Elements of each tensor that the weights' fingerprint reads (evenly spaced)."""


def fingerprint(model: Any) -> str:
    """A short hash of the weights, the same on every rank that holds them: of each tensor's name,
    shape and `FINGERPRINT_ELEMENTS` evenly spaced elements (an optimizer step moves them all), so
    that it costs little for a large model.

    Example:
        >>> import torch
        >>> a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        >>> fingerprint(a) == fingerprint(a), fingerprint(a) == fingerprint(b)
        (True, False)
    """
    digest = hashlib.blake2b(digest_size=5)
    for name, tensor in model.state_dict().items():
        flat = tensor.detach().reshape(-1)
        stride = max(1, flat.numel() // FINGERPRINT_ELEMENTS)
        digest.update(f"{name}{tuple(tensor.shape)}".encode())
        digest.update(flat[::stride].float().cpu().numpy().tobytes())
    return digest.hexdigest()


def version_of(step: int, weights: str) -> str:
    """The version tag of the weights `weights` (a `fingerprint`) at `step`: sortable by step, and
    different for other weights at the same step (another run, a checkpoint loaded in place).

    Example:
        >>> version_of(12, "ab12cd34ef")
        'step-000000012-ab12cd34ef'
    """
    return f"{PREFIX}{step:09d}-{weights}"


def is_complete(path: Path) -> bool:
    """A snapshot directory is whole once it holds its marker."""
    return (path / MARKER).is_file()


def publish_snapshot(model: Any, root: str, version: str, step: int, keep: int) -> Snapshot:
    """Writes `model` (a `transformers` model) as the snapshot of `version` under `root`, unless it is
    there already, and deletes the oldest complete snapshots beyond `keep` (and half-written ones)."""
    base = Path(root).expanduser().resolve()
    base.mkdir(parents=True, exist_ok=True)
    final = base / version
    if not is_complete(final):
        tmp = base / f".tmp-{version}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp, safe_serialization=True)
        with open(tmp / MARKER, "w") as marker:
            json.dump({"version": version, "step": step}, marker)
            marker.flush()
            os.fsync(marker.fileno())
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    _prune(base, keep, final)
    return Snapshot(str(final), version, step)


def _prune(base: Path, keep: int, current: Path) -> None:
    complete = sorted(p for p in base.glob(f"{PREFIX}*") if p.is_dir() and is_complete(p))
    for old in [p for p in complete if p != current][: max(0, len(complete) - keep)]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in base.glob(f".tmp-{PREFIX}*-{os.getpid()}"):
        shutil.rmtree(stale, ignore_errors=True)


async def load_version(fleet: Fleet, url: str, snapshot: Snapshot) -> None:
    """Makes the server at `url` hold `snapshot` and tags it with its version.

    Raises:
        ServerError: a route failed (after its retries) or was refused.
    """
    timeout = fleet.options.load_timeout_s
    if fleet.options.kind is ServerKind.SGLANG:
        body = {"model_path": snapshot.path, "weight_version": snapshot.version, "abort_all_requests": False}
        answer = await fleet.request("POST", url, "/update_weights_from_disk", timeout, body)
        if isinstance(answer, dict) and answer.get("success") is False:
            raise ServerError(f"{url} could not load {snapshot.path}: {answer.get('message')}")
        return
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": snapshot.path}, "timeout": timeout}
    await fleet.request("POST", url, "/collective_rpc", timeout, rpc)
    await fleet.request("POST", url, "/reset_prefix_cache", ADMIN_TIMEOUT_S)
    await fleet.request("POST", url, "/update_weight_version", ADMIN_TIMEOUT_S, {"new_version": snapshot.version})


async def server_version(fleet: Fleet, url: str) -> str:
    """The weight version the server at `url` says it holds."""
    if fleet.options.kind is ServerKind.SGLANG:
        answer = await fleet.request("GET", url, "/get_weight_version", ADMIN_TIMEOUT_S)
    else:
        answer = await fleet.request("GET", url, "/weight_info", ADMIN_TIMEOUT_S)
    if isinstance(answer, dict):
        return str(answer.get("weight_version"))
    return str(answer)


async def served_max_len(fleet: Fleet, url: str) -> int | None:
    """The longest sequence (prompt and completion) the server at `url` takes for the served model:
    ``max_model_len`` of its ``/v1/models`` entry; None where it does not say."""
    answer = await fleet.request("GET", url, "/v1/models", ADMIN_TIMEOUT_S)
    entries = answer.get("data", []) if isinstance(answer, dict) else []
    lengths = [e.get("max_model_len") for e in entries if isinstance(e, dict) and e.get("id") == fleet.options.model]
    return int(lengths[0]) if lengths and isinstance(lengths[0], int) else None


async def server_checksums(fleet: Fleet, url: str) -> dict[str, str] | None:
    """vLLM's per-parameter checksums of the weights the server holds (None for SGLang: it has none)."""
    if fleet.options.kind is ServerKind.SGLANG:
        return None
    answer = await fleet.request("POST", url, "/weight_checker", ADMIN_TIMEOUT_S, {"action": "checksum"})
    return dict(answer["checksums"]) if isinstance(answer, dict) else None
