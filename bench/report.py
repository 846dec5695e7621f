#!/usr/bin/python3
"""Turns the raw outputs of bench/run.sh into bench/out/results.json.

Every ratio divides two figures measured in the same run, so the machine's
noise hits both sides; targets are the ones issues #2 and #13 set. Every
training rate is also given as a fraction of the compute ceiling that
train_bench measured in the same run.
"""
import json
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1])
GB = 1e9


def transport():
    runs = json.loads((out / "transport.json").read_text())["benchmarks"]
    table = {}
    for run in runs:
        name = run["name"].split("/")
        kind, size = name[0].replace("BM_", ""), int(name[1])
        threads = next((p.split(":")[1] for p in name if p.startswith("threads:")), "1")
        threaded = any(p.startswith("threads:") for p in name)
        table.setdefault(size, {})[f"{kind}_t{threads}" if threaded else kind] = run["bytes_per_second"] / GB
    sizes = {}
    for size, row in sorted(table.items()):
        def best(kind):
            return max(v for k, v in row.items() if k.startswith(kind + "_t"))
        grpc, bare, raw = best("GrpcPushPull"), best("BareGrpcPushPull"), best("RawTcpPushPull")
        sizes[f"{size // 1024}KiB"] = {
            "gb_per_s_per_direction": {k: round(v, 3) for k, v in row.items()},
            "grpc_best_vs_tcp_stream": round(grpc / row["RawTcpStream"], 3),
            "grpc_best_vs_tcp_echo": round(grpc / row["RawTcpEcho"], 3),
            # the ceilings: the same exchange over plain sockets and over bare gRPC
            "grpc_best_vs_raw_tcp_push_pull_best": round(grpc / raw, 3),
            "grpc_best_vs_bare_grpc_best": round(grpc / bare, 3),
            "bare_grpc_best_vs_raw_tcp_push_pull_best": round(bare / raw, 3),
            "raw_tcp_push_pull_best_vs_tcp_stream": round(raw / row["RawTcpStream"], 3),
            "inproc_vs_tcp_stream": round(row["InProcPushPull"] / row["RawTcpStream"], 3),
        }
    return sizes


def target(value, goal):
    return {"value": round(value, 3), "target": goal, "met": value >= goal}


a = transport()
b = json.loads((out / "train.json").read_text())
# shoal's steady rate leaves out the first 50 global steps, as the DDP peer
# leaves out 50 warm-up steps.
shoal = [json.loads(l)["steady_examples_per_second"] for l in (out / "shoal_grpc.jsonl").read_text().split("\n") if l]
ddp = [json.loads(l)["examples_per_second"] for l in (out / "ddp.jsonl").read_text().split("\n") if l]
ceiling = b["ceiling_examples_per_second"]
ceiling_info = {k: b[k] for k in ("cores", "blas", "single_core_gemm_gflops", "flops_per_example",
                                  "ceiling_examples_per_second")}
c = {
    "shoal_2_workers_1_ps_grpc_examples_per_second": [round(x, 1) for x in shoal],
    "pytorch_ddp_gloo_2_workers_examples_per_second": [round(x, 1) for x in ddp],
    "ratio_medians": round(statistics.median(shoal) / statistics.median(ddp), 3),
    "shoal_vs_ceiling": round(statistics.median(shoal) / ceiling, 3),
    "ddp_vs_ceiling": round(statistics.median(ddp) / ceiling, 3),
}
sync = [json.loads(l)["steady_examples_per_second"] for l in (out / "shoal_sync_grpc.jsonl").read_text().split("\n") if l]
d = {
    "shoal_sync_2_workers_1_ps_grpc_examples_per_second": [round(x, 1) for x in sync],
    "pytorch_ddp_gloo_2_workers_examples_per_second": [round(x, 1) for x in ddp],
    "ratio_medians": round(statistics.median(sync) / statistics.median(ddp), 3),
    "shoal_vs_ceiling": round(statistics.median(sync) / ceiling, 3),
    "ddp_vs_ceiling": round(statistics.median(ddp) / ceiling, 3),
}
print(json.dumps({
    "compute_ceiling": ceiling_info,
    "a_transport": a,
    "b_train_one_worker": b,
    "c_two_workers_vs_ddp": c,
    "d_sync_two_workers_vs_ddp": d,
    "targets": {
        "a_grpc_1MiB_push_pull_vs_raw_tcp_stream": target(a["1024KiB"]["grpc_best_vs_tcp_stream"], 0.8),
        "a_grpc_64KiB_push_pull_vs_raw_tcp_echo": target(a["64KiB"]["grpc_best_vs_tcp_echo"], 1.0),
        "b_shoal_vs_libtorch_one_worker": target(b["ratio_shoal_vs_libtorch"], 0.95),
        "main_job_2_workers_inproc_vs_ceiling": target(b["main_job_vs_ceiling"], 0.7),
        "c_shoal_grpc_vs_ddp": target(c["ratio_medians"], 1.0),
        "d_shoal_sync_grpc_vs_ddp": target(d["ratio_medians"], 1.0),
    },
}, indent=2))
