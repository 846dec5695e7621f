#!/usr/bin/env bash
# Click-through training (configs/click.yaml, in one process) with a
# dynamic table bounded below the log's ids: MAX_ROWS rows over the 2 ps
# tasks (default 200,000; the log of 400,000 examples brings about 1.5M),
# full shards evicting by lru and by lfu, against the same table unbounded.
# Alternating, ROUNDS rounds (default 3). One JSON line a run: eviction,
# test AUC, rows held and evicted.
#
#   bench/click_eviction.sh     # about 2 minutes on 2 cores, the log made first
source "$(dirname "$0")/common.sh"
max_rows=${MAX_ROWS:-200000}
rounds=${ROUNDS:-3}
data=$out/criteo
click_log
for round in $(seq "$rounds"); do
  for run in unbounded lru lfu; do
    # The click config with a dynamic table; bounded and evicting but for the first run.
    bounded=()
    if [ "$run" != unbounded ]; then
      bounded=(--set "model.click.max_rows=$max_rows" --set model.click.evict_when_full=true
               --set "model.click.eviction=$run")
    fi
    build/shoal train --config configs/click.yaml --set model.click.rows=0 --set "data.train_file=$data/train.tsv" \
      --set "data.test_file=$data/test.tsv" "${bounded[@]}" --quiet --result_file "$out/click_eviction_$run.json" >&2
    /usr/bin/python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
print(json.dumps({'run': sys.argv[2], 'max_rows': int(sys.argv[3]) if sys.argv[2] != 'unbounded' else 0,
                  'test_auc': round(r['test_auc'], 4), 'rows_held': r['table_rows_held'],
                  'rows_evicted': r['table_rows_evicted']}))" "$out/click_eviction_$run.json" "$run" "$max_rows"
  done
done
