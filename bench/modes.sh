#!/usr/bin/env bash
# The training-mode table of docs/modes/sync.md: the default MLP on Fashion-MNIST for
# 5 epochs, in-process, async (the main job), sync, sync with a backup worker,
# and SSP. Writes bench/out/mode_<name>.json and prints a Markdown table.
#
#   bench/modes.sh      # about a minute on 2 cores
source "$(dirname "$0")/common.sh"
run() {  # name, then shoal train flags
  local name=$1; shift
  echo "$name" >&2
  build/shoal train "$@" --quiet --result_file "$out/mode_$name.json" >&2
}
run async
run sync --config configs/sync.yaml
run sync_backup --config configs/sync_backup.yaml
run ssp --config configs/ssp.yaml

/usr/bin/python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rows = [("async, 2 workers", "(default)", "async"),
        ("sync, 2 workers, R = 2", "`configs/sync.yaml`", "sync"),
        ("sync, 3 workers, R = 2 (1 backup)", "`configs/sync_backup.yaml`", "sync_backup"),
        ("SSP, 2 workers, s = 2", "`configs/ssp.yaml`", "ssp")]
print("| mode | config | global steps | examples/s | seconds | test accuracy |")
print("|---|---|---|---|---|---|")
for label, config, name in rows:
    r = json.load(open(f"{out}/mode_{name}.json"))
    extra = ""
    if r.get("stale_gradients_dropped"):
        extra = f" ({r['stale_gradients_dropped']} late gradients dropped)"
    if r.get("ssp_gap_histogram"):
        extra = " (gaps " + "/".join(str(i) for i in range(len(r["ssp_gap_histogram"]))) + ": " + \
                "/".join(str(x) for x in r["ssp_gap_histogram"]) + " steps)"
    print(f"| {label} | {config} | {r['global_step']} | {r['examples_per_second']:.0f} | {r['seconds']:.1f} "
          f"| {100 * r['test_accuracy']:.2f}%{extra} |")
PY
