"""Dropout of a Hugging Face policy is a stated choice (`policy.disable_dropout`, default true), applied
to the whole model, and every module trains in training mode whatever `from_pretrained` left.

Tiny random GPT-2 (``nn.Dropout`` modules) and Llama (an ``attention_dropout`` float) models with
dropout 0.1 in their configs, trained one step by Lightning's `Trainer` under its defaults.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch import nn

pytest.importorskip("transformers")
from hf_models import save_tiny_llama, tiny_tokenizer, write_gsm8k

from areal_lightning.app.builders import build_module
from areal_lightning.app.config import load_config

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
EXAMPLE = EXAMPLES / "math" / "gsm8k_grpo.yaml"
DROPOUT = 0.1


def _save_tiny_gpt2(path: Path) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = tiny_tokenizer()
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tok),
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=128,
        resid_pdrop=DROPOUT,
        embd_pdrop=DROPOUT,
        attn_pdrop=DROPOUT,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    GPT2LMHeadModel(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _save_tiny_llama_with_dropout(path: Path) -> Path:
    save_tiny_llama(path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "attention_dropout": DROPOUT}))
    return path


class ModesAtTraining(L.Callback):
    """What the module looks like when a training step starts."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        self.seen.append(
            {
                "eval_mode": [name for name, m in pl_module.named_modules() if not m.training],
                "dropout": {m.p for m in pl_module.modules() if isinstance(m, nn.Dropout)},
                "attention_dropout": {
                    m.attention_dropout
                    for m in pl_module.modules()
                    if isinstance(getattr(m, "attention_dropout", None), float)
                },
            }
        )


def _train_one_step(tmp_path: Path, model: Path, *overrides: str) -> dict[str, Any]:
    data = write_gsm8k(tmp_path / "gsm8k.jsonl", 4)
    cfg = load_config(
        EXAMPLE,
        [
            f"policy.path={model}",
            "policy.dtype=float32",
            "policy.attn_implementation=eager",
            "task.prompt_style=plain",
            f"task.path={data}",
            "task.verifier=numeric",
            f"eval_sets.gsm8k.path={data}",
            "trainer.accelerator=cpu",
            "grpo.group_size=2",
            "grpo.prompts_per_step=2",
            "grpo.max_new_tokens=4",
            *overrides,
        ],
    )
    module = build_module(cfg)
    probe = ModesAtTraining()
    L.Trainer(max_steps=1, accelerator="cpu", callbacks=[probe], default_root_dir=tmp_path, logger=False).fit(module)
    return probe.seen[0]


@pytest.mark.parametrize("save", [_save_tiny_gpt2, _save_tiny_llama_with_dropout], ids=["gpt2", "llama"])
def test_by_default_every_module_trains_in_training_mode_with_dropout_off(save: Any, tmp_path: Path) -> None:
    seen = _train_one_step(tmp_path, save(tmp_path / "model"))
    assert seen["eval_mode"] == []
    assert seen["dropout"] | seen["attention_dropout"] == {0.0}


def test_the_vlm_example_trains_every_module_in_training_mode_with_dropout_off(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    from hf_models import save_tiny_llava, write_geometry3k

    model = save_tiny_llava(tmp_path / "vlm")
    config = json.loads((model / "config.json").read_text())
    config["text_config"]["attention_dropout"] = DROPOUT
    (model / "config.json").write_text(json.dumps(config))
    spec = importlib.util.spec_from_file_location("geometry3k_grpo", EXAMPLES / "vlm" / "geometry3k_grpo.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    rows = example.load_problems(write_geometry3k(tmp_path / "geo.jsonl", 2))
    module = example.VisionGRPOModule(str(model), rows, group_size=2, prompts_per_step=2, max_new_tokens=4)
    probe = ModesAtTraining()
    L.Trainer(max_steps=1, accelerator="cpu", callbacks=[probe], default_root_dir=tmp_path, logger=False).fit(module)
    assert probe.seen[0]["eval_mode"] == []
    assert probe.seen[0]["attention_dropout"] == {0.0}


def test_disable_dropout_false_keeps_the_models_dropout_in_training_mode(tmp_path: Path) -> None:
    seen = _train_one_step(tmp_path, _save_tiny_gpt2(tmp_path / "model"), "policy.disable_dropout=false")
    assert seen["eval_mode"] == []
    assert seen["dropout"] == {DROPOUT}
