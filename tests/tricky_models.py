"""Models that are hard to capture, loaded by the tests as ``tests/tricky_models.py:Name``.

Each class documents what fxforge is expected to do with it; tests/test_capture_tricky.py checks it.
Lines the tests look for carry a ``# MARK:name`` comment, so that the tests find their line numbers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# --------------------------------------------------------------------------------------------------
# data-dependent control flow


class Gate(nn.Module):
    """A data-dependent branch inside a submodule: fxforge makes the submodule a leaf."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.mean() > 0:  # MARK:gate-branch
            return x.relu()
        return -x


class SubmoduleBranch(nn.Module):
    """Leaf expected: ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.gate = Gate()
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gate(self.lin(x)))


class RootBranch(nn.Module):
    """A data-dependent branch in the root's own forward: no leaf helps, torch.export refuses too."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if y.sum() > 0:  # MARK:root-branch
            return y
        return -y


class GateThenRootBranch(nn.Module):
    """A branch in a submodule (fixable: leaf) and then one in the root (not fixable): the error must
    name the root's line, the one that stopped capture, not the submodule's, which a leaf fixed."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = Gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.gate(x)
        if y.max() > 1:  # MARK:late-root-branch
            return y / y.max()
        return y


class BatchLoop(nn.Module):
    """A Python loop over ``x.size(0)``: symbolic tracing cannot iterate a Proxy, so torch.export
    captures it, unrolled for the example batch size (the graph bakes the batch in)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = []
        for i in range(x.size(0)):
            rows.append(self.lin(x[i]) * (i + 1))
        return torch.stack(rows)


class ShapeArithmetic(nn.Module):
    """Shape arithmetic through ``x.shape``/``x.size()``: symbolic tracing records it as graph ops."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, channels = x.shape[0], x.size(1)
        y = self.lin(x.reshape(batch, -1, channels))
        return y.reshape(batch, -1) * (channels // 2) + x.shape[-1]


class LenOfTensor(nn.Module):
    """``len(x)`` is not traceable (fx refuses ``len`` of a Proxy); torch.export captures it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = len(x)
        return self.lin(x).reshape(n, -1) / n


# --------------------------------------------------------------------------------------------------
# helper functions with data-dependent branches


def rescale(x: torch.Tensor) -> torch.Tensor:
    """A plain (non-torch) helper with a data-dependent branch: fxforge wraps it as one call."""
    if x.abs().max() > 1:
        return x / x.abs().max()
    return x


def _private_shift(x: torch.Tensor) -> torch.Tensor:
    """The same, with a private name (``torch.fx.wrap`` users often miss these)."""
    if x.min() < 0:
        return x - x.min()
    return x


class HelperBranch(nn.Module):
    """Wrapped expected: ``rescale``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rescale(self.lin(x)) * 2


class PrivateHelperBranch(nn.Module):
    """Wrapped expected: ``_private_shift``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _private_shift(self.lin(x)) + 1


# --------------------------------------------------------------------------------------------------
# structured inputs and outputs


class DictIO(nn.Module):
    """A dict input and a dict output holding a tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 4)
        self.b = nn.Linear(6, 4)

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, object]:
        a, b = self.a(inputs["a"]), self.b(inputs["b"])
        return {"sum": a + b, "parts": (a, b)}


class TupleOut(nn.Module):
    """A tuple output (logits, features)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = F.gelu(self.body(x))
        return self.head(features), features


class KwargsModel(nn.Module):
    """A keyword input (a mask), given to capture as ``example_kwargs``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
        y = self.lin(x) * scale
        if mask is not None:
            y = y.masked_fill(mask, 0.0)
        return y


# --------------------------------------------------------------------------------------------------
# module reuse, in-place ops, state


class Block(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))


class SharedBlock(nn.Module):
    """One submodule called twice: its parameters count once."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.block(x)))


class InPlace(nn.Module):
    """In-place ops on intermediate values: ``relu_``, ``+=``, ``mul_`` and ``clamp_``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        y.relu_()
        y += 1
        y.mul_(x)
        return y.clamp_(max=2.0)


class InputMutation(nn.Module):
    """Writes into its own input in place."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return self.lin(x)


class CallCounter(nn.Module):
    """A buffer mutated in forward (a call counter), which the output depends on."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return self.lin(x) * self.calls


class NaNBuffer(nn.Module):
    """A buffer holding NaN (as ``torch.empty`` buffers may), read but never written."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("fill", torch.tensor([float("nan"), 1.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + torch.nan_to_num(self.fill, nan=0.5).sum()


class ScaleGradFn(torch.autograd.Function):
    """A custom autograd Function: doubles its input, passes gradients through unchanged."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


class CustomFunction(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ScaleGradFn.apply(self.lin(x)) + 1


class TwoBlocks(nn.Module):
    """For user-given leaf modules, by name (``first``) or by type (:class:`Block`)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = Block()
        self.second = Block()
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.second(self.first(x)))


example_inputs = ["2x8"]


# --------------------------------------------------------------------------------------------------
# attention (FLOP counting)


class Attention(nn.Module):
    """``F.scaled_dot_product_attention`` on (batch, 2 heads, seq, 16): 4 * b * h * s^2 * 16 FLOPs."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)


class MultiheadSelfAttention(nn.Module):
    """``nn.MultiheadAttention`` (width 32, 4 heads), whose CPU fast path is one fused op."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attention(x, x, x, need_weights=False)[0]
