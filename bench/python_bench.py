#!/usr/bin/env python3
"""The Python package against its peers, measured in one run, alternating:

1. shoal.train on the default job (the MLP on Fashion-MNIST, 2 ps, 2
   workers, in-process) against `build/shoal train` with the same config:
   examples/s, median of the rounds (target: at least 0.95).
2. A PyTorch loop that keeps its weights on one ps through shoal.Client
   (pull, forward/backward, push) against the same loop with a local
   torch.optim.SGD: steps/s (target: at least 0.9). The ps runs in this
   process (shoal.Server, gRPC on loopback) and as a `shoal server` process.
   Both loops use one libtorch thread, as a shoal worker does.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_bench.py [--rounds 3] [--steps 600]

Prints one JSON object.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import shoal

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHOAL = os.path.join(ROOT, "build", "shoal")


def free_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def train_rates(rounds, max_steps):
    config = {"training": {"max_steps": max_steps}}
    api, cli = [], []
    with tempfile.TemporaryDirectory() as folder:
        config_file = os.path.join(folder, "job.json")  # JSON is YAML
        with open(config_file, "w") as f:
            json.dump(config, f)
        result = os.path.join(folder, "result.json")
        for _ in range(rounds):
            api.append(shoal.train(config=config, progress=False)["examples_per_second"])
            subprocess.run([SHOAL, "train", "--config", config_file, "--quiet", "--result_file", result],
                           check=True, stdout=subprocess.DEVNULL)
            with open(result) as f:
                cli.append(json.load(f)["examples_per_second"])
    return {"shoal.train examples/s": api, "shoal train (CLI) examples/s": cli,
            "ratio": statistics.median(api) / statistics.median(cli)}


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 10))


def batches(steps, batch_size):
    torch.manual_seed(1)
    return [(torch.randn(batch_size, 784), torch.randint(0, 10, (batch_size,))) for _ in range(steps)]


def local_loop(data):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    start = time.perf_counter()
    for x, y in data:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return len(data) / (time.perf_counter() - start)


def client_loop(data, address):
    model = mlp()
    client = shoal.Client({"ps": [address]}, model.named_parameters())
    client.create(dict(model.named_parameters()), optimizer={"kind": "sgd", "learning_rate": 0.05})
    start = time.perf_counter()
    client.pull(model.named_parameters())
    for x, y in data:
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        # The push brings back the values the next step uses: one round trip a step.
        client.apply_and_pull({name: p.grad for name, p in model.named_parameters()}, model.named_parameters())
    rate = len(data) / (time.perf_counter() - start)
    client.shutdown_servers()
    return rate


def client_rates(rounds, steps, batch_size):
    torch.set_num_threads(1)
    data = batches(steps, batch_size)
    local, in_process, separate = [], [], []
    for _ in range(rounds):
        local.append(local_loop(data))
        server = shoal.Server()  # on a port the system picks
        in_process.append(client_loop(data, server.address))
        server.close()
        address = free_address()
        with tempfile.TemporaryDirectory() as folder:
            cluster = os.path.join(folder, "cluster.json")
            with open(cluster, "w") as f:
                json.dump({"ps": [address], "worker": [free_address()]}, f)
            ps = subprocess.Popen([SHOAL, "server", "--cluster", cluster, "--task", "ps:0"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                separate.append(client_loop(data, address))
            finally:
                ps.wait(timeout=30)
    median = statistics.median
    return {"batch_size": batch_size, "local steps/s": local, "client, ps in-process, steps/s": in_process,
            "client, ps as a process, steps/s": separate,
            "ratio (ps in-process)": median(in_process) / median(local),
            "ratio (ps as a process)": median(separate) / median(local)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--max_steps", type=int, default=4000)
    parser.add_argument("--batch_sizes", default="64,512")
    args = parser.parse_args()
    result = {"train": train_rates(args.rounds, args.max_steps)}
    result["client"] = [client_rates(args.rounds, args.steps, int(b)) for b in args.batch_sizes.split(",")]
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
