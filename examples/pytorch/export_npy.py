#!/usr/bin/python3
"""Exports Fashion-MNIST (Debian's dataset-fashion-mnist, IDX files) to NPY
files that shoal reads with data.format npy: uint8 images [N, 1, 28, 28] and
int64 labels [N], one pair per split. Any dataset saved the same way from
numpy trains the same way.

  /usr/bin/python3 examples/pytorch/export_npy.py --out /tmp/fmnist [--limit N]
  build/shoal train --config examples/pytorch/npy.yaml
"""
import argparse
import gzip
import os

import numpy as np

DATA_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data_dir", default=DATA_DIR)
    parser.add_argument("--out", default="/tmp/fmnist")
    parser.add_argument("--limit", type=int, default=0, help="the first N examples of each split; 0: all")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for split, name in (("train", "train"), ("t10k", "test")):
        images = read_idx(os.path.join(args.data_dir, f"{split}-images-idx3-ubyte.gz"))
        labels = read_idx(os.path.join(args.data_dir, f"{split}-labels-idx1-ubyte.gz"))
        if args.limit:
            images, labels = images[:args.limit], labels[:args.limit]
        np.save(os.path.join(args.out, f"{name}_features.npy"), images.reshape(-1, 1, 28, 28))
        np.save(os.path.join(args.out, f"{name}_labels.npy"), labels.astype(np.int64))
        print(f"{name}: {len(labels)} examples -> {args.out}/{name}_features.npy, {name}_labels.npy")


if __name__ == "__main__":
    main()
