"""An eval round through inference servers (`policy.eval_engine: server`) against a plain client
loop sending the same requests; one server against two; the weight publication and load apart.

The servers are started by hand from one model directory (each one thread), e.g. with the tests'
command: ``cd tests && python server_helpers.py /tmp/srv 18101 18102`` (it saves a tiny Llama in
/tmp/srv/model). The round is the default evaluation (`run_round`: tokenizing, requests, scoring,
metrics) on a GSM8K-format set of `--prompts` prompts x `--n-samples` completions. Its requests are
recorded, then sent again by a plain loop: one `aiohttp.ClientSession` (and, for comparison, one
`httpx.AsyncClient` without kept-alive connections), the same bodies to the same servers, at most
`max_in_flight` in flight per server; the plain loop also sends them all to the first server, so
that one server against two is measured for the servers alone (``one_over_two_servers_plain``) as
well as for the round. Each measurement is repeated `--repeats` times, interleaved, and the medians
compared. A first round at a new step publishes the weights (`publish_secs`) and
loads them on the servers (`load_secs`); the timed rounds after it find the snapshot there and the
servers holding it (their version is checked, nothing loaded).

    .venv-vllm/bin/python benchmarks/server_round.py --model /tmp/srv/model \
        --urls http://127.0.0.1:18101,http://127.0.0.1:18102 [--prompts 16] [--n-samples 4] \
        [--max-new-tokens 16] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _write_data(path: Path, n: int) -> Path:
    """`n` distinct GSM8K-format questions (an eval set drops repeated prompts)."""
    rows = [
        {
            "question": f"Tom has {i} apples and buys {i % 7 + 2} more. How many apples?",
            "answer": f"#### {i + i % 7 + 2}",
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _module(model: str, urls: list[str], tmp: Path, data: Path, args: argparse.Namespace) -> tuple[Any, Any]:
    from areal_lightning.app.builders import build_module
    from areal_lightning.app.config import load_config

    cfg = load_config(
        None,
        [
            "policy.kind=hf", f"policy.path={model}", "policy.eval_engine=server",
            f"policy.server.urls=[{','.join(urls)}]", "policy.server.model=tiny",
            f"policy.server.snapshot_dir={tmp / 'snapshots'}", f"policy.server.max_in_flight={args.in_flight}",
            "task.name=math", f"task.path={data}", "task.verifier=numeric",
            f"eval_sets.bench.path={data}", f"eval_sets.bench.n_samples={args.n_samples}",
            "eval_sets.bench.temperature=1.0", f"eval_sets.bench.max_new_tokens={args.max_new_tokens}",
            f"eval_sets.bench.batch_size={args.prompts}", "logger.wandb.mode=disabled", f"output_dir={tmp / 'run'}",
        ],
    )  # fmt: skip
    return cfg, build_module(cfg)


def _round(cfg: Any, module: Any, step: int) -> float:
    from areal_lightning.app.builders import build_eval_sets
    from areal_lightning.callbacks.async_evaluator import module_evaluate
    from areal_lightning.eval_round import run_round

    started = time.perf_counter()
    run_round(module, build_eval_sets(cfg), module_evaluate, seed=cfg.seed, global_step=step, epoch=0)
    return time.perf_counter() - started


def _record(evaluator: Any) -> list[tuple[dict[str, Any], int]]:
    """Wraps the evaluator's `complete_all` so that it keeps the bodies and routes it sends."""
    sent: list[tuple[dict[str, Any], int]] = []
    inner = evaluator.fleet.complete_all

    def complete_all(bodies: Any, routes: Any, timeout_s: float) -> Any:
        sent.extend(zip(bodies, routes, strict=True))
        return inner(bodies, routes, timeout_s)

    evaluator.fleet.complete_all = complete_all
    return sent


def _plain(urls: list[str], sent: list[tuple[dict[str, Any], int]], in_flight: int, client: str = "aiohttp") -> float:
    """The same requests from one client (`aiohttp`, or `httpx` without kept-alive connections),
    `in_flight` per server, all started together; the first call opens the connections."""

    async def send(post: Any) -> None:
        slots = {u: asyncio.Semaphore(in_flight) for u in urls}

        async def one(body: dict[str, Any], route: int) -> None:
            url = urls[route % len(urls)]
            async with slots[url]:
                await post(f"{url}/v1/completions", body)

        await asyncio.gather(*(one(b, r) for b, r in sent))

    async def run() -> float:
        if client == "httpx":
            import httpx

            limits = httpx.Limits(max_connections=len(urls) * in_flight, max_keepalive_connections=0)
            async with httpx.AsyncClient(limits=limits, timeout=600) as hx:

                async def post_httpx(url: str, body: dict[str, Any]) -> None:
                    (await hx.post(url, json=body)).raise_for_status()

                started = time.perf_counter()
                await send(post_httpx)
                return time.perf_counter() - started
        import aiohttp

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def post_aiohttp(url: str, body: dict[str, Any]) -> None:
                async with session.post(url, json=body) as answer:
                    answer.raise_for_status()
                    await answer.read()

            started = time.perf_counter()
            await send(post_aiohttp)
            return time.perf_counter() - started

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the directory the servers were started from")
    parser.add_argument("--urls", required=True, help="two servers, comma-separated")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n-samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    urls = args.urls.split(",")
    assert len(urls) == 2, "--urls: two servers"
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        data = _write_data(tmp / "bench.jsonl", args.prompts)
        cfg2, two = _module(args.model, urls, tmp, data, args)
        cfg1, one = _module(args.model, urls[:1], tmp, data, args)
        sent = _record(two.engine_evaluate_fn)
        _round(cfg2, two, step=1)  # a new version: published and loaded on both servers
        publish, load = two.engine_evaluate_fn.publish_secs, two.engine_evaluate_fn.load_secs
        _round(cfg1, one, step=1)  # warms the one-server client (the snapshot is there, loaded)
        times: dict[str, list[float]] = {k: [] for k in ("round_2", "plain_2", "plain_2_httpx", "round_1", "plain_1")}
        for _ in range(args.repeats):
            sent.clear()
            times["round_2"].append(_round(cfg2, two, step=1))
            times["plain_2"].append(_plain(urls, list(sent), args.in_flight))
            times["plain_2_httpx"].append(_plain(urls, list(sent), args.in_flight, client="httpx"))
            times["round_1"].append(_round(cfg1, one, step=1))
            times["plain_1"].append(_plain(urls[:1], list(sent), args.in_flight))
        for module in (one, two):
            module.engine_evaluate_fn.close()
    med = {k: median(v) for k, v in times.items()}
    out = {
        "requests": len(sent),
        **{f"{k}_secs": round(v, 3) for k, v in med.items()},
        "round_over_plain": round(med["round_2"] / med["plain_2"], 3),
        "one_over_two_servers": round(med["round_1"] / med["round_2"], 3),
        "one_over_two_servers_plain": round(med["plain_1"] / med["plain_2"], 3),
        "publish_secs": round(publish, 3),
        "load_secs": round(load, 3),
        "all": times,
    }
    print(json.dumps(out) if args.json else "\n".join(f"{k}: {v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
