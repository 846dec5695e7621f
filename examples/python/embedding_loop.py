#!/usr/bin/env python3
"""A PyTorch click-through model whose embedding table lives on shoal's ps
tasks, row by row, as in Persia or HugeCTR: shoal.Embedding, a PyTorch layer,
pulls only the rows of each batch's distinct ids, and backward pushes their
gradients to the table's sparse optimizer (Adagrad) on the ps. The small
dense part is trained by PyTorch here.
The log is made up: Zipf-distributed ids of 8 features and a planted logistic
model, so the AUC the data allows is known.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/embedding_loop.py [--steps 400] [--ps HOST:PORT,...]
"""
import argparse

import numpy as np
import torch
import shoal

FEATURES, IDS_PER_FEATURE, DIM = 8, 5000, 8


def planted_log(examples, rng, weights):
    """Ids [examples, FEATURES] (feature f's ids offset by f * IDS_PER_FEATURE, one
    table for all) and 0/1 labels drawn from the planted model, with its logits."""
    ids = np.minimum(rng.zipf(1.2, size=(examples, FEATURES)) - 1, IDS_PER_FEATURE - 1)
    ids += np.arange(FEATURES) * IDS_PER_FEATURE
    logits = weights[ids].sum(axis=1) - 1.0
    labels = (rng.random(examples) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    return torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(labels), logits


def auc(scores, labels):
    """The area under the ROC curve (ties counted half)."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    positives = labels.sum()
    negatives = len(labels) - positives
    return (ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--ps", default="", help="the ps tasks of a running cluster, comma-separated")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    weights = rng.normal(0, 0.6, size=FEATURES * IDS_PER_FEATURE)
    train_ids, train_labels, _ = planted_log(args.steps * args.batch_size, rng, weights)
    test_ids, test_labels, test_logits = planted_log(20000, rng, weights)

    servers = [] if args.ps else [shoal.Server(), shoal.Server()]  # each on a port the system picks
    addresses = args.ps.split(",") if args.ps else [server.address for server in servers]
    client = shoal.Client({"ps": addresses}, {})  # no dense variables: the table only
    client.create_table("embeddings", rows=FEATURES * IDS_PER_FEATURE, dim=DIM, seed=1, init_scale=0.01,
                        optimizer={"kind": "adagrad", "learning_rate": 0.1, "initial_accumulator_value": 1e-8})

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        shoal.Embedding(client, "embeddings"),  # [batch, FEATURES] ids -> [batch, FEATURES, DIM] rows
        torch.nn.Flatten(),
        torch.nn.Linear(FEATURES * DIM, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)  # the dense part: the table is the ps's

    for step in range(args.steps):
        batch = slice(step * args.batch_size, (step + 1) * args.batch_size)
        ids = train_ids[batch]
        logits = model(ids).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, train_labels[batch])
        optimizer.zero_grad()
        loss.backward()  # also pushes one gradient row per distinct id to the table
        optimizer.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}, {len(torch.unique(ids))} distinct ids pulled and pushed")

    with torch.no_grad():  # nothing is pushed
        scores = torch.cat([model(test_ids[i:i + 4096]).squeeze(1) for i in range(0, len(test_ids), 4096)])
    labels = test_labels.numpy()
    print(f"test AUC {auc(scores.numpy(), labels):.4f} (the planted model's {auc(test_logits, labels):.4f})")
    if servers:
        client.shutdown_servers()


if __name__ == "__main__":
    main()
