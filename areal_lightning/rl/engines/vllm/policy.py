"""The policy and module as `rollout_evaluate` sees them when a vLLM engine generates (`VLLMEvaluator`).

`_EnginePolicy.generate_scored` maps one completion to one request, as `HFPolicy.generate` samples
it: its own seed, the eval set's sampling settings and stop strings. With scores, each request
asks vLLM for the sampled tokens' log-probabilities (``logprobs=0``; raw, vLLM's default mode) and
carries a key under which the engine's `EntropyRecorder` keeps its entropies.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from areal_lightning.rl.engines.generation import Generation
from areal_lightning.rl.policy import GeneratesFromScored, Generators

ENTROPY_REQUEST_KEY = "areal_entropy"  # as `rl.engines.vllm.entropy`'s (importing it would import vLLM)

_SEED_BITS = 63
_REQUESTS = itertools.count()  # names the requests whose entropies are recorded, unique in a process


def completion_seed(prompt_seed: int, sample: int) -> int:
    """The seed of the `sample`-th completion of a prompt: a hash of both, so that completions of
    one prompt differ and each depends on its own two numbers only (not on the batch or the rank).

    Example:
        >>> completion_seed(7, 0) == completion_seed(7, 0), completion_seed(7, 0) == completion_seed(7, 1)
        (True, False)
    """
    digest = hashlib.blake2b(f"{prompt_seed}:{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - _SEED_BITS)


class _EnginePolicy(GeneratesFromScored):
    """The policy as `rollout_evaluate` sees it, generating with the engine: `HFPolicy`'s outputs."""

    def __init__(self, engine: Any, policy: Any, stop: Sequence[str]) -> None:
        self.engine, self.policy = engine, policy
        self.eos_id, self.pad_id = policy.eos_id, policy.pad_id
        self.stop = [*policy.tokenizer.stop, *stop]

    def _params(
        self,
        generators: Sequence[torch.Generator],
        max_new_tokens: int,
        stop: list[str],
        keys: list[str] | None,
        **kw: Any,
    ) -> list[Any]:
        from vllm import SamplingParams

        params: list[Any] = []
        position: dict[int, int] = {}
        for row, g in enumerate(generators):
            # Rows of one prompt share its generator: the k-th of them is the prompt's k-th sample.
            k = position[id(g)] = position.get(id(g), -1) + 1
            params.append(
                SamplingParams(
                    n=1,
                    temperature=kw["temperature"],
                    top_p=kw["top_p"],
                    top_k=kw["top_k"] or 0,
                    seed=completion_seed(g.initial_seed(), k),
                    max_tokens=max_new_tokens,
                    ignore_eos=True,  # the policy's EOS below is the only end token, as in HFPolicy
                    stop_token_ids=[self.eos_id],
                    stop=stop or None,
                    include_stop_str_in_output=True,
                    detokenize=bool(stop),
                    logprobs=None if keys is None else 0,  # the sampled token's own, raw
                    extra_args=None if keys is None else {ENTROPY_REQUEST_KEY: keys[row]},
                )
            )
        return params

    def generate_scored(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        *,
        max_new_tokens: int,
        temperature: float,
        generators: Generators,
        top_p: float = 1.0,
        top_k: int | None = None,
        stop_at_eos: bool = True,
        stop: Sequence[str] = (),
        scores: bool = True,
    ) -> Generation:
        """`HFPolicy.generate_scored`'s contract: completions ended also at `stop` (one that produced a
        stop string gets an EOS after it, if there is room), with vLLM's raw log-probability of each
        sampled token and the `EntropyRecorder`'s entropy when `scores` (`rl.engines.generation`)."""
        rows = prompt_ids.shape[0]
        gens = [generators] * rows if isinstance(generators, torch.Generator) else list(generators)
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids.cpu(), prompt_mask.cpu(), strict=True)]
        keys = [f"areal-{next(_REQUESTS)}" for _ in range(rows)] if scores else None
        stops = [*self.stop, *(s for s in stop if s not in self.stop)]
        sampling = dict(temperature=temperature, top_p=top_p, top_k=top_k)
        outputs = self.engine.generate(prompts, self._params(gens, max_new_tokens, stops, keys, **sampling))
        out = torch.full((rows, max_new_tokens), self.pad_id, dtype=torch.long)
        stopped = torch.zeros(rows, dtype=torch.bool)
        recorded = self.engine.entropies(keys) if keys is not None else None
        logprobs, entropy, scored = (torch.zeros(rows, max_new_tokens) for _ in range(3))
        for row, output in enumerate(outputs):
            completion = output.outputs[0]
            tokens = list(completion.token_ids)[:max_new_tokens]
            if recorded is not None:
                n = len(tokens)
                logprobs[row, :n] = torch.tensor([completion.logprobs[i][t].logprob for i, t in enumerate(tokens)])
                entropy[row, :n] = torch.tensor(recorded[row][:n])
                scored[row, :n] = 1
            stopped[row] = isinstance(completion.stop_reason, str)
            if stopped[row] and len(tokens) < max_new_tokens:
                tokens.append(self.eos_id)
            out[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        device = prompt_ids.device
        if recorded is None:
            return Generation(out.to(device), stopped.to(device))
        return Generation(
            out.to(device), stopped.to(device), logprobs.to(device), entropy.to(device), scored.bool().to(device)
        )


class _EngineModule:
    """The module as `rollout_evaluate` sees it: its task, tokenizer and settings, the engine's policy."""

    def __init__(self, module: Any, policy: _EnginePolicy) -> None:
        self._module, self.policy = module, policy

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)
