#!/usr/bin/env bash
# What leased data (data.leases: every batch's places committed with its
# dense update and with each table shard's rows) costs the click job:
# configs/click.yaml (wide & deep, 10M x 16 table over 2 ps tasks, 2
# workers) as processes, on leased data and on each worker's own slice,
# alternating, ROUNDS rounds (default 3), one pass over the generated log
# (EXAMPLES, default 400,000; click_log in common.sh). Prints each run's
# examples/s after warm-up, test AUC and (leased) ledger, then the ratio of
# the medians (ratio_leased_vs_owned) and the median AUCs.
#
# With CKPT_EVERY_S, both sides also save checkpoints that often, in the
# background (on leased data each ps task's table rows take no push while
# it writes them, so that the saved rows match its saved watermarks): the
# ratio then says what that pause costs.
#
#   bench/click_leases.sh     # about 2 minutes on 2 cores, once the log is made
#   CKPT_EVERY_S=3 EXAMPLES=2000000 bench/click_leases.sh
source "$(dirname "$0")/common.sh"
rounds=${ROUNDS:-3}
data=$out/criteo
click_log "${EXAMPLES:-400000}"
checkpoints=()
if [ -n "${CKPT_EVERY_S:-}" ]; then
  checkpoints=(--set "checkpoint.dir=$out/click_leases_ckpt" --set "checkpoint.every_seconds=$CKPT_EVERY_S"
               --set "checkpoint.keep=1" --set "checkpoint.background=true")
fi

: > "$out/click_leases.jsonl"
for round in $(seq "$rounds"); do
  for leases in false true; do
    rm -rf "$out/click_leases_ckpt"
    build/shoal train --config configs/click.yaml --processes --quiet \
      --set "data.train_file=$data/train.tsv" --set "data.test_file=$data/test.tsv" --set "data.leases=$leases" \
      "${checkpoints[@]}" --result_file "$out/click_leases_run.json" >&2
    printf '{"round": %d, "leases": %s, "result": %s}\n' "$round" "$leases" \
      "$(tr -d '\n' < "$out/click_leases_run.json")" >> "$out/click_leases.jsonl"
  done
done

/usr/bin/python3 - "$out/click_leases.jsonl" <<'PY'
import json
import statistics
import sys

runs = [json.loads(line) for line in open(sys.argv[1])]
rates = {False: [], True: []}
aucs = {False: [], True: []}
for run in runs:
    result, leased = run["result"], run["leases"]
    rates[leased].append(result["steady_examples_per_second"])
    aucs[leased].append(result["test_auc"])
    ledger = result.get("data_ledger", {})
    extra = ""
    if leased:
        extra = (f"  ledger: {ledger.get('places_applied')} places, {ledger.get('places_missing')} missing, "
                 f"{ledger.get('places_repeated')} twice, {ledger.get('variable_ledgers')} variable and "
                 f"{ledger.get('table_ledgers')} table-shard ledgers")
    print(f"round {run['round']} leases={str(leased).lower():5}  {result['steady_examples_per_second']:9.0f} ex/s  "
          f"AUC {result['test_auc']:.4f}  checkpoints {result.get('checkpoints_saved', 0)}{extra}")
owned, leased = statistics.median(rates[False]), statistics.median(rates[True])
print(json.dumps({"owned_examples_per_second": round(owned, 1), "leased_examples_per_second": round(leased, 1),
                  "ratio_leased_vs_owned": round(leased / owned, 4),
                  "auc_owned": round(statistics.median(aucs[False]), 4),
                  "auc_leased": round(statistics.median(aucs[True]), 4)}))
PY
