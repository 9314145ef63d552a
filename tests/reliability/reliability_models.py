"""Small models that once made fxforge report a wrong result, change the caller's objects or crash.

Each is referenced by the reliability tests through the Python API or as a CLI model spec
(``tests/reliability/reliability_models.py:NAME``).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn


class MeanGate(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.mean() > 0:  # MARK:mean-gate
            return x * 2
        return x - 1


class GatedBlock(nn.Module):
    """A data-dependent branch inside a submodule: a trace freezes one side."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.gate = MeanGate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(self.lin(x))


def gated_block() -> nn.Module:
    return GatedBlock()


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


class LoopThenFlag(nn.Module):
    """``range(x.size(0))`` stops symbolic tracing (torch.export handles it); ``flag`` picks a branch."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor, flag: bool = True) -> torch.Tensor:
        for _ in range(x.size(0)):
            x = x + 1
        if flag:
            return self.lin(x) * 2
        return self.lin(x) * 3


class NoFlopFormula(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cdist(x, x) + torch.fft.fft(x).real


class Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        y = self.lin(x)
        return y if mask is None else y * mask


class Identity(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class AsInt64(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.long()


class AllNaN(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * float("nan")


class RandomOutput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, 0.5, training=True)


class CounterThenBranch(nn.Module):
    """A buffer written in forward, then a data-dependent branch: no capture method can take it."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()))
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count += 1
        if x.sum() > 0:
            return self.lin(x)
        return x


class Counter(nn.Module):
    """A buffer written in forward: symbolic tracing cannot record the assignment; torch.export can."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()))
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count += 1  # MARK:counter-write
        return self.lin(x) * self.count


class WritesInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return self.lin(x)


@dataclasses.dataclass
class Prediction:
    logits: torch.Tensor
    scale: float


class DataclassOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> Prediction:
        return Prediction(self.lin(x), 2.0)


def dataclass_output() -> nn.Module:
    return DataclassOutput()


def masked() -> nn.Module:
    return Masked()


def factory_that_raises() -> nn.Module:
    raise ValueError("bad config value 7")  # MARK:factory-raises


class WithScriptedPart(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scripted = torch.jit.script(nn.Linear(4, 4))
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.scripted(x))


def with_scripted_part() -> nn.Module:
    return WithScriptedPart()


def conv_bn() -> nn.Module:
    return ConvBN()


class MisspeltOp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.hardtanh(x)  # MARK:misspelt-op (F.hardtanh exists, torch.hardtanh does not)


def misspelt_op() -> nn.Module:
    return MisspeltOp()


class MisspeltLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lienar(x)  # MARK:misspelt-layer


def misspelt_layer() -> nn.Module:
    return MisspeltLayer()


class BatchOfTwoOnly(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(2, 4).relu()  # MARK:batch-of-two


def batch_of_two_only() -> nn.Module:
    return BatchOfTwoOnly()


example_inputs = ["2x4"]
