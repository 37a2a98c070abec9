"""The evaluation round and what it stands on: eval sets, sharding, per-sample seeds, fingerprints.

`run_round` is the one function that sync, async and standalone evaluation share.
"""

from areal_lightning.eval_round.context import EvalBatch, EvalContext, EvalRoundError, EvaluateFn, SetResult
from areal_lightning.eval_round.eval_set import EvalSet, as_eval_sets
from areal_lightning.eval_round.fingerprint import EvalSetMismatchError, check_eval_sets_consistent
from areal_lightning.eval_round.round import (
    LocalSetResult,
    evaluate_local,
    evaluate_set,
    local_batches,
    reduce_set,
    run_round,
)
from areal_lightning.eval_round.sampling import SamplingParams, cut_at_stop

__all__ = [
    "EvalBatch",
    "EvalContext",
    "EvalRoundError",
    "EvalSet",
    "EvalSetMismatchError",
    "EvaluateFn",
    "SamplingParams",
    "SetResult",
    "as_eval_sets",
    "check_eval_sets_consistent",
    "cut_at_stop",
    "LocalSetResult",
    "evaluate_local",
    "evaluate_set",
    "local_batches",
    "reduce_set",
    "run_round",
]
