"""A user helper that capture keeps as one call (it branches on data) may write into what it is given. QA found four
passes treating such a call as pure: dead_code removed one whose only effect was ``buf.add_(1)``, remove_identity
dropped ``x + buf`` for a zero buffer the helper had incremented, remove_redundant_activation dropped ``relu(a)``
for an ``a`` the helper had negated, fold_bn folded statistics the helper updated. Each pass now counts an opaque
call as a writer of its tensor inputs (and only those: a shape passed to one, timm's ``get_same_padding``, is not)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from fxforge import apply_pass, capture


def bump(t, x):
    if x.sum() > -1e9:  # data-dependent: capture keeps the helper as one call (no trailing _: not named in place)
        t.add_(1)
    return x * 0


def negate(t, x):
    if x.sum() > -1e9:
        t.mul_(-1)
    return x


class UnusedWrite(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x):
        bump(self.count, x)  # result unused: only the write matters
        return x + self.count


class ZeroBufferWritten(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x):
        x = bump(self.count, x) + x
        return x + self.count  # not x + 0: the helper wrote the buffer first


class ReluInputWritten(nn.Module):
    def forward(self, x):
        a = torch.relu(x)
        x = negate(a, x)  # a is <= 0 now
        return torch.relu(a) + x


class StatisticsWritten(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

    def forward(self, x):
        x = x + bump(self.bn.running_mean, x)
        return self.bn(self.conv(x))


class InPlaceBeforeRelu(nn.Module):  # the same with a plain in-place op, which the pass missed too
    def forward(self, x):
        a = torch.relu(x)
        a.mul_(-1)
        return torch.relu(a)


CASES = [
    (UnusedWrite, (2, 4), "dead_code"),
    (ZeroBufferWritten, (2, 4), "remove_identity"),
    (ReluInputWritten, (2, 4), "remove_redundant_activation"),
    (InPlaceBeforeRelu, (2, 4), "remove_redundant_activation"),
    (StatisticsWritten, (1, 3, 8, 8), "fold_bn"),
]


@pytest.mark.parametrize(("model_class", "shape", "pass_name"), CASES, ids=[c[0].__name__ for c in CASES])
def test_a_pass_keeps_what_an_opaque_call_or_in_place_op_writes(model_class, shape, pass_name):
    torch.manual_seed(0)
    model, x = model_class().eval(), torch.randn(*shape)
    expected = copy.deepcopy(model)(x.clone())
    captured = capture(model, (x,))
    assert captured.record.wrapped or model_class is InPlaceBeforeRelu
    torch.testing.assert_close(copy.deepcopy(captured.graph_module)(x.clone()), expected)
    result = apply_pass(captured.graph_module, pass_name)
    torch.testing.assert_close(copy.deepcopy(result.graph_module)(x.clone()), expected)
    assert not result.changed, result.log
    if pass_name != "dead_code":  # dead_code keeps live nodes silently; the others say why they left one
        assert result.skipped, "the kept node should come with its reason"
