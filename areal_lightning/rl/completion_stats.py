"""Completion statistics of a batch of rollouts, for the default evaluation (``completion/...``) and
for training (``train/completion/...``): the same metrics and the same rules in both.

Per completion:

* **length**: the tokens the policy sampled, up to and including the EOS that ended it (an EOS
  an engine appends after a stop string was not sampled and is not counted);
* **truncated**: it reached ``max_new_tokens`` without an EOS and without a stop string;
* **stopped**: it ended at a stop string: the engine stopped there (`Generation.stopped`), or its
  text holds one of the eval set's stop strings (a policy that does not stop at them);
* **no_answer**: the task's answer extraction found no final answer (``answer_id == NO_ANSWER``);
* **logprob** and **entropy**: means over every scored token (the engine's own scores, see
  `rl.engines.generation`); NaN when the policy gives none.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from areal_lightning.eval_round.packing import compute_replayed, pack_states, record_states, unpack_states
from areal_lightning.eval_round.ranks import all_gather_object, dist_info
from areal_lightning.metrics import NO_ANSWER, CompletionLength, Share, TokenMean
from areal_lightning.rl.engines.generation import Generation
from areal_lightning.rl.policy import completion_mask

PREFIX = "completion"
LENGTH = f"{PREFIX}/length"
TRUNCATED = f"{PREFIX}/truncated"
STOPPED = f"{PREFIX}/stopped"
NO_ANSWER_SHARE = f"{PREFIX}/no_answer"
LOGPROB = f"{PREFIX}/logprob"
ENTROPY = f"{PREFIX}/entropy"


def completion_metrics(max_new_tokens: int) -> dict[str, Callable[[], Metric]]:
    """The completion metrics by name, for completions of at most `max_new_tokens` tokens.

    Example:
        >>> sorted(completion_metrics(4))[:3]
        ['completion/entropy', 'completion/length', 'completion/logprob']
    """
    return {
        LENGTH: functools.partial(CompletionLength, max_new_tokens),
        TRUNCATED: Share,
        STOPPED: Share,
        NO_ANSWER_SHARE: Share,
        LOGPROB: TokenMean,
        ENTROPY: TokenMean,
    }


def update_completion_metrics(
    metrics: Mapping[str, Metric],
    generation: Generation,
    eos_id: int,
    answer_ids: Sequence[int],
    stop_in_text: Tensor | None = None,
    scores: tuple[Tensor, Tensor | None, Tensor] | None = None,
) -> None:
    """Adds one batch of completions to `metrics` (named as `completion_metrics`).

    Args:
        generation: the completions as the engine returned them.
        eos_id: the policy's end-of-sequence id.
        answer_ids: the task's answer id of each completion (``NO_ANSWER`` for none).
        stop_in_text: ``[B]`` bool, the completion's text holds one of the eval set's stop strings.
        scores: ``(logprobs, entropy, mask)`` to use instead of the generation's own (training:
            the loss's forward).
    """
    tokens = generation.tokens
    device = tokens.device
    stopped = generation.stopped.to(device)
    has_eos = (tokens == eos_id).any(dim=1)
    # An engine that stopped at a stop string appended an EOS it did not sample.
    lengths = completion_mask(tokens, eos_id).sum(dim=1) - (stopped & has_eos).long()
    if stop_in_text is not None:
        stopped = stopped | stop_in_text.to(device)
    metrics[LENGTH].update(lengths)
    metrics[TRUNCATED].update(~has_eos & ~stopped)
    metrics[STOPPED].update(stopped)
    metrics[NO_ANSWER_SHARE].update(torch.tensor([a == NO_ANSWER for a in answer_ids], dtype=torch.bool))
    if scores is None and generation.logprobs is not None:
        assert generation.scored is not None
        scores = (generation.logprobs, generation.entropy, generation.scored)
    if scores is not None:
        logprobs, entropy, mask = scores
        metrics[LOGPROB].update(logprobs.detach().float(), mask)
        if entropy is not None:  # an inference server gives no entropies: completion/entropy stays NaN
            metrics[ENTROPY].update(entropy.detach().float(), mask)


def step_completion_stats(
    metrics: Mapping[str, Metric],
    generation: Generation,
    eos_id: int,
    answer_ids: Sequence[int],
    scores: tuple[Tensor, Tensor, Tensor] | None = None,
    prefix: str = "train/",
) -> dict[str, Tensor]:
    """The completion statistics of one batch of rollouts over every rank's batch, by logged name
    (``train/completion/length/mean`` ...): `metrics` are reset, updated and computed over the ranks
    in one gather (`computed_over_ranks`; every rank must call it, as every rank runs each training
    step), so the values are the same on every rank and on any number of ranks for the same rollouts."""
    for metric in metrics.values():
        metric.reset()
    update_completion_metrics(metrics, generation, eos_id, answer_ids, scores=scores)
    return logged_values(computed_over_ranks(metrics), prefix)


def computed_over_ranks(metrics: Mapping[str, Metric]) -> dict[str, Any]:
    """Every metric's value over all ranks, from one gather of every rank's packed states (the eval
    round's `eval_round.packing`) instead of torchmetrics' two collectives and a barrier per state
    (a training step computes them at every step). Every metric here has tensor states only, so
    every rank records the same number of tensors per metric."""
    if dist_info()[1] == 1:
        return {name: metric.compute() for name, metric in metrics.items()}
    recorded = {name: record_states(metric) for name, metric in metrics.items()}
    packs = all_gather_object(pack_states([t for tensors in recorded.values() for t in tensors]))
    per_rank: list[dict[str, list[Tensor]]] = []
    for pack in packs:
        tensors, states = unpack_states(pack, None), {}
        for name, own in recorded.items():
            states[name], tensors = tensors[: len(own)], tensors[len(own) :]
        per_rank.append(states)
    return {name: compute_replayed(metric, [r[name] for r in per_rank]) for name, metric in metrics.items()}


def logged_values(computed: Mapping[str, Any], prefix: str = "train/") -> dict[str, Tensor]:
    """Computed metric values by logged name: ``<prefix><name>``, and ``<prefix><name>/<key>`` for
    each key of a metric that computes a dict (``completion/length/mean`` ...)."""
    values: dict[str, Tensor] = {}
    for name, value in computed.items():
        items = value.items() if isinstance(value, dict) else [("", value)]
        values.update({f"{prefix}{name}/{key}".rstrip("/"): v for key, v in items})
    return values
