#!/usr/bin/python3
"""Sums up bench/click.sh's runs (bench/out/click_*.jsonl) as JSON: shoal's
steady examples/s against the PyTorch peer's (medians over the rounds),
with and without the workers' row cache, over the default transport and
over gRPC alone; the test AUC of each against the planted model's and each
other's; each ps task's peak resident memory against its share of the table
and the Adagrad accumulator, and what it holds beyond what loading libtorch
alone keeps resident (torch_footprint.json, bench/torch_footprint.cc)
against the same share."""
import json
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/out")
shoal = [json.loads(l) for l in (out / "click_shoal.jsonl").read_text().splitlines() if l]
peer = [json.loads(l) for l in (out / "click_peer.jsonl").read_text().splitlines() if l]
planted = json.loads((out / "criteo" / "planted.json").read_text())
footprint = json.loads((out / "torch_footprint.json").read_text())["rss_bytes"]
rows, dim, ps = 10_000_000, 16 + 1, 2  # configs/click.yaml: wide & deep keeps the wide weight in the row
share = rows * dim * 4 * 2 / ps  # the rows and Adagrad's accumulator, split over the ps tasks


def median(values):
    return statistics.median(values) if values else 0.0


def runs(cached, transport):
    return [r for r in shoal if ("cached" in r["config"]) == cached and r["transport"] == transport]


peer_rate = median([p["steady_examples_per_second"] for p in peer])
peer_auc = median([p["test_auc"] for p in peer])
summary = {"planted_test_auc": planted["test"]["planted_auc"], "examples": planted["examples"],
           "peer_examples_per_second": peer_rate, "peer_test_auc": peer_auc}
for name, cached, transport in (("shoal", False, "auto"), ("shoal_cached", True, "auto"),
                                ("shoal_grpc", False, "grpc")):
    r = runs(cached, transport)
    if not r:
        continue
    rate = median([x["result"]["steady_examples_per_second"] for x in r])
    auc = median([x["result"]["test_auc"] for x in r])
    rss = max((b for x in r for b in x["ps_peak_rss_bytes"]), default=0)
    summary[name] = {
        "transport": transport,
        "examples_per_second": rate,
        "vs_peer": rate / peer_rate if peer_rate else 0.0,
        "test_auc": auc,
        "auc_below_planted": planted["test"]["planted_auc"] - auc,
        "auc_below_peer": peer_auc - auc,
        "row_cache_hit_rate": median([x["result"].get("row_cache_hit_rate", 0) for x in r]),
        "ps_peak_rss_bytes": rss,
        "ps_rss_vs_share_and_slots": rss / share,
        "libtorch_alone_rss_bytes": footprint,
        "ps_rss_beyond_libtorch_vs_share_and_slots": (rss - footprint) / share,
    }
print(json.dumps(summary, indent=2))
