#!/usr/bin/python3
"""The PyTorch peer of the click benchmark: shoal's wide & deep click model
(model.kind click, arch wide_deep) in one process, with the table as an
nn.EmbeddingBag(sparse=True) trained by torch.optim.Adagrad and the dense
part by Adam, on the same Criteo-format log, batch and hyper-parameters.

Same model, term for term: ids are (feature << 32) | hash folded into the
table by id mod rows; each row is dim + 1 wide, its last column the id's
wide weight; integers enter as log(1 + max(x, 0)); logit = the ids' wide
weights + a linear map of the integers + an MLP over the pooled embeddings
and the integers. Table Adagrad as TensorFlow's (epsilon 1e-7), its accumulator from
configs/click.yaml's 1e-8, rows uniform in [-0.01, 0.01].

Prints one JSON line: steady examples/s (after --warmup steps), the test
AUC and log loss after one pass (or --steps), and the threads it used.

  bench/click_peer.py --train bench/out/criteo/train.tsv --test bench/out/criteo/test.tsv --rows 10000000
"""
import argparse
import json
import time

import numpy as np
import torch


def read_criteo(path, limit=0):
    """Labels, integers and ids, parsed into arrays made once (a 10M-line
    log in Python lists would take ~9 GB; this takes its 3.1 GB)."""
    with open(path, "rb") as f:
        n = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))
    if limit:
        n = min(n, limit)
    labels = np.empty(n, dtype=np.float32)
    integers = np.empty((n, 13), dtype=np.int64)
    ids = np.empty((n, 26), dtype=np.int64)
    features = np.arange(26, dtype=np.int64) << 32
    with open(path) as f:
        for row, line in enumerate(f):
            if row >= n:
                break
            fields = line.rstrip("\n").split("\t")
            labels[row] = float(fields[0])
            integers[row] = [int(x) if x else 0 for x in fields[1:14]]
            ids[row] = [int(h, 16) if h else 0 for h in fields[14:40]]
    ids |= features
    return torch.from_numpy(labels), torch.from_numpy(integers), torch.from_numpy(ids)


def auc(scores, labels):
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat(first + (counts - 1) / 2.0 + 1, counts)
    positives = labels.sum()
    negatives = len(labels) - positives
    return float((ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


class WideDeep(torch.nn.Module):
    def __init__(self, rows, dim, features, integers, hidden, wide_only=False):
        super().__init__()
        self.dim = 0 if wide_only else dim
        self.table = torch.nn.EmbeddingBag(rows, self.dim + 1, mode="sum", sparse=True)
        torch.nn.init.uniform_(self.table.weight, -0.01, 0.01)
        self.wide = torch.nn.Parameter(torch.zeros(integers, 1))
        self.deep = None
        if wide_only:
            self.bias = torch.nn.Parameter(torch.zeros(1))
            return
        layers, width = [], features * dim + integers
        for h in hidden:
            layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
            width = h
        layers.append(torch.nn.Linear(width, 1))
        self.deep = torch.nn.Sequential(*layers)

    def forward(self, integers, ids):
        n, features = ids.shape
        flat = ids.reshape(-1)
        rows = self.table(flat, torch.arange(flat.numel()))  # one id per bag: single-hot features
        pooled = rows.view(n, features, self.dim + 1)
        dense = torch.log1p(integers.clamp_min(0).float())
        wide = pooled[:, :, self.dim].sum(1) + (dense @ self.wide).view(n)
        if self.deep is None:
            return wide + self.bias
        return wide + self.deep(torch.cat([pooled[:, :, : self.dim].reshape(n, -1), dense], 1)).view(n)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", required=True)
    parser.add_argument("--test", required=True)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--hidden", default="64,32")
    parser.add_argument("--wide_only", action="store_true",
                        help="logistic regression on the ids' weights and the integers, no deep part: the "
                             "generator's planted model's own form (bench/click_accuracy.sh's one-pass ceiling)")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=0, help="0: one pass over the training log")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--table_lr", type=float, default=0.05)
    parser.add_argument("--table_initial_accumulator", type=float, default=1e-8,
                        help="the table Adagrad's accumulator at start (configs/click.yaml's)")
    parser.add_argument("--dense_lr", type=float, default=0.001)
    parser.add_argument("--threads", type=int, default=0, help="0: torch's default (the cores)")
    parser.add_argument("--train_examples", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(1)

    labels, integers, ids = read_criteo(args.train, args.train_examples)
    ids = ids.remainder(args.rows)
    model = WideDeep(args.rows, args.dim, ids.shape[1], integers.shape[1], [int(h) for h in args.hidden.split(",")],
                     args.wide_only)
    table_opt = torch.optim.Adagrad([model.table.weight], lr=args.table_lr,
                                    initial_accumulator_value=args.table_initial_accumulator, eps=1e-7)
    dense_opt = torch.optim.Adam([p for name, p in model.named_parameters() if name != "table.weight"],
                                 lr=args.dense_lr)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    n = labels.numel()
    steps = args.steps or (n + args.batch - 1) // args.batch
    order = torch.randperm(n)
    start = None
    for step in range(steps):
        if step == args.warmup:
            start = time.perf_counter()
        begin = (step * args.batch) % n
        batch = order[begin:begin + args.batch]
        loss = loss_fn(model(integers[batch], ids[batch]), labels[batch])
        table_opt.zero_grad()
        dense_opt.zero_grad()
        loss.backward()
        table_opt.step()
        dense_opt.step()
    seconds = time.perf_counter() - start
    steady = (steps - args.warmup) * args.batch / seconds

    test_labels, test_integers, test_ids = read_criteo(args.test)
    with torch.no_grad():
        p = torch.sigmoid(model(test_integers, test_ids.remainder(args.rows))).numpy()
    y = test_labels.numpy()
    clipped = np.clip(p, 1e-7, 1 - 1e-7)
    print(json.dumps({"peer": "pytorch EmbeddingBag(sparse) + Adagrad, one process", "wide_only": args.wide_only,
                      "steps": steps,
                      "batch": args.batch, "steady_examples_per_second": steady,
                      "test_auc": auc(p, y),
                      "test_log_loss": float(-(y * np.log(clipped) + (1 - y) * np.log(1 - clipped)).mean()),
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
