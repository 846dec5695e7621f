#!/usr/bin/python3
"""Throughput follows membership: a job on leased data over processes starts
with one worker; a second joins mid-job (SIGUSR1 to the launcher). From the
chief's metrics file (global step against wall time) it prints the job's
examples/s before the join and in the seconds after the new worker started,
and the time from that start to the new worker's first applied update (the
job's report). One JSON line.

    /usr/bin/python3 bench/elastic_throughput.py [--shoal build/shoal] [--before 15] [--after 20]
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rate(records, start, end, batch):
    """Examples/s of the job between two wall times, from the chief's records."""
    inside = [r for r in records if start <= r["unix_time"] <= end]
    if len(inside) < 2:
        return None
    first, last = inside[0], inside[-1]
    return (last["global_step"] - first["global_step"]) * batch / (last["unix_time"] - first["unix_time"])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shoal", default=os.path.join(ROOT, "build", "shoal"))
    parser.add_argument("--before", type=float, default=15, help="seconds with one worker")
    parser.add_argument("--after", type=float, default=20, help="seconds after the second worker starts")
    args = parser.parse_args()
    batch = 64
    with tempfile.TemporaryDirectory(prefix="shoal-elastic-bench-") as workdir:
        metrics = os.path.join(workdir, "metrics")
        result_file = os.path.join(workdir, "result.json")
        launcher = subprocess.Popen(
            [args.shoal, "train", "--processes", "--quiet", "--set", "cluster.workers=1", "--set", "data.leases=true",
             "--set", "training.epochs=1000", "--set", f"hooks.metrics_dir={metrics}", "--set",
             "hooks.metrics_every_steps=20", "--result_file", result_file],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # this script prints the figures
        # Until the chief's first record: start-up is not the one-worker rate.
        chief_file = os.path.join(metrics, "worker_0.jsonl")
        while not (os.path.exists(chief_file) and os.path.getsize(chief_file) > 0):
            time.sleep(0.1)
        time.sleep(args.before)
        joined = time.time()
        launcher.send_signal(signal.SIGUSR1)
        time.sleep(args.after)
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=120)
        with open(chief_file) as f:
            records = [json.loads(line) for line in f if line.strip()]
        with open(result_file) as f:
            result = json.load(f)
    before = rate(records, joined - 10, joined, batch)
    windows = {f"examples_per_second_{a}_to_{b}_s_after_join": rate(records, joined + a, joined + b, batch)
               for a, b in [(0, 5), (5, 10), (10, 20)]}
    ledger = result.get("data_ledger", {})
    out = {"benchmark": "elastic_throughput", "examples_per_second_one_worker": before, **windows,
           "ratio_5_to_10_s_after_vs_before": (windows["examples_per_second_5_to_10_s_after_join"] / before
                                               if before and windows["examples_per_second_5_to_10_s_after_join"]
                                               else None),
           "join_seconds_to_first_update": ledger.get("join_seconds_mean"),
           "places_missing": ledger.get("places_missing"), "places_repeated": ledger.get("places_repeated")}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
