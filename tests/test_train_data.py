"""A resumed `fit` trains on the batches the uninterrupted one would have: `EpochShuffle` draws each
epoch's order from (seed, epoch), `ResumableLoader` holds the epoch's position in the checkpoint.

Real Lightning Trainers (one process, and DDP on 2 gloo ranks): a 14-step run of 4-batch epochs
checkpoints every step, then a fresh Trainer resumes from a step checkpoint (mid-epoch, at an
epoch's last batch, at an epoch's first) and must see the same (step, epoch, batch index, batch)
sequence and end its epochs at the same steps. A plain shuffled `DataLoader` fails this: a resumed
process replays epoch 0's order, and a mid-epoch resume starts the epoch's batches over.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from ddp_utils import run_ddp
from lightning.pytorch.callbacks import ModelCheckpoint

from areal_lightning.rl.grpo.train_data import EpochShuffle, ResumableLoader

SEED = 1
BATCH_SIZE = 3
BATCHES_PER_EPOCH = 4
MAX_STEPS = 14  # 3 whole epochs and half of a 4th
RESUME_STEPS = (1, 3, 4, 5, 10, 13)  # mid-epoch, an epoch's last batch, an epoch's first, ...
NOT_RESUMABLE = "your dataloader is not resumable"  # Lightning's warning on a mid-epoch resume


class BatchRecorder(L.LightningModule):
    """Records the batches it trains on, and the steps its epochs end at."""

    def __init__(self, n_samples: int) -> None:
        super().__init__()
        self.n_samples = n_samples
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[tuple[int, int, int, list[int]]] = []
        self.epoch_ends: list[int] = []

    def train_dataloader(self) -> ResumableLoader:
        data = list(range(self.n_samples))
        return ResumableLoader(data, batch_size=BATCH_SIZE, sampler=EpochShuffle(data, SEED))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.append((self.global_step, self.current_epoch, batch_idx, batch.tolist()))
        return self.w.sum() * 0

    def on_train_epoch_end(self) -> None:
        self.epoch_ends.append(self.global_step)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(n_samples: int, ckpt_dir: Path, ckpt_path: Path | None = None, **trainer: Any) -> BatchRecorder:
    module = BatchRecorder(n_samples)
    saves = ModelCheckpoint(dirpath=ckpt_dir, filename="{step}", every_n_train_steps=1, save_top_k=-1)
    L.Trainer(
        max_steps=MAX_STEPS,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[saves],
        **trainer,
    ).fit(module, ckpt_path=ckpt_path)
    return module


def _resumes(n_samples: int, tmp: Path, **trainer: Any) -> tuple[list[str], BatchRecorder]:
    """Mismatches between the uninterrupted run and each resume from `RESUME_STEPS` (empty: none),
    plus the resumes that got Lightning's not-resumable warning; and the uninterrupted run."""
    reference = _fit(n_samples, tmp / "reference", **trainer)
    assert len(reference.seen) == MAX_STEPS and reference.epoch_ends == [4, 8, 12, 14]
    problems = []
    for step in RESUME_STEPS:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            resumed = _fit(n_samples, tmp / f"from{step}", tmp / "reference" / f"step={step}.ckpt", **trainer)
        if resumed.seen != reference.seen[step:]:
            problems.append(f"from step {step}: {resumed.seen} != {reference.seen[step:]}")
        if resumed.epoch_ends != [end for end in reference.epoch_ends if end > step]:
            problems.append(f"from step {step}: epochs ended at {resumed.epoch_ends}")
        if any(NOT_RESUMABLE in str(w.message) for w in caught):
            problems.append(f"from step {step}: Lightning warned that the loader is not resumable")
    return problems, reference


def test_each_epochs_order_comes_from_the_seed_and_the_epoch_alone() -> None:
    orders = []
    for epoch in range(3):
        sampler = EpochShuffle(range(12), seed=SEED)  # a fresh one, as a resumed process builds it
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
        assert list(sampler) == orders[-1]
        assert sorted(orders[-1]) == list(range(12))
    assert len({tuple(order) for order in orders}) == 3  # each epoch its own order
    other_seed = EpochShuffle(range(12), seed=SEED + 1)
    assert list(other_seed) != orders[0]


def test_a_loader_state_continues_its_pass_once() -> None:
    loader = ResumableLoader(list(range(12)), batch_size=BATCH_SIZE)
    assert loader.state_dict() == {"batches": 0}  # a checkpoint before the first batch
    whole = [b.tolist() for b in loader]
    assert loader.state_dict() == {"batches": BATCHES_PER_EPOCH}

    resumed = ResumableLoader(list(range(12)), batch_size=BATCH_SIZE)
    resumed.load_state_dict({"batches": 1})
    assert [b.tolist() for b in resumed] == whole[1:]
    assert resumed.state_dict() == {"batches": BATCHES_PER_EPOCH}
    assert [b.tolist() for b in resumed] == whole  # the pass after is whole

    for finished_or_missing in ({"batches": BATCHES_PER_EPOCH}, {}):
        fresh = ResumableLoader(list(range(12)), batch_size=BATCH_SIZE)
        fresh.load_state_dict(finished_or_missing)
        assert [b.tolist() for b in fresh] == whole


def test_a_loader_without_a_length_is_refused() -> None:
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self) -> Any:
            return iter(range(12))

    class Unsized:  # a sampler without __len__
        def __iter__(self) -> Any:
            return iter(range(12))

    with pytest.raises(ValueError, match=r"^ResumableLoader needs a dataset and sampler with a length; got Stream "):
        ResumableLoader(Stream(), batch_size=BATCH_SIZE)
    with pytest.raises(ValueError, match=r"; got list with Unsized$"):
        ResumableLoader(list(range(12)), batch_size=BATCH_SIZE, sampler=Unsized())


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_resumed_fit_trains_on_the_uninterrupted_runs_batches(tmp_path: Path) -> None:
    problems, _ = _resumes(BATCH_SIZE * BATCHES_PER_EPOCH, tmp_path, accelerator="cpu", devices=1)
    assert not problems, "\n".join(problems)


def _ddp_resumes(rank: int, world_size: int, tmp: str) -> tuple[list[str], list[list[int]]]:
    warnings.filterwarnings("ignore", category=UserWarning)
    n_samples = world_size * BATCH_SIZE * BATCHES_PER_EPOCH
    problems, reference = _resumes(n_samples, Path(tmp), accelerator="cpu", devices=world_size, strategy="ddp")
    return problems, [batch for _, epoch, _, batch in reference.seen if epoch == 0]


@pytest.mark.ddp
def test_a_resumed_ddp_fit_trains_each_rank_on_its_uninterrupted_batches(tmp_path: Path) -> None:
    (problems0, epoch0_rank0), (problems1, epoch0_rank1) = run_ddp(_ddp_resumes, 2, str(tmp_path))
    assert not problems0 + problems1, "\n".join(problems0 + problems1)
    # Lightning's DistributedSampler took the sampler's place: the ranks share out each epoch.
    seen = [i for batch in epoch0_rank0 + epoch0_rank1 for i in batch]
    assert sorted(seen) == list(range(2 * BATCH_SIZE * BATCHES_PER_EPOCH))
