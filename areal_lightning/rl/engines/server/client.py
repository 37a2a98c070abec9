"""`Fleet`: one async HTTP client for a list of OpenAI-compatible servers, its event loop on a thread.

A round is synchronous code; the fleet runs its requests on an event loop of its own (a daemon
thread, started on first use), so that one `aiohttp.ClientSession` keeps its connections across
rounds (httpx's pool of kept-alive connections made a round 2-4x slower than fresh connections:
benchmarks/RESULTS.md). Each server has at most ``max_in_flight`` requests in flight. A request goes
to the server its route picks; transport errors and 5xx answers are retried there (``retries``
times, waiting ``retry_wait_s`` doubled each time), then the server is marked down for the round and
the request goes to the next one. A 4xx answer is never retried: the request itself is wrong, and
every server would refuse it. Every request is answered once or the round fails: its answer is the
one it waits on.
"""

from __future__ import annotations

import asyncio
import json
import threading
import weakref
from collections import Counter
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import aiohttp

from areal_lightning.rl.engines.server.options import ServerOptions

T = TypeVar("T")
CONNECT_TIMEOUT_S = 10.0


class ServerError(RuntimeError):
    """The servers could not answer: every one failed (named with its reason), or one refused a request (4xx)."""


class ServerRefusedError(ServerError):
    """A server answered 4xx: the request itself is wrong (never retried, never sent elsewhere)."""


class _Retryable(Exception):
    """A failure worth another attempt: a transport error or a 5xx answer; `reason` names its kind."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


TRANSPORT_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError)
"""What a request can fail with before a whole answer arrived: worth another attempt."""


def _reason(err: BaseException) -> str:
    return "timeout" if isinstance(err, asyncio.TimeoutError) else "transport"


def _shut_down(loop: asyncio.AbstractEventLoop, thread: threading.Thread, client: Any) -> None:
    if client is not None and thread.is_alive():
        asyncio.run_coroutine_threadsafe(client.close(), loop).result()
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


class Fleet:
    """The servers of `options`, spoken to over one async client (see the module docstring).

    Attributes:
        down: the servers marked down in the current round, with the reason (`begin_round` clears it).
        failures: failed attempts of the current round by reason (``transport``, ``timeout``, ``5xx``).
        failovers: requests of the current round that moved to another server.
    """

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.down: dict[str, str] = {}
        self.failures: Counter[str] = Counter()
        self.failovers = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: aiohttp.ClientSession | None = None
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._closer: weakref.finalize[Any, Fleet] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(
            _loop=None, _thread=None, _client=None, _slots={}, _closer=None, down={}, failures=Counter(), failovers=0
        )
        return state

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(self.options.urls)

    def begin_round(self) -> None:
        """Forgets the last round's down servers and failure counts: a server gets a new chance each round."""
        self.down, self.failures, self.failovers = {}, Counter(), 0

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Runs `coro` on the fleet's event loop and returns its result (raises what it raised)."""
        if self._loop is None:
            self._start()
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _start(self) -> None:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="server-fleet", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread

        async def make() -> None:
            # No limit of the connector's own: the slots bound each server's completions, and a
            # version check must not wait behind them.
            self._client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
            self._slots = {url: asyncio.Semaphore(self.options.max_in_flight) for url in self.urls}

        asyncio.run_coroutine_threadsafe(make(), loop).result()
        # A fleet nobody closed (dropped, or alive at exit) closes its client and loop all the same.
        self._closer = weakref.finalize(self, _shut_down, loop, thread, self._client)

    def close(self) -> None:
        """Closes the client and stops the loop (the next `run` starts them again)."""
        closer = self._closer
        self._loop = self._thread = self._client = self._closer = None
        if closer is not None:
            closer()

    async def request(self, method: str, url: str, path: str, timeout_s: float, body: Any = None) -> Any:
        """One request to one server with its retries; the answer's JSON (None when it has no body).

        Raises:
            ServerError: the server answered 4xx, or failed every attempt (the reason and last error).
        """
        assert self._client is not None
        wait, last = self.options.retry_wait_s, None
        for attempt in range(self.options.retries + 1):
            if attempt:
                await asyncio.sleep(wait)
                wait *= 2
            try:
                return await self._once(method, url + path, timeout_s, body)
            except _Retryable as err:
                self.failures[err.reason] += 1
                last = err
        assert last is not None
        raise ServerError(f"{url}{path} failed {self.options.retries + 1} time(s), last: {last.reason}: {last}")

    async def _once(self, method: str, url: str, timeout_s: float, body: Any) -> Any:
        assert self._client is not None
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=CONNECT_TIMEOUT_S)
        try:
            async with self._client.request(method, url, json=body, timeout=timeout) as answer:
                status, content = answer.status, await answer.read()
        except TRANSPORT_ERRORS as err:
            raise _Retryable(_reason(err), f"{type(err).__name__}: {err}") from err
        text = content.decode(errors="replace")
        if status >= 500:
            raise _Retryable("5xx", f"HTTP {status}: {text[:300]}")
        if status >= 400:
            raise ServerRefusedError(f"{url} refused the request (HTTP {status}): {text[:500]}")
        return json.loads(content) if content else None

    async def complete(self, body: dict[str, Any], route: int, timeout_s: float) -> dict[str, Any]:
        """One completions request, sent to server ``route % n`` and, when that one fails, to the next
        ones in order; servers marked down this round are skipped.

        Raises:
            ServerError: every server failed (each named with its reason), or one refused the request.
        """
        n = len(self.urls)
        tried = 0
        for url in (self.urls[(route + i) % n] for i in range(n)):
            if url in self.down:
                continue
            if tried:
                self.failovers += 1
            tried += 1
            try:
                async with self._slots[url]:
                    return await self.request("POST", url, "/v1/completions", timeout_s, body)
            except ServerRefusedError:
                raise
            except ServerError as err:
                self.down.setdefault(url, str(err))
        named = "; ".join(f"{url}: {why}" for url, why in self.down.items())
        raise ServerError(f"every server failed ({named})")

    def complete_all(
        self, bodies: Sequence[dict[str, Any]], routes: Sequence[int], timeout_s: float
    ) -> list[dict[str, Any]]:
        """The answers of `bodies`, in order, all in flight at once (within each server's limit)."""

        async def all_of() -> list[dict[str, Any]]:
            tasks = [asyncio.ensure_future(self.complete(b, r, timeout_s)) for b, r in zip(bodies, routes, strict=True)]
            try:
                return list(await asyncio.gather(*tasks))
            except BaseException:
                for task in tasks:  # a failed round leaves nothing running on the servers' slots
                    task.cancel()
                raise

        return self.run(all_of())
