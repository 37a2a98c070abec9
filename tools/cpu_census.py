"""Where a run's CPU went, process by process, including the processes that were killed.

`/usr/bin/time` counts only the children that were waited for, and an exit hook misses a process
ended by a signal or by `os._exit` (vLLM's engines, the servers the tests kill, DDP ranks). This
reads every process's CPU time (`/proc/PID/stat`: utime + stime) once a second and keeps the last
value it saw, so a process is counted up to its last second.

    python3 tools/cpu_census.py record census.json -- make test     # runs the command, then reports
    python3 tools/cpu_census.py report census.json [--top 40]

The report groups processes by their command line (temporary paths, file descriptors and pids
taken out), with the CPU seconds and the number of processes of each group; the processes that ran
before the command started are left out. A process shorter than the interval may be missed, and
one seen first just after `fork` carries its parent's command line until it is seen again.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
INTERVAL_S = 1.0


def _sample(seen: dict[str, dict], me: int) -> None:
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            cpu = (int(fields[11]) + int(fields[12])) / TICKS
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue  # the process ended meanwhile
        key = f"{name}:{fields[19]}"  # pid and start time: a reused pid is another process
        entry = seen.setdefault(key, {"cmd": cmd, "first_cpu": cpu, "first": time.time()})
        if cmd:
            entry["cmd"] = cmd  # the last one: a process seen just after fork has exec'd since
        entry["cpu"] = cpu


def record(out: Path, command: list[str]) -> int:
    seen: dict[str, dict] = {}
    _sample(seen, os.getpid())
    before = set(seen)
    done = threading.Event()

    def sampler() -> None:
        while not done.wait(INTERVAL_S):
            _sample(seen, os.getpid())

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    start = time.time()
    try:
        status = subprocess.call(command)
    finally:
        done.set()
        thread.join()
        _sample(seen, os.getpid())
        for key in before:
            seen[key]["before"] = True
        out.write_text(json.dumps({"start": start, "end": time.time(), "processes": seen}))
    return status


def _group(cmd: str) -> str:
    cmd = re.sub(r"/tmp/[^\s'\"]*", "TMP", cmd)
    cmd = re.sub(r"\d+", "N", cmd)
    return cmd[:120] or "(no command line)"


def report(path: Path, top: int) -> None:
    data = json.loads(path.read_text())
    cpu: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for entry in data["processes"].values():
        used = entry["cpu"] - (entry["first_cpu"] if entry.get("before") else 0)
        group = ("(running before) " if entry.get("before") else "") + _group(entry["cmd"])
        cpu[group] += used
        count[group] += 1
    wall = data["end"] - data["start"]
    print(f"{wall:.0f} s of wall, {sum(cpu.values()):.0f} CPU-s seen, in {sum(count.values())} processes")
    for group, seconds in cpu.most_common(top):
        print(f"{seconds:8.1f} CPU-s {count[group]:5d}  {group}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    rec = sub.add_parser("record", help="run a command and record every process's CPU time")
    rec.add_argument("out", type=Path)
    rec.add_argument("command", nargs=argparse.REMAINDER)
    rep = sub.add_parser("report", help="the CPU seconds by command line")
    rep.add_argument("path", type=Path)
    rep.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    if args.action == "record":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            parser.error("record: give the command to run after --")
        status = record(args.out, command)
        report(args.out, 40)
        sys.exit(status)
    report(args.path, args.top)


if __name__ == "__main__":
    main()
