"""The ``policy.server`` section refuses, at load time and naming the key, what could not reach a
server: no URL, a URL that is not http(s), a URL listed twice, no served model name, no snapshot
directory, an unknown server kind, the server engine with the tiny policy; episodes go through the
servers, and are refused for the in-process vLLM engine (single turns only)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_models import save_tiny_llama

from areal_lightning.app.config import ConfigError, load_config
from areal_lightning.rl.engines.server.options import ServerKind

URL = "http://127.0.0.1:8000"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("m") / "model")


def _load(model: Path, *extra: str) -> object:
    base = ["eval_sets.easy.size=5", "policy.kind=hf", f"policy.path={model}", "policy.eval_engine=server"]
    return load_config(None, [*base, *extra])


GOOD = (f"policy.server.urls=[{URL}]", "policy.server.model=tiny", "policy.server.snapshot_dir=/tmp/snapshots")


def test_a_complete_section_builds_its_options(model: Path) -> None:
    cfg = _load(model, *GOOD, "policy.server.kind=sglang", "policy.server.max_in_flight=4")
    options = cfg.policy.server.build()  # type: ignore[attr-defined]
    assert options.urls == (URL,) and options.kind is ServerKind.SGLANG and options.max_in_flight == 4


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ((), r"policy.server.urls must be a non-empty list of http:// or https:// base URLs, got \[\]"),
        (("policy.server.urls=[ftp://x]",), r"policy.server.urls must be http://host:port .*, got 'ftp://x'"),
        ((f"policy.server.urls=[{URL},{URL}]",), r"policy.server.urls must be distinct URLs"),
        ((f"policy.server.urls=[{URL}]",), r"policy.server.model must be the served model name"),
        ((f"policy.server.urls=[{URL}]", "policy.server.model=m"), r"policy.server.snapshot_dir must be a directory"),
        ((*GOOD, "policy.server.kind=tgi"), r"policy.server.kind must be one of vllm, sglang"),
        ((*GOOD, "policy.server.retries=-1"), r"policy.server.retries must be an integer >= 0, got -1"),
        ((*GOOD, "policy.server.max_in_flight=0"), r"policy.server.max_in_flight must be a positive integer"),
    ],
)
def test_what_cannot_reach_a_server_is_refused_naming_the_key(
    model: Path, extra: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(model, *extra)


def test_the_server_engine_needs_an_hf_policy() -> None:
    with pytest.raises(ConfigError, match=r"policy.eval_engine: server needs policy.kind: hf"):
        load_config(None, ["eval_sets.easy.size=5", "policy.eval_engine=server", *GOOD])


def test_episodes_run_through_the_servers_and_not_through_the_in_process_vllm_engine(model: Path) -> None:
    data = model.parent / "test.jsonl"
    data.write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    episodes = ("task.name=math", f"task.path={data}", f"eval_sets.easy.path={data}", "eval_sets.easy.size=null")
    episodes += ("episodes.env=retry", "episodes.max_turns=2")
    cfg = _load(model, *GOOD, *episodes)
    assert cfg.episodes.max_turns == 2  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"episodes need policy.eval_engine: policy or server .* got vllm"):
        _load(model, *episodes, "policy.eval_engine=vllm")


def test_evaluate_and_the_watcher_evaluate_with_the_configured_engine(model: Path) -> None:
    from areal_lightning.app.builders import build_module
    from areal_lightning.app.evaluate import default_evaluate_fn
    from areal_lightning.rl.engines.server.evaluator import ServerEvaluator

    module = build_module(_load(model, *GOOD))  # what `evaluate --ckpt` and `--watch` evaluate with
    assert isinstance(default_evaluate_fn(module), ServerEvaluator)
    assert default_evaluate_fn(module) is module.engine_evaluate_fn
