"""A small CNN trained on scikit-learn's digits, with calibration and test data (docs/commands/quantize.md).

    fxforge quantize examples/digits.py:trained --calib examples/digits.py:train_images \
        --eval examples/digits.py:test_set --sensitivity -o out/digits-int8

The digits ship with scikit-learn (no download): 1797 8x8 images, split 1347 for training (and calibration)
and 450 held out for evaluation. Training takes a few seconds on a CPU and is seeded, so runs agree.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

example_inputs = ["1x1x8x8"]


class DigitsCNN(nn.Module):
    """Two conv-BatchNorm-ReLU blocks, max pooling, two linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.pool(self.relu(self.bn2(self.conv2(x))))
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


@functools.cache
def split() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train/test split of the digits scaled to [0, 1]: (N, 1, 8, 8) images and int64 labels."""
    from sklearn import datasets, model_selection

    data = datasets.load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target, dtype=torch.int64)
    train, test = model_selection.train_test_split(
        torch.arange(len(y)).numpy(), test_size=0.25, random_state=0, stratify=y.numpy()
    )
    return x[train], y[train], x[test], y[test]


def fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float = 3e-3) -> list[float]:
    """Train ``model`` on ``(x, y)`` with Adam in shuffled batches of 64 (seeded); returns the losses."""
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), 64):
            batch = order[start : start + 64]
            loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def trained(epochs: int = 8) -> nn.Module:
    """The CNN trained for ``epochs`` passes over the training split."""
    x, y, _, _ = split()
    torch.manual_seed(0)
    model = DigitsCNN()
    fit(model, x, y, epochs)
    return model.eval()


def train_images() -> list[torch.Tensor]:
    """Calibration data: the training images in batches of 64."""
    return list(split()[0].split(64))


def test_set() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Evaluation data: (images, labels) batches of the held-out split, so the report measures real accuracy."""
    _, _, x, y = split()
    return list(zip(x.split(64), y.split(64)))
