"""A harness task's ``loglikelihood`` requests (multiple choice), scored by the HF policy's model.

What the harness's HF backend (`HFLM.loglikelihood`, `TemplateLM._encode_pair`,
`HFLM._loglikelihood_tokens`) does with a ``(context, continuation)`` request, done the same way:
the context's trailing spaces moved to the continuation, the whole text encoded and split after the
context's tokens (an empty context replaced by the BOS token, or EOS where there is none), one
forward over the right-padded rows ``(context + continuation)[:-1]`` without an attention mask (as
HFLM calls the model), a log-softmax, and per request the sum of the continuation tokens'
log-probabilities (float32, as HFLM sums them) and whether each of them was the argmax. Unlike
HFLM, a request longer than the policy's positions is refused, not truncated on the left.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def _prefix_token_id(hf_tokenizer: Any) -> int:
    """HFLM's `prefix_token_id`: BOS, or EOS for a tokenizer without one."""
    bos = hf_tokenizer.bos_token_id
    return int(bos if bos is not None else hf_tokenizer.eos_token_id)


def tok_encode(hf_tokenizer: Any, text: str) -> list[int]:
    """`HFLM.tok_encode` (``add_bos_token`` unset): the tokenizer's special tokens, none when the
    text already starts with the prefix token's text."""
    from lm_eval.models.utils import has_bos_prefix

    prefix = hf_tokenizer.decode(_prefix_token_id(hf_tokenizer))
    special = {"add_special_tokens": False} if has_bos_prefix(text, prefix) else {}
    return list(hf_tokenizer.encode(text, **special))


def encode_pair(hf_tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """A request's context and continuation ids, as `TemplateLM.loglikelihood` makes them."""
    if context == "":
        cont = list(hf_tokenizer.encode(continuation, add_special_tokens=False))
        prefix = _prefix_token_id(hf_tokenizer)
        return ([prefix], cont) if prefix != cont[0] else (cont[:1], cont[1:])
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = tok_encode(hf_tokenizer, context + continuation)
    context_enc = tok_encode(hf_tokenizer, context)
    return context_enc, whole[len(context_enc) :]


@torch.no_grad()
def score_requests(
    policy: Any, hf_tokenizer: Any, pairs: Sequence[tuple[str, str]], device: Any, where: str
) -> list[tuple[float, bool]]:
    """``(log-probability, is_greedy)`` of each ``(context, continuation)`` pair under `policy.model`.

    Raises:
        ValueError: a request does not fit the policy's positions (`where` names the eval set).
    """
    encoded = [encode_pair(hf_tokenizer, context, continuation) for context, continuation in pairs]
    rows = [(context + continuation)[:-1] for context, continuation in encoded]
    max_len = getattr(policy, "max_len", None)
    longest = max(len(r) for r in rows)
    if isinstance(max_len, int) and longest > max_len:
        raise ValueError(
            f"{where}: a context and choice of {longest + 1} tokens exceed the policy's {max_len} positions "
            "(the harness would cut the context on the left; we refuse): lower the task's num_fewshot"
        )
    ids = torch.full((len(rows), longest), int(policy.pad_id), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    logp = torch.log_softmax(policy.model(ids.to(device)).logits, dim=-1).cpu()
    out = []
    for i, (row, (_, continuation)) in enumerate(zip(rows, encoded, strict=True)):
        # The positions whose logits predict the continuation's tokens.
        scored = logp[i, len(row) - len(continuation) : len(row)]
        tokens = torch.tensor(continuation, dtype=torch.long)
        greedy = bool((scored.argmax(dim=-1) == tokens).all())
        out.append((float(scored.gather(-1, tokens[:, None]).squeeze(-1).sum()), greedy))
    return out
