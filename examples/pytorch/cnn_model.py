#!/usr/bin/python3
"""A CNN with BatchNorm and dropout, written in PyTorch, scripted and saved
for shoal to train (model.kind torchscript).

  /usr/bin/python3 examples/pytorch/cnn_model.py --out examples/pytorch/cnn.pt
  build/shoal train --config examples/pytorch/cnn.yaml

shoal names the variables after named_parameters() (conv1.weight, bn1.bias,
...) and the buffers after named_buffers() (bn1.running_mean,
bn1.num_batches_tracked, ...). Every task loads the same file, so every
worker starts from the values saved in it. forward() takes a batch of
images [B, 1, 28, 28] and returns logits [B, 10].
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.dropout = nn.Dropout(0.25)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = self.dropout(F.relu(self.fc1(x.flatten(1))))
        return self.fc2(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="examples/pytorch/cnn.pt")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    scripted = torch.jit.script(Net())
    scripted.save(args.out)
    params = sum(p.numel() for p in scripted.parameters())
    print(f"saved {args.out}: {params} parameters, buffers {[name for name, _ in scripted.named_buffers()]}")


if __name__ == "__main__":
    main()
