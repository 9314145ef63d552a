"""Built-in demo models, so every command runs with no extra installed (``fxforge inspect demo``).

``convnet`` is deliberately imperfect: it has foldable BatchNorms, a redundant activation and a
Dropout left in, so ``lint`` and ``optimize`` have something to show.
"""

from __future__ import annotations

import torch
from torch import nn


class DemoConvNet(nn.Module):
    """A small CIFAR-sized classifier: two conv-BN-ReLU blocks, pooling, dropout and a linear head."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.2)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.relu(self.bn2(self.conv2(x))))  # the outer relu is redundant
        x = self.pool(x).flatten(1)
        return self.fc(self.dropout(x))


class DemoMLP(nn.Module):
    """A three-layer perceptron on flat 64-feature inputs (the size of scikit-learn's digits)."""

    def __init__(self, in_features: int = 64, hidden: int = 128, num_classes: int = 10) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


DEMO_MODELS: dict[str, tuple[type[nn.Module], list[str]]] = {
    "convnet": (DemoConvNet, ["1x3x32x32"]),
    "mlp": (DemoMLP, ["1x64"]),
}
