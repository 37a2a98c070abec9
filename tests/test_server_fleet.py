"""The server engine's HTTP client (`Fleet`) against small HTTP servers of the test's own on
127.0.0.1: a 5xx answer is retried and then succeeds, a 4xx answer is never retried, a port nobody
listens on fails as ``transport`` after its retries, and a fleet nobody closed closes its session
and its thread when it is dropped (no "Unclosed client session" at exit). Real `vllm serve`
processes: tests/test_server_round.py."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import threading
import warnings
from collections.abc import Iterator

import pytest
from aiohttp import web

from areal_lightning.rl.engines.server.client import Fleet, ServerError, ServerRefusedError
from areal_lightning.rl.engines.server.options import ServerOptions

HOST = "127.0.0.1"


def _options(url: str, retries: int = 2) -> ServerOptions:
    return ServerOptions([url], model="m", snapshot_dir="/tmp/unused", retries=retries, retry_wait_s=0.01)


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 in a thread: ``/flaky`` answers 503 twice, then 200; ``/refuse``
    answers 404. Yields its base URL and the paths of the requests it received, in order."""
    seen: list[str] = []
    flaky = iter([503, 503])

    async def handle(request: web.Request) -> web.Response:
        seen.append(request.path)
        if request.path == "/refuse":
            return web.json_response({"error": "no such route"}, status=404)
        return web.json_response({"ok": True}, status=next(flaky, 200) if request.path == "/flaky" else 200)

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    with socket.socket() as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    loop.run_until_complete(web.TCPSite(runner, HOST, port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{HOST}:{port}", seen
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def test_a_5xx_answer_is_retried_and_a_4xx_answer_is_not(server: tuple[str, list[str]]) -> None:
    url, seen = server
    client = Fleet(_options(url))
    try:
        assert client.run(client.request("POST", url, "/flaky", 10, {"x": 1})) == {"ok": True}
        assert seen == ["/flaky"] * 3 and client.failures["5xx"] == 2
        with pytest.raises(ServerRefusedError, match="HTTP 404"):
            client.run(client.request("POST", url, "/refuse", 10, {}))
        assert seen[3:] == ["/refuse"]  # once: the request itself is wrong, every server would refuse it
    finally:
        client.close()


def test_a_port_nobody_listens_on_fails_as_transport_after_its_retries() -> None:
    with socket.socket() as s:
        s.bind((HOST, 0))
        url = f"http://{HOST}:{s.getsockname()[1]}"  # closed again before the request
    client = Fleet(_options(url, retries=1))
    try:
        with pytest.raises(ServerError, match=r"failed 2 time\(s\), last: transport"):
            client.run(client.request("GET", url, "/weight_info", 5))
        assert client.failures["transport"] == 2
    finally:
        client.close()


def test_a_fleet_nobody_closed_ends_its_session_and_thread_when_dropped(server: tuple[str, list[str]]) -> None:
    url, _ = server
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        client = Fleet(_options(url))
        client.run(client.request("POST", url, "/ok", 10, {}))
        thread = client._thread
        assert thread is not None and thread.is_alive()
        del client
        gc.collect()
        thread.join(10)
        assert not thread.is_alive()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]


def test_a_closed_fleet_opens_again_on_its_next_request(server: tuple[str, list[str]]) -> None:
    url, seen = server
    client = Fleet(_options(url))
    try:
        client.run(client.request("POST", url, "/a", 10, {}))
        client.close()
        client.close()  # twice is harmless
        client.run(client.request("POST", url, "/b", 10, {}))
        assert seen == ["/a", "/b"]
    finally:
        with contextlib.suppress(Exception):
            client.close()
