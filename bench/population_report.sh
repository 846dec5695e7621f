#!/usr/bin/env bash
# The population report: configs/population.yaml (4 members, learning rates
# drawn log-uniform from [1e-4, 1e-1], truncation every 500 steps) against the
# same 4 members trained independently (policy none: the same initial draws,
# steps and seeds). Writes bench/out/population_{pbt,independent}.json and
# bench/out/population_pbt/lineage.svg, and prints a Markdown table.
#
#   bench/population_report.sh     # about 30 seconds on 2 cores
source "$(dirname "$0")/common.sh"
for policy in truncation none; do
  name=$([ "$policy" = none ] && echo independent || echo pbt)
  rm -rf "$out/population_$name"
  echo "$name" >&2
  build/shoal train --config configs/population.yaml --set "population.policy=$policy" \
    --set "population.lineage_dir=$out/population_$name" --quiet --result_file "$out/population_$name.json" >&2
done
/usr/bin/python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print("| run | member | hyper-parameters at the end | validation accuracy | test accuracy |")
print("|---|---|---|---|---|")
for name in ["pbt", "independent"]:
    r = json.load(open(f"{out}/population_{name}.json"))
    for m in r["members"]:
        best = " (best)" if m["member"] == r["best_member"] else ""
        print(f"| {name} | {m['member']}{best} | {m['hyperparameters']} | {m['fitness']:.4f} | {100 * m['test_accuracy']:.2f}% |")
for name in ["pbt", "independent"]:
    r = json.load(open(f"{out}/population_{name}.json"))
    print(f"\n{name}: best member {r['best_member']}, test accuracy {100 * r['test_accuracy']:.2f}%, "
          f"{r['peer_bytes_read'] / 1e6:.1f} MB moved reading other members")
    if r.get("copies"):
        bins = ", ".join(f"{k} copies: {n}" for k, n in enumerate(r["copies_per_interval"]))
        print(f"\n{name}: ready intervals by copies made in them: {bins}; the copier was the worst ranked "
              f"in {r['copies_by_the_worst']} of {r['copies']} copies")
PY
