"""The Python tool environment (rl/episodes/tool_env.py): a tiny policy solves additions by running code in
the sandbox, the round counts its tool calls, and a hostile program changes nothing outside the
sandbox and leaves no process and no file behind."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from areal_lightning.app.config import load_config
from areal_lightning.eval_round import EvalSet, SamplingParams, run_round
from areal_lightning.rl.episodes.environments import EpisodeView
from areal_lightning.rl.episodes.make_environment import make_environment
from areal_lightning.rl.episodes.runner import Episode
from areal_lightning.rl.episodes.settings import EnvName, EpisodeSettings
from areal_lightning.rl.episodes.tool_env import FencedPython, PythonToolEnvironment
from areal_lightning.rl.episodes.training import episode_batch
from areal_lightning.rl.grpo.config import GRPOConfig
from areal_lightning.rl.grpo.module import GRPOModule
from areal_lightning.rl.policy import TinyPolicy
from areal_lightning.tasks.arithmetic import ArithmeticTask, Sample

pytestmark = pytest.mark.process

SFT_STEPS = 120
TOOL = EpisodeSettings(env=EnvName.PYTHON_TOOL, max_turns=2, tool_timeout_s=3.0)


def _processes_in(directory: str) -> list[int]:
    """Processes whose working directory is `directory` or below it (the sandbox's workers and programs)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if cwd == directory or cwd.startswith(directory + "/"):
            found.append(int(pid))
    return found


def _tool_transcript(task: ArithmeticTask, sample: Sample) -> Episode:
    """``3+4`` (a program), the tool's ``7=``, then the answer ``07``."""
    tok = task.tokenizer
    episode = Episode(sample, 0, 0, tok.encode(sample.prompt))
    episode.completion_ids = [
        [*tok.encode(sample.prompt[:-1], bos=False), tok.eos_id],
        [*tok.encode(sample.answer, bos=False), tok.eos_id],
    ]
    episode.observation_ids = [tok.encode_observation(f"{int(sample.answer)}=")]
    return episode


def _taught_to_use_the_tool(task: ArithmeticTask) -> TinyPolicy:
    """A tiny policy taught the tool's format on transcripts (the policy's tokens only, as GRPO's loss)."""
    tok = task.tokenizer
    torch.manual_seed(0)
    policy = TinyPolicy(
        tok.vocab_size, d_model=32, n_layers=2, n_heads=2, max_len=24, pad_id=tok.pad_id, eos_id=tok.eos_id
    )
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    samples, generator = task.train_samples(), torch.Generator().manual_seed(0)
    for _ in range(SFT_STEPS):
        picks = torch.randint(len(samples), (64,), generator=generator).tolist()
        b = episode_batch([_tool_transcript(task, samples[i]) for i in picks], tok, "cpu")
        logp, _ = policy.completion_logprobs(b["prompt_ids"], b["prompt_mask"], b["action_ids"])
        mine = b["loss_mask"].float()
        loss = -(logp * mine).sum() / mine.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return policy


@pytest.fixture
def tool_module() -> Iterator[GRPOModule]:
    task = ArithmeticTask(train_digits=1, train_size=100, seed=0)
    module = GRPOModule(_taught_to_use_the_tool(task), task, GRPOConfig(max_new_tokens=4), episodes=TOOL)
    yield module
    assert isinstance(module.environment, PythonToolEnvironment)
    module.environment.close()


def test_a_tiny_policy_solves_additions_by_running_code(tool_module: GRPOModule) -> None:
    samples = tool_module.task.make_samples("tool", digits=1, size=20)
    eval_set = EvalSet("tool", samples, batch_size=8, sampling=SamplingParams(n_samples=1, temperature=0.0))
    (result,) = run_round(
        tool_module, [eval_set], GRPOModule.evaluate, seed=1, global_step=0, epoch=0, max_table_rows=1
    )
    m = result.metrics
    assert m["tool/calls"] == 20 and m["tool/errors"] == 0 and m["tool/timeouts"] == 0
    assert m["success@1"] == 0.0 and m["success@2"] >= 0.9 and m["turns/mean"] == 2.0
    # Per turn: the first completions are programs (no final answer), the second ones answers.
    assert m["turn1/completion/no_answer"] == 1.0 and m["turn2/completion/no_answer"] <= 0.1
    assert m["completion/no_answer"] == pytest.approx((1.0 + m["turn2/completion/no_answer"]) / 2)
    first = samples[0]
    a, b = first.prompt[:-1].split("+")
    assert result.table_rows[0]["completion"] == f"{a}+{b} [{int(a) + int(b)}=] {first.answer}"
    assert m["reward/mean"] == pytest.approx(0.9 * m["success@2"])  # a right answer at turn 2 earns 0.9


def test_a_hostile_block_stays_in_the_sandbox(tmp_path: Path) -> None:
    outside = tmp_path / "escaped.txt"
    hostile = (
        "Let me check.\n```python\n"
        "import os, signal, time\n"
        f"open({str(outside)!r}, 'w').write('out')\n"
        "os.kill(os.getppid(), signal.SIGKILL)\n"
        "if os.fork() == 0:\n    os.setsid()\n    time.sleep(300)\n"
        "while True:\n    pass\n```"
    )
    env = PythonToolEnvironment(object(), timeout_s=2.0, syntax=FencedPython())
    sample = Sample(0, "What is 3+4?", "7")
    (answer,) = env.respond([EpisodeView(sample, (hostile,), (), 0)])
    assert answer.tool.called and (answer.tool.error or answer.tool.timeout) and not answer.done
    assert answer.observation.startswith("```output\n")
    assert not outside.exists()
    base = env.sandbox._base
    assert base is not None and _processes_in(base)  # the workers run there
    env.close()
    assert _processes_in(base) == [] and not Path(base).exists()


def test_the_config_builds_the_tool_environment_and_its_metrics() -> None:
    cfg = load_config(
        None, ["eval_sets.easy.size=4", "episodes.env=python_tool", "evaluator.metric_thresholds={tool/errors: 0.5}"]
    )
    assert cfg.episodes is not None
    env = make_environment(cfg.episodes, ArithmeticTask())
    assert isinstance(env, PythonToolEnvironment) and env.uses_tools
    env.close()
