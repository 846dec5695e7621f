#!/usr/bin/python3
"""The PyTorch DistributedDataParallel peer for benchmarks (c) and (d).

Trains the same model as shoal (--model mlp: 784-256-128-10, ReLU; --model
cnn: configs/cnn.yaml's CNN, two 3x3 convolutions of 32 and 64 channels with
BatchNorm, ReLU and 2x2 max-pooling, a 256-unit dense layer, dropout 0.4,
the logits) with softmax cross-entropy and Adam lr 1e-3 on Fashion-MNIST,
with W processes and the gloo backend on loopback, per-worker batch B, one
intra-op thread per process; prints one JSON line with the examples/s over
the timed steps (after warm-up).

Run with Debian's python3-torch:
  /usr/bin/python3 bench/ddp_peer.py --workers 2 --batch_size 64 --steps 600 [--model cnn]
"""
import argparse
import gzip
import json
import os
import socket
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

DATA_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_train(data_dir, shape):
    images = read_idx(os.path.join(data_dir, "train-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, "train-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(images.reshape((len(images),) + shape).astype(np.float32) / 255.0)
    x = (x - 0.2860) / 0.3530
    return x, torch.from_numpy(labels.astype(np.int64))


class Mlp(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(layers, layers[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return x


def cnn():
    def block(c_in, c_out):
        return [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(), nn.MaxPool2d(2)]

    return nn.Sequential(*block(1, 32), *block(32, 64), nn.Flatten(), nn.Linear(64 * 7 * 7, 256), nn.ReLU(),
                         nn.Dropout(0.4), nn.Linear(256, 10))


def worker(rank, args, port, result_queue):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.workers)
    torch.manual_seed(1)
    x, y = load_train(args.data_dir, (1, 28, 28) if args.model == "cnn" else (784,))
    shard = slice(rank * len(x) // args.workers, (rank + 1) * len(x) // args.workers)
    x, y = x[shard], y[shard]
    model = nn.parallel.DistributedDataParallel(cnn() if args.model == "cnn" else Mlp([784, 256, 128, 10]))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    order = torch.randperm(len(x), generator=generator)
    position = 0

    def step():
        nonlocal position, order
        if position + args.batch_size > len(x):
            order = torch.randperm(len(x), generator=generator)
            position = 0
        index = order[position:position + args.batch_size]
        position += args.batch_size
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x[index]), y[index])
        loss.backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    dist.barrier()
    seconds = time.perf_counter() - start
    if rank == 0:
        result_queue.put(seconds)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--data_dir", default=DATA_DIR)
    parser.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, args, port, queue)) for r in range(args.workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
        if p.exitcode != 0:
            raise SystemExit(f"DDP worker exited with {p.exitcode}")
    seconds = queue.get()
    examples = args.steps * args.batch_size * args.workers
    print(json.dumps({"peer": "pytorch_ddp_gloo", "model": args.model, "workers": args.workers, "batch_size": args.batch_size,
                      "steps": args.steps, "seconds": seconds, "examples_per_second": examples / seconds}))


if __name__ == "__main__":
    main()
