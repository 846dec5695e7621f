#!/usr/bin/env bash
# The local-replica report: the default MLP on Fashion-MNIST for 5 epochs
# (2 ps, 2 workers, in-process) with async PS, Downpour, model averaging
# (interval 8) and EASGD (tau 8). Writes bench/out/local_modes.json and prints
# a Markdown table: test accuracy and the bytes the workers sent and received
# per epoch (message frames: headers and tensors), measured by shoal's client.
#
#   bench/local_modes.sh      # about a minute on 2 cores
source "$(dirname "$0")/common.sh"
run() {  # name, then shoal train flags
  local name=$1; shift
  echo "$name" >&2
  build/shoal train "$@" --epochs 5 --quiet --result_file "$out/local_$name.json" >&2
}
run async --mode async
run downpour --config configs/downpour.yaml
run model_average --config configs/model_average.yaml
run easgd --config configs/easgd.yaml

/usr/bin/python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
names = ["async", "downpour", "model_average", "easgd"]
rows = {n: json.load(open(f"{out}/local_{n}.json")) for n in names}
base = rows["async"]["bytes_sent"] / rows["async"]["epochs_trained"]
table = {}
tensor_base = rows["async"]["tensor_bytes_sent"] / rows["async"]["epochs_trained"]
print("| mode | test accuracy | sent per epoch | received per epoch | sent vs async | tensor bytes sent vs async |")
print("|---|---|---|---|---|---|")
for n in names:
    r = rows[n]
    sent = r["bytes_sent"] / r["epochs_trained"]
    received = r["bytes_received"] / r["epochs_trained"]
    tensors = r["tensor_bytes_sent"] / r["epochs_trained"]
    table[n] = {"test_accuracy": r["test_accuracy"], "bytes_sent_per_epoch": sent,
                "bytes_received_per_epoch": received, "sent_vs_async": sent / base,
                "tensor_bytes_sent_vs_async": tensors / tensor_base,
                "examples_per_second": r["examples_per_second"]}
    print(f"| {n} | {100 * r['test_accuracy']:.2f}% | {sent / 1e6:.1f} MB | {received / 1e6:.1f} MB "
          f"| 1/{base / sent:.3f} | 1/{tensor_base / tensors:.3f} |")
json.dump(table, open(f"{out}/local_modes.json", "w"), indent=2)
PY
