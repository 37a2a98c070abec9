"""Evaluation through two real `vllm serve` processes of a tiny Llama (the vLLM CPU build), on
127.0.0.1: a round gives the same metrics and completions through two servers, one server and the
in-process vLLM engine; new weights between rounds reach both servers; a server killed in the
middle of a round leaves the round's results unchanged (its requests go to the other); a server
restarted with other weights is reloaded before the next round, and one that claims the round's
version while holding other weights fails the round. The servers start once for the module and
their process groups are killed at its end; or, to rerun the tests in minutes, start them by hand
(``cd tests && python server_helpers.py /tmp/srv 18101 18102 18103``) and name them in
``AREAL_TEST_VLLM_SERVERS=http://127.0.0.1:18101,http://127.0.0.1:18102,http://127.0.0.1:18103``:
the tests use the first two and leave them fit for the next run; the kill test kills the third
(without it, that test skips); the restart test reloads other weights in place of a restart."""

from __future__ import annotations

import contextlib
import math
import sys
import threading
from collections import Counter
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import torch
from ddp_utils import run_ddp
from hf_models import save_tiny_llama, write_gsm8k
from procs import run_in_group
from server_helpers import REUSE_ENV, SERVED_NAME, Server, free_port, reused_servers
from vllm_helpers import HIDDEN, require_vllm

from areal_lightning.rl.engines.server.evaluator import FAILED_KEY, FAILOVERS_KEY, VERSION_NOTE, WEIGHTS_STEP_KEY
from areal_lightning.rl.engines.server.weights import VersionError

require_vllm()
pytestmark = pytest.mark.timeout(2400)  # two servers start in 5-6 min each on the loaded 2-core box

PROMPTS = 6
ENGINE_ONLY = ("completion/entropy", "server/", "vllm/")
"""Metrics only one engine has: servers give no entropies; each engine's own counters."""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Two servers started for the module and killed at its end; or, with `REUSE_ENV` set, the servers
    it names (started by hand; nothing here starts or stops them, except the kill test's victim)."""
    tmp = tmp_path_factory.mktemp("servers")
    model = save_tiny_llama(tmp / "model", hidden=HIDDEN, digit_bias=2.0)
    other = save_tiny_llama(tmp / "other", seed=1, hidden=HIDDEN, digit_bias=2.0)
    reused: list[Server] | None = list(reused_servers() or []) or None
    servers = reused or [Server(model, free_port(), tmp / f"server{i}.log").start() for i in range(2)]
    try:
        for server in servers:
            server.wait_ready()
        victim = servers[1] if reused is None else (servers[2] if len(servers) == 3 else None)
        yield SimpleNamespace(
            tmp=tmp, model=model, other=other, data=write_gsm8k(tmp / "test.jsonl", PROMPTS), servers=servers[:2],
            victim=victim, reused=reused is not None,
        )  # fmt: skip
    finally:
        for server in servers if reused is None else []:
            server.kill()


def _overrides(fleet: Any, engine: str, urls: list[str]) -> list[str]:
    return [
            "policy.kind=hf",
            f"policy.path={fleet.model}",
            f"policy.eval_engine={engine}",
            "policy.vllm.max_model_len=256",
            "policy.vllm.max_num_seqs=32",
            f"policy.server.urls=[{','.join(urls)}]",
            f"policy.server.model={SERVED_NAME}",
            f"policy.server.snapshot_dir={fleet.tmp / 'snapshots'}",
            "policy.server.retry_wait_s=0.2",
            # Two in flight per server: the requests queue, and a round's chunks (2 x servers x 2
            # completions) differ between one and two servers: a seed taken from a request's place
            # in its chunk would change the results.
            "policy.server.max_in_flight=2",
            "task.name=math",
            f"task.path={fleet.data}",
            "task.verifier=numeric",
            f"eval_sets.sampled.path={fleet.data}",
            "eval_sets.sampled.n_samples=3",
            "eval_sets.sampled.temperature=1.0",
            "eval_sets.sampled.max_new_tokens=8",
            "eval_sets.sampled.batch_size=2",
            f"eval_sets.greedy.path={fleet.data}",
            "eval_sets.greedy.temperature=0.0",
            "eval_sets.greedy.max_new_tokens=8",
            "logger.wandb.mode=disabled",
            f"output_dir={fleet.tmp / 'run'}",
    ]  # fmt: skip


def _module(fleet: Any, engine: str = "server", urls: list[str] | None = None, *extra: str) -> tuple[Any, Any]:
    from areal_lightning.app.builders import build_module
    from areal_lightning.app.config import load_config

    overrides = _overrides(fleet, engine, [s.url for s in fleet.servers] if urls is None else urls)
    if any(e.startswith("eval_sets=") for e in extra):  # eval sets of the caller's own
        overrides = [o for o in overrides if not o.startswith("eval_sets.")]
    cfg = load_config(None, [*overrides, *extra])
    return cfg, build_module(cfg)


def _round(cfg: Any, module: Any, step: int = 0) -> list[Any]:
    from areal_lightning.app.builders import build_eval_sets
    from areal_lightning.callbacks.async_evaluator import module_evaluate
    from areal_lightning.eval_round import run_round

    return run_round(
        module, build_eval_sets(cfg), module_evaluate, seed=cfg.seed, global_step=step, epoch=0, max_table_rows=PROMPTS
    )


def _shared(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not any(p in k for p in ENGINE_ONLY)}


def assert_same_results(a: list[Any], b: list[Any]) -> None:
    """The same metrics to the last digit (NaN where both are NaN) and the same completions."""
    assert [r.dataset for r in a] == [r.dataset for r in b]
    for x, y in zip(a, b, strict=True):
        mx, my = _shared(x.metrics), _shared(y.metrics)
        assert mx.keys() == my.keys()
        differ = {k: (mx[k], my[k]) for k in mx if not (mx[k] == my[k] or (math.isnan(mx[k]) and math.isnan(my[k])))}
        assert not differ, f"{x.dataset}: {differ}"
        assert [r["completion"] for r in x.table_rows] == [r["completion"] for r in y.table_rows]


def _versions(fleet: Any) -> list[str]:
    return [httpx.get(f"{s.url}/weight_info", timeout=30).json()["weight_version"] for s in fleet.servers]


@pytest.fixture(scope="module")
def reference(fleet: Any) -> list[Any]:
    """The round at step 0 through both servers; the routes of each of its calls in `fleet.calls`."""
    cfg, module = _module(fleet)
    inner, fleet.calls = module.engine_evaluate_fn.fleet.complete_all, []

    def complete_all(bodies: Any, routes: Any, timeout_s: float) -> Any:
        fleet.calls.append([(body["prompt"], route % 2) for body, route in zip(bodies, routes, strict=True)])
        return inner(bodies, routes, timeout_s)

    module.engine_evaluate_fn.fleet.complete_all = complete_all
    try:
        return _round(cfg, module)
    finally:
        module.engine_evaluate_fn.close()


@pytest.mark.process
@pytest.mark.slow
def test_two_servers_one_server_and_the_in_process_engine_give_the_same_round(fleet: Any, reference: list[Any]) -> None:
    sampled = next(r for r in reference if r.dataset == "sampled")
    assert sampled.metrics[WEIGHTS_STEP_KEY] == 0 and sampled.metrics[FAILED_KEY] == 0
    assert not math.isnan(sampled.metrics["completion/logprob"])  # the servers' log-probabilities
    assert math.isnan(sampled.metrics["completion/entropy"])  # servers give none: null, not made up
    assert len(set(_versions(fleet))) == 1 and _versions(fleet)[0].startswith("step-000000000-")
    assert {r.notes[VERSION_NOTE] for r in reference} == {_versions(fleet)[0]}  # what the records say
    # Each call's prompts are dealt evenly: each server gets as many requests as the other, give or
    # take one prompt's, and a prompt's requests go to one server (its prefix cache).
    for call in fleet.calls:
        per_server = Counter(server for _, server in call)
        assert abs(per_server[0] - per_server[1]) <= max(Counter(tuple(p) for p, _ in call).values()), call
        assert all(len({server for p, server in call if p == prompt}) == 1 for prompt, _ in call)
    cfg, one = _module(fleet, urls=[fleet.servers[1].url])
    try:
        assert_same_results(reference, _round(cfg, one))
    finally:
        one.engine_evaluate_fn.close()
    cfg, in_process = _module(fleet, engine="vllm")
    try:
        assert_same_results(reference, _round(cfg, in_process))
    finally:
        in_process.engine_evaluate_fn.close()


@pytest.mark.process
@pytest.mark.slow
def test_new_weights_between_rounds_reach_every_server(fleet: Any, reference: list[Any]) -> None:
    from transformers import AutoModelForCausalLM

    cfg, module = _module(fleet)
    other = AutoModelForCausalLM.from_pretrained(fleet.other, dtype=torch.float32)
    try:
        module.policy.model.load_state_dict(other.state_dict())
        after = _round(cfg, module, step=1)
        versions = _versions(fleet)
        assert len(set(versions)) == 1 and versions[0].startswith("step-000000001-")
        assert all(r.metrics[WEIGHTS_STEP_KEY] == 1 for r in after)
        greedy = next(r for r in after if r.dataset == "greedy")
        before = next(r for r in reference if r.dataset == "greedy")
        assert [r["completion"] for r in greedy.table_rows] != [r["completion"] for r in before.table_rows]
    finally:
        module.engine_evaluate_fn.close()
    cfg, in_process = _module(fleet, engine="vllm")
    try:
        in_process.policy.model.load_state_dict(other.state_dict())
        assert_same_results(after, _round(cfg, in_process, step=1))
    finally:
        in_process.engine_evaluate_fn.close()


def _round_on_rank(rank: int, world_size: int, overrides: list[str]) -> list[Any]:
    from areal_lightning.app.builders import build_module
    from areal_lightning.app.config import load_config

    torch.set_num_threads(1)
    cfg = load_config(None, overrides)
    module = build_module(cfg)
    try:
        return _round(cfg, module)
    finally:
        module.engine_evaluate_fn.close()


@pytest.mark.ddp
@pytest.mark.slow
def test_two_ranks_through_the_servers_give_the_one_rank_round(fleet: Any, reference: list[Any]) -> None:
    # Rank 0 publishes and loads the weights, rank 1 waits until the servers report them; each
    # rank sends its own deal (6 prompts: 3 and 3, in batches of 2).
    overrides = _overrides(fleet, "server", [s.url for s in fleet.servers])
    ranks = run_ddp(_round_on_rank, 2, overrides, timeout_s=900)
    assert_same_results(reference, ranks[0])
    for zero, one in zip(*ranks, strict=True):  # the same reduced round on both, server counters included
        assert zero.metrics.keys() == one.metrics.keys()
        assert all(
            v == one.metrics[k] or (math.isnan(v) and math.isnan(one.metrics[k])) for k, v in zero.metrics.items()
        )
    assert [r.num_samples for r in ranks[0]] == [r.num_samples for r in reference]


def _kill_mid_round(module: Any, victim: Server) -> threading.Timer:
    """Arms the round: as it sends its first completions, `victim` is paused (its requests wait,
    unanswered), and killed a moment later, while they wait: mid-round on any machine, however fast."""
    fleet = module.engine_evaluate_fn.fleet
    inner, timer = fleet.complete_all, threading.Timer(KILL_AFTER_S, victim.kill)

    def complete_all(bodies: Any, routes: Any, timeout_s: float) -> Any:
        if not timer.is_alive() and victim.running:
            victim.pause()
            timer.start()
        return inner(bodies, routes, timeout_s)

    fleet.complete_all = complete_all
    return timer


KILL_AFTER_S = 2.0


@pytest.mark.process
@pytest.mark.slow
def test_a_server_killed_mid_round_leaves_the_results_unchanged(fleet: Any, reference: list[Any]) -> None:
    victim = fleet.victim
    if victim is None:
        pytest.skip(f"the reused servers ({REUSE_ENV}) name no third server for this test to kill")
    cfg, module = _module(fleet, urls=[fleet.servers[0].url, victim.url])
    killer = _kill_mid_round(module, victim)
    try:
        results = _round(cfg, module)
    finally:
        if killer.is_alive():
            killer.join()
        module.engine_evaluate_fn.close()
    assert not victim.running, "the server was not killed during the round"
    assert_same_results(reference, results)
    assert sum(r.metrics[FAILOVERS_KEY] for r in results) > 0
    assert sum(r.metrics[FAILED_KEY] for r in results) > 0
    # Every completion counted once: as many samples as without the kill (3 and 4 per prompt).
    assert [r.num_samples for r in results] == [r.num_samples for r in reference] == [PROMPTS * 3, PROMPTS * 4]


@pytest.mark.process
@pytest.mark.slow
def test_a_server_restarted_with_other_weights_is_caught(fleet: Any, reference: list[Any]) -> None:
    from areal_lightning.eval_round import EvalRoundError

    restarted = fleet.servers[1]
    if fleet.reused:  # what a restart from other weights leaves: other weights under another version
        _hold(restarted, fleet.other, "restarted")
    else:
        restarted.kill()
        restarted.model = fleet.other
        restarted.start().wait_ready()
    cfg, module = _module(fleet)
    try:
        # It holds other weights under vLLM's starting version: the round loads its own first.
        assert _versions(fleet)[1] != _versions(fleet)[0]
        assert_same_results(reference, _round(cfg, module))
        # Other weights under the round's own version: the checksums tell them apart.
        _hold(restarted, fleet.other, _versions(fleet)[0])
        with pytest.raises(EvalRoundError, match="different weights") as caught:
            _round(cfg, module)
        assert isinstance(caught.value.__cause__, VersionError) or "VersionError" in str(caught.value)
    finally:
        module.engine_evaluate_fn.close()
        with contextlib.suppress(httpx.HTTPError):  # a reused server's next round loads its weights again
            httpx.post(f"{restarted.url}/update_weight_version", json={"new_version": "stale"}, timeout=30)


def _hold(server: Server, weights: Any, version: str) -> None:
    """Makes `server` hold the weights in the directory `weights` under the tag `version`."""
    httpx.post(
        f"{server.url}/collective_rpc",
        json={"method": "reload_weights", "kwargs": {"weights_path": str(weights)}},
        timeout=300,
    ).raise_for_status()
    httpx.post(f"{server.url}/update_weight_version", json={"new_version": version}, timeout=30).raise_for_status()


EPISODES = ("episodes.env=retry", "episodes.max_turns=2", "episodes.feedback=No.")
"""A short feedback: the second turn fits the test servers' --max-model-len (256)."""


@pytest.mark.process
@pytest.mark.slow
def test_episodes_generate_every_turn_through_the_servers_alike_on_one_and_two_servers(fleet: Any) -> None:
    results = []
    for urls in ([s.url for s in fleet.servers], [fleet.servers[0].url]):
        cfg, module = _module(fleet, "server", urls, *EPISODES)
        try:
            results.append(_round(cfg, module))
        finally:
            module.engine_evaluate_fn.close()
    two, one = results
    assert_same_results(two, one)
    sampled = next(r for r in two if r.dataset == "sampled")
    assert sampled.metrics[WEIGHTS_STEP_KEY] == 0 and sampled.metrics[FAILED_KEY] == 0
    # Episodes' own metrics, from turns the servers wrote: a second turn after each wrong first one.
    assert {"success@1", "success@2", "turns/mean"} <= sampled.metrics.keys()
    assert sampled.metrics["success@1"] < 1 and 1 < sampled.metrics["turns/mean"] <= 2
    assert not math.isnan(sampled.metrics["turn2/completion/logprob"])  # the servers' log-probabilities
    # A second turn longer than the servers take is refused before it is sent, naming their limit.
    from areal_lightning.eval_round import EvalRoundError

    cfg, module = _module(fleet, "server", None, *EPISODES[:2], "episodes.feedback=" + "No, wrong. " * 30)
    try:
        with pytest.raises(EvalRoundError, match=r"turn 2 of an episode needs \d+ tokens .* more than the servers' "):
            _round(cfg, module)
    finally:
        module.engine_evaluate_fn.close()


def _fit(fleet: Any, mode: str) -> list[dict[str, Any]]:
    from areal_lightning.tracking.history import eval_rows, read_history

    run = fleet.tmp / f"fit-{mode}"
    overrides = _overrides(fleet, "server", [s.url for s in fleet.servers])
    overrides = [o for o in overrides if not o.startswith(("output_dir=", "eval_sets.greedy"))]
    config = fleet.tmp / "server_fit.yaml"
    config.write_text("experiment_name: server-fit\n")  # the rest from the overrides, as a user may
    proc = run_in_group(
        [
            sys.executable, "-m", "areal_lightning", "fit", "-c", str(config), *overrides, f"output_dir={run}",
            "policy.dtype=float32", "policy.attn_implementation=eager", "trainer.accelerator=cpu",
            "trainer.max_steps=3", "trainer.enable_progress_bar=false", "trainer.checkpoint_every_n_steps=null",
            "grpo.group_size=4", "grpo.prompts_per_step=2", "grpo.lr=1e-2", "grpo.max_new_tokens=6",
            "evaluator.freq_steps=2", "evaluator.freq_epochs=null", "evaluator.freq_secs=null",
            "evaluator.eval_before_train=true", f"evaluator.mode={mode}", "evaluator.on_busy=wait",
        ],
        timeout=1200,
        cwd=fleet.tmp,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return eval_rows(read_history(run))


@pytest.mark.process
@pytest.mark.slow
def test_an_async_fit_through_the_servers_records_the_sync_fits_rounds(fleet: Any) -> None:
    sync, asyn = _fit(fleet, "sync"), _fit(fleet, "async")
    assert [(r["step"], r["trigger"]) for r in asyn] == [(r["step"], r["trigger"]) for r in sync]
    assert [r["step"] for r in sync] == [0, 2, 3] and {r["mode"] for r in asyn} == {"async"}
    for a, b in zip(asyn, sync, strict=True):
        shared_a, shared_b = _shared(a["metrics"]), _shared(b["metrics"])
        assert shared_a == shared_b, a["step"]
        # One weight version a round, the snapshot's own step (training went on meanwhile), in the record.
        assert a["metrics"][WEIGHTS_STEP_KEY] == a["step"] == b["metrics"][WEIGHTS_STEP_KEY]
        assert a["notes"][VERSION_NOTE] == b["notes"][VERSION_NOTE]
        assert a["notes"][VERSION_NOTE].startswith(f"step-{a['step']:09d}-")
    logprobs = [r["metrics"]["completion/logprob"] for r in asyn]
    assert len(set(logprobs)) == 3  # each round's servers held that step's weights


@pytest.mark.process
@pytest.mark.slow
def test_a_harness_task_generates_through_the_servers_as_through_the_engine_and_the_policy(
    fleet: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("lm_eval")
    from test_harness import write_task

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    train = write_gsm8k(fleet.tmp / "harness_train.jsonl", 4, offset=PROMPTS)
    task = write_task(fleet.tmp, fleet.data, train, "tiny_gsm_servers", num_fewshot=0)  # greedy, 6 new tokens
    harness = "eval_sets={h: {harness: {task_file: " + str(task) + "}, batch_size: 3}}"
    urls = [s.url for s in fleet.servers]
    results = {}
    for name, engine, using in (("two", "server", urls), ("one", "server", urls[:1]), ("vllm", "vllm", urls)):
        cfg, module = _module(fleet, engine, using, harness)
        try:
            results[name] = [r for r in _round(cfg, module) if r.dataset == "h"]
        finally:
            module.engine_evaluate_fn.close()
    cfg, module = _module(fleet, "policy", urls, harness)
    results["policy"] = [r for r in _round(cfg, module) if r.dataset == "h"]
    assert_same_results(results["two"], results["one"])
    assert_same_results(results["two"], results["vllm"])
    (two,), (policy,) = results["two"], results["policy"]
    harness_metrics = {k: v for k, v in two.metrics.items() if "," in k}  # the task's own: exact_match,<filter>
    assert harness_metrics and harness_metrics == {k: policy.metrics[k] for k in harness_metrics}
    assert two.metrics[WEIGHTS_STEP_KEY] == 0 and two.num_prompts == PROMPTS
    assert [r["completion"] for r in two.table_rows] == [r["completion"] for r in policy.table_rows]


@pytest.mark.process
@pytest.mark.slow
def test_the_code_task_generates_through_the_servers_and_grades_in_the_sandbox_as_in_process(fleet: Any) -> None:
    from test_code_grpo import STATUSES, write_int_problems

    problems = write_int_problems(fleet.tmp / "ints.jsonl", PROMPTS)  # any int passes: some programs do
    code = (
        "task.name=code",
        f"task.path={problems}",
        "task.sandbox_wall_s=5",
        "eval_sets={ints: {path: " + str(problems) + ", n_samples: 4, max_new_tokens: 3, temperature: 1.0}}",
    )
    urls = [s.url for s in fleet.servers]
    results = {}
    for name, engine, using in (("two", "server", urls), ("one", "server", urls[:1]), ("vllm", "vllm", urls)):
        cfg, module = _module(fleet, engine, using, *code)
        try:
            results[name] = _round(cfg, module)
        finally:
            module.engine_evaluate_fn.close()
    assert_same_results(results["two"], results["one"])
    assert_same_results(results["two"], results["vllm"])
    (ints,) = results["two"]
    counts = {s: ints.metrics[f"code/{s}"] for s in STATUSES}
    assert sum(counts.values()) == ints.num_samples == 4 * PROMPTS  # every program graded once
    assert 0 < counts["passed"] < ints.num_samples  # some pass, some fail: the equality means something
    assert ints.metrics[WEIGHTS_STEP_KEY] == 0
