"""Tiny random-weight `transformers` models built in the test (the causal LM and the reward model
are the package's own, `rl/engines/hf/tiny_model.py`, which `areal-lightning tiny-model` writes),
a tiny LLaVA, and small GSM8K- and Geometry3K-format files: nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from areal_lightning.rl.engines.hf.tiny_model import save_tiny_llama, save_tiny_reward_model, tiny_tokenizer

__all__ = [
    "save_tiny_llama",
    "save_tiny_llava",
    "save_tiny_reward_model",
    "tiny_tokenizer",
    "write_geometry3k",
    "write_gsm8k",
]
PROBLEMS = [(a, b) for a in range(1, 6) for b in range(1, 5)]  # one-digit sums: a random model hits some


def write_gsm8k(path: Path, n: int, *, offset: int = 0) -> Path:
    """`n` GSM8K-format rows ({"question", "answer": "... #### N"}) as JSONL."""
    rows = []
    for i in range(offset, offset + n):
        a, b = PROBLEMS[i % len(PROBLEMS)]
        rows.append(
            {
                "question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
                "answer": f"{a} + {b} = {a + b}\n#### {a + b}",
                "level": f"L{i % 2}",
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


VLM_CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {% for c in m['content'] %}{% if c['type'] == 'image' %}"
    "<image>{% else %}{{ c['text'] }}{% endif %}{% endfor %} {% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)


def save_tiny_llava(path: Path, *, seed: int = 0) -> Path:
    """A random-weight LLaVA (CLIP vision tower, Llama text model) and its processor, saved to `path`."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tok = tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
        projection_dim=32,
    )
    text = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )
    torch.manual_seed(seed)
    LlavaForConditionalGeneration(config).save_pretrained(path)
    image_processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        patch_size=8,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=VLM_CHAT_TEMPLATE,
    ).save_pretrained(path)
    return path


def write_geometry3k(path: Path, n: int, *, seed: int = 0) -> Path:
    """`n` Geometry3K-style rows with random PNG images beside the JSONL file."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    (path.parent / "img").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(path.parent / "img" / f"{i}.png")
        rows.append({"image": f"img/{i}.png", "problem": f"Find x. The side is {i + 3}.", "answer": str(i + 3)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
