#!/bin/bash
# The CNN benchmarks of issue "Your own model and data in every mode", in
# one run so that every ratio's two sides share the machine's noise:
#   (1) one worker through shoal against a plain libtorch loop (cnn_bench);
#   (2) 2 workers + 1 ps over gRPC, async and sync, against PyTorch DDP
#       (gloo) with the same CNN, per-worker batch 64, alternating, 2 rounds.
# Writes bench/out/cnn.json.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cmake --build build -j2 --target cnn_bench >&2

build/bench/cnn_bench --steps 400 --repeats 3 > "$out/cnn_one_worker.json"

: > "$out/cnn_grpc.jsonl"
: > "$out/cnn_ddp.jsonl"
for round in 1 2; do
  for mode in async sync; do
    steps=$([ "$mode" = sync ] && echo 350 || echo 700)
    build/shoal train --config configs/cnn.yaml --mode "$mode" --processes --transport grpc --ps 1 --workers 2 \
      --max_steps "$steps" --quiet --result_file "$out/cnn_$mode.json" >&2
    /usr/bin/python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(json.dumps({'mode': sys.argv[2], 'examples_per_second': r['steady_examples_per_second']}))" \
      "$out/cnn_$mode.json" "$mode" >> "$out/cnn_grpc.jsonl"
    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/ddp_peer.py --model cnn --workers 2 --batch_size 64 \
      --steps 350 >> "$out/cnn_ddp.jsonl"
  done
done

/usr/bin/python3 - "$out" > "$out/cnn.json" <<'PY'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
one = json.loads((out / "cnn_one_worker.json").read_text())
runs = [json.loads(l) for l in (out / "cnn_grpc.jsonl").read_text().splitlines() if l.strip()]
ddp = statistics.median(json.loads(l)["examples_per_second"]
                        for l in (out / "cnn_ddp.jsonl").read_text().splitlines() if l.strip())
result = {"one_worker": one, "ddp_examples_per_second": round(ddp, 1)}
for mode in ("async", "sync"):
    rate = statistics.median(r["examples_per_second"] for r in runs if r["mode"] == mode)
    result[f"{mode}_examples_per_second"] = round(rate, 1)
    result[f"ratio_{mode}_vs_ddp"] = round(rate / ddp, 3)
print(json.dumps(result, indent=1))
PY
cat "$out/cnn.json"
