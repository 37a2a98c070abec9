"""`ServerOptions`: which inference servers the evaluation generates on, and how it talks to them.
Pure Python, so that a config checks its section without importing torch or aiohttp."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from urllib.parse import urlsplit

from areal_lightning.errors import ArgumentError


class ServerKind(str, Enum):
    """The server's weight routes: ``vllm`` (``/collective_rpc`` reload_weights, ``/update_weight_version``,
    ``/weight_info``; ``VLLM_SERVER_DEV_MODE=1``) or ``sglang`` (``/update_weights_from_disk``,
    ``/get_weight_version``; untested here, docs/servers.md)."""

    VLLM = "vllm"
    SGLANG = "sglang"


def _positive(owner: str, name: str, value: object, number: type = int) -> None:
    ok = isinstance(value, (int, float) if number is float else int) and not isinstance(value, bool)
    if not ok or value <= 0:  # type: ignore[operator]
        raise ArgumentError(owner, name, value, f"a positive {'number' if number is float else 'integer'}")


@dataclass(frozen=True)
class ServerOptions:
    """The fleet of servers a round generates on.

    Args:
        urls: the servers' base URLs (``http://host:port``), each serving the same model; a
            prompt's requests go to one server (the prompts dealt evenly), the next one when that
            one fails.
        model: the served model name (``vllm serve --served-model-name``).
        snapshot_dir: where the evaluated weights are published before a round, a directory every
            server can read (a shared file system, or the local disk when they run on this machine).
        kind: the servers' weight routes (`ServerKind`).
        keep_snapshots: published snapshots kept on disk (the oldest are deleted; at least 1).
        max_in_flight: requests in flight per server, enough to feed its continuous batching.
        retries: attempts after the first on one server, for transport errors and 5xx answers only
            (never a 4xx); then the request goes to the next server.
        retry_wait_s: the wait before the first retry, doubled after each.
        timeout_base_s: a request's time limit is this plus `timeout_per_token_s` per max_tokens.
        timeout_per_token_s: see `timeout_base_s`.
        load_timeout_s: the time limit of a weight load on one server.

    Raises:
        ArgumentError: for an empty or malformed URL list, or a value out of range.

    Example:
        >>> ServerOptions(["http://127.0.0.1:8000"], model="m", snapshot_dir="/tmp/s").request_timeout_s(100)
        40.0
    """

    urls: tuple[str, ...] | list[str]
    model: str
    snapshot_dir: str
    kind: ServerKind = ServerKind.VLLM
    keep_snapshots: int = 2
    max_in_flight: int = 32
    retries: int = 2
    retry_wait_s: float = 0.5
    timeout_base_s: float = 30.0
    timeout_per_token_s: float = 0.1
    load_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        urls = list(self.urls)
        if not urls:
            raise ArgumentError("ServerOptions", "urls", self.urls, "a non-empty list of http:// or https:// base URLs")
        for url in urls:
            parts = urlsplit(url) if isinstance(url, str) else None
            if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
                raise ArgumentError("ServerOptions", "urls", url, "http://host:port or https://host:port base URLs")
        if len(set(urls)) != len(urls):
            raise ArgumentError("ServerOptions", "urls", urls, "distinct URLs (a server listed twice)")
        object.__setattr__(self, "urls", tuple(u.rstrip("/") for u in urls))
        object.__setattr__(self, "kind", ServerKind(self.kind))
        if not isinstance(self.model, str) or not self.model:
            raise ArgumentError("ServerOptions", "model", self.model, "the served model name, a non-empty string")
        if not isinstance(self.snapshot_dir, str) or not self.snapshot_dir:
            raise ArgumentError("ServerOptions", "snapshot_dir", self.snapshot_dir, "a directory the servers can read")
        for name in ("keep_snapshots", "max_in_flight"):
            _positive("ServerOptions", name, getattr(self, name))
        if not isinstance(self.retries, int) or isinstance(self.retries, bool) or self.retries < 0:
            raise ArgumentError("ServerOptions", "retries", self.retries, "an integer >= 0")
        for name in ("retry_wait_s", "timeout_base_s", "timeout_per_token_s", "load_timeout_s"):
            _positive("ServerOptions", name, getattr(self, name), float)

    def request_timeout_s(self, max_tokens: int) -> float:
        """The time limit of one completions request of `max_tokens` tokens."""
        return self.timeout_base_s + self.timeout_per_token_s * max_tokens
