#!/usr/bin/env bash
# Runs benchmarks (a) to (d) and the compute ceiling, and writes
# bench/out/results.json: every figure with the peer it is compared against,
# measured in the same run, and every training rate as a fraction of the
# ceiling (the single-core GEMM rate times the cores over the model's FLOPs
# per example). shoal sets its own compute threads; the DDP peer gets one
# BLAS and one libtorch thread per process, as shoal's workers do.
#
#   bench/run.sh            # about 12 minutes on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh  # python3-torch included, for the DDP peer
out=bench/out
mkdir -p "$out"

echo "(a) transport push+pull, two calls and one (gRPC, UCX over shared memory and TCP) vs raw loopback TCP; UCX's own ceiling" >&2
build/bench/transport_bench --benchmark_filter='RawTcp|PushPull|PushAndPull' \
  --benchmark_out="$out/transport.json" --benchmark_out_format=json >&2
bench/ucx_ceiling.sh > "$out/ucx_ceiling.json"

echo "(a) scaling: 1-8 client processes pushing and pulling a 4 MiB model to 1 and 2 ps processes" >&2
build/bench/scaling_bench --seconds 3 > "$out/scaling.jsonl"
/usr/bin/python3 bench/scaling_plot.py "$out/scaling.jsonl" "$out/scaling.svg"
echo "(a) an idle ps with a connected client, over UCX: CPU over 10 s" >&2
build/bench/scaling_bench --idle_s 10 --transport ucx > "$out/idle.json"

echo "(e) the main job: in-process, and as processes over UCX and over gRPC, alternating, 3 rounds" >&2
: > "$out/main_job.jsonl"
for round in 1 2 3; do
  for how in inproc ucx grpc; do
    flags=(--max_steps 4000 --quiet --result_file "$out/main_$how.json")
    [ "$how" != inproc ] && flags+=(--processes --transport "$how")
    build/shoal train "${flags[@]}" >&2
    printf '{"how": "%s", "result": %s}\n' "$how" "$(tr -d '\n' < "$out/main_$how.json")" >> "$out/main_job.jsonl"
  done
done

echo "(e) the main job beside a CPU load (one busy process per core, as a build or another job would be): auto (the default: UCX, with route trials), UCX alone and gRPC, alternating, 2 rounds" >&2
: > "$out/main_under_load.jsonl"
hogs=()
for _ in $(seq "$(nproc)"); do yes > /dev/null & hogs+=($!); done
for round in 1 2; do
  for how in auto ucx grpc; do
    build/shoal train --processes --transport "$how" --max_steps 3000 --quiet --result_file "$out/main_under_load_$how.json" >&2
    printf '{"how": "%s", "result": %s}\n' "$how" "$(tr -d '\n' < "$out/main_under_load_$how.json")" >> "$out/main_under_load.jsonl"
  done
done
kill "${hogs[@]}"

echo "(e) where the CPU goes in the main job as processes over UCX" >&2
/usr/bin/python3 bench/cpu_shares.py -- build/shoal train --processes --transport ucx --max_steps 12000 --quiet \
  > "$out/main_cpu_shares.json"
echo "(e) one worker with one thread, so that the transport has a core of its own: in-process vs processes" >&2
: > "$out/one_worker.jsonl"
for round in 1 2 3; do
  for how in inproc ucx; do
    flags=(--workers 1 --threads_per_task 1 --max_steps 3000 --quiet --result_file "$out/one_worker_$how.json")
    [ "$how" != inproc ] && flags+=(--processes --transport "$how")
    build/shoal train "${flags[@]}" >&2
    printf '{"how": "%s", "result": %s}\n' "$how" "$(tr -d '\n' < "$out/one_worker_$how.json")" >> "$out/one_worker.jsonl"
  done
done

echo "(b) one worker through shoal vs a plain libtorch loop; the compute ceiling; the main job" >&2
build/bench/train_bench --steps 600 --repeats 3 > "$out/train.json"

echo "(c) 2 workers + 1 ps over gRPC and over UCX vs PyTorch DDP (gloo), alternating, 2 rounds" >&2
: > "$out/shoal_grpc.jsonl"
: > "$out/shoal_ucx.jsonl"
: > "$out/ddp.jsonl"
for round in 1 2; do
  for t in grpc ucx; do
    build/shoal train --processes --transport $t --ps 1 --workers 2 --max_steps 1300 \
      --quiet --result_file "$out/shoal_${t}_$round.json" >&2
    tr -d '\n' < "$out/shoal_${t}_$round.json" >> "$out/shoal_$t.jsonl"; echo >> "$out/shoal_$t.jsonl"
  done
  OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/ddp_peer.py --workers 2 --batch_size 64 --steps 600 >> "$out/ddp.jsonl"
done

echo "(d) synchronous training, 2 workers + 1 ps over gRPC and over UCX vs PyTorch DDP (gloo), 2 rounds" >&2
: > "$out/shoal_sync_grpc.jsonl"
: > "$out/shoal_sync_ucx.jsonl"
for round in 1 2; do
  for t in grpc ucx; do
    build/shoal train --config configs/sync.yaml --processes --transport $t --ps 1 --workers 2 \
      --max_steps 650 --quiet --result_file "$out/shoal_sync_${t}_$round.json" >&2
    tr -d '\n' < "$out/shoal_sync_${t}_$round.json" >> "$out/shoal_sync_$t.jsonl"; echo >> "$out/shoal_sync_$t.jsonl"
  done
  OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/ddp_peer.py --workers 2 --batch_size 64 --steps 600 >> "$out/ddp.jsonl"
done

echo "(f) embedding tables: bytes per step for 1M, 10M and 100M (dynamic) rows x 16" >&2
build/bench/embedding_bench --steps 20 --batch 1024 > "$out/embedding_bytes.jsonl"
echo "(f) a full dynamic shard (1M rows) under a stream of new ids: evicting, refusing, and one that grows" >&2
build/bench/embedding_bench --eviction 1 --steps 40 > "$out/embedding_eviction.json"
echo "(f) lru against lfu eviction, long enough for them to part: a 100k-row shard, 200 pushes once full" >&2
build/bench/embedding_bench --eviction 1 --steps 200 --max_rows 100000 > "$out/embedding_eviction_long.json"
echo "(f) a 5M-row table shard saved while pushes go on, against a plain write of as many bytes" >&2
build/bench/embedding_bench --checkpoint 1 > "$out/table_checkpoint.json"
echo "(f) a worker's work on a batch's ids: distinct ids against torch::_unique, the row cache's lookups and inserts" >&2
build/bench/embedding_bench --worker_side 1 > "$out/embedding_worker_side.json"

echo "(g) click-through training, 10M x 16 table, 2 ps + 2 workers as processes vs the PyTorch EmbeddingBag peer" >&2
bench/click.sh >&2

/usr/bin/python3 bench/report.py "$out" > "$out/results.json"
cat "$out/results.json"
