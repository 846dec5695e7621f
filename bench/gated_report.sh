#!/usr/bin/env bash
# The gated-ensemble report: configs/gated.yaml (three MLPs of different
# widths, 784-256-128-10, 784-128-10 and 784-32-10, one per worker task, a
# master on the chief, 5 epochs of Fashion-MNIST) with the master's scale
# per sample and per batch, and with the cross-entropy master loss. Writes
# bench/out/gated_<variant>.json and prints a Markdown table: test accuracy
# of the master-weighted vote, the uniform average and each network alone.
#
#   bench/gated_report.sh     # about 6 minutes on 2 cores
source "$(dirname "$0")/common.sh"
variant() {  # name, then sed expressions applied to configs/gated.yaml
  local name=$1; shift
  sed "$@" configs/gated.yaml > "$out/gated_$name.yaml"
  echo "$name" >&2
  build/shoal train --config "$out/gated_$name.yaml" --quiet --result_file "$out/gated_$name.json" >&2
}
variant per_sample -e ''   # as shipped
variant batch_mean -e "s|^  scale: per_sample |  scale: batch_mean |"
variant cross_entropy -e "s|^  master_loss: mse |  master_loss: cross_entropy |"

/usr/bin/python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print("| master | gated vote | uniform average | 784-256-128-10 alone | 784-128-10 alone | 784-32-10 alone | examples/s |")
print("|---|---|---|---|---|---|---|")
labels = {"per_sample": "mse, per-sample scale", "batch_mean": "mse, batch-mean scale",
          "cross_entropy": "cross-entropy, per-sample scale"}
for name, label in labels.items():
    r = json.load(open(f"{out}/gated_{name}.json"))
    alone = " | ".join(f"{100 * a:.2f}%" for a in r["network_test_accuracies"])
    print(f"| {label} | {100 * r['test_accuracy']:.2f}% | {100 * r['uniform_average_accuracy']:.2f}% | {alone} "
          f"| {r['examples_per_second']:.0f} |")
PY
