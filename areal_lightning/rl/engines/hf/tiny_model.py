"""Tiny random-weight `transformers` models and their tokenizer, built from a config: a local model
directory to try a config with (``areal-lightning tiny-model DIR``) and the tests' models. Nothing
is downloaded; a random model's completions are noise, so its metrics show the pipeline, not skill.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

TEXTS = (
    "Question: Tom has 3 apples and buys 5 more. How many apples does he have?\nAnswer: 3 + 5 = 8 #### 8",
    "Question: What is 12 + 30?\nAnswer: The answer is 42. #### 42",
    "<user> <assistant> <system> Please reason step by step, and put your final answer within \\boxed{}.",
    "0123456789 + - * / = $ , . ? ! dollars cents",
)
"""What the tokenizer's BPE merges are learnt from (characters outside these lines are ``<unk>``)."""
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)
MAX_POSITIONS = 2048
"""Positions of the saved config: HumanEval's longest header (1,278 of these tokens) and a completion fit."""


def tiny_tokenizer(vocab_size: int = 80) -> Any:
    """A Metaspace BPE tokenizer (`PreTrainedTokenizerFast`) trained on `TEXTS`, with a chat template.

    Example:
        >>> tok = tiny_tokenizer()
        >>> tok.decode(tok.encode("3 + 5 = 8"), skip_special_tokens=True)
        '3 + 5 = 8'
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        TEXTS, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False)
    )
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", BOS_ID)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _llama_config(vocab_size: int, hidden: int, layers: int, max_positions: int, **extra: Any) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        **extra,
    )


def save_tiny_llama(
    path: str | Path,
    *,
    seed: int = 0,
    hidden: int = 32,
    layers: int = 2,
    digit_bias: float = 1.0,
    max_positions: int = MAX_POSITIONS,
) -> Path:
    """A random-weight Llama causal LM (24k parameters by default) and its tokenizer, saved with
    `save_pretrained` to `path`: a directory for ``policy.path`` or a judge.

    Args:
        path: the directory to write (created).
        seed: the weights' seed; the same seed writes the same weights.
        hidden: the width (a multiple of 4: four attention heads).
        layers: decoder layers.
        digit_bias: scales the output rows of the digit tokens; above 1, random completions are
            often short numbers (some right, some wrong, so rewards vary within a group).
        max_positions: the config's ``max_position_embeddings`` (an engine such as vLLM limits
            prompt plus completion to it).

    Example:
        >>> import tempfile
        >>> from transformers import AutoModelForCausalLM
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     AutoModelForCausalLM.from_pretrained(save_tiny_llama(tmp)).config.num_hidden_layers
        2
    """
    from transformers import LlamaForCausalLM

    tok = tiny_tokenizer()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(_llama_config(len(tok), hidden, layers, max_positions, initializer_range=0.1))
    with torch.no_grad():  # EOS likely enough that some completions end early, not all
        model.lm_head.weight[EOS_ID] *= 2
        digits = tok.convert_tokens_to_ids(list("0123456789"))
        model.lm_head.weight[digits] *= digit_bias
    return _save(model, tok, path)


def save_tiny_reward_model(path: str | Path, *, seed: int = 0, hidden: int = 32, layers: int = 1) -> Path:
    """A random-weight Llama with a one-score sequence-classification head and its tokenizer, saved
    to `path`: a directory for `RewardModelGrader` (its scores are continuous and random).

    Example:
        >>> import tempfile
        >>> from transformers import AutoModelForSequenceClassification
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     AutoModelForSequenceClassification.from_pretrained(save_tiny_reward_model(tmp)).config.num_labels
        1
    """
    from transformers import LlamaForSequenceClassification

    tok = tiny_tokenizer()
    torch.manual_seed(seed)
    model = LlamaForSequenceClassification(_llama_config(len(tok), hidden, layers, MAX_POSITIONS, num_labels=1))
    return _save(model, tok, path)


def _save(model: Any, tokenizer: Any, path: str | Path) -> Path:
    out = Path(path)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
