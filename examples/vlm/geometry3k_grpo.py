"""GRPO on Geometry3K-style problems (image + question -> answer) with a `transformers`
vision-language model, evaluated by `EvaluationCallback` with the user's own evaluate_fn.

The module is the user's own (not `GRPOModule`): it samples `group_size` answers per problem with
the model's `generate`, rewards each by its final answer, and takes a policy-gradient step with
group-relative advantages. `evaluate_fn` takes four steps: prepare data, run inference,
compute rewards, record metrics.

Data: a local JSONL file, one problem a line: ``{"image": "img/0.png", "problem": "...",
"answer": "14"}`` (image paths relative to the file). Model: a local directory holding an
image-text-to-text model and its processor (`save_pretrained`), e.g. a Qwen2-VL or LLaVA checkpoint.

Run:
    python examples/vlm/geometry3k_grpo.py --model /models/qwen2-vl-2b --data data/geometry3k/train.jsonl \
        --eval-data data/geometry3k/test.jsonl --steps 200 --accelerator gpu
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from areal_lightning.callbacks import EvaluationCallback
from areal_lightning.eval_round import EvalBatch, EvalContext
from areal_lightning.metrics import AccuracyMetric, RewardMetric
from areal_lightning.metrics.functional import group_advantages
from areal_lightning.rl.engines.hf.policy import zero_dropout
from areal_lightning.tasks.math_answers import WRONG_REWARD, final_answer, math_verify_score, numeric_score

CORRECT = 0.8  # a reward above 0.8 counts as correct (AccuracyMetric's default threshold)


def load_problems(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a Geometry3K-style JSONL file with `image` resolved to an absolute path."""
    path = Path(path)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for index, row in enumerate(rows):
        missing = {"image", "problem", "answer"} - set(row)
        if missing:
            raise ValueError(f"row {index} of {path} lacks {sorted(missing)}; fields present: {sorted(row)}")
        row["image"] = str((path.parent / row["image"]).resolve())
        row["index"] = index
    return rows


# Scored as `MathTask(verifier="auto")` scores: math-verify where installed, else the numeric fallback.
SCORE = math_verify_score if importlib.util.find_spec("math_verify") is not None else numeric_score


def geometric_reward(completion: str, answer: str) -> float:
    """1.0 when the completion's final answer equals the reference, else 0.0
    (a completion without a final answer included)."""
    score = SCORE(completion, answer)
    return WRONG_REWARD if score is None else score


class VisionGRPOModule(L.LightningModule):
    """GRPO of a vision-language model: `group_size` sampled answers per image-question pair.

    Args:
        model_dir: local directory of the model and its processor.
        train_rows: problems from `load_problems`.
        group_size, prompts_per_step, lr, max_new_tokens, temperature: GRPO settings.
    """

    def __init__(
        self,
        model_dir: str,
        train_rows: list[dict[str, Any]],
        *,
        group_size: int = 4,
        prompts_per_step: int = 2,
        lr: float = 1e-5,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        disable_dropout: bool = True,
    ) -> None:
        super().__init__()
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.model = AutoModelForImageTextToText.from_pretrained(model_dir, local_files_only=True)
        if disable_dropout:  # as HFPolicy: a training forward computes the policy that sampled
            zero_dropout(self.model)
        self.model.train()  # from_pretrained leaves the model in eval mode; the whole module trains
        self.processor = AutoProcessor.from_pretrained(model_dir, local_files_only=True)
        self.processor.tokenizer.padding_side = "left"  # generation continues every row at the right edge
        self.train_rows = train_rows
        self.group_size, self.prompts_per_step, self.lr = group_size, prompts_per_step, lr
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.seed = 0

    def encode(self, rows: Sequence[dict[str, Any]]) -> dict[str, Tensor]:
        """Images and questions through the processor's chat template, left-padded, on the device."""
        from PIL import Image

        messages = [
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": r["problem"]}]}] for r in rows
        ]
        texts = [self.processor.apply_chat_template(m, add_generation_prompt=True) for m in messages]
        images = [Image.open(r["image"]).convert("RGB") for r in rows]
        inputs = self.processor(images=images, text=texts, return_tensors="pt", padding=True)
        return {k: v.to(self.device) for k, v in inputs.items()}

    def sample(self, inputs: dict[str, Tensor], *, temperature: float, max_new_tokens: int) -> Tensor:
        """Completion ids [B, max_new_tokens] (EOS, then pad) after each prompt."""
        config = self.model.config
        image_token = getattr(config, "image_token_id", None) or getattr(config, "image_token_index", None)
        out = self.model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            pad_token_id=self.processor.tokenizer.pad_token_id,
            # an image placeholder in a completion would ask for an image that is not there
            suppress_tokens=[image_token] if image_token is not None else None,
        )
        completions = out[:, inputs["input_ids"].shape[1] :]
        pad = torch.full(
            (completions.shape[0], max_new_tokens - completions.shape[1]),
            self.processor.tokenizer.pad_token_id,
            dtype=completions.dtype,
            device=completions.device,
        )
        return torch.cat([completions, pad], dim=1)

    def decode(self, completions: Tensor) -> list[str]:
        return self.processor.batch_decode(completions, skip_special_tokens=True)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.train_rows,
            batch_size=self.prompts_per_step,
            shuffle=True,
            generator=torch.Generator().manual_seed(self.seed),
            collate_fn=list,
        )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.model.parameters(), lr=self.lr)

    def training_step(self, rows: list[dict[str, Any]], batch_idx: int) -> Tensor:
        g = self.group_size
        inputs = self.encode([r for r in rows for _ in range(g)])
        with torch.no_grad():
            completions = self.sample(inputs, temperature=self.temperature, max_new_tokens=self.max_new_tokens)
        rewards = torch.tensor(
            [
                geometric_reward(t, r["answer"])
                for t, r in zip(self.decode(completions), [r for r in rows for _ in range(g)], strict=True)
            ],
            device=self.device,
        )
        advantages = group_advantages(rewards.view(-1, g)).reshape(-1, 1)
        eos = self.processor.tokenizer.eos_token_id
        is_eos = completions == eos
        keep = ~((is_eos.cumsum(1) - is_eos.long()) > 0)  # up to and including the first EOS
        ids = torch.cat([inputs["input_ids"], completions], dim=1)
        mask = torch.cat([inputs["attention_mask"], keep.long()], dim=1)
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        logits = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, pixel_values=inputs["pixel_values"]
        ).logits[:, inputs["input_ids"].shape[1] - 1 : -1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, completions[..., None]).squeeze(-1)
        loss = -(advantages * logp * keep).sum() / keep.sum().clamp(min=1)
        self.log_dict({"train/reward": rewards.mean(), "train/loss": loss.detach()}, batch_size=len(rows))
        return loss


def evaluate_fn(module: VisionGRPOModule, batches: Sequence[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    """Evaluation of a geometry model: prepare data, run inference, compute rewards,
    record metrics. The callback already put the model in eval mode under `torch.no_grad()`."""
    reward = ctx.metric("reward", RewardMetric)  # metrics first: a rank dealt no batch still reduces them
    accuracy = ctx.metric("accuracy", lambda: AccuracyMetric(threshold=CORRECT))
    temperature = float(ctx.options.get("temperature", 0.0))
    max_new_tokens = int(ctx.options.get("max_new_tokens", module.max_new_tokens))
    for batch in batches:
        # 1. prepare data: images and questions on this rank's device
        inputs = module.encode(batch.samples)
        # 2. run inference (greedy by default; sampled rows are seeded by the batch's first sample)
        torch.manual_seed(batch.seeds[0])
        texts = module.decode(module.sample(inputs, temperature=temperature, max_new_tokens=max_new_tokens))
        # 3. compute rewards
        rewards = torch.tensor(
            [geometric_reward(t, s["answer"]) for t, s in zip(texts, batch.samples, strict=True)], device=ctx.device
        )
        # 4. record metrics (reduced across ranks once per round by the callback)
        reward.update(rewards)
        accuracy.update(rewards)
        ctx.num_samples += len(texts)
        for index, sample, text, r in zip(batch.indices, batch.samples, texts, rewards.tolist(), strict=True):
            ctx.record_sample(
                index,
                prompt=sample["problem"],
                completion=text,
                answer=sample["answer"],
                extracted=final_answer(text),
                reward=r,
            )
    return {}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="local directory of the model and its processor")
    parser.add_argument("--data", required=True, help="training problems (JSONL)")
    parser.add_argument("--eval-data", default=None, help="evaluation problems (JSONL); default: --data")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=50, help="evaluate every N steps")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--output-dir", default="runs/geometry3k-grpo")
    parser.add_argument(
        "--keep-dropout",
        action="store_true",
        help="keep the model's dropout in training steps (default: every dropout probability set to 0)",
    )
    args = parser.parse_args(argv)

    L.seed_everything(0, verbose=False)
    module = VisionGRPOModule(
        args.model,
        load_problems(args.data),
        group_size=args.group_size,
        prompts_per_step=args.prompts_per_step,
        lr=args.lr,
        max_new_tokens=args.max_new_tokens,
        disable_dropout=not args.keep_dropout,
    )
    evaluation = EvaluationCallback(
        {"geometry3k": load_problems(args.eval_data or args.data)},
        evaluate_fn,
        schedule={"freq_steps": args.eval_every, "eval_before_train": True},
        decisions={"metric_thresholds": {"reward": 0.85, "accuracy": 0.7}},
        output_dir=args.output_dir,
    )
    trainer = L.Trainer(
        max_steps=args.steps,
        accelerator=args.accelerator,
        devices=args.devices,
        logger=False,
        enable_checkpointing=False,
        callbacks=[evaluation],
        default_root_dir=args.output_dir,
    )
    trainer.fit(module)
    print(f"eval history: {Path(args.output_dir) / 'eval_history.jsonl'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
