"""The evaluation round and what it stands on: eval sets, sharding, per-sample seeds, fingerprints.

`run_round` is the one function that sync, async and standalone evaluation share.

The names below load on first use (PEP 562): `eval_set` is pure Python, so a config that checks
an `EvalSet`'s arguments does not pay for torch, torchmetrics and Lightning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from areal_lightning.lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time `__getattr__` imports on first use
    from areal_lightning.eval_round.context import (
        EvalBatch as EvalBatch,
        EvalContext as EvalContext,
        EvalRoundError as EvalRoundError,
        EvaluateFn as EvaluateFn,
        SetResult as SetResult,
    )
    from areal_lightning.eval_round.eval_set import (
        EvalSet as EvalSet,
        as_eval_sets as as_eval_sets,
    )
    from areal_lightning.eval_round.fingerprint import (
        EvalSetMismatchError as EvalSetMismatchError,
        check_eval_sets_consistent as check_eval_sets_consistent,
    )
    from areal_lightning.eval_round.reduction import (
        LocalSetResult as LocalSetResult,
        reduce_round as reduce_round,
        reduce_set as reduce_set,
    )
    from areal_lightning.eval_round.round import (
        evaluate_local as evaluate_local,
        evaluate_set as evaluate_set,
        local_batches as local_batches,
        run_round as run_round,
    )
    from areal_lightning.eval_round.sampling_params import (
        SamplingParams as SamplingParams,
        cut_at_stop as cut_at_stop,
    )


_EXPORTS = {
    "EvalBatch": "areal_lightning.eval_round.context",
    "EvalContext": "areal_lightning.eval_round.context",
    "EvalRoundError": "areal_lightning.eval_round.context",
    "EvaluateFn": "areal_lightning.eval_round.context",
    "SetResult": "areal_lightning.eval_round.context",
    "EvalSet": "areal_lightning.eval_round.eval_set",
    "as_eval_sets": "areal_lightning.eval_round.eval_set",
    "EvalSetMismatchError": "areal_lightning.eval_round.fingerprint",
    "check_eval_sets_consistent": "areal_lightning.eval_round.fingerprint",
    "LocalSetResult": "areal_lightning.eval_round.reduction",
    "evaluate_local": "areal_lightning.eval_round.round",
    "evaluate_set": "areal_lightning.eval_round.round",
    "reduce_round": "areal_lightning.eval_round.reduction",
    "reduce_set": "areal_lightning.eval_round.reduction",
    "local_batches": "areal_lightning.eval_round.round",
    "run_round": "areal_lightning.eval_round.round",
    "SamplingParams": "areal_lightning.eval_round.sampling_params",
    "cut_at_stop": "areal_lightning.eval_round.sampling_params",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, globals())
