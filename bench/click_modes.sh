#!/usr/bin/env bash
# Hybrid against all-async on the generated click log: configs/click.yaml's
# job (2 ps + 2 workers as processes) trained with `training.mode: async`
# (dense part and tables asynchronous) and `training.mode: sync` (the hybrid
# mode: dense part through SyncReplicas accumulators, tables asynchronous),
# alternating, ROUNDS rounds (default 3); prints each run's test AUC, log loss
# and examples/s, and the medians. Uses bench/click.sh's log (made if absent).
#
#   bench/click_modes.sh      # about 3 minutes on 2 cores
source "$(dirname "$0")/common.sh"
rounds=${ROUNDS:-3}
data=$out/criteo
click_log
: > "$out/click_modes.jsonl"
for round in $(seq "$rounds"); do
  for mode in async sync; do
    build/shoal train --config configs/click.yaml --mode "$mode" --processes --transport grpc --quiet \
      --result_file "$out/click_mode.json" >&2
    printf '{"mode": "%s", "round": %d, "result": %s}\n' "$mode" "$round" \
      "$(tr -d '\n' < "$out/click_mode.json")" >> "$out/click_modes.jsonl"
  done
done
/usr/bin/python3 - "$out/click_modes.jsonl" "$data/planted.json" <<'PY'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
planted = json.load(open(sys.argv[2]))["test"]["planted_auc"]
summary = {"planted_auc": planted}
for mode in ("async", "sync"):
    mine = [r["result"] for r in runs if r["mode"] == mode]
    summary[mode] = {
        "test_auc": [round(r["test_auc"], 4) for r in mine],
        "median_test_auc": statistics.median(r["test_auc"] for r in mine),
        "median_test_loss": statistics.median(r["test_loss"] for r in mine),
        "median_examples_per_second": statistics.median(r["steady_examples_per_second"] for r in mine),
    }
summary["sync_minus_async_auc"] = summary["sync"]["median_test_auc"] - summary["async"]["median_test_auc"]
print(json.dumps(summary, indent=1))
PY
