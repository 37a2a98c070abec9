"""lm-evaluation-harness tasks as eval sets: equal to `lm_eval.simple_evaluate` with the harness's own
HF backend (greedy, metric by metric and document by document), identical on 1 and 2 ranks, refused
before work when the task or its data is missing. Everything is local: task YAMLs over JSON files made
here, a tiny Llama built from a config; the hub and datasets are offline.

The equality is made to mean something: the harness's HF backend first answers each document once (a
probe), then the documents' targets are written from those answers so that some documents, not all,
are right under each filter; a wrong prompt, decode, stop string or filter on our side changes a
document's completion or score, which the per-document comparison names."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lm_eval")

from tests.ddp_utils import run_ddp
from tests.hf_models import PROBLEMS, save_tiny_llama, write_gsm8k

# lm-eval's dataset loading starts processes (datasets' workers): make test-fast leaves these out.
pytestmark = pytest.mark.process

GEN_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files: {{test: {test}, train: {train}}}
  cache_dir: {cache}
output_type: generate_until
test_split: test
fewshot_split: train
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer.split('####')[-1].strip()}}}}"
generation_kwargs: {{until: ["\\n\\n", "Question:", "77"], do_sample: false, max_gen_toks: 6}}
metric_list:
  - {{metric: exact_match, aggregation: mean, higher_is_better: true}}
filter_list:
  - name: first-digit
    filter: [{{function: regex, regex_pattern: "([0-9])"}}, {{function: take_first}}]
  - name: last-number
    filter: [{{function: regex, group_select: -1, regex_pattern: "(-?[0-9]+)"}}, {{function: take_first}}]
num_fewshot: {num_fewshot}
"""
MC_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files: {{test: {test}, train: {train}}}
  cache_dir: {cache}
output_type: multiple_choice
test_split: test
fewshot_split: train
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - {{metric: acc, aggregation: mean, higher_is_better: true}}
  - {{metric: acc_norm, aggregation: mean, higher_is_better: true}}
num_fewshot: {num_fewshot}
"""
N_DOCS = 10
WRONG = "-1"  # a target no filter extracts from these completions


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def write_task(root: Path, test: Path, train: Path, task: str, num_fewshot: int = 1, template: str = GEN_YAML) -> Path:
    path = root / f"{task}.yaml"
    cache = root / "hf_cache"
    path.write_text(template.format(task=task, test=test, train=train, cache=cache, num_fewshot=num_fewshot))
    return path


def harness_run(model_dir: Path, task_file: Path) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """`simple_evaluate` with the harness's HF backend (batch 1: no padding): its metrics and samples."""
    import transformers
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=1, device="cpu")
    out = simple_evaluate(
        model=lm, tasks=[str(task_file)], task_manager=TaskManager(include_defaults=False), log_samples=True
    )
    ((name, results),) = out["results"].items()
    return {k: v for k, v in results.items() if "," in k}, out["samples"][name]


def _by_filter(samples: list[dict[str, Any]], filter_name: str) -> dict[int, dict[str, Any]]:
    return {s["doc_id"]: s for s in samples if s["filter"] == filter_name}


def gen_task(root: Path, model: Path, train: Path, num_fewshot: int) -> Path:
    """A generative task whose targets are the probe's greedy answers for some documents: even
    documents right under last-number, every fourth from 1 right under first-digit, the rest wrong."""
    probe_data = write_gsm8k(root / f"probe{num_fewshot}.jsonl", N_DOCS)
    _, samples = harness_run(model, write_task(root, probe_data, train, f"probe{num_fewshot}", num_fewshot))
    last, first = _by_filter(samples, "last-number"), _by_filter(samples, "first-digit")
    rows = [json.loads(line) for line in probe_data.read_text().splitlines()]
    for i, row in enumerate(rows):
        answer = last[i]["filtered_resps"][0] if i % 2 == 0 else first[i]["filtered_resps"][0] if i % 4 == 1 else WRONG
        row["answer"] = f"{row['answer'].split('####')[0]}#### {WRONG if answer == '[invalid]' else answer}"
    data = root / f"gen{num_fewshot}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return write_task(root, data, train, f"gen{num_fewshot}", num_fewshot)


def probed_gen_task(files, num_fewshot: int) -> Path:
    """`gen_task` once per module (the probe costs a harness run)."""
    key = f"gen{num_fewshot}"
    if key not in files:
        files[key] = gen_task(files["root"], files["model"], files["train"], num_fewshot)
    return files[key]


def write_choices(path: Path, n: int, labels: list[int] | None = None, offset: int = 0) -> Path:
    rows = []
    for i in range(offset, offset + n):
        a, b = PROBLEMS[i % len(PROBLEMS)]
        choices = [str(a + b), f"{a + b + 1} apples", "seven", "I do not know"]
        label = labels[i - offset] if labels is not None else 0
        question = f"Tom has {a} apples and buys {b} more. How many?"
        rows.append({"question": question, "choices": choices, "label": label})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def mc_task(root: Path, model: Path, num_fewshot: int) -> Path:
    """A multiple-choice task whose gold labels are the probe's choice for even documents and its
    length-normalised choice for every fourth from 1, another choice for the rest."""
    train = write_choices(root / "mc_train.jsonl", N_DOCS, offset=N_DOCS)
    probe = write_choices(root / f"mc_probe{num_fewshot}.jsonl", N_DOCS)
    _, samples = harness_run(model, write_task(root, probe, train, f"mc_probe{num_fewshot}", num_fewshot, MC_YAML))
    labels = []
    for i, sample in sorted((s["doc_id"], s) for s in samples):
        lls = [r[0][0] for r in sample["resps"]]
        lengths = [len(c) for c in sample["doc"]["choices"]]
        pick = max(range(len(lls)), key=lambda c: lls[c])
        pick_norm = max(range(len(lls)), key=lambda c: lls[c] / lengths[c])
        labels.append(pick if i % 2 == 0 else pick_norm if i % 4 == 1 else (pick + 1) % len(lls))
    data = write_choices(root / f"mc{num_fewshot}.jsonl", N_DOCS, labels)
    return write_task(root, data, train, f"mc{num_fewshot}", num_fewshot, MC_YAML)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("harness")
    model = save_tiny_llama(root / "model", digit_bias=3.0, max_positions=512)
    data = write_gsm8k(root / "problems.jsonl", N_DOCS)
    train = write_gsm8k(root / "train.jsonl", N_DOCS, offset=N_DOCS)
    task = write_task(root, data, train, "tiny_gsm")
    return {"model": model, "data": data, "train": train, "task": task, "root": root}


def config_overrides(files, task_file: Path | None = None, **harness) -> list[str]:
    spec = {"task_file": str(task_file or files["task"]), **harness}
    return [
        "policy.kind=hf",
        f"policy.path={files['model']}",
        "task.name=math",
        f"task.path={files['data']}",
        "eval_sets={h: {harness: " + json.dumps(spec) + ", batch_size: 3}}",
    ]


def evaluate_config(overrides: list[str]) -> dict[str, Any]:
    from areal_lightning.app.builders import build_eval_sets, build_module
    from areal_lightning.app.config import load_config
    from areal_lightning.eval_round import run_round

    cfg = load_config(None, overrides)
    module = build_module(cfg)
    (result,) = run_round(
        module, build_eval_sets(cfg), _evaluate, seed=cfg.seed, global_step=0, epoch=0, max_table_rows=N_DOCS
    )
    rows = {r["index"]: r for r in result.table_rows}
    outcomes = {name: dict(o) for name, o in result.outcomes.items()}
    return {**result.metrics, "num_prompts": result.num_prompts, "rows": rows, "outcomes": outcomes}


def _evaluate(module, batches, ctx):
    return module.evaluate(batches, ctx)


def _on_rank(rank: int, world_size: int, overrides: list[str]) -> dict[str, float]:
    out = evaluate_config(overrides)
    return {k: v for k, v in out.items() if k not in ("rows", "outcomes")}


def assert_equal_to_harness(files, task_file: Path) -> dict[str, Any]:
    """Ours and `simple_evaluate`'s metrics `==`, each strictly between 0 and 1, and each document's
    score under each filter the same; returns ours and the harness's samples."""
    ours = evaluate_config(config_overrides(files, task_file))
    theirs, samples = harness_run(files["model"], task_file)
    assert sorted(theirs) == sorted(k for k in ours if "," in k and not k.startswith("pass@"))
    for key, value in theirs.items():
        assert ours[key] == value, key  # to the last digit
        if "_stderr" not in key:
            assert 0 < value < 1, f"{key}={value}: the test's targets should make some documents right, not all"
    assert ours["num_prompts"] == N_DOCS
    for s in samples:
        for metric in s["metrics"]:
            assert ours["outcomes"][f"{metric},{s['filter']}"][s["doc_id"]] == s[metric], (s["doc_id"], metric)
    return {"ours": ours, "samples": samples}


@pytest.mark.parametrize("num_fewshot", [0, 1])
def test_greedy_results_equal_simple_evaluate_metric_by_metric(files, num_fewshot):
    out = assert_equal_to_harness(files, probed_gen_task(files, num_fewshot))
    rows = out["ours"]["rows"]
    for s in out["samples"]:  # the completion itself, cut at the task's stop strings as HFLM cuts it
        assert rows[s["doc_id"]]["completion"] == s["resps"][0][0], s["doc_id"]
    assert out["ours"]["completion/length/mean"] > 0
    # The completions that hit the stop string "77" end there during generation, not only when decoded.
    assert out["ours"]["completion/truncated"] < 1


@pytest.mark.parametrize("num_fewshot", [0, 1])
def test_multiple_choice_equals_simple_evaluate(files, num_fewshot):
    task_file = mc_task(files["root"], files["model"], num_fewshot)
    out = assert_equal_to_harness(files, task_file)
    assert {"acc,none", "acc_norm,none", "acc_stderr,none"} <= set(out["ours"])
    assert not any(k.startswith("completion/") for k in out["ours"])  # nothing is generated
    for s in out["samples"]:  # each choice's log-probability (float32 sums; our batches are padded, HFLM's not)
        theirs = [r[0][0] for r in s["resps"]]
        assert out["ours"]["rows"][s["doc_id"]]["choice_logprobs"] == pytest.approx(theirs, rel=1e-5), s["doc_id"]


def test_multiple_choice_refused_for_vllm_engine(files):
    from areal_lightning.app.config import ConfigError, load_config

    data = write_choices(files["root"] / "mc_any.jsonl", 4)
    task = write_task(files["root"], data, data, "mc_any", 0, MC_YAML)
    message = r"eval_sets\.h\.harness is a multiple-choice task: .* policy\.eval_engine: vllm does not give"
    with pytest.raises(ConfigError, match=message):
        load_config(None, [*config_overrides(files, task), "policy.eval_engine=vllm"])


@pytest.mark.ddp
def test_one_and_two_ranks_identical(files):
    overrides = config_overrides(files)
    (one,) = run_ddp(_on_rank, 1, overrides)
    two = run_ddp(_on_rank, 2, overrides)
    assert two[0] == two[1] == one
    assert not math.isnan(one["exact_match_stderr,last-number"])


def test_missing_task_file_refused_at_load(files):
    from areal_lightning.app.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"eval_sets\.h\.harness: task file '.*nope\.yaml' does not exist"):
        load_config(None, config_overrides(files, files["root"] / "nope.yaml"))


def test_uncached_dataset_refused_at_load(files, tmp_path):
    from areal_lightning.app.config import ConfigError, load_config

    task = write_task(tmp_path, tmp_path / "absent.jsonl", tmp_path / "absent.jsonl", "absent_data")
    with pytest.raises(ConfigError, match=r"eval_sets\.h\.harness: task file .* its dataset is not in the local cache"):
        load_config(None, config_overrides(files, task))
    hub = tmp_path / "hub.yaml"
    hub.write_text(task.read_text().replace("dataset_path: json", "dataset_path: someone/not-cached-anywhere"))
    with pytest.raises(ConfigError, match=r"its dataset is not in the local cache .*OfflineModeIsEnabled"):
        load_config(None, config_overrides(files, hub))


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


def test_integrity_of_a_multiple_choice_task(files):
    from areal_lightning.app.builders import build_eval_sets, build_module
    from areal_lightning.app.config import load_config

    labels = [0, 1, 2, 3]
    data = write_choices(files["root"] / "mc_integrity.jsonl", 4, labels)
    cfg = load_config(None, config_overrides(files, write_task(files["root"], data, data, "mc_integrity", 0, MC_YAML)))
    module = build_module(cfg)
    docs = build_eval_sets(cfg)[0].samples
    references = [module.integrity_reference(d) for d in docs]
    assert references == [d.doc["choices"][label] for d, label in zip(docs, labels, strict=True)]
    assert all(module.integrity_grade(references, docs))
    wrong = [d.doc["choices"][(label + 1) % 4] for d, label in zip(docs, labels, strict=True)]
    assert not any(module.integrity_grade(wrong, docs))


def sampled_task(root: Path, data: Path, train: Path, name: str, temperature: float) -> Path:
    """The generative task, each document sampled 4 times (`repeats: 4`) at `temperature`."""
    path = write_task(root, data, train, name, 0)
    text = path.read_text().replace("do_sample: false", f"do_sample: true, temperature: {temperature}")
    path.write_text(text + "repeats: 4\n")
    return path


def test_pass_at_k_of_a_task_that_samples_each_document_several_times(files):
    from areal_lightning.rl.harness import HarnessSpec
    from areal_lightning.rl.harness.evaluation import logged_names

    probed = probed_gen_task(files, 0)  # targets some of whose greedy answers are right
    root, data, train = files["root"], probed.with_suffix(".jsonl"), files["train"]
    # Near-greedy sampling: the 4 repeats of a document are its greedy completion, so pass@1 and
    # pass@4 are the greedy exact match under each filter (the task's metric scores the first repeat).
    near_greedy = sampled_task(root, data, train, "sampled_cold", 1e-4)
    cold = evaluate_config(config_overrides(files, near_greedy))
    for f in ("first-digit", "last-number"):
        assert cold[f"pass@1,{f}"] == cold[f"pass@4,{f}"] == cold[f"exact_match,{f}"], f
        assert 0 < cold[f"pass@1,{f}"] < 1, f
    hot_task = sampled_task(root, data, train, "sampled_hot", 1.0)
    hot = evaluate_config(config_overrides(files, hot_task))
    assert sorted(k for k in hot if k not in ("num_prompts", "rows", "outcomes")) == logged_names(
        HarnessSpec(task_file=str(hot_task))
    )
    for f in ("first-digit", "last-number"):
        assert hot[f"pass@1,{f}"] <= hot[f"pass@4,{f}"] <= 1, f
    assert hot["pass@4,first-digit"] > hot["pass@1,first-digit"]  # the samples differ: more tries find more
    again = evaluate_config(config_overrides(files, hot_task))
    assert {k: again[k] for k in hot if k.startswith("pass@")} == {k: hot[k] for k in hot if k.startswith("pass@")}
