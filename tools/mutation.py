"""Mutation testing of the plugin's core modules with mutmut, one module at a time.

Each module is mutated in its own scratch copy of the checkout (``build/mutation/<name>/``) and
its mutants run only against that module's own fast tests (``MODULES`` below), so a run never
takes the whole suite. A surviving mutant is either killed by a new test or listed as equivalent
in the table "Equivalent mutants" of ``docs/development.md`` (module, function, the change, why);
this script reads that table and counts the listed survivors as equivalent.

Usage (from the repository root, in the project's environment)::

    python tools/mutation.py                    # every module, report in build/mutation/report.md
    python tools/mutation.py trigger exact      # only these modules (names as in MODULES)
    python tools/mutation.py --list             # the modules and their tests

Exit status 0 when every mutant is killed or listed as equivalent, 1 otherwise (the survivors
and a line to paste into the table for each are in the report), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = ROOT / "build" / "mutation"
DOCS = ROOT / "docs" / "development.md"
RUN_FILE = "run.json"  # in each module's scratch copy: the tests it ran against and how long it took
RETEST_FILE = "retest.json"  # survivors run again against the current tests (`--retest`)
VERIFY_FILE = "verify.json"  # kills run again in a fresh process (`--verify`)
RETEST_TIMEOUT_S = 120
COMMAND_TESTS_TIMEOUT_S = 1800  # `SUBPROCESS_TESTS`: a few commands on a busy box; each ends a hang itself

# Module -> its own fast tests (files or node ids): what runs against each of its mutants.
# Tests that fit a Trainer (seconds each) are left out where the module's logic has tests without
# one; multi-process (`ddp`) and `slow` tests are deselected for every module (see PYTEST_ARGS).
MODULES: dict[str, tuple[str, list[str]]] = {
    # the pure core
    "trigger": ("areal_lightning/callbacks/trigger.py", ["tests/test_trigger.py", "tests/test_trigger_messages.py"]),
    "sharding": (
        "areal_lightning/eval_round/sharding.py",
        [
            "tests/test_sharding.py",
            "tests/test_sharding_messages.py",
            "tests/test_sample_seeds_stable.py",
            "tests/test_sharding_options.py",
        ],
    ),
    "subsample": (
        "areal_lightning/eval_round/subsample.py",
        [
            "tests/test_subsample.py::test_allocation_is_proportional_with_one_per_stratum",
            "tests/test_subsample.py::test_fewer_places_than_strata_go_to_the_largest_strata",
            "tests/test_subsample.py::test_subset_is_stable_and_its_seed_matters",
            "tests/test_subsample.py::test_arithmetic_eval_set_keeps_the_share_of_two_digit_sums",
            "tests/test_subsample.py::test_config_needs_exactly_one_size",
            "tests/test_subsample_rules.py",
        ],
    ),
    "functional": (
        "areal_lightning/metrics/functional.py",
        [
            "tests/test_metrics_functional.py",
            "tests/test_metrics_functional_edges.py",
            # the NaN strategies are the metric classes' arguments
            "tests/test_metrics_classes.py::test_reward_metric_nan_strategies",
            "tests/test_metrics_classes.py::test_reward_metric_rejects_unknown_nan_strategy",
            "tests/test_metrics_classes.py::test_accuracy_metric_nan_strategy_and_empty",
        ],
    ),
    "intervals": (
        "areal_lightning/metrics/intervals.py",
        ["tests/test_metrics_functional.py", "tests/test_metrics_functional_edges.py", "tests/test_metrics_classes.py"],
    ),
    "exact": (
        "areal_lightning/metrics/exact.py",
        ["tests/test_exact_sums.py", "tests/test_exact_sums_edges.py", "tests/test_exact_sums_device.py"],
    ),
    "paired": (
        "areal_lightning/metrics/paired.py",
        [
            "tests/test_paired_change.py::test_t_quantile_matches_scipy",
            "tests/test_paired_change.py::test_interval_matches_scipy_paired_t_and_is_narrower_than_the_unpaired_one",
            "tests/test_paired_change.py::test_one_pair_has_no_interval_and_no_pair_nothing",
            "tests/test_paired_rounds.py",
            "tests/test_paired_resume.py",
            "tests/test_paired_t_edges.py",
            "tests/test_paired_device.py",
        ],
    ),
    # the newer modules
    "adaptive": (
        "areal_lightning/callbacks/adaptive.py",
        [
            "tests/test_adaptive.py::test_rule_shrinks_on_movement_grows_on_stillness_and_stays_in_bounds",
            "tests/test_adaptive.py::test_bad_bounds_are_refused_with_their_names",
            "tests/test_adaptive_schedule.py",
        ],
    ),
    "budget": (
        "areal_lightning/callbacks/budget.py",
        ["tests/test_budget.py::test_bad_budget_is_refused", "tests/test_budget_rule.py"],
    ),
    "best": ("areal_lightning/callbacks/best.py", ["tests/test_best_values.py"]),
    "reward_hacking": (
        "areal_lightning/callbacks/reward_hacking.py",
        [
            "tests/test_reward_hacking.py::test_decision_needs_a_reward_rise_and_a_fall_beyond_noise",
            "tests/test_reward_hacking.py::test_one_alert_per_episode_and_again_after_recovery",
            "tests/test_reward_hacking.py::test_against_the_best_round_a_slow_drift_alerts",
            "tests/test_reward_hacking.py::test_metric_without_outcomes_uses_the_tolerance_and_the_watch_resumes",
            "tests/test_reward_hacking.py::test_bad_arguments_are_refused",
            "tests/test_reward_hacking_rules.py",
        ],
    ),
    "async_evaluator": (
        "areal_lightning/callbacks/async_evaluator.py",
        [
            "tests/test_async_eval.py::test_async_config_errors_name_the_key",
            "tests/test_async_eval.py::test_sharded_strategies_are_refused_with_a_clear_message",
            "tests/test_async_eval.py::test_the_result_cache_with_async_is_refused_naming_both",
            "tests/test_async_messages.py",
            "tests/test_async_worker.py",
        ],
    ),
    "cache": ("areal_lightning/eval_round/cache.py", ["tests/test_result_cache.py", "tests/test_cache_identity.py"]),
    "precision": (
        "areal_lightning/eval_round/precision.py",
        [
            "tests/test_eval_precision_drift.py::test_precision_in_yaml_and_errors",
            "tests/test_eval_precision_choice.py",
        ],
    ),
    "eval_set_drift": ("areal_lightning/eval_round/eval_set_drift.py", ["tests/test_drift_reports.py"]),
    "runs": ("areal_lightning/app/runs.py", ["tests/test_run_dirs.py"]),
    "train_data": ("areal_lightning/rl/grpo/train_data.py", ["tests/test_train_data.py"]),
    "watch_directory": (
        "areal_lightning/app/watch_directory.py",
        [
            "tests/test_watch.py::test_next_checkpoint_takes_the_oldest_step_not_yet_evaluated",
            "tests/test_watch_decisions.py",
        ],
    ),
    "watch_checkpoints": (
        "areal_lightning/app/watch_checkpoints.py",
        [
            "tests/test_watch.py::test_next_checkpoint_takes_the_oldest_step_not_yet_evaluated",
            "tests/test_watch_decisions.py",
            # the command itself, in this process on one CPU device (a second or two per test)
            "tests/test_watch_loop.py",
            # `evaluate` without -c names the run's config, for --ckpt and --watch (a 4-step fit first)
            "tests/test_cli_exit_status.py::test_evaluate_without_a_config_names_the_runs_own",
        ],
    ),
    # the last wave: the sandbox, the integrity checks, episodes, the code task, completion
    # statistics, the prompt story, selection, packing
    # The sandbox's pool runs in the test process; its worker, isolation and process code run only
    # in the worker processes the pool starts (not here: see docs/development.md).
    "sandbox_pool": (
        "areal_lightning/scoring/sandbox/pool.py",
        [
            "tests/test_sandbox_limits.py::test_a_sandboxs_arguments_are_refused_naming_each_and_the_defaults_are_one_worker",
            "tests/test_sandbox.py",
            "tests/test_sandbox_hostile.py::test_the_wall_clock_holds_measured_from_outside",
        ],
    ),
    "sandbox_results": (
        "areal_lightning/scoring/sandbox/results.py",
        ["tests/test_sandbox_limits.py", "tests/test_sandbox.py"],
    ),
    "integrity_checks": (
        "areal_lightning/callbacks/integrity_checks.py",
        [
            "tests/test_integrity_findings.py",
            "tests/test_integrity.py::test_normalising_drops_case_punctuation_and_spacing_but_keeps_numbers_apart",
            "tests/test_integrity.py::test_a_constructed_overlap_is_found_with_counts_and_examples",
            "tests/test_integrity.py::test_a_deliberately_wrong_grader_is_reported_with_its_failing_rows",
            # the null programs' and the duplicates' checks: through a Trainer's fit only
            "tests/test_integrity.py::test_a_vacuous_test_is_found_by_grading_a_null_program_in_the_sandbox",
            "tests/test_integrity.py::test_duplicate_prompts_are_reported_and_a_file_sets_are_dropped_at_load",
        ],
    ),
    # the checks' findings without a Trainer, then the fits that record them (check_integrity)
    "integrity": (
        "areal_lightning/callbacks/integrity.py",
        ["tests/test_integrity_findings.py", "tests/test_integrity.py"],
    ),
    "episode_metrics": (
        "areal_lightning/rl/episodes/metrics.py",
        [
            "tests/test_episode_metrics.py",
            "tests/test_episode_eval.py",
            "tests/test_episodes.py::test_episode_metric_names_are_accepted_in_thresholds",
        ],
    ),
    "episode_runner": ("areal_lightning/rl/episodes/runner.py", ["tests/test_episodes.py"]),
    "episode_settings": ("areal_lightning/rl/episodes/settings.py", ["tests/test_episodes.py"]),
    # the code task's prompts and programs without a sandbox first; then its grading, whose tests
    # start sandbox workers (a second or so each)
    "code_task": (
        "areal_lightning/tasks/code.py",
        ["tests/test_code_prompts.py", "tests/test_code_task.py", "tests/test_code_config.py"],
    ),
    "completion": ("areal_lightning/metrics/completion.py", ["tests/test_completion_stats.py"]),
    "completion_stats": (
        "areal_lightning/rl/completion_stats.py",
        [
            "tests/test_completion_stats.py",
            "tests/test_round_statistics.py::test_a_round_reports_completions_and_every_k",
            "tests/test_round_statistics.py::test_token_scores_can_be_switched_off_per_eval_set",
        ],
    ),
    "prompt_story": ("areal_lightning/callbacks/prompt_story.py", ["tests/test_prompt_story.py"]),
    "selection": ("areal_lightning/callbacks/selection.py", ["tests/test_selection_rules.py"]),
    "packing": ("areal_lightning/eval_round/packing.py", ["tests/test_packing.py"]),
}

# Functions that run only in a process the tests start (a spawned worker): mutmut records which
# tests call a function in the test process only, so it would find no test for these. Each gets
# the tests of the function (same module) that starts that process.
IN_WORKER: dict[str, dict[str, str]] = {
    "async_evaluator": {"_worker_main": "AsyncEvaluator._spawn"},
}

# Tests that run the module only in a command they start (a pipe reader, several ranks): mutmut sees
# no call from them, so its run never tries them. `--retest` runs them against every survivor, ddp
# and slow ones included, with the scratch copy first on the commands' PYTHONPATH (so the command
# runs the mutant).
SUBPROCESS_TESTS: dict[str, list[str]] = {
    "watch_checkpoints": [
        "tests/test_watch_loop.py::test_a_reader_of_the_pipe_sees_each_round_while_the_watch_waits_for_the_next",
        "tests/test_watch.py::test_watch_stops_cleanly_on_ctrl_c_and_on_idle_timeout",
        "tests/test_ddp_learning.py::test_the_watch_and_the_plot_follow_the_run_on_two_processes",
        "tests/test_watch_ranks.py",
    ],
}

# Modules whose mutants are forked from mutmut's fork server, not from its main process. Its
# default runner forks each mutant's test process from the process that ran the stats, and takes
# the next result from `os.wait()`, which reaps any child: the shared sandbox of `run_program`
# (`_default_sandbox`, cached) starts its workers in that process during the stats run, a mutant's
# test process (a forked copy) kills one of them and starts another (a wall-clock kill, a lost
# worker), and the dead worker's pid reaches `wait_for_result`, which knows only its own
# (`KeyError`, mutmut 3.8.1). The fork server keeps pytest out of the main process and ignores the
# pids it did not start.
FORKSERVER = {"sandbox_pool"}

# Added to every pytest run of mutmut: no multi-process (`ddp`) or `slow` test, a mutant must die in
# seconds.
# The module's own doctests run too: its path is the first test path of each run, and the
# project's pytest settings (`--doctest-modules`) come with the copied pyproject.toml.
# Tests that start other processes without a `ddp` or `slow` mark: seconds each.
DESELECT = [
    "tests/test_sharding.py::test_seeds_and_fingerprints_are_stable_across_processes",
    "tests/test_watch.py::test_watch_stops_cleanly_on_ctrl_c_and_on_idle_timeout",
    # MathTask's graders, not the integrity checks': math_verify's scores 0 for a right reference under
    # mutmut's in-process stats run (the test passes under pytest), so mutmut would refuse to start
    "tests/test_integrity.py::test_gsm8k_and_math_reference_solutions_pass_the_math_tasks_graders",
]
PYTEST_ARGS = ["-p", "no:cacheprovider", "-m", "not ddp and not slow", "-q"] + [
    arg for node in DESELECT for arg in ("--deselect", node)
]

# mutmut's exit codes of a test run for one mutant (mutmut/stats.py). A timeout or a killed worker
# is not counted as killed: a forked test process can hang on a lock another thread held at the
# fork (torch), whatever the mutant. `--retest` runs such a mutant in a fresh process, where a
# hang (past RETEST_TIMEOUT_S) is the mutant's.
# 2 is pytest's "interrupted": a KeyboardInterrupt escaped a test. Nothing interrupts mutmut's test
# processes, so the mutant raised it (a signal handler's mutant that raises on the first Ctrl-C).
KILLED_CODES = {1, 2, 3, 37}
# One OpenMP thread in mutmut and the test processes it forks: GNU OpenMP's worker threads do not
# survive a fork, and a forked test that then runs a parallel torch op waits on them for ever.
_ENV = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
TIMEOUT_CODES = {24, -24, 36, 152, 255, -9, -11}
SURVIVED_CODES = {0}
NO_TESTS_CODES = {5, 33}


@dataclass
class Mutant:
    name: str
    function: str
    code: int | None
    change: str = ""
    killed_by: str = ""  # the first test that failed on a retest


@dataclass
class ModuleResult:
    name: str
    path: str
    tests: list[str]
    seconds: float
    mutants: list[Mutant] = field(default_factory=list)
    equivalent: list[Mutant] = field(default_factory=list)
    survived: list[Mutant] = field(default_factory=list)
    killed_on_retest: list[Mutant] = field(default_factory=list)
    error: str = ""
    population: int = 0  # with a sampled run: how many mutants the module has

    verified: int = 0  # kills of mutmut's run checked again in a fresh process (`--verify`)
    unconfirmed: int = 0  # of those, the ones no test failed on there: counted as survivors

    @property
    def killed(self) -> int:
        return sum(1 for m in self.mutants if m.code in KILLED_CODES) - self.unconfirmed + len(self.killed_on_retest)

    @property
    def score(self) -> float:
        denominator = len(self.mutants) - len(self.equivalent)
        return self.killed / denominator if denominator else 1.0


def function_of(mutant_name: str) -> str:
    """`pkg.mod.xǁClassǁmethod__mutmut_3` -> `Class.method`; `pkg.mod.x_func__mutmut_3` -> `func`."""
    tail = mutant_name.rsplit("__mutmut_", 1)[0].split(".")[-1]
    if tail.startswith("xǁ"):
        return ".".join(part for part in tail[2:].split("ǁ") if part)
    return tail.removeprefix("x_")


def change_of(diff: str) -> str:
    """The mutant's diff as one line: ``old → new`` (stripped, several lines joined by ``⏎``)."""
    removed = [line[1:].strip() for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    return f"{' ⏎ '.join(removed)} → {' ⏎ '.join(added)}"


def _cells(row: str) -> list[str]:
    """The cells of a markdown table row; `\\|` is a literal bar, code spans lose their backticks."""
    cells = re.split(r"(?<!\\)\|", row.strip().strip("|"))
    return [cell.strip().replace("\\|", "|").strip("`").strip() for cell in cells]


def read_equivalents(docs: Path = DOCS) -> set[tuple[str, str, str]]:
    """(module, function, change) of every row of the table under "### Equivalent mutants" (stripped, as a
    cell is: a change that deletes code ends in a space)."""
    rows: set[tuple[str, str, str]] = set()
    in_section = False
    for line in docs.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            in_section = line.strip().lower() == "### equivalent mutants"
            continue
        if in_section and line.startswith("|") and not set(line) <= set("|-: "):
            cells = _cells(line)
            if len(cells) >= 4 and cells[0] != "Module":
                rows.add((cells[0], cells[1], cells[2]))
    return rows


def _md(text: str) -> str:
    """A code span for a markdown table cell (bars escaped, backticks doubled around if present)."""
    text = text.replace("|", "\\|")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _pyproject(module_path: str, tests: list[str], process_isolation_forkserver: bool = False) -> str:
    """The scratch copy's pyproject.toml: the project's own (its pytest settings) and this module's mutmut settings."""
    mutmut = [
        "",
        "[tool.mutmut]",
        'source_paths = ["areal_lightning"]',
        'also_copy = ["docs"]',  # tests that check a documented value read docs/
        f"only_mutate = {json.dumps([module_path])}",
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
        f"pytest_add_cli_args = {json.dumps(PYTEST_ARGS)}",
        "use_git_change_detection = false",
        *(['process_isolation = "forkserver"'] if process_isolation_forkserver else []),
        "",
    ]
    return (ROOT / "pyproject.toml").read_text(encoding="utf-8") + "\n".join(mutmut)


def _mangled(module_path: str, function: str) -> str:
    """mutmut's name of a function (`Class.method` or `func`) in its stats."""
    prefix = module_path.removesuffix(".py").replace("/", ".")
    if "." in function:
        return f"{prefix}.xǁ{'ǁ'.join(function.split('.'))}"
    return f"{prefix}.x_{function}"


def attach_worker_tests(name: str) -> list[str]:
    """Give each of the module's `IN_WORKER` functions the tests of the function that starts its
    process, in mutmut's stats; returns the mutants of those functions that mutmut found no test for
    (run them again by name)."""
    module_path, _ = MODULES[name]
    work = SCRATCH / name
    stats_file, meta = work / "mutants" / "mutmut-stats.json", work / "mutants" / f"{module_path}.meta"
    if name not in IN_WORKER or not stats_file.is_file():
        return []
    stats = json.loads(stats_file.read_text(encoding="utf-8"))
    tests = stats["tests_by_mangled_function_name"]
    for function, starter in IN_WORKER[name].items():
        tests[_mangled(module_path, function)] = sorted(tests.get(_mangled(module_path, starter), []))
    stats_file.write_text(json.dumps(stats, indent=4), encoding="utf-8")
    codes = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"] if meta.is_file() else {}
    return sorted(k for k, v in codes.items() if v in NO_TESTS_CODES and function_of(k) in IN_WORKER[name])


def _run_low(command: list[str], cwd: Path, log: TextIO) -> int:
    """Runs `command` in a session of its own at this process's nice value; its exit status.

    The kernel's autogroups give each session one share of the CPU whatever its processes' nice
    values, so `nice` alone does not lower mutmut against a `make test` run from another terminal:
    the new session's group gets the nice value too. Ctrl-C here ends the whole session.
    """
    proc = subprocess.Popen(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=_ENV, start_new_session=True)
    with contextlib.suppress(OSError):  # no autogroups (another kernel, or switched off)
        Path(f"/proc/{proc.pid}/autogroup").write_text(str(os.nice(0)), encoding="ascii")
    try:
        return proc.wait()
    except BaseException:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        raise


def run_module(name: str, mutmut: Path, max_children: int) -> ModuleResult:
    """Mutate one module in a fresh scratch copy; its result is kept there (`collect` reads it)."""
    module_path, tests = MODULES[name]
    tests = [module_path, *tests]
    work = SCRATCH / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "areal_lightning", work / "areal_lightning", ignore=ignore)
    shutil.copytree(ROOT / "tests", work / "tests", ignore=ignore)
    shutil.copytree(ROOT / "docs", work / "docs", ignore=ignore)
    (work / "pyproject.toml").write_text(_pyproject(module_path, tests, name in FORKSERVER), encoding="utf-8")

    start = time.monotonic()
    with open(work / "mutmut.log", "w", encoding="utf-8") as log:
        # mutmut asks the tests for `areal_lightning` from its copy (mutants/) first on sys.path;
        # the editable install of the checkout is a fallback finder that comes after it.
        returncode = _run_low([str(mutmut), "run", "--max-children", str(max_children)], work, log)
        rerun = attach_worker_tests(name) if returncode == 0 else []
        if rerun:  # the worker's functions, now with their tests
            returncode = _run_low([str(mutmut), "run", "--max-children", str(max_children), *rerun], work, log)
    run = {"tests": tests, "seconds": time.monotonic() - start, "returncode": returncode}
    (work / RUN_FILE).write_text(json.dumps(run), encoding="utf-8")
    result = collect(name)
    assert result is not None
    return result


def sample_module(name: str, mutmut: Path, size: int, max_children: int = 1) -> ModuleResult | None:
    """Test `size` mutants of the module's last run (those already checked, then a seeded random
    draw of the others): a score from a sample when a full run does not fit the time there is."""
    module_path, tests = MODULES[name]
    work = SCRATCH / name
    meta = work / "mutants" / f"{module_path}.meta"
    if not meta.is_file():
        return None  # mutants are generated by a run: start one, stop it, then sample
    codes = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
    untested = set(attach_worker_tests(name))  # "no tests" only because they run in a worker: not checked
    checked = sorted(k for k, v in codes.items() if v is not None and k not in untested)
    unchecked = sorted(k for k, v in codes.items() if v is None or k in untested)
    chosen = checked + random.Random(0).sample(unchecked, max(0, min(size - len(checked), len(unchecked))))
    # mutmut runs every mutant it is named again: a killed one keeps its result, the rest run.
    to_run = [k for k in chosen if codes[k] not in KILLED_CODES]
    start = time.monotonic()
    returncode = 0
    if to_run:  # named none, mutmut would run them all
        with open(work / "mutmut.log", "a", encoding="utf-8") as log:
            returncode = _run_low([str(mutmut), "run", "--max-children", str(max_children), *to_run], work, log)
    run = {"tests": [module_path, *tests], "seconds": time.monotonic() - start, "returncode": returncode}
    run["sampled"] = len(chosen)
    (work / RUN_FILE).write_text(json.dumps(run), encoding="utf-8")
    return collect(name)


def collect(name: str) -> ModuleResult | None:
    """The last run of module `name`, read from its scratch copy; None when it never ran."""
    module_path, _ = MODULES[name]
    work = SCRATCH / name
    meta = work / "mutants" / f"{module_path}.meta"
    if (work / RUN_FILE).is_file():
        run = json.loads((work / RUN_FILE).read_text(encoding="utf-8"))
    elif meta.is_file():  # a run that was stopped before it wrote its summary
        selection = next(
            line.split("=", 1)[1]
            for line in (work / "pyproject.toml").read_text(encoding="utf-8").splitlines()
            if line.startswith("pytest_add_cli_args_test_selection")
        )
        seconds = meta.stat().st_mtime - (work / "pyproject.toml").stat().st_mtime
        run = {"tests": json.loads(selection), "seconds": seconds, "returncode": 0}
    else:
        return None
    result = ModuleResult(name, module_path, run["tests"], run["seconds"])
    if run["returncode"] != 0 or not meta.is_file():
        result.error = f"mutmut exited {run['returncode']}; see {(work / 'mutmut.log').relative_to(ROOT)}"
        return result

    codes = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
    if run.get("sampled"):
        result.population = len(codes)
        # Checked mutants only; a worker's function left "no tests" by the first run was not sampled.
        in_worker = IN_WORKER.get(name, {})
        codes = {
            k: v
            for k, v in codes.items()
            if v is not None and not (v in NO_TESTS_CODES and function_of(k) in in_worker)
        }
    if not (work / RUN_FILE).is_file() and None in codes.values():
        checked = sum(code is not None for code in codes.values())
        result.error = f"running or stopped: {checked} of {len(codes)} mutants checked"
        return result
    result.mutants = [Mutant(key, function_of(key), code) for key, code in sorted(codes.items())]
    verified = json.loads((work / VERIFY_FILE).read_text(encoding="utf-8")) if (work / VERIFY_FILE).is_file() else {}
    result.verified = len(verified)
    # A kill that a fresh process does not reproduce was the test process's, not the mutant's.
    unconfirmed = {k for k, v in verified.items() if v["status"] != "killed"}
    result.unconfirmed = len(unconfirmed)
    not_killed = [m for m in result.mutants if m.code not in KILLED_CODES or m.name in unconfirmed]
    if not_killed:
        _describe(work, module_path, not_killed)
    equivalents = read_equivalents()
    retested = json.loads((work / RETEST_FILE).read_text(encoding="utf-8")) if (work / RETEST_FILE).is_file() else {}
    for m in not_killed:
        if (module_path, m.function, m.change.strip()) in equivalents:
            result.equivalent.append(m)
        elif retested.get(m.name, {}).get("status") == "killed":
            m.killed_by = retested[m.name]["by"]
            result.killed_on_retest.append(m)
        else:
            result.survived.append(m)
    return result


def retest(name: str, retest_timeout: float = RETEST_TIMEOUT_S, commands: bool = True) -> ModuleResult | None:
    """Run the module's current tests against each survivor of its last run, one pytest process per
    mutant (the mutant written into the scratch copy's source, then put back).

    Cheaper than a new run when tests were added for a few survivors: only the survivors are tested,
    only against the tests added to the module's map since the run. A survivor whose function
    changed since the run is reported as stale (run the module again). `commands=False` leaves out
    the module's `SUBPROCESS_TESTS` (minutes a mutant): for a retest after fast tests were added,
    when an earlier retest ran them against the same survivors.
    """
    result = collect(name)
    if result is None or result.error:
        return result
    module_path, tests = MODULES[name]
    work = SCRATCH / name
    _refresh_scratch(work)
    retested = json.loads((work / RETEST_FILE).read_text(encoding="utf-8")) if (work / RETEST_FILE).is_file() else {}
    # The code is the run's, so only tests added since can kill a survivor: those added to the map,
    # and those in test files changed since the run started.
    started = (work / "pyproject.toml").stat().st_mtime
    added = [t for t in tests if t not in result.tests or (ROOT / t.split("::")[0]).stat().st_mtime > started]
    # A timeout is tested again against every mapped test: in a fresh process a hang is the mutant's.
    in_commands = SUBPROCESS_TESTS.get(name, []) if commands else []
    todo = [m for m in result.survived if m.code in TIMEOUT_CODES or added or in_commands]
    if not todo:
        return result
    for m in todo:
        selected = [module_path, *tests] if m.code in TIMEOUT_CODES else added
        try:
            with _mutant_in_scratch(work, module_path, m.name) as env:
                retested[m.name] = {**_fresh_run(work, selected, in_commands, env, retest_timeout), "change": m.change}
        except _StaleMutant:
            retested[m.name] = {"status": "stale", "by": "", "change": m.change}
        # After each mutant: a stopped retest keeps what it found.
        (work / RETEST_FILE).write_text(json.dumps(retested, indent=1), encoding="utf-8")
    return collect(name)


def verify(
    name: str, size: int, retest_timeout: float = RETEST_TIMEOUT_S, chosen: list[str] | None = None
) -> ModuleResult | None:
    """Check `size` of the kills of the module's last run again (a seeded draw), each in a fresh
    pytest process with the mutant written into the scratch copy's source, against every mapped test
    and `SUBPROCESS_TESTS`. mutmut's forked test process fails now and then whatever the mutant; a
    kill that does not reproduce here is counted as a survivor."""
    result = collect(name)
    if result is None or result.error:
        return result
    module_path, tests = MODULES[name]
    work = SCRATCH / name
    _refresh_scratch(work)  # a kill by a test added since the run is a kill too
    verified = json.loads((work / VERIFY_FILE).read_text(encoding="utf-8")) if (work / VERIFY_FILE).is_file() else {}
    kills = sorted(m.name for m in result.mutants if m.code in KILLED_CODES and m.name not in verified)
    unknown = sorted(set(chosen or []) - {m.name for m in result.mutants})
    if unknown:
        raise SystemExit(f"--mutant: no mutant of {module_path} is named {', '.join(unknown)} (the report names them)")
    todo = [k for k in kills if k in chosen] if chosen else random.Random(0).sample(kills, min(size, len(kills)))
    nodes, in_commands = [module_path, *tests], SUBPROCESS_TESTS.get(name, [])
    for key in todo:
        try:
            with _mutant_in_scratch(work, module_path, key) as env:
                verified[key] = _fresh_run(work, nodes, in_commands, env, retest_timeout)
        except _StaleMutant:
            verified[key] = {"status": "stale", "by": ""}
        (work / VERIFY_FILE).write_text(json.dumps(verified, indent=1), encoding="utf-8")
    return collect(name)


def _refresh_scratch(work: Path) -> None:
    """The checkout's package and tests copied over the scratch copy's (the run's). A mutant whose
    function changed since the run is then found stale when it is written in (`_mutant_in_scratch`)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in ("areal_lightning", "tests", "docs"):
        shutil.copytree(ROOT / part, work / part, ignore=ignore, dirs_exist_ok=True)


class _StaleMutant(Exception):
    """The mutant's function changed since the run: mutmut cannot write it into the source."""


@contextlib.contextmanager
def _mutant_in_scratch(work: Path, module_path: str, key: str) -> Iterator[dict[str, str]]:
    """Mutant `key` written into the scratch copy's source (mutmut's `apply_mutant`, run from the
    copy) and put back afterwards, whatever happens; yields the environment of a fresh test run,
    whose commands import the mutant from the copy, not the checkout."""
    from mutmut.configuration import reset_config
    from mutmut.mutation.diff_apply import apply_mutant

    source = work / module_path
    original = source.read_text(encoding="utf-8")
    cwd = Path.cwd()
    os.chdir(work)
    reset_config()
    try:
        try:
            apply_mutant(key)
        except Exception as err:  # mutmut raises several kinds when a function changed
            raise _StaleMutant(key) from err
        yield {**_ENV, "PYTHONPATH": os.pathsep.join(p for p in (str(work), os.environ.get("PYTHONPATH")) if p)}
    finally:
        source.write_text(original, encoding="utf-8")
        os.chdir(cwd)
        reset_config()


def _fresh_run(
    work: Path, nodes: list[str], in_commands: list[str], env: dict[str, str], timeout: float
) -> dict[str, str]:
    """The mutant now in `work`'s source against `nodes` (the mutation's pytest arguments), then
    `in_commands` (whatever their marks), in fresh pytest processes: {"status", "by"}."""
    runs = [
        ([sys.executable, "-m", "pytest", "-x", *PYTEST_ARGS], nodes, timeout),
        # named node ids run whatever their marks; a hang fails inside the test, at its own limit
        ([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"], in_commands, COMMAND_TESTS_TIMEOUT_S),
    ]
    outcome = {"status": "no tests", "by": ""}
    for command, selected, limit in runs:
        if not selected:
            continue
        try:
            proc = subprocess.run(
                [*command, *selected], cwd=work, env=env, capture_output=True, text=True, timeout=limit, check=False
            )
        except subprocess.TimeoutExpired:
            return {"status": "killed", "by": "(timeout)"}  # a hang is noticed
        # 0: every test passed; 5: none ran; anything else (failures, an import error): killed.
        status = {0: "survived", 5: "no tests"}.get(proc.returncode, "killed")
        failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, flags=re.MULTILINE)
        outcome = {"status": status, "by": failed[0] if failed else ""}
        if status == "killed":
            break
    return outcome


def _describe(work: Path, module_path: str, mutants: list[Mutant]) -> None:
    """Fill in each mutant's change, read from mutmut's copy in `work`."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    cwd = Path.cwd()
    os.chdir(work)
    try:
        for m in mutants:
            m.change = change_of(get_diff_for_mutant(m.name, path=module_path))
    finally:
        os.chdir(cwd)


def report(results: list[ModuleResult], seconds: float) -> str:
    lines = [
        "# Mutation testing report",
        "",
        f"mutmut, one module at a time against its own tests; {seconds / 60:.1f} min of runs in all.",
        "",
        "| Module | Mutants | Killed | Survived | Equivalent | Score | Time of the run |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r.error:
            lines.append(f"| `{r.path}` | error: {r.error} | | | | | |")
            continue
        retest = f" ({len(r.killed_on_retest)} on retest)" if r.killed_on_retest else ""
        sample = f" (a sample of {r.population})" if r.population else ""
        lines.append(
            f"| `{r.path}` | {len(r.mutants)}{sample} | {r.killed}{retest} | {len(r.survived)} "
            f"| {len(r.equivalent)} | {r.score:.0%} | {r.seconds:.0f} s |"
        )
    checked = [r for r in results if r.verified]
    if checked:
        lines += ["", "Kills checked again in a fresh process (`--verify`):", ""]
        lines += [f"- `{r.path}`: {r.verified - r.unconfirmed} of {r.verified} reproduced" for r in checked]
    lines += ["", "## Tests of each module's run", ""]
    for r in results:
        tests = ", ".join("doctests" if t == r.path else f"`{t.removeprefix('tests/')}`" for t in r.tests)
        lines.append(f"- `{r.path}`: {tests}")
    retested = [(r, m) for r in results for m in r.killed_on_retest]
    if retested:
        lines += [
            "",
            "## Killed on retest (by tests added after the run)",
            "",
            "| Module | Function | Change | Killed by |",
        ]
        lines.append("|---|---|---|---|")
        lines += [f"| `{r.path}` | `{m.function}` | {_md(m.change)} | `{m.killed_by}` |" for r, m in retested]
    survivors = [(r, m) for r in results for m in r.survived]
    if survivors:
        lines += [
            "",
            "## Survivors",
            "",
            "Kill each with a test of behaviour a user would notice, or add its row (with why) to the",
            'table "Equivalent mutants" in docs/development.md. "no tests": no selected test calls the function.',
            "",
            "| Module | Function | Change | Why |",
            "|---|---|---|---|",
        ]
        for r, m in survivors:
            status = "no tests" if m.code in NO_TESTS_CODES else "timeout" if m.code in TIMEOUT_CODES else "survived"
            lines.append(f"| `{r.path}` | `{m.function}` | {_md(m.change)} | {status}: {m.name} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help=f"modules to mutate (default: all): {', '.join(MODULES)}")
    parser.add_argument("--report", type=Path, default=SCRATCH / "report.md", help="where to write the report")
    parser.add_argument(
        "--max-children", type=int, default=1, help="mutants tested in parallel, in a run or --sample (default 1)"
    )
    parser.add_argument("--list", action="store_true", help="print the modules and their tests, run nothing")
    parser.add_argument(
        "--report-only", action="store_true", help="write the report from the last run of each module, run nothing"
    )
    parser.add_argument(
        "--sample",
        type=int,
        metavar="N",
        help="instead of a new run, test N mutants of each module's last (stopped) run",
    )
    parser.add_argument(
        "--retest",
        action="store_true",
        help="instead of a new run, test only the survivors of each module's last run against its current tests",
    )
    parser.add_argument(
        "--verify",
        type=int,
        metavar="N",
        help="instead of a new run, check N more kills of each module's last run in fresh processes",
    )
    parser.add_argument(
        "--mutant",
        action="append",
        metavar="NAME",
        help="with --verify: these kills (mutmut's names, as the report prints them) instead of a draw",
    )
    parser.add_argument(
        "--skip-commands",
        action="store_true",
        help="with --retest: leave out the module's tests that run it in commands (SUBPROCESS_TESTS)",
    )
    parser.add_argument(
        "--retest-timeout",
        type=float,
        default=RETEST_TIMEOUT_S,
        metavar="SECS",
        help=f"with --retest: a run of the tests past SECS is a hang, the mutant's (default {RETEST_TIMEOUT_S})",
    )
    args = parser.parse_args(argv)
    # SIGTERM as an exception: a stopped --retest or --verify puts the scratch copy's source back
    # (its `finally`) instead of leaving a mutant in it for the next one to take as the original.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    if args.skip_commands and not args.retest:
        parser.error("--skip-commands leaves tests out of a retest: it needs --retest")
    if args.mutant and not args.verify:
        parser.error("--mutant names kills to check again: it needs --verify N")
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module(s) {', '.join(unknown)}; choose from {', '.join(MODULES)}")
    if args.list:
        for name, (path, tests) in MODULES.items():
            print(f"{name:16} {path:48} {' '.join(tests)}")
        return 0
    mutmut = Path(sys.executable).with_name("mutmut")
    if not args.report_only and not mutmut.exists():
        print(f"mutmut is not installed in {Path(sys.executable).parent.parent}: pip install mutmut", file=sys.stderr)
        return 2

    for name in [] if args.report_only else args.modules or list(MODULES):
        doing = "retesting the survivors of" if args.retest else "verifying kills of" if args.verify else "mutating"
        print(f"{doing} {MODULES[name][0]} ...", flush=True)
        if args.sample:
            r = sample_module(name, mutmut, args.sample, args.max_children)
        elif args.verify:
            r = verify(name, args.verify, args.retest_timeout, args.mutant)
        else:
            r = (
                retest(name, args.retest_timeout, commands=not args.skip_commands)
                if args.retest
                else run_module(name, mutmut, args.max_children)
            )
        if r is None:
            print("  never run", flush=True)
            continue
        summary = r.error or (
            f"{len(r.mutants)} mutants: {r.killed} killed, {len(r.survived)} survived, "
            f"{len(r.equivalent)} equivalent ({r.score:.0%}) in {r.seconds:.0f} s"
        )
        print(f"  {summary}", flush=True)
    # The report covers every module's last run, so a run of one module updates the whole table.
    results = [r for r in (collect(name) for name in MODULES) if r is not None]
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(report(results, sum(r.seconds for r in results)), encoding="utf-8")
    missing = [name for name in MODULES if name not in {r.name for r in results}]
    print(f"report: {args.report}" + (f" (never run: {', '.join(missing)})" if missing else ""))
    return 0 if not missing and all(not r.error and not r.survived for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
