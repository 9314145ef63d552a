"""A model for `fxforge debug --nan` (docs/commands/debug.md): a `log` that goes NaN for inputs below 3, inside a
model whose root `forward` branches on a tensor value, which no capture method takes, so debug runs it eagerly."""

import torch
from torch import nn

example_inputs = ["4x8"]


class Gate(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x - 3)  # NaN wherever x < 3: every value of a standard normal input, nearly


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = Gate()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent control flow
            return self.linear(self.gate(x))
        return self.linear(self.gate(-x))


def build() -> nn.Module:
    torch.manual_seed(0)
    return Model().eval()
