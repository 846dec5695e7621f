#!/usr/bin/env python3
"""Trains a PyTorch CNN of its own on Fashion-MNIST with shoal, asynchronously
(2 ps tasks, 2 workers), and prints the report.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/train_cnn.py [--epochs 2] [--processes]
"""
import argparse

import torch
import shoal


class Cnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(16)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = torch.nn.Linear(32 * 7 * 7, 128)
        self.drop = torch.nn.Dropout(0.25)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(self.drop(torch.relu(self.fc1(x.flatten(1)))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max_steps", type=int, default=0)
    parser.add_argument("--processes", action="store_true")
    args = parser.parse_args()
    config = {
        "cluster": {"ps": 2, "workers": 2},
        "training": {"mode": "async", "epochs": args.epochs, "max_steps": args.max_steps, "batch_size": 64,
                     "optimizer": {"kind": "adam", "learning_rate": 0.001}},
    }
    report = shoal.train(Cnn(), config, processes=args.processes)
    print(f"trained {report['global_step']} steps in {report['seconds']:.1f} s "
          f"({report['examples_per_second']:.0f} examples/s); test accuracy {100 * report['test_accuracy']:.2f}%")


if __name__ == "__main__":
    main()
