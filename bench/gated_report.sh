#!/usr/bin/env bash
# The gated-ensemble report: configs/gated.yaml (three MLPs of different
# widths, 784-256-128-10, 784-128-10 and 784-32-10, one per worker task, a
# master on the chief, 5 epochs of Fashion-MNIST) with the master's scale
# per sample and per batch, with the cross-entropy master loss, and with
# sigmoid weights. Writes
# bench/out/gated_<variant>.json and prints a Markdown table: test accuracy
# of the master-weighted vote, the uniform average, each network alone (with
# the master's mean weight for it), and how often some network is right.
#
#   bench/gated_report.sh     # about a minute on 2 cores
source "$(dirname "$0")/common.sh"
variant() {  # name, then settings over configs/gated.yaml
  local name=$1; shift
  echo "$name" >&2
  build/shoal train --config configs/gated.yaml "$@" --quiet --result_file "$out/gated_$name.json" >&2
}
variant per_sample   # as shipped
variant batch_mean --set gated.scale=batch_mean
variant cross_entropy --set gated.master_loss=cross_entropy
variant sigmoid --set gated.output=sigmoid

/usr/bin/python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print("| master | gated vote | uniform average | 784-256-128-10 alone (weight) | 784-128-10 alone (weight) "
      "| 784-32-10 alone (weight) | some network right | examples/s |")
print("|---|---|---|---|---|---|---|---|")
labels = {"per_sample": "softmax, mse, per-sample scale", "batch_mean": "softmax, mse, batch-mean scale",
          "cross_entropy": "softmax, cross-entropy, per-sample scale", "sigmoid": "sigmoid, mse, per-sample scale"}
for name, label in labels.items():
    r = json.load(open(f"{out}/gated_{name}.json"))
    alone = " | ".join(f"{100 * a:.2f}% ({w:.2f})"
                       for a, w in zip(r["network_test_accuracies"], r["network_mean_weights"]))
    print(f"| {label} | {100 * r['test_accuracy']:.2f}% | {100 * r['uniform_average_accuracy']:.2f}% | {alone} "
          f"| {100 * r['any_network_right']:.2f}% | {r['examples_per_second']:.0f} |")
PY
