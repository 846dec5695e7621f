#!/usr/bin/python3
"""A bounded chaos soak: jobs over processes, with checkpoints, while a random
task is killed or frozen every little while. Not part of the default suite.

For each mode it trains once undisturbed and once under faults, then checks:
  - the disturbed job finished (exit 0, a result);
  - no update was applied twice and the steps lost per ps loss are at most the
    checkpoint interval (plus the steps in flight when the ps died): from the
    job's own ledger, the steps the workers made against the global step;
  - its test accuracy is within 1 point of the undisturbed run's.

Faults, every 20-40% of the undisturbed run's time (uniform, so about three a
run on any machine; at least 2-4 s apart): SIGKILL of a ps task (the launcher
restarts it, the chief restores the newest checkpoint), or SIGSTOP of any
task for 1-3 s, then SIGCONT. A disturbed run that saw no fault fails: it
would have checked nothing. Workers are not killed: a killed worker takes
its step count with it, and the ledger would no longer balance.

    /usr/bin/python3 scripts/chaos_soak.py                 # about 7 minutes
    /usr/bin/python3 scripts/chaos_soak.py --quick         # about 2 minutes

--elastic: async, sync (2 of 3 workers' gradients a step), model_average,
downpour and easgd jobs, and an async click job (its table rows leased too),
on leased data (data.leases) whose workers come and go. Every
little while one of: SIGKILL of a worker (the launcher starts it again; its
lease runs out and another worker takes the shard over), SIGSTOP of a worker
for 1-4 s (past the 2 s lease timeout: its shard is taken over and its late
update refused), a worker added (SIGUSR1 to the launcher) or removed
(SIGUSR2: the newest worker leaves), or SIGKILL of a ps task (the launcher
starts it again, empty, and the chief restores the newest checkpoint onto
every task, each task at the watermarks saved with its own shard).
Checkpoints every 100 steps, taken while the workers train. Then checks,
from every ps task's exactly-once ledger, that no example of a finished epoch
was lost and none applied twice (the click job's table shards too), and
that accuracy is within 1 point of an undisturbed run (the click job's AUC
within 0.01); and prints the takeover and join times.

    /usr/bin/python3 scripts/chaos_soak.py --elastic          # about 18 minutes
    /usr/bin/python3 scripts/chaos_soak.py --elastic --quick  # about 3 minutes
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def children_of(pid):
    """(pid, command line) of each process whose parent is `pid`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            parent = int(stat[stat.rindex(")") + 2:].split()[1])
            if parent != pid:
                continue
            with open(f"/proc/{name}/cmdline") as f:
                found.append((int(name), f.read().replace("\0", " ")))
        except (OSError, ValueError):
            continue
    return found


def run_job(shoal, mode, epochs, every_steps, workdir, faults=None, interval=(2, 4), seed=0):
    """Runs one job; returns (exit code, result dict or None, fault log)."""
    checkpoints = os.path.join(workdir, f"{mode}_{'chaos' if faults else 'calm'}_ckpt")
    config = os.path.join(workdir, f"{mode}.yaml")
    with open(config, "w") as f:
        f.write(f"cluster: {{ps: 2, workers: 2, max_restarts: 50}}\n"
                f"training: {{mode: {mode}, epochs: {epochs}}}\n"
                f"checkpoint: {{dir: {checkpoints}, every_steps: {every_steps}, keep: 3}}\n")
    result_file = os.path.join(workdir, f"{mode}_{'chaos' if faults else 'calm'}.json")
    launcher = subprocess.Popen([shoal, "train", "--processes", "--quiet", "--config", config,
                                 "--result_file", result_file], stderr=subprocess.PIPE, text=True)
    log, stderr_lines = [], []
    reader = threading.Thread(target=lambda: stderr_lines.extend(launcher.stderr), daemon=True)
    reader.start()
    rng = random.Random(seed)
    next_fault = time.time() + rng.uniform(*interval)
    while launcher.poll() is None:
        time.sleep(0.2)
        if not faults or time.time() < next_fault:
            continue
        next_fault = time.time() + rng.uniform(*interval)
        tasks = [(pid, cmd) for pid, cmd in children_of(launcher.pid) if "--task" in cmd]
        ps = [(pid, cmd) for pid, cmd in tasks if "/job:ps/" in cmd]
        if ps and rng.random() < 0.5:
            pid, cmd = rng.choice(ps)
            os.kill(pid, signal.SIGKILL)
            log.append(("kill", cmd.split("--task ")[1].split()[0]))
        elif tasks:
            pid, cmd = rng.choice(tasks)
            pause = rng.uniform(1, 3)
            os.kill(pid, signal.SIGSTOP)
            time.sleep(pause)
            os.kill(pid, signal.SIGCONT)
            log.append((f"freeze {pause:.1f}s", cmd.split("--task ")[1].split()[0]))
    reader.join(timeout=5)
    result = None
    if os.path.exists(result_file):
        with open(result_file) as f:
            result = json.load(f)
    if launcher.returncode != 0:
        sys.stderr.write("".join(stderr_lines[-20:]))
    return launcher.returncode, result, log


def signal_task(pid, sig):
    """Sends `sig`; False if the task ended meanwhile."""
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def click_log(workdir):
    """A generated click log with a planted model (bench/criteo_gen.py) for
    the click mode: its training and test files."""
    train, test = os.path.join(workdir, "clicks.tsv"), os.path.join(workdir, "clicks_test.tsv")
    if not os.path.exists(train):
        subprocess.run([sys.executable, os.path.join(ROOT, "bench", "criteo_gen.py"), "--examples", "100000",
                        "--vocabulary", "20000", "--out", train, "--test_out", test, "--test_examples", "20000"],
                       check=True, stdout=subprocess.DEVNULL)
    return train, test


def run_elastic_job(shoal, mode, epochs, workdir, faults=None, interval=(2, 4), seed=0):
    """One job on leased data; returns (exit code, result dict or None, fault log).
    Mode `click`: the click model (a 200,000 x 16 table over the 2 ps tasks,
    async) on a generated click log, whose table rows are leased too."""
    tag = f"{mode}_{'chaos' if faults else 'calm'}"
    config = os.path.join(workdir, f"{tag}.yaml")
    training = f"mode: {'async' if mode == 'click' else mode}, epochs: {epochs}"
    if mode == "sync":
        training += ", replicas_to_aggregate: 2"  # a backup worker: its late gradients are dropped
    data = "leases: true, lease_timeout_s: 2"
    model = ""
    every_steps = 100
    if mode == "click":
        train, test = click_log(workdir)
        data += f", format: criteo, train_file: {train}, test_file: {test}"
        model = ("model: {kind: click, click: {rows: 200000, dim: 16, hidden: [64, 32], "
                 "optimizer: {kind: adagrad, learning_rate: 0.05}}}\n")
        training += ", batch_size: 256"
        every_steps = 200
    with open(config, "w") as f:
        f.write(f"cluster: {{ps: 2, workers: 3, max_restarts: 100}}\n"
                f"training: {{{training}}}\n"
                f"data: {{{data}}}\n" + model +
                f"checkpoint: {{dir: {os.path.join(workdir, tag + '_ckpt')}, every_steps: {every_steps}, keep: 2}}\n")
    result_file = os.path.join(workdir, f"{tag}.json")
    launcher = subprocess.Popen([shoal, "train", "--processes", "--quiet", "--config", config,
                                 "--result_file", result_file], stderr=subprocess.PIPE, text=True)
    log, stderr_lines = [], []
    reader = threading.Thread(target=lambda: stderr_lines.extend(launcher.stderr), daemon=True)
    reader.start()
    rng = random.Random(seed)
    next_fault = time.time() + rng.uniform(*interval)
    added = 0
    while launcher.poll() is None:
        time.sleep(0.2)
        if not faults or time.time() < next_fault:
            continue
        next_fault = time.time() + rng.uniform(*interval)
        tasks = children_of(launcher.pid)
        workers = [(pid, cmd) for pid, cmd in tasks if "/job:worker/" in cmd]
        ps = [(pid, cmd) for pid, cmd in tasks if "/job:ps/" in cmd]
        if not workers:
            continue
        kind = rng.choice(["kill", "freeze", "add", "remove", "kill-ps"])
        if kind == "kill-ps" and ps:
            # The launcher starts it again, empty; the chief restores the
            # newest checkpoint onto every task, each with its own marks.
            pid, cmd = rng.choice(ps)
            if signal_task(pid, signal.SIGKILL):
                log.append(("ps-kill", cmd.split("--task ")[1].split()[0]))
        elif kind == "kill-ps":
            continue
        elif kind == "add" or (kind == "remove" and added == 0):
            launcher.send_signal(signal.SIGUSR1)
            added += 1
            log.append(("add", ""))
        elif kind == "remove":
            launcher.send_signal(signal.SIGUSR2)
            added -= 1
            log.append(("remove", ""))
        elif kind == "kill":
            pid, cmd = rng.choice(workers)
            if signal_task(pid, signal.SIGKILL):
                log.append(("kill", cmd.split("--task ")[1].split()[0]))
        else:
            pid, cmd = rng.choice(workers)
            pause = rng.uniform(1, 4)
            if not signal_task(pid, signal.SIGSTOP):
                continue  # it ended meanwhile
            time.sleep(pause)
            signal_task(pid, signal.SIGCONT)
            log.append((f"freeze {pause:.1f}s", cmd.split("--task ")[1].split()[0]))
    reader.join(timeout=5)
    result = None
    if os.path.exists(result_file):
        with open(result_file) as f:
            result = json.load(f)
    if launcher.returncode != 0:
        sys.stderr.write("".join(stderr_lines[-20:]))
    return launcher.returncode, result, log


def elastic_main(args):
    # About 100 s each undisturbed on 2 cores (--quick: about 25 s).
    epochs = {"async": 40, "sync": 25, "model_average": 60, "downpour": 40, "easgd": 40, "click": 60}
    if args.quick:
        epochs = {m: max(6, e // 4) for m, e in epochs.items()}
    modes = [m for m in (args.modes or ",".join(epochs)).split(",") if m in epochs]
    rows, ok = [], True
    with tempfile.TemporaryDirectory(prefix="shoal-elastic-") as workdir:
        for mode in modes:
            e = epochs[mode]
            start = time.time()
            calm_code, calm, _ = run_elastic_job(args.shoal, mode, e, workdir)
            calm_s = time.time() - start
            interval = (max(2.0, 0.06 * calm_s), max(4.0, 0.12 * calm_s))
            start = time.time()
            code, chaos, log = run_elastic_job(args.shoal, mode, e, workdir, faults=True, interval=interval,
                                               seed=args.seed)
            chaos_s = time.time() - start
            checks = []
            if calm_code != 0 or calm is None:
                checks.append("undisturbed run failed")
            if code != 0 or chaos is None:
                checks.append("disturbed run failed")
            if not log:
                checks.append("no fault was injected")
            ledger = (chaos or {}).get("data_ledger", {})
            if chaos is not None:
                if not ledger.get("leased"):
                    checks.append("the result has no ledger")
                if ledger.get("places_missing", 1) != 0:
                    checks.append(f"{ledger.get('places_missing')} examples lost")
                if ledger.get("places_repeated", 1) != 0:
                    checks.append(f"{ledger.get('places_repeated')} examples applied twice")
                if ledger.get("epochs_finished", 0) != e:  # a leased job ends when its data is over
                    checks.append(f"{ledger.get('epochs_finished')} epochs finished, not {e}")
            # The click job's figure is its test AUC.
            metric = "test_auc" if mode == "click" else "test_accuracy"
            if calm is not None and chaos is not None and abs(calm[metric] - chaos[metric]) > 0.01:
                checks.append(f"{metric} differs by more than 0.01")
            ps_kills = sum(1 for k, _ in log if k == "ps-kill")
            if chaos is not None and ps_kills and chaos.get("restores", 0) == 0:
                checks.append("a ps task was killed but nothing was restored")
            if mode == "click" and ledger.get("table_ledgers", 0) == 0:
                checks.append("the table rows' ledgers are missing")
            ok = ok and not checks
            count = lambda kind: sum(1 for k, _ in log if k.startswith(kind))
            shown = (lambda r: f"AUC {r[metric]:.4f}") if mode == "click" else (lambda r: f"{r[metric] * 100:.2f}%")
            rows.append((mode, e, shown(calm) if calm else "-", shown(chaos) if chaos else "-",
                         f"{count('kill')} / {count('freeze')} / {count('add')} / {count('remove')} / "
                         f"{ps_kills} ({(chaos or {}).get('restores', 0)} restores)",
                         ledger.get("epochs_finished", "-"), ledger.get("places_applied", "-"),
                         ledger.get("places_missing", "-"), ledger.get("places_repeated", "-"),
                         f"{ledger.get('takeovers', 0)}: {ledger.get('takeover_seconds_mean', 0):.2f} / "
                         f"{ledger.get('takeover_seconds_max', 0):.2f}",
                         f"{ledger.get('joins', 0)}: {ledger.get('join_seconds_mean', 0):.2f}",
                         f"{calm_s:.0f} / {chaos_s:.0f}", "ok" if not checks else "; ".join(checks)))
            print(f"{mode}: faults {log}", flush=True)
    print("\n| mode | epochs | accuracy undisturbed | accuracy with faults "
          "| workers killed / frozen / added / removed / ps killed | epochs finished | examples applied | lost | twice | takeovers: s mean / max "
          "| joins: s to first update | seconds (calm / chaos) | verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    return 0 if ok else 1


def lost_steps(mode, result, workers=2):
    """Steps the workers made that the job no longer counts (rewound by
    restores); negative would mean updates applied twice."""
    made = result["worker_steps"]
    if mode == "sync":  # every worker makes every step
        made = made / workers
    return made - result["global_step"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shoal", default=os.path.join(ROOT, "build", "shoal"))
    parser.add_argument("--modes", help="comma-separated (default: async,sync,model_average; "
                        "with --elastic also downpour and easgd)")
    parser.add_argument("--quick", action="store_true", help="shorter jobs, checkpoints every 200 steps")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--elastic", action="store_true", help="leased data; workers killed, frozen, added, removed")
    args = parser.parse_args()
    if args.elastic:
        return elastic_main(args)
    # 45-100 s each, undisturbed, on 2 cores.
    epochs = {"async": 60, "sync": 45, "downpour": 60, "model_average": 120}
    every_steps = 500
    if args.quick:
        epochs = {m: max(4, e // 6) for m, e in epochs.items()}
        every_steps = 200
    rows, ok = [], True
    with tempfile.TemporaryDirectory(prefix="shoal-soak-") as workdir:
        for mode in (args.modes or "async,sync,model_average").split(","):
            e = epochs.get(mode, 10)
            start = time.time()
            calm_code, calm, _ = run_job(args.shoal, mode, e, every_steps, workdir)
            calm_s = time.time() - start
            # Faults spaced by the job's own length: a faster machine (or
            # build) must not leave the disturbed run with none.
            interval = (max(2.0, 0.2 * calm_s), max(4.0, 0.4 * calm_s))
            start = time.time()
            code, chaos, log = run_job(args.shoal, mode, e, every_steps, workdir, faults=True, interval=interval,
                                       seed=args.seed)
            chaos_s = time.time() - start
            kills = sum(1 for kind, _ in log if kind == "kill")
            freezes = len(log) - kills
            checks = []
            if calm_code != 0 or calm is None:
                checks.append("undisturbed run failed")
            if code != 0 or chaos is None:
                checks.append("disturbed run failed")
            if not log:
                checks.append("no fault was injected")
            lost = None
            if chaos is not None:
                lost = lost_steps(mode, chaos)
                restores = chaos.get("restores", 0)
                if lost < 0:
                    checks.append(f"{-lost:.0f} steps applied twice")
                # Steps in flight when a ps dies (2 workers, a few each) come on top of the interval.
                if restores and lost / restores > every_steps + 20:
                    checks.append(f"lost {lost / restores:.0f} steps per restore (> {every_steps})")
                if restores == 0 and kills > 0:
                    checks.append("a ps was killed but nothing was restored")
            if calm is not None and chaos is not None and abs(calm["test_accuracy"] - chaos["test_accuracy"]) > 0.01:
                checks.append("accuracy differs by more than 1 point")
            ok = ok and not checks
            rows.append((mode, e, f"{calm['test_accuracy'] * 100:.2f}%" if calm else "-",
                         f"{chaos['test_accuracy'] * 100:.2f}%" if chaos else "-", kills, freezes,
                         chaos.get("restores", 0) if chaos else "-",
                         f"{lost:.0f}" if lost is not None else "-", f"{calm_s:.0f} / {chaos_s:.0f}",
                         "ok" if not checks else "; ".join(checks)))
            print(f"{mode}: faults {log}", flush=True)
    print("\n| mode | epochs | accuracy undisturbed | accuracy with faults | ps killed | tasks frozen | restores "
          "| steps lost | seconds (calm / chaos) | verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
