"""The metric names a config gives (thresholds, best metrics, the reward watch), checked against
what the default evaluation logs, before any round.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

from areal_lightning.app.config_errors import ConfigError
from areal_lightning.app.episode_checks import logged_episode_metrics
from areal_lightning.app.sections.eval_sets import EvalSetConfig
from areal_lightning.app.sections.task import TaskName
from areal_lightning.callbacks.selection import SelectionRule
from areal_lightning.callbacks.settings import Decisions
from areal_lightning.rl.episodes.settings import EpisodeSettings
from areal_lightning.rl.grader_checks import JUDGE_LABELS

AT_K = re.compile(r"^(pass@|pass\^|maj@)(\d+)(/.+)?$")
"""``pass@4``, ``pass^4/stderr``, ``maj@16``: (symbol, k, the rest)."""


def check_metric_names(
    ev: Decisions,
    eval_sets: Mapping[str, EvalSetConfig],
    task: TaskName,
    episodes: EpisodeSettings | None,
    *,
    judge: bool = False,
) -> None:
    """Refuses a threshold, best metric or reward-watch metric the default evaluation does not log
    with these eval sets, task, episodes and judge (its verdicts' counts, ``judge/*``), naming the
    closest one, and a reward watch on an eval set that is not defined."""
    if not (ev.metric_thresholds or ev.best_metrics or ev.reward_watch):
        return  # nothing names a metric: the metric classes (torch) need not load
    from areal_lightning.callbacks.prompt_story import StoryBuckets, story_metric_names
    from areal_lightning.rl.rollout_eval import (  # torch and torchmetrics: only when needed
        OUTCOME_METRICS,
        metric_names,
    )

    labels = _task_labels(task) + ((JUDGE_LABELS,) if judge else ())
    base = {m for es in eval_sets.values() for m in _metric_names(episodes, es, metric_names, labels)}
    story = ev.prompt_story
    # Stratum buckets are named by the data's strata, unknown here: the sanity pass checks those.
    by_stratum = story is not None and story.buckets is StoryBuckets.STRATUM
    logged = sorted(base | set(story_metric_names(base, story)))
    named = [(f"evaluator.decisions.metric_thresholds.{name}", name, True) for name in ev.metric_thresholds]
    named += [(f"evaluator.decisions.best_metrics.{name}", name, False) for name in ev.best_metrics or {}]
    if ev.reward_watch is not None:
        named.append(("evaluator.decisions.reward_watch.metric", ev.reward_watch.metric, False))
        if ev.reward_watch.eval_set is not None and ev.reward_watch.eval_set not in eval_sets:
            raise ConfigError(
                f"evaluator.decisions.reward_watch.eval_set must name an eval set, got "
                f"{ev.reward_watch.eval_set!r}; defined: {', '.join(eval_sets)}"
            )
    for key, name, mean_too in named:
        if by_stratum and story is not None and name.startswith(f"{story.metric}/bucket/"):
            continue
        if name not in logged and not (mean_too and f"{name}/mean" in logged):
            close = difflib.get_close_matches(name, logged, n=1)
            hint = _k_hint(name, logged, eval_sets) or (f" Did you mean `{close[0]}`?" if close else "")
            raise ConfigError(
                f"{key} names a metric the evaluation does not log.{hint} Accepted "
                f"(with the eval sets' n_samples): {', '.join(logged)}"
            )
    _check_outcomes_known(ev, OUTCOME_METRICS)


def _check_outcomes_known(ev: Decisions, recorded: tuple[str, ...]) -> None:
    """A noise-aware best_rule ranks by per-prompt outcomes, which the evaluation records for a few
    metrics only: a best metric without them is refused here, not at the warm-up's end."""
    if ev.best_rule is SelectionRule.POINT:
        return
    for name in ev.best().directions:
        if name not in recorded:
            rule = ev.best_rule.value
            raise ConfigError(
                f"evaluator.decisions.best_rule: {rule} ranks rounds by per-prompt outcomes, and the evaluation "
                f"records them only for {' and '.join(recorded)}; evaluator.decisions.best_metrics.{name} has none. "
                f"Name {' or '.join(recorded)} in best_metrics, or use best_rule: point"
            )


def _k_hint(name: str, logged: list[str], eval_sets: Mapping[str, EvalSetConfig]) -> str:
    """For ``pass@16`` when no eval set computes k=16: which k's they compute, and how to add one."""
    found = AT_K.match(name)
    if found is None or not any(AT_K.match(m) for m in logged):
        return ""
    k = int(found.group(2))
    if f"{found.group(1)}{k}" in logged:
        return ""  # k is computed; the rest of the name is what is wrong
    ks = {m for m in logged if (at := AT_K.match(m)) and at.group(1) == found.group(1) and at.group(3) is None}
    per_set = "; ".join(
        f"eval_sets.{n}: ks {es.ks if es.ks is not None else 'null (1 and n_samples)'}, n_samples {es.n_samples}"
        for n, es in eval_sets.items()
    )
    return (
        f" k={k} is not among the eval sets' ks ({per_set}), which give {', '.join(sorted(ks, key=_k_of))}; add "
        f"{k} to an eval set's ks (with n_samples >= {k})."
    )


def _k_of(name: str) -> int:
    found = AT_K.match(name)
    return int(found.group(2)) if found else 0


def _metric_names(episodes: EpisodeSettings | None, es: EvalSetConfig, single_turn: Any, labels: Any) -> list[str]:
    if es.harness is not None:
        from areal_lightning.rl.harness.evaluation import logged_names

        return logged_names(es.harness.spec())
    if episodes is None:
        return list(single_turn(es.n_samples, labels, es.ks))
    return logged_episode_metrics(episodes, es.n_samples)


def _task_labels(task: TaskName) -> tuple[Any, ...]:
    """The `ScoreLabels` a task's scores carry (counted per round), for the metric-name check."""
    if task is not TaskName.CODE:
        return ()
    from areal_lightning.tasks.code import CODE_LABELS

    return (CODE_LABELS,)
