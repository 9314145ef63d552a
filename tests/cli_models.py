"""Small models loaded by the CLI tests as ``tests/cli_models.py:Name``."""

from __future__ import annotations

import torch
from torch import nn


class Gate(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.mean() > 0:  # data-dependent: fxforge must make this module a leaf
            return x.relu()
        return -x


class GatedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.gate = Gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(self.lin(x))


class RootBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if y.sum() > 0:  # data-dependent in the root: nothing can be made a leaf
            return y
        return -y


class RootNumpy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.lin(x).detach().numpy().clip(0))  # numpy in the root: no leaf can hold it


class KeywordOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, *, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class KeywordScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, *, scale: float) -> torch.Tensor:
        return self.lin(x) * scale


def Relu() -> nn.Module:
    return nn.Sequential(nn.ReLU())


def ReluClamped() -> nn.Module:
    return nn.Sequential(nn.ReLU(), nn.Hardtanh(0.0, 0.5))


class TakesACount(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return self.lin(x) * n


class SmallVocabulary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 8)
        self.positions = nn.Embedding(512, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids) + self.positions(torch.arange(ids.shape[1]))


class TakesAMode(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, *, mode: str) -> torch.Tensor:
        return self.lin(x) if mode == "a" else x
