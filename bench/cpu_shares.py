#!/usr/bin/python3
"""Where the machine's CPU goes while a job runs as processes.

Runs the command after `--` in a session of its own, lets it warm up, then
reads every thread of every process of that session from /proc twice,
`--window_s` apart, and prints one JSON object: each (task, thread) pair's
CPU time as a fraction of the machine (cores x window), the same summed by
kind (a worker's main thread is its compute; UCX loops are named "ucx ...",
see UcxLoop), and the fraction the machine sat idle (/proc/stat).

  /usr/bin/python3 bench/cpu_shares.py -- build/shoal train --processes --transport ucx --max_steps 8000
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import time

TICKS = os.sysconf("SC_CLK_TCK")


def session_processes(sid):
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:  # field 6 of stat: the session id
                yield int(entry)
        except (OSError, IndexError):
            continue  # gone meanwhile


def task_of(pid):
    """"ps:0" / "worker:1" from the process's --task flag; "launcher" without."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return None
    for flag, value in zip(args, args[1:]):
        if flag == b"--task":
            match = re.match(r"/job:(\w+)/task:(\d+)", value.decode())
            if match:
                return f"{match.group(1)}:{match.group(2)}"
    return "launcher"


def sample(sid):
    """{(task, thread label): CPU seconds so far}"""
    seconds = collections.Counter()
    for pid in session_processes(sid):
        task = task_of(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    text = f.read()
            except OSError:
                continue
            name = text[text.index("(") + 1:text.rindex(")")]
            fields = text.rsplit(")", 1)[1].split()
            label = "main" if int(tid) == pid else name
            seconds[(task, label)] += (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
    return seconds


def idle_seconds():
    with open("/proc/stat") as f:
        cpu = f.readline().split()[1:]
    return (int(cpu[3]) + int(cpu[4])) / TICKS  # idle, iowait


def kind(task, label):
    role = task.split(":")[0]
    if label == "main":
        return f"{role} main threads"
    if label.startswith("ucx "):
        return f"{role} UCX loops"
    return f"{role} other threads"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--warmup_s", type=float, default=4)
    parser.add_argument("--window_s", type=float, default=4)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    flags = parser.parse_args()
    command = flags.command[1:] if flags.command[:1] == ["--"] else flags.command
    job = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL)
    time.sleep(flags.warmup_s)
    before, idle_before, start = sample(job.pid), idle_seconds(), time.monotonic()
    time.sleep(flags.window_s)
    after, idle_after, window = sample(job.pid), idle_seconds(), time.monotonic() - start
    if job.poll() is not None:
        sys.exit(f"the job ended before the window closed (exit {job.returncode}): run it longer")
    job.wait()
    capacity = os.cpu_count() * window
    # Each thread's share of the machine over the window (threads that did nothing left out).
    shares = {key: (spent - before.get(key, 0)) / capacity for key, spent in after.items()}
    shares = {key: share for key, share in shares.items() if share > 0}
    by_kind = collections.Counter()
    for (task, label), share in shares.items():
        by_kind[kind(task, label)] += share
    print(json.dumps({
        "command": command,
        "window_s": round(window, 2),
        "cores": os.cpu_count(),
        "machine_idle": round((idle_after - idle_before) / capacity, 3),
        "by_kind": {k: round(v, 3) for k, v in sorted(by_kind.items())},
        "by_thread": {f"{task} {label}": round(share, 3)
                      for (task, label), share in sorted(shares.items(), key=lambda item: -item[1])},
    }, indent=2))


if __name__ == "__main__":
    main()
