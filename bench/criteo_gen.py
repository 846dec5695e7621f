#!/usr/bin/python3
"""A Criteo-shaped click log with a planted logistic model.

Each example has 13 integer features and 26 categorical features in the
Criteo format (tab-separated: label, I1..I13, C1..C26 as 8-digit hex
hashes). Categorical ids are Zipf-distributed per feature, as click logs'
are; each (feature, id) has a hidden weight, each integer feature a hidden
coefficient, and the label is drawn from sigmoid(bias + the weights of the
example's ids + the coefficients times log(1 + integer)). The planted
model's own AUC and log loss on the data it wrote are the best any model
can expect from unlimited data, and are printed (JSON) at the end, with the
click rate; with --test_out, also those of a held-out log drawn from the
same hidden model. What one pass over this log allows is lower:
bench/criteo_bound.py bounds it.

  bench/criteo_gen.py --examples 10000000 --out /tmp/criteo.tsv [--test_out /tmp/test.tsv] [--vocabulary 1000000]
"""
import argparse
import json
import os
import sys

import numpy as np


def auc(scores, labels):
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    # average ranks for ties
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    average = first + (counts - 1) / 2.0 + 1
    ranks[order] = np.repeat(average, counts)
    positives = labels.sum()
    negatives = len(labels) - positives
    return (ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives)


FEATURES, INTEGERS = 26, 13
ID_SCALE = 2 / np.sqrt(FEATURES)  # an id's weight's share of the logit
ID_WEIGHT_SD = 0.6


class PlantedModel:
    """The hidden model and the stream of examples it draws, from one seed.

    Two instances with the same seed, vocabulary and chunk sizes draw the
    same examples, which is how bench/criteo_bound.py replays a log without
    reading it back."""

    def __init__(self, vocabulary, zipf, seed):
        self.vocabulary, self.zipf = vocabulary, zipf
        self.rng = np.random.default_rng(seed)
        # Hidden weights: per feature, per id (by rank), and per integer feature.
        self.id_weights = self.rng.normal(0, ID_WEIGHT_SD, size=(FEATURES, vocabulary)).astype(np.float32)
        self.coefficients = self.rng.normal(0, 0.25, size=INTEGERS).astype(np.float32)
        self.bias = -1.6  # about one example in eight clicked (Criteo's logs: about one in four)
        # Each feature's ranks map to distinct 32-bit hashes.
        self.hashes = self.rng.choice(2**32, size=(FEATURES, vocabulary), replace=False if vocabulary < 2**20 else True)
        self.rates = self.rng.uniform(0.5, 20, size=INTEGERS)  # each integer feature's Poisson mean

    def draw(self, n):
        """n examples: each feature's id rank [n, 26], the integers [n, 13]
        and which are missing, the planted logit [n], its probability [n]
        and the label drawn from it [n]."""
        ranks = np.minimum(self.rng.zipf(self.zipf, size=(n, FEATURES)), self.vocabulary) - 1
        counts = self.rng.poisson(self.rates, size=(n, INTEGERS))
        missing = self.rng.random((n, INTEGERS)) < 0.1
        logit = self.bias + self.id_weights[np.arange(FEATURES), ranks].sum(axis=1) * ID_SCALE
        # Centred on each feature's typical value, so that the bias sets the click rate.
        logit += ((np.log1p(np.where(missing, 0, counts)) - np.log1p(self.rates)) * self.coefficients).sum(axis=1)
        p = 1 / (1 + np.exp(-logit))
        y = (self.rng.random(n) < p).astype(np.int64)
        return ranks, counts, missing, logit, p, y

    def chunks(self, examples, chunk):
        written = 0
        while written < examples:
            n = min(chunk, examples - written)
            yield self.draw(n)
            written += n


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=1_000_000)
    parser.add_argument("--vocabulary", type=int, default=1_000_000, help="distinct ids per categorical feature")
    parser.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the ids")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--test_out", help="also a held-out log of the same hidden model")
    parser.add_argument("--test_examples", type=int, default=100_000)
    parser.add_argument("--learnable_min_count", type=int, default=10,
                        help="ids seen this often in training count as learnable (the test's learnable_auc)")
    parser.add_argument("--chunk", type=int, default=200_000)
    args = parser.parse_args()

    model = PlantedModel(args.vocabulary, args.zipf, args.seed)

    # How often the training log shows each (feature, id): the test log's
    # "learnable" AUC scores it with the planted weights of the ids seen at
    # least --learnable_min_count times and 0 (the prior) for the others, a
    # ceiling for any model that learns from this log alone.
    seen = np.zeros(FEATURES * args.vocabulary, dtype=np.int64)

    def write(path, examples, training):
        all_p, all_y, all_learnable = [], [], []
        with open(path, "w") as out:
            written = 0
            for ranks, counts, missing, logit, p, y in model.chunks(examples, args.chunk):
                n = len(y)
                all_p.append(p.astype(np.float32))
                all_y.append(y)
                flat = np.arange(FEATURES) * args.vocabulary + ranks
                if training:
                    seen[:] += np.bincount(flat.ravel(), minlength=seen.size)
                else:
                    known = seen[flat] >= args.learnable_min_count
                    learnable = logit - (model.id_weights[np.arange(FEATURES), ranks] * ~known).sum(axis=1) * ID_SCALE
                    all_learnable.append(learnable.astype(np.float32))
                written += n
                if path == os.devnull:  # figures only (same draws, so the same log as written before)
                    continue
                ids = model.hashes[np.arange(FEATURES), ranks]
                lines = []
                for i in range(n):
                    ints = "\t".join("" if missing[i, j] else str(counts[i, j]) for j in range(INTEGERS))
                    cats = "\t".join(f"{h:08x}" for h in ids[i])
                    lines.append(f"{y[i]}\t{ints}\t{cats}\n")
                out.writelines(lines)
                print(f"{path}: {written} examples", file=sys.stderr)
        p = np.concatenate(all_p)
        y = np.concatenate(all_y)
        clipped = np.clip(p, 1e-7, 1 - 1e-7)
        log_loss = float(-(y * np.log(clipped) + (1 - y) * np.log(1 - clipped)).mean())
        figures = {"examples": examples, "click_rate": float(y.mean()), "planted_auc": float(auc(p, y)),
                   "planted_log_loss": log_loss}
        if all_learnable:
            figures["learnable_auc"] = float(auc(np.concatenate(all_learnable), y))
            figures["learnable_min_count"] = args.learnable_min_count
        return figures

    result = write(args.out, args.examples, training=True)
    if args.test_out:
        # Fresh examples of the same hidden model: what a trained model is judged on.
        result["test"] = write(args.test_out, args.test_examples, training=False)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
