"""lm-evaluation-harness tasks as eval sets: equal to `lm_eval.simple_evaluate` with the harness's own
HF backend (greedy, metric by metric), identical on 1 and 2 ranks, refused before work when the task
or its data is missing. Everything is local: a task YAML over a JSON file made here, a tiny Llama
built from a config; the hub and datasets are offline."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from tests.ddp_utils import run_ddp
from tests.hf_models import save_tiny_llama, write_gsm8k

TASK = "tiny_gsm"
TASK_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files: {{test: {data}, train: {data}}}
  cache_dir: {cache}
output_type: generate_until
test_split: test
fewshot_split: train
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer.split('####')[-1].strip()}}}}"
generation_kwargs: {{until: ["\\n\\n", "Question:"], do_sample: false, max_gen_toks: 6}}
metric_list:
  - {{metric: exact_match, aggregation: mean, higher_is_better: true}}
filter_list:
  - name: strict-match
    filter: [{{function: regex, regex_pattern: "#### (\\\\-?[0-9\\\\.\\\\,]+)"}}, {{function: take_first}}]
  - name: flexible-extract
    filter: [{{function: regex, group_select: -1, regex_pattern: "(-?[0-9]+)"}}, {{function: take_first}}]
num_fewshot: 1
"""


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def write_task(root: Path, data: Path, task: str = TASK) -> Path:
    path = root / f"{task}.yaml"
    path.write_text(TASK_YAML.format(task=task, data=data, cache=root / "hf_cache"))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("harness")
    model = save_tiny_llama(root / "model", digit_bias=3.0, max_positions=512)
    data = write_gsm8k(root / "problems.jsonl", 10)
    return {"model": model, "data": data, "task": write_task(root, data), "root": root}


def config_overrides(files, **harness) -> list[str]:
    spec = {"task_file": str(files["task"]), **harness}
    return [
        "policy.kind=hf",
        f"policy.path={files['model']}",
        "task.name=math",
        f"task.path={files['data']}",
        "eval_sets={h: {harness: " + json.dumps(spec) + ", batch_size: 3}}",
    ]


def evaluate_config(overrides: list[str]) -> dict[str, float]:
    from areal_lightning.app.builders import build_eval_sets, build_module
    from areal_lightning.app.config import load_config
    from areal_lightning.eval_round import run_round

    cfg = load_config(None, overrides)
    module = build_module(cfg)
    (result,) = run_round(module, build_eval_sets(cfg), _evaluate, seed=cfg.seed, global_step=0, epoch=0)
    return {**result.metrics, "num_prompts": result.num_prompts}


def _evaluate(module, batches, ctx):
    return module.evaluate(batches, ctx)


def _on_rank(rank: int, world_size: int, overrides: list[str]) -> dict[str, float]:
    return evaluate_config(overrides)


def harness_results(files) -> dict[str, float]:
    import transformers
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    model = transformers.AutoModelForCausalLM.from_pretrained(files["model"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(files["model"])
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=1, device="cpu")
    out = simple_evaluate(model=lm, tasks=[str(files["task"])], task_manager=TaskManager(include_defaults=False))
    return {k: v for k, v in out["results"][TASK].items() if "," in k}


def test_greedy_results_equal_simple_evaluate_metric_by_metric(files):
    ours = evaluate_config(config_overrides(files))
    theirs = harness_results(files)
    assert sorted(theirs) == sorted(k for k in ours if "," in k and not k.startswith("pass@"))
    for key, value in theirs.items():
        assert ours[key] == value, key  # to the last digit
    assert ours["num_prompts"] == 10
    assert ours["completion/length/mean"] > 0
    assert set(theirs) >= {"exact_match,flexible-extract", "exact_match_stderr,strict-match"}


@pytest.mark.ddp
def test_one_and_two_ranks_identical(files):
    overrides = config_overrides(files)
    (one,) = run_ddp(_on_rank, 1, overrides)
    two = run_ddp(_on_rank, 2, overrides)
    assert two[0] == two[1] == one
    assert not math.isnan(one["exact_match_stderr,flexible-extract"])


def test_missing_task_file_refused_at_load(files):
    from areal_lightning.app.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"eval_sets\.h\.harness: task file '.*nope\.yaml' does not exist"):
        load_config(None, config_overrides(files, task_file=str(files["root"] / "nope.yaml")))


def test_uncached_dataset_refused_at_load(files, tmp_path):
    from areal_lightning.app.config import ConfigError, load_config

    task = write_task(tmp_path, tmp_path / "absent.jsonl", task="absent_data")
    with pytest.raises(ConfigError, match=r"eval_sets\.h\.harness: task file .* its dataset is not in the local cache"):
        load_config(None, config_overrides(files, task_file=str(task)))
    hub = tmp_path / "hub.yaml"
    hub.write_text(task.read_text().replace("dataset_path: json", "dataset_path: someone/not-cached-anywhere"))
    with pytest.raises(ConfigError, match=r"its dataset is not in the local cache .*OfflineModeIsEnabled"):
        load_config(None, config_overrides(files, task_file=str(hub)))


def test_task_not_in_file_and_tiny_policy_refused(files):
    from areal_lightning.app.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"has no task 'gsm8k'; it has \['tiny_gsm'\]"):
        load_config(None, config_overrides(files, task="gsm8k"))
    tiny = [o for o in config_overrides(files) if o.startswith("eval_sets")]
    with pytest.raises(ConfigError, match=r"eval_sets\.h\.harness needs policy\.kind: hf"):
        load_config(None, tiny)


def test_integrity_targets_graded_correct_by_the_task(files):
    from areal_lightning.app.builders import build_eval_sets, build_module
    from areal_lightning.app.config import load_config

    cfg = load_config(None, config_overrides(files))
    module = build_module(cfg)
    docs = build_eval_sets(cfg)[0].samples
    references = [module.integrity_reference(d) for d in docs]
    assert references[0] == json.loads(files["data"].read_text().splitlines()[0])["answer"].split("####")[-1].strip()
    assert all(module.integrity_grade(references, docs))
    assert not any(module.integrity_grade(["no number here"] * len(docs), docs))
