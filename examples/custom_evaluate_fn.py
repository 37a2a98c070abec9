"""`EvaluationCallback` on your own LightningModule, with a torchmetrics text metric beside accuracy.

The module below is not ours: a word-by-word English-to-French "translator" (an embedding and a
linear layer) trained with cross-entropy. `evaluate_translation` is the user's `evaluate_fn`: it
translates each eval sentence and updates a BLEU score (`torchmetrics.text.BLEUScore`) and the
exact-match accuracy. The callback evaluates on its triggers, reduces both metrics across ranks,
logs ``eval/<set>/bleu`` and ``eval/<set>/accuracy`` to the Trainer's logger (a CSV file,
``<output-dir>/csv/version_0/metrics.csv``) and appends them to the eval history: any torchmetrics
metric, from accuracy to BLEU to reward. The Trainer keeps Lightning's defaults (progress bar, checkpoints).

Run:
    python examples/custom_evaluate_fn.py --steps 300 --eval-every 100
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import Tensor, nn
from torch.utils.data import DataLoader
from torchmetrics import MeanMetric
from torchmetrics.text import BLEUScore

from areal_lightning.callbacks import EvaluationCallback
from areal_lightning.eval_round import EvalBatch, EvalContext

DICTIONARY = {
    "one": "un",
    "two": "deux",
    "three": "trois",
    "cat": "chat",
    "dog": "chien",
    "red": "rouge",
    "big": "grand",
    "small": "petit",
    "house": "maison",
    "car": "voiture",
    "green": "vert",
    "sees": "voit",
}
SOURCE = sorted(DICTIONARY)
TARGET = sorted(set(DICTIONARY.values()))


def sentences(n: int, seed: int) -> list[tuple[str, str]]:
    """`n` (English, French) pairs of 3 to 6 words."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        words = [rng.choice(SOURCE) for _ in range(rng.randint(3, 6))]
        pairs.append((" ".join(words), " ".join(DICTIONARY[w] for w in words)))
    return pairs


class WordTranslator(L.LightningModule):
    """A user's own model: one target word per source word."""

    def __init__(self, lr: float = 0.05, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(len(SOURCE), width)
        self.out = nn.Linear(width, len(TARGET))
        self.lr = lr

    def forward(self, source_ids: Tensor) -> Tensor:
        return self.out(torch.tanh(self.embed(source_ids)))

    def translate(self, english: Sequence[str]) -> list[str]:
        translations = []
        for sentence in english:
            ids = torch.tensor([SOURCE.index(w) for w in sentence.split()], device=self.device)
            translations.append(" ".join(TARGET[i] for i in self(ids).argmax(-1).tolist()))
        return translations

    def training_step(self, batch: list[tuple[str, str]], batch_idx: int) -> Tensor:
        source = torch.tensor([SOURCE.index(w) for en, _ in batch for w in en.split()], device=self.device)
        target = torch.tensor([TARGET.index(w) for _, fr in batch for w in fr.split()], device=self.device)
        loss = nn.functional.cross_entropy(self(source), target)
        self.log("train/loss", loss, batch_size=len(batch))
        return loss

    def train_dataloader(self) -> DataLoader:
        return DataLoader(sentences(256, seed=0), batch_size=16, shuffle=True, collate_fn=list)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def evaluate_translation(module: WordTranslator, batches: Sequence[EvalBatch], ctx: EvalContext) -> dict[str, Any]:
    """Prepare data, run inference, compute scores, record metrics."""
    bleu = ctx.metric("bleu", lambda: BLEUScore(n_gram=2))  # sum states: exact across ranks
    accuracy = ctx.metric("accuracy", MeanMetric)
    for batch in batches:
        english = [en for en, _ in batch.samples]  # 1. prepare data
        french = module.translate(english)  # 2. run inference (eval mode, no grad: the callback's)
        references = [fr for _, fr in batch.samples]
        exact = torch.tensor(
            [f == r for f, r in zip(french, references, strict=True)], dtype=torch.float32
        )  # 3. compute
        bleu.update(french, [[r] for r in references])  # 4. record
        accuracy.update(exact.to(ctx.device))
        ctx.num_samples += len(french)
        for index, en, fr, ref in zip(batch.indices, english, french, references, strict=True):
            ctx.record_sample(index, prompt=en, completion=fr, answer=ref)
    return {}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--eval-size", type=int, default=64)
    parser.add_argument("--output-dir", default="runs/custom-evaluate-fn")
    args = parser.parse_args(argv)

    L.seed_everything(0, verbose=False)
    callback = EvaluationCallback(
        {"dev": sentences(args.eval_size, seed=1)},
        evaluate_translation,
        schedule={"freq_steps": args.eval_every, "eval_before_train": True},
        decisions={"metric_thresholds": {"bleu": 0.5, "accuracy": 0.7}},
        output_dir=args.output_dir,
    )
    trainer = L.Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        logger=CSVLogger(args.output_dir, name="csv"),
        callbacks=[callback],
        default_root_dir=args.output_dir,
    )
    trainer.fit(WordTranslator())
    print(f"eval history: {Path(args.output_dir) / 'eval_history.jsonl'}")
    print(f"logged metrics: {Path(trainer.logger.log_dir) / 'metrics.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
