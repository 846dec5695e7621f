#!/usr/bin/env bash
# (g) Click-through training (configs/click.yaml): shoal's wide & deep model,
# its 10M x 16 table (+1 wide weight per row) over 2 ps tasks, 2 workers, as
# processes over the default transport (and over gRPC alone), against the
# single-process PyTorch peer (bench/click_peer.py: nn.EmbeddingBag(sparse=
# True) + Adagrad, the same model, log, batch and hyper-parameters, all the
# cores), alternating, 2 rounds. One pass over a generated log with a
# planted model each (EXAMPLES, default 400,000; the held-out log: 100,000):
# examples/s after warm-up, test AUC and log loss of both and of the planted
# model, and each ps task's peak resident memory against its share of the
# table and the Adagrad accumulator (and beyond what a process that only
# loads libtorch keeps resident).
#
#   bench/click.sh      # about 10 minutes on 2 cores
source "$(dirname "$0")/common.sh"
data=$out/criteo
click_log "${EXAMPLES:-400000}"

# The largest resident set each ps task process reached while $1 runs.
peak_ps_rss() {
  "$@" >&2 &
  local job=$! peak=""
  while kill -0 "$job" 2>/dev/null; do
    for pid in $(pgrep -f -- '/job:ps/task' || true); do
      local rss
      rss=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
      [ -n "$rss" ] && peak="$peak $pid:$rss"
    done
    sleep 0.5
  done
  wait "$job"
  printf '%s\n' "$peak" | tr ' ' '\n' | awk -F: 'NF == 2 {if ($2 > max[$1]) max[$1] = $2}
    END {n = 0; printf "["; for (p in max) {printf "%s%d", (n++ ? ", " : ""), max[p] * 1024}; print "]"}'
}

: > "$out/click_shoal.jsonl"
: > "$out/click_peer.jsonl"
for round in 1 2; do
  # The default transport (auto: UCX between tasks on one host), with and
  # without the row cache; and over gRPC alone, to compare.
  for run in "plain auto" "cached auto" "plain grpc"; do
    read -r variant transport <<< "$run"
    config=configs/click.yaml cached=()
    if [ "$variant" = cached ]; then  # each worker's cache of hot rows (4 steps' staleness)
      config="configs/click.yaml (cached)"
      cached=(--set model.click.cache_rows=200000 --set model.click.cache_staleness=4)
    fi
    rss=$(peak_ps_rss build/shoal train --config configs/click.yaml "${cached[@]}" --processes \
      --transport "$transport" --quiet --result_file "$out/click_shoal_$round.json")
    printf '{"config": "%s", "transport": "%s", "result": %s, "ps_peak_rss_bytes": %s}\n' "$config" "$transport" \
      "$(tr -d '\n' < "$out/click_shoal_$round.json")" "$rss" >> "$out/click_shoal.jsonl"
  done
  /usr/bin/python3 bench/click_peer.py --train "$data/train.tsv" --test "$data/test.tsv" --rows 10000000 \
    --threads "$(nproc)" >> "$out/click_peer.jsonl"
done

build/bench/torch_footprint > "$out/torch_footprint.json"
/usr/bin/python3 bench/click_report.py "$out" > "$out/click.json"
cat "$out/click.json"
