"""Serves click predictions from what `shoal export` wrote for a click model,
with PyTorch and NumPy alone (no shoal): the dense part (model.pt) and the
embedding tables (tables/manifest.json and an ids/rows NPY pair per shard).

    build/shoal train --config configs/click.yaml --checkpoint_dir ckpt
    build/shoal export --config configs/click.yaml --checkpoint ckpt --out served/model.pt
    /usr/bin/python3 examples/python/serve_clicks.py served test.tsv

It reads a Criteo-format log (label, 13 integers, 26 hex hashes per line), turns
each hash into the id shoal trained (feature << 32 | hash; modulo a fixed
table's rows), looks the ids up, pools them per feature and
runs the dense part. An id the table does not hold (a dynamic table's unseen
id) gets the row shoal would have started it with, so the predictions are the
ones shoal's evaluator makes. Prints the log loss and AUC on the log.
"""

import argparse
import json
import os

import numpy as np
import torch

def _mix(x):
    """SplitMix64 on uint64 arrays (overflow wraps, as in C++): how shoal draws a row's start."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class Table:
    """One exported table: its rows by id, and shoal's initial row for an id it does not hold."""

    def __init__(self, folder, entry):
        ids = [np.load(os.path.join(folder, s["ids"])) for s in entry["shards"]]
        rows = [np.load(os.path.join(folder, s["rows"])) for s in entry["shards"]]
        self.ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        order = np.argsort(self.ids)
        self.ids = self.ids[order]
        self.rows = (np.concatenate(rows) if rows else np.zeros((0, entry["width"]), np.float32))[order]
        self.width, self.seed, self.init_scale = entry["width"], entry["seed"], entry["init_scale"]

    def initial_rows(self, ids):
        """Row `id` starts uniform in [-init_scale, init_scale], drawn from (seed, id) alone."""
        base = _mix(np.uint64(self.seed) ^ _mix(ids.astype(np.uint64)))
        columns = base[:, None] + np.arange(self.width, dtype=np.uint64)[None, :]
        unit = (_mix(columns) >> np.uint64(11)).astype(np.float64) * 2.0**-53
        return ((2 * unit - 1) * self.init_scale).astype(np.float32)

    def lookup(self, ids):
        flat = ids.reshape(-1)
        held = np.zeros(len(flat), bool)
        where = np.zeros(len(flat), np.int64)
        if len(self.ids):
            where = np.searchsorted(self.ids, flat).clip(0, len(self.ids) - 1)
            held = self.ids[where] == flat
        out = np.empty((len(flat), self.width), np.float32)
        out[held] = self.rows[where[held]]
        if (~held).any():
            out[~held] = self.initial_rows(flat[~held])
        return out.reshape(*ids.shape, self.width)


def read_criteo(path, rows):
    """Labels, integer features and ids as shoal's Criteo reader makes them."""
    labels, integers, ids = [], [], []
    with open(path) as log:
        for line in log:
            fields = line.rstrip("\n").split("\t")
            labels.append(float(fields[0]))
            integers.append([int(x) if x else 0 for x in fields[1:14]])
            ids.append([(f << 32) | (int(h, 16) if h else 0) for f, h in enumerate(fields[14:40])])
    ids = np.array(ids, dtype=np.int64)
    if rows > 0:  # a fixed table: the model takes each id modulo its rows
        ids = ids % rows
    return np.array(labels, np.float32), np.array(integers, np.int64), ids


def auc(probabilities, labels):
    order = np.argsort(probabilities, kind="mergesort")
    ranks = np.empty(len(order))
    ranks[order] = np.arange(1, len(order) + 1)
    positives = labels.sum()
    negatives = len(labels) - positives
    return (ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", help="the folder of model.pt and tables/ (shoal export --out FOLDER/model.pt)")
    parser.add_argument("log", help="a Criteo-format log to predict")
    args = parser.parse_args()
    folder = os.path.join(args.export, "tables")
    with open(os.path.join(folder, "manifest.json")) as f:
        manifest = json.load(f)
    click = manifest["click"]
    if click["bag_size"] != 1:
        raise SystemExit("this example reads single-id features (Criteo's); the model takes bags of "
                         f"{click['bag_size']}")
    (entry,) = manifest["tables"]
    table = Table(folder, entry)
    dense = torch.jit.load(os.path.join(args.export, "model.pt"))
    labels, integers, ids = read_criteo(args.log, entry["rows_configured"])
    pooled = table.lookup(ids)  # [n, features, width]: one id a feature, so sum and mean pool alike
    with torch.no_grad():
        logits = dense(torch.from_numpy(integers), torch.from_numpy(pooled)).numpy().astype(np.float64)
    p = 1 / (1 + np.exp(-logits))
    log_loss = -np.mean(labels * np.log(np.clip(p, 1e-12, 1)) + (1 - labels) * np.log(np.clip(1 - p, 1e-12, 1)))
    print(f"served {len(labels)} examples: log loss {log_loss:.6f}, AUC {auc(p, labels):.6f}")


if __name__ == "__main__":
    main()
