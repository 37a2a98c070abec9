"""The result cache without a Trainer: which changes make a different key (weights, their names,
dtypes and shapes, the eval set, settings, the evaluate function's code), and what a stored result
gives back (every field, NaN metrics), a miss for a missing or damaged file, no partial files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from areal_lightning.eval_round import EvalSet
from areal_lightning.eval_round.cache import ResultCache, cache_key, function_identity, result_key, weights_digest
from areal_lightning.eval_round.context import SetResult


def _linear(seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(3, 2)


def test_the_weights_digest_sees_every_value_name_dtype_shape_and_buffer() -> None:
    a = _linear()
    assert weights_digest(a) == weights_digest(_linear()) and len(weights_digest(a)) == 32
    changed = _linear()
    with torch.no_grad():
        changed.bias[1] += 1e-6
    assert weights_digest(changed) != weights_digest(a)

    class Renamed(nn.Module):
        def __init__(self, inner: nn.Linear) -> None:
            super().__init__()
            self.other = inner

    assert weights_digest(Renamed(_linear())) != weights_digest(nn.Sequential(_linear()))
    assert weights_digest(_linear().double()) != weights_digest(a)

    class Flat(nn.Module):
        def __init__(self, weight: torch.Tensor) -> None:
            super().__init__()
            self.weight = nn.Parameter(weight)

    w = torch.arange(6.0)
    assert weights_digest(Flat(w.reshape(2, 3))) != weights_digest(Flat(w.reshape(3, 2)))
    with_buffer = _linear()
    with_buffer.register_buffer("count", torch.zeros(0))
    assert weights_digest(with_buffer) != weights_digest(a)  # an empty buffer still counts by its name


def _evaluate(module: object, batches: object, ctx: object) -> dict[str, float]:
    return {"accuracy": 0.5}


def _evaluate_edited(module: object, batches: object, ctx: object) -> dict[str, float]:
    return {"accuracy": 0.75}


class Scorer:
    def score(self, module: object, batches: object, ctx: object) -> dict[str, float]:
        return {"accuracy": 1.0}


def test_the_function_identity_is_its_name_and_a_digest_of_its_code() -> None:
    identity = function_identity(_evaluate)
    assert identity.startswith("_evaluate:") and function_identity(_evaluate) == identity
    # Other code under another name, and other constants in the same shape of code, differ.
    assert function_identity(_evaluate_edited).split(":")[1] != identity.split(":")[1]
    assert function_identity(lambda m, b, c: {"a": 1.0}) != function_identity(lambda m, b, c: {"a": 2.0})
    assert function_identity(Scorer.score).startswith("Scorer.score:")


def test_a_key_is_the_same_for_the_same_parts_in_any_order_and_differs_otherwise() -> None:
    assert cache_key({"a": 1, "b": [1, 2]}) == cache_key({"b": [1, 2], "a": 1})
    assert cache_key({"a": 1}) != cache_key({"a": 1.5}) and cache_key({"a": 1}) != cache_key({"b": 1})
    assert len(cache_key({})) == 32
    easy, other = EvalSet("easy", [1, 2, 3]), EvalSet("easy", [1, 2, 4])
    key = result_key("w1", easy, seed=0, precision="32")
    assert key == result_key("w1", EvalSet("easy", [1, 2, 3]), precision="32", seed=0)
    assert (
        len({key, result_key("w2", easy, seed=0, precision="32"), result_key("w1", other, seed=0, precision="32")}) == 3
    )
    assert key != result_key("w1", easy, seed=1, precision="32") != result_key("w1", easy, seed=1, precision="bf16")


def test_a_stored_result_comes_back_whole_and_nan_stays_nan(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path / "eval_cache")
    result = SetResult("easy", {"accuracy": 0.5, "reward/std": math.nan}, 8, 2, 0.25, [{"prompt": "1+1", "ok": True}])
    cache.put("k1", result)
    back = cache.get("k1")
    assert back is not None
    assert (back.dataset, back.num_samples, back.num_prompts, back.eval_secs, back.table_rows) == (
        "easy",
        8,
        2,
        0.25,
        [{"prompt": "1+1", "ok": True}],
    )
    assert back.metrics["accuracy"] == 0.5 and math.isnan(back.metrics["reward/std"])
    assert sorted(p.name for p in (tmp_path / "eval_cache").iterdir()) == ["k1.json"]  # no partial file left
    cache.put("k1", SetResult("easy", {"accuracy": 0.75}, 8, 2, 0.5, []))
    assert cache.get("k1").metrics == {"accuracy": 0.75}  # type: ignore[union-attr]


def test_a_missing_or_damaged_entry_is_a_miss_not_an_error(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path)
    assert cache.get("nothing") is None
    (tmp_path / "torn.json").write_text('{"dataset": "easy", "metr')
    (tmp_path / "partial.json").write_text('{"dataset": "easy", "metrics": {}}')
    (tmp_path / "wrong.json").write_text(
        '{"dataset": "easy", "metrics": {"a": "x"}, "num_samples": 1,'
        ' "num_prompts": 1, "eval_secs": 0, "table_rows": []}'
    )
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "dir.json").mkdir()
    for key in ("torn", "partial", "wrong", "list", "dir"):
        assert cache.get(key) is None


class FirstScorer:
    def __call__(self, module: object, batches: object, ctx: object) -> dict[str, float]:
        return {"accuracy": 0.25}


class SecondScorer:
    def __call__(self, module: object, batches: object, ctx: object) -> dict[str, float]:
        return {"accuracy": 0.5}


def test_two_callable_classes_have_different_identities() -> None:
    first, second = function_identity(FirstScorer()), function_identity(SecondScorer())
    assert first != second
    assert first.startswith("FirstScorer") and second.startswith("SecondScorer")


def test_settings_that_are_not_json_still_make_a_key() -> None:
    from areal_lightning.eval_round.precision import EvalPrecision

    easy = EvalSet("easy", [1, 2])
    assert result_key("w", easy, precision=EvalPrecision.BF16) != result_key("w", easy, precision=EvalPrecision.FP16)
    assert result_key("w", easy, where=Path("a")) == result_key("w", easy, where=Path("a"))


def test_the_cache_directory_is_created_with_its_parents_and_holds_standard_json(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path / "run" / "nested" / "eval_cache")
    cache.put("k", SetResult("easy", {"accuracy": math.nan}, 1, 1, 0.5, [{"file": Path("x.txt")}]))
    text = (tmp_path / "run" / "nested" / "eval_cache" / "k.json").read_text()
    data = json.loads(text, parse_constant=lambda token: pytest.fail(f"not standard JSON: {token}"))
    assert data["metrics"] == {"accuracy": None} and data["table_rows"] == [{"file": "x.txt"}]
    back = cache.get("k")
    assert back is not None and math.isnan(back.metrics["accuracy"]) and back.table_rows == [{"file": "x.txt"}]
