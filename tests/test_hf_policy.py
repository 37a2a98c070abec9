"""HFPolicy: cached batched generation agrees token by token with an uncached forward of each row
alone; a row's sample depends on its seed only; log-probs match a direct computation; only local
model directories load."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from areal_lightning.rl.engines.hf.policy import HFPolicy, LocalModelNotFoundError, race_noise
from areal_lightning.rl.engines.hf.tokenizer import HFTokenizer, cut_after_stop_string
from areal_lightning.rl.policy import Policy

TEXTS = [
    "What is 12 + 30 ? The answer is 42 .",
    "Tom has 3 apples and buys 5 more , so he has 8 apples .",
    "<user> <assistant> <system> question answer #### 0123456789",
]
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)
PROMPTS = [
    "What is 1 + 2 ?",
    "Tom has",
    "3",
    "The answer is",
    "apples and buys 5 more , so he",
    "12 + 30",
    "What is 42 ? Tom has 8 apples .",
    "so",
]
MAX_NEW = 12


def _tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=60, special_tokens=SPECIALS, show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _model(arch: str, vocab: int) -> torch.nn.Module:
    torch.manual_seed(0)
    ids = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "initializer_range": 0.1}
    if arch == "llama":  # rotary positions: left padding must not shift them, and the cache must advance
        model = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=vocab,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                **ids,
            )
        )
    else:  # learned absolute positions and dropout 0.1: positions must come from the mask
        model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=64, **ids))
    with torch.no_grad():  # make EOS likely enough that some completions end before max_new_tokens, not all
        model.lm_head.weight[2] *= 2
    return model


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def model_dir(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    tok = _tokenizer()
    _model(request.param, len(tok)).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def policy(model_dir) -> HFPolicy:
    return HFPolicy.from_pretrained(model_dir)


def _seeds(*seeds: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(s) for s in seeds]


def _row_logits(policy: HFPolicy, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion: torch.Tensor):
    """Logits predicting each completion token, from an uncached forward of the row alone, unpadded."""
    prompt = prompt_ids[prompt_mask]
    with torch.no_grad():
        logits = policy.model(input_ids=torch.cat([prompt, completion])[None]).logits[0]
    return logits[len(prompt) - 1 : -1]


def _until_eos(row: torch.Tensor, eos: int) -> torch.Tensor:
    ends = (row == eos).nonzero()
    return row[: int(ends[0]) + 1] if len(ends) else row


def test_from_pretrained_loads_a_local_directory_as_a_policy(policy):
    assert isinstance(policy, Policy)
    assert (policy.eos_id, policy.pad_id) == (2, 0)
    # The whole model in training mode (from_pretrained leaves it in eval mode), dropout off by default.
    assert all(m.training for m in policy.modules())


def test_from_pretrained_refuses_missing_paths_and_hub_names(tmp_path):
    for name in [tmp_path / "nope", "Qwen/Qwen2.5-0.5B-Instruct"]:
        with pytest.raises(LocalModelNotFoundError, match=r"no such local directory.*never downloads models"):
            HFPolicy.from_pretrained(name)
    with pytest.raises(FileNotFoundError, match=r"has no config.json"):
        HFPolicy.from_pretrained(tmp_path)


def test_from_pretrained_rejects_an_unknown_dtype(model_dir):
    with pytest.raises(ValueError, match=r"`HFPolicy.from_pretrained\(dtype='fp8'\)`. Possible choices are: float32"):
        HFPolicy.from_pretrained(model_dir, dtype="fp8")


def test_completion_logprobs_match_a_full_forward_of_each_row_alone(policy):
    ids, mask = policy.encode_prompts(PROMPTS[:4])
    completions = torch.randint(4, len(policy.tokenizer.tokenizer), (4, 6), generator=torch.Generator().manual_seed(0))
    completions[1, 2], completions[1, 3:] = policy.eos_id, policy.pad_id
    completions[3, 0], completions[3, 1:] = policy.eos_id, policy.pad_id
    temperature = 0.7
    logp, entropy = policy.completion_logprobs(ids, mask, completions, temperature=temperature)
    assert logp.shape == entropy.shape == completions.shape
    for row in range(4):
        n = len(_until_eos(completions[row], policy.eos_id))
        ref = F.log_softmax(_row_logits(policy, ids[row], mask[row], completions[row]) / temperature, dim=-1)
        expected = ref[torch.arange(n), completions[row, :n]]
        torch.testing.assert_close(logp[row, :n], expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(entropy[row, :n], -(ref.exp() * ref).sum(-1)[:n], atol=1e-5, rtol=1e-5)
        assert (logp[row, n:] == 0).all() and (entropy[row, n:] == 0).all()  # after EOS: masked


def test_completion_logprobs_carry_gradients_and_ignore_training_mode(policy):
    ids, mask = policy.encode_prompts(PROMPTS[:2])
    completions = torch.full((2, 3), 5)
    policy.train()  # GPT-2 has dropout 0.1 unless the policy disabled it
    try:
        a, _ = policy.completion_logprobs(ids, mask, completions)
        b, _ = policy.completion_logprobs(ids, mask, completions)
    finally:
        policy.eval()
    torch.testing.assert_close(a, b)
    a.sum().backward()
    assert policy.model.lm_head.weight.grad is not None
    policy.model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_every_generated_token_matches_an_uncached_forward(policy, temperature):
    ids, mask = policy.encode_prompts(PROMPTS)
    seeds = list(range(100, 100 + len(PROMPTS)))
    out = policy.generate(ids, mask, max_new_tokens=MAX_NEW, temperature=temperature, generators=_seeds(*seeds))
    checked = 0
    for row, seed in enumerate(seeds):
        completion = _until_eos(out[row], policy.eos_id)
        logits = _row_logits(policy, ids[row], mask[row], completion)
        if temperature == 0:
            expected = logits.argmax(-1)
        else:  # the row's t-th step draws the t-th vocab-sized vector of its own generator
            g = torch.Generator().manual_seed(seed)
            noise = torch.stack([race_noise(g, 1, logits.shape[-1], logits.device)[0] for _ in completion])
            expected = (logits / temperature - noise.log()).argmax(-1)
        assert torch.equal(completion, expected), f"row {row}"
        checked += len(completion)
    assert checked > 2 * len(PROMPTS)


def test_completions_end_with_eos_then_padding(policy):
    ids, mask = policy.encode_prompts(PROMPTS)
    out = policy.generate(ids, mask, max_new_tokens=MAX_NEW, temperature=1.0, generators=_seeds(*range(8)))
    assert out.shape == (len(PROMPTS), MAX_NEW)
    ended = 0
    for row in out:
        n = len(_until_eos(row, policy.eos_id))
        if n < MAX_NEW:
            ended += 1
            assert row[n - 1] == policy.eos_id and (row[n:] == policy.pad_id).all()
    assert ended > 0  # the fixture makes EOS likely; a test without an EOS would check nothing


def test_greedy_sample_is_the_same_alone_and_in_a_batch_of_eight(policy):
    ids, mask = policy.encode_prompts(PROMPTS)
    assert len(set(mask.sum(1).tolist())) > 4  # neighbours of different lengths
    batch = policy.generate(ids, mask, max_new_tokens=MAX_NEW, temperature=0.0, generators=torch.Generator())
    for row, prompt in enumerate(PROMPTS):
        alone = policy.generate(
            *policy.encode_prompts([prompt]), max_new_tokens=MAX_NEW, temperature=0.0, generators=torch.Generator()
        )
        assert torch.equal(alone[0], batch[row]), f"row {row}"


def test_sampled_completion_depends_on_its_own_seed_only(policy):
    ids, mask = policy.encode_prompts(PROMPTS)
    seeds = [7, 8, 9, 10, 11, 12, 13, 14]
    batch = policy.generate(ids, mask, max_new_tokens=MAX_NEW, temperature=1.0, generators=_seeds(*seeds))
    for row, prompt in enumerate(PROMPTS):
        alone = policy.generate(
            *policy.encode_prompts([prompt]), max_new_tokens=MAX_NEW, temperature=1.0, generators=_seeds(seeds[row])
        )
        assert torch.equal(alone[0], batch[row]), f"row {row}"
    same_prompt = ids[:1].repeat(8, 1), mask[:1].repeat(8, 1)
    other = policy.generate(*same_prompt, max_new_tokens=MAX_NEW, temperature=1.0, generators=_seeds(*range(8)))
    assert len({tuple(r) for r in other.tolist()}) > 1  # different seeds, different samples


def test_generate_checks_its_arguments(policy):
    ids, mask = policy.encode_prompts(PROMPTS[:3])
    with pytest.raises(ValueError, match="got 2 generators for 3 rows"):
        policy.generate(ids, mask, max_new_tokens=4, temperature=1.0, generators=_seeds(1, 2))
    with pytest.raises(ValueError, match=r"max_new_tokens=0\)` must be a positive integer"):
        policy.generate(ids, mask, max_new_tokens=0, temperature=1.0, generators=torch.Generator())
    with pytest.raises(ValueError, match=r"temperature=-1.0\)` must be >= 0"):
        policy.generate(ids, mask, max_new_tokens=4, temperature=-1.0, generators=torch.Generator())
    one = policy.generate(ids, mask, max_new_tokens=4, temperature=1.0, generators=torch.Generator().manual_seed(3))
    again = policy.generate(ids, mask, max_new_tokens=4, temperature=1.0, generators=torch.Generator().manual_seed(3))
    assert torch.equal(one, again)  # one generator shared by the batch is reproducible too


def test_stop_string_ends_a_completion_with_eos(model_dir):
    plain = HFPolicy.from_pretrained(model_dir)
    ids, mask = plain.encode_prompts(PROMPTS)
    free = plain.generate(ids, mask, max_new_tokens=MAX_NEW, temperature=0.0, generators=torch.Generator())
    row = max(range(len(PROMPTS)), key=lambda r: len(plain.decode_completions(free[r : r + 1])[0]))
    text = plain.decode_completions(free[row : row + 1])[0]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    stopping = HFPolicy.from_pretrained(model_dir, stop=[stop])
    out = stopping.generate(
        ids[row : row + 1], mask[row : row + 1], max_new_tokens=MAX_NEW, temperature=0.0, generators=torch.Generator()
    )[0]
    n = len(_until_eos(out, plain.eos_id))
    assert n < len(_until_eos(free[row], plain.eos_id)) and out[n - 1] == plain.eos_id
    assert torch.equal(out[: n - 1], free[row, : n - 1])  # the same tokens up to the stop
    assert (out[n:] == plain.pad_id).all()
    decoded = stopping.decode_completions(out[None])[0]
    assert decoded.endswith(stop) and text.startswith(decoded)


def test_prompts_encode_plain_or_through_the_chat_template(model_dir):
    plain = HFPolicy.from_pretrained(model_dir)
    chat = HFPolicy.from_pretrained(model_dir, chat=True, system_prompt="answer")
    ids, mask = plain.encode_prompts(["3", "Tom has"])
    assert ids[0].tolist()[-2:] == [1, plain.tokenizer.tokenizer.convert_tokens_to_ids("▁3")]  # BOS, then the prompt
    assert mask[1].all() and mask[0].sum() == 2 and not mask[0, 0]  # left padded
    chat_ids = chat.tokenizer.encode("3")
    text = chat.tokenizer.tokenizer.decode(chat_ids)
    assert text.replace(" ", "") == "<bos><system>answer<user>3<assistant>" and chat_ids.count(1) == 1  # one BOS


def test_hf_tokenizer_checks_its_options(model_dir):
    tok = _tokenizer()
    with pytest.raises(ValueError, match="needs chat=True"):
        HFTokenizer(tok, system_prompt="hi")
    tok.chat_template = None
    with pytest.raises(ValueError, match="has no chat template"):
        HFTokenizer(tok, chat=True)
    with pytest.raises(ValueError, match="takes chat, system_prompt, stop and eos_id from that HFTokenizer"):
        HFPolicy(torch.nn.Linear(1, 1), HFTokenizer(tok), chat=True)
    assert cut_after_stop_string("a b. c. d", [". ", "c"]) == "a b. "
