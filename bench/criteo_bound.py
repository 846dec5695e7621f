#!/usr/bin/python3
"""How close to the planted AUC can any model get after one pass over a log?

A bound for the accuracy target of bench/click_accuracy.sh. It replays the
log that bench/criteo_gen.py writes (same seed, vocabulary and chunk: the
same draws, without reading the file) and scores the held-out log with a
genie-aided Bayes estimate of every id's weight:

- the integer features' coefficients and the bias are the planted ones;
- an id seen at least --exact_from times in training gets its planted
  weight;
- an id seen fewer times gets its posterior mean: the planted prior
  N(0, 0.6^2) times the likelihood of its training examples' labels, each
  example's other weights taken as the planted ones (the genie: no learner
  knows them), on a grid of weights;
- an id never seen in training gets the prior's mean, 0.

Every learner of this log knows less than the genie does (the others'
weights exactly), so its AUC on the held-out log is at most about the
genie's. Also printed: the "seen at least k times" oracles, which know the
planted weights of those ids exactly and give the rest 0.

  bench/criteo_bound.py --examples 10000000 --vocabulary 1000000 --chunk 500000 --test_examples 200000
"""
import argparse
import json
import sys

import numpy as np

from criteo_gen import FEATURES, ID_SCALE, ID_WEIGHT_SD, PlantedModel, auc


def log_sigmoid(x):
    return -np.logaddexp(0, -x)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=1_000_000)
    parser.add_argument("--vocabulary", type=int, default=1_000_000)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=200_000, help="as criteo_gen.py was given (it sets the draws)")
    parser.add_argument("--test_examples", type=int, default=100_000)
    parser.add_argument("--exact_from", type=int, default=2000,
                        help="ids seen this often get their planted weight (their posterior is that narrow)")
    parser.add_argument("--grid", type=int, default=49, help="weights on the posterior's grid, over +-4 sd")
    args = parser.parse_args()

    # Pass 1: how often training shows each (feature, id); then the held-out log.
    model = PlantedModel(args.vocabulary, args.zipf, args.seed)
    seen = np.zeros(FEATURES * args.vocabulary, dtype=np.int64)
    for ranks, _, _, _, _, _ in model.chunks(args.examples, args.chunk):
        seen += np.bincount((np.arange(FEATURES) * args.vocabulary + ranks).ravel(), minlength=seen.size)
        print(".", end="", file=sys.stderr, flush=True)
    test = list(model.chunks(args.test_examples, args.chunk))
    test_flat = np.concatenate([np.arange(FEATURES) * args.vocabulary + t[0] for t in test])  # [n, 26]
    test_logit = np.concatenate([t[3] for t in test])
    test_y = np.concatenate([t[5] for t in test])
    planted = model.id_weights.ravel()

    # The ids whose posterior is worked out: in the held-out log, seen in
    # training, and seen fewer than --exact_from times.
    wanted = np.unique(test_flat)
    wanted = wanted[(seen[wanted] > 0) & (seen[wanted] < args.exact_from)]
    slot = np.full(seen.size, -1, dtype=np.int64)
    slot[wanted] = np.arange(len(wanted))
    grid = np.linspace(-4 * ID_WEIGHT_SD, 4 * ID_WEIGHT_SD, args.grid)
    log_posterior = np.tile(-0.5 * (grid / ID_WEIGHT_SD) ** 2, (len(wanted), 1))

    # Pass 2: the same training draws again, each sighting of a wanted id
    # adding its label's log likelihood at every weight on the grid.
    replay = PlantedModel(args.vocabulary, args.zipf, args.seed)
    for ranks, _, _, logit, _, y in replay.chunks(args.examples, args.chunk):
        flat = np.arange(FEATURES) * args.vocabulary + ranks
        where = slot[flat]
        rows, columns = np.nonzero(where >= 0)
        ids = where[rows, columns]
        others = logit[rows] - planted[flat[rows, columns]] * ID_SCALE
        sign = np.where(y[rows] == 1, 1.0, -1.0)
        for g, w in enumerate(grid):
            log_posterior[:, g] += np.bincount(ids, weights=log_sigmoid(sign * (others + w * ID_SCALE)),
                                               minlength=len(wanted))
        print("+", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    log_posterior -= log_posterior.max(axis=1, keepdims=True)
    posterior = np.exp(log_posterior)
    posterior_mean = (posterior * grid).sum(axis=1) / posterior.sum(axis=1)

    estimate = np.where(seen >= args.exact_from, planted, 0.0).astype(np.float64)
    estimate[wanted] = posterior_mean
    id_part = lambda weights: weights[test_flat].sum(axis=1) * ID_SCALE
    rest = test_logit - id_part(planted)  # bias and integer features, as planted
    figures = {
        "examples": args.examples,
        "vocabulary": args.vocabulary,
        "test_examples": len(test_y),
        "planted_auc": float(auc(test_logit, test_y)),
        "genie_bayes_auc": float(auc(rest + id_part(estimate), test_y)),
        "exact_from": args.exact_from,
        "ids_with_a_posterior": int(len(wanted)),
    }
    for k in (1, 2, 5, 10, 100):
        figures[f"oracle_seen_{k}_auc"] = float(auc(rest + id_part(np.where(seen >= k, planted, 0.0)), test_y))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
