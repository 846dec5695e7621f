#!/usr/bin/env python3
"""A PyTorch training loop that keeps its weights on a shoal parameter server:
pull, forward and backward in PyTorch, push the gradients; the ps applies
them with its optimizer. Starts the ps in this process unless --ps names one
(a `shoal server` of a running cluster, for instance). With --checkpoint_dir
it saves every 100 steps and at the end, and a second run resumes from the
newest checkpoint there (a `shoal server` given --ps needs the same
--checkpoint_dir).

    PYTHONPATH=build/python /usr/bin/python3 examples/python/client_loop.py [--steps 500] [--ps HOST:PORT] \
        [--checkpoint_dir DIR]
"""
import argparse
import gzip

import numpy as np
import torch
import shoal

FASHION = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path) as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--ps", default="")
    parser.add_argument("--checkpoint_dir", default="")
    args = parser.parse_args()
    images = torch.from_numpy(read_idx(f"{FASHION}/train-images-idx3-ubyte.gz").astype(np.float32) / 255).flatten(1)
    labels = torch.from_numpy(read_idx(f"{FASHION}/train-labels-idx1-ubyte.gz").astype(np.int64))

    # A ps in this process, on a port the system picks, unless --ps names one.
    server = None if args.ps else shoal.Server(checkpoint_dir=args.checkpoint_dir or None)
    address = args.ps or server.address
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    client = shoal.Client({"ps": [address]}, model.named_parameters())
    client.create(dict(model.named_parameters()), optimizer={"kind": "sgd", "learning_rate": 0.1})
    start = 0
    if args.checkpoint_dir:
        start = client.restore(args.checkpoint_dir) or 0  # the newest checkpoint's step, if there is one
        print(f"resumed at step {start}" if start else "no checkpoint yet: starting afresh")

    for step in range(start, args.steps):
        client.pull(model.named_parameters())  # pull: the ps's values into the model
        batch = torch.randint(0, len(images), (args.batch_size,))
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(images[batch]), labels[batch])
        loss.backward()
        client.apply({name: p.grad for name, p in model.named_parameters()})  # push
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}")
        if args.checkpoint_dir and ((step + 1) % 100 == 0 or step == args.steps - 1):
            client.save(args.checkpoint_dir)  # as ckpt-<global step>: steps done, counting earlier runs
    if server is not None:
        client.shutdown_servers()


if __name__ == "__main__":
    main()
