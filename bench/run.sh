#!/usr/bin/env bash
# Runs benchmarks (a) to (d) and the compute ceiling, and writes
# bench/out/results.json: every figure with the peer it is compared against,
# measured in the same run, and every training rate as a fraction of the
# ceiling (the single-core GEMM rate times the cores over the model's FLOPs
# per example). shoal sets its own compute threads; the DDP peer gets one
# BLAS and one libtorch thread per process, as shoal's workers do.
#
#   bench/run.sh            # about 6 minutes on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh  # python3-torch included, for the DDP peer
out=bench/out
mkdir -p "$out"

echo "(a) transport push+pull vs raw loopback TCP" >&2
build/bench/transport_bench --benchmark_filter='RawTcp|PushPull' \
  --benchmark_out="$out/transport.json" --benchmark_out_format=json >&2

echo "(b) one worker through shoal vs a plain libtorch loop; the compute ceiling; the main job" >&2
build/bench/train_bench --steps 600 --repeats 3 > "$out/train.json"

echo "(c) 2 workers + 1 ps over gRPC vs PyTorch DDP (gloo), alternating, 2 rounds" >&2
: > "$out/shoal_grpc.jsonl"
: > "$out/ddp.jsonl"
for round in 1 2; do
  build/shoal train --processes --ps 1 --workers 2 --max_steps 1300 \
    --quiet --result_file "$out/shoal_grpc_$round.json" >&2
  tr -d '\n' < "$out/shoal_grpc_$round.json" >> "$out/shoal_grpc.jsonl"; echo >> "$out/shoal_grpc.jsonl"
  OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/ddp_peer.py --workers 2 --batch_size 64 --steps 600 >> "$out/ddp.jsonl"
done

echo "(d) synchronous training, 2 workers + 1 ps over gRPC vs PyTorch DDP (gloo), 2 rounds" >&2
: > "$out/shoal_sync_grpc.jsonl"
for round in 1 2; do
  build/shoal train --config configs/sync.yaml --processes --ps 1 --workers 2 \
    --max_steps 650 --quiet --result_file "$out/shoal_sync_$round.json" >&2
  tr -d '\n' < "$out/shoal_sync_$round.json" >> "$out/shoal_sync_grpc.jsonl"; echo >> "$out/shoal_sync_grpc.jsonl"
  OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/ddp_peer.py --workers 2 --batch_size 64 --steps 600 >> "$out/ddp.jsonl"
done

/usr/bin/python3 bench/report.py "$out" > "$out/results.json"
cat "$out/results.json"
