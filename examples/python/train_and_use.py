"""Trains a PyTorch module with shoal, then uses it without shoal: the module
itself holds the trained values when shoal.train returns (as after Keras'
fit), and the job's run folder holds them as TorchScript for serving.

    /usr/bin/python3 examples/python/train_and_use.py [--epochs 2] [--run_dir runs]

It reads Fashion-MNIST (Debian's dataset-fashion-mnist) with NumPy, so that the
test set it scores the module on is the one it handed shoal.
"""

import argparse
import gzip
import os

import numpy as np
import torch

import shoal

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


def read_idx(name):
    with gzip.open(os.path.join(FASHION_MNIST, name)) as f:
        data = f.read()
    dimensions = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dimensions)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dimensions).reshape(shape)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(784, 128)
        self.bn = torch.nn.BatchNorm1d(128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x.flatten(1)))))


def accuracy(model, images, labels):
    with torch.no_grad():
        return (model(images).argmax(1) == labels).double().mean().item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--run_dir", default="runs", help="where the job's run folder goes (hooks.run_dir)")
    args = parser.parse_args()
    x_train, y_train = read_idx("train-images-idx3-ubyte.gz"), read_idx("train-labels-idx1-ubyte.gz")
    x_test, y_test = read_idx("t10k-images-idx3-ubyte.gz"), read_idx("t10k-labels-idx1-ubyte.gz")
    net = Net()
    # uint8 features: shoal scales them to [0, 1], as the evaluation below does.
    report = shoal.train(net, {"training": {"epochs": args.epochs}, "hooks": {"run_dir": args.run_dir}},
                         data=(x_train, y_train.astype(np.int64), x_test, y_test.astype(np.int64)))
    images = torch.from_numpy(x_test.astype(np.float32) / 255)
    labels = torch.from_numpy(y_test.astype(np.int64))
    print(f"shoal's report: test accuracy {100 * report['test_accuracy']:.2f}%")
    # 1. The module itself, in plain PyTorch.
    net.eval()
    print(f"the module, in plain PyTorch: {100 * accuracy(net, images, labels):.2f}%")
    # 2. The run folder's TorchScript file, as a server would load it.
    served = torch.jit.load(report["model_file"])
    print(f"{report['model_file']}, through torch.jit.load: {100 * accuracy(served, images, labels):.2f}%")


if __name__ == "__main__":
    main()
