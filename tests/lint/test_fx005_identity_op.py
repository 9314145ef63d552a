from __future__ import annotations

import pytest
import torch
from torch import nn


class WithIdentity(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.skip = nn.Identity()

    def forward(self, x):
        return self.skip(self.fc(x))


class NeutralArithmetic(nn.Module):
    def forward(self, x):
        a = x * 1
        b = 0 + a
        c = b.sub(0)
        return torch.add(c, 0) * 2 + 1  # the last two are not identities


class FloatLiteral(nn.Module):
    def forward(self, x):
        return (x * 1.0).relu()


class IntegerDivision(nn.Module):
    def forward(self, x):
        return (x / 1).abs()  # integer input: true division makes it float, not an identity


X = torch.randn(2, 4)


def test_identity_module(capture_as, findings):
    found = findings(capture_as(WithIdentity(), X, "torch"), "FX005")
    assert [(f.code, f.node, f.fix) for f in found] == [("FX005", "skip", "remove_identity")]
    assert "nn.Identity" in found[0].message


def test_identity_module_gone_in_aten(capture_as, findings):
    # torch.export drops nn.Identity: nothing to report
    assert findings(capture_as(WithIdentity(), X, "aten"), "FX005") == []


@pytest.mark.parametrize(
    ("dialect", "nodes"),
    # torch dialect: x * 1 on the graph input stays (a bool input would become int64, and a torch-dialect graph
    # takes any dtype); an exported program refuses other dtypes than its example's
    [("torch", ["add", "sub", "add_1"]), ("aten", ["mul", "add", "sub", "add_1"])],
)
def test_neutral_literals(capture_as, findings, dialect, nodes):
    found = findings(capture_as(NeutralArithmetic(), X, dialect), "FX005")
    assert [f.node for f in found] == nodes
    if dialect == "aten":
        assert "(x * 1) returns x unchanged" in found[0].message
        assert found[1].message.endswith("returns x unchanged")  # mul goes first, so add reads x
    else:
        assert found[0].message.endswith("returns mul unchanged")


def test_float_literal_needs_known_dtype(capture_as, findings):
    # a bare symbolic trace records no dtypes, so x * 1.0 might promote an integer tensor: not flagged
    assert findings(torch.fx.symbolic_trace(FloatLiteral()), "FX005") == []
    # torch.export records (and its program checks) that x is float32; a torch-dialect graph takes any dtype, and
    # x * 1.0 on an integer input promotes it: kept there
    assert [f.node for f in findings(capture_as(FloatLiteral(), X, "aten"), "FX005")] == ["mul"]
    assert findings(capture_as(FloatLiteral(), X, "torch"), "FX005") == []


def test_a_returned_copy_of_an_input_is_kept_as_the_pass_keeps_it(capture_as, findings):
    # the caller would get their own input tensor back instead of a copy: the pass refuses, so FX005 is silent
    class ReturnsCopy(nn.Module):
        def forward(self, x):
            return x * 1

    assert findings(capture_as(ReturnsCopy(), X, "aten"), "FX005") == []


def test_integer_true_division_is_not_identity(capture_as, findings):
    ints = torch.arange(8).reshape(2, 4)
    assert findings(capture_as(IntegerDivision(), ints, "aten"), "FX005") == []
    assert [f.node for f in findings(capture_as(IntegerDivision(), X, "aten"), "FX005")] == ["div"]


def test_clean_models(capture_as, findings, resnet18_captured):
    assert findings(capture_as(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), X, "aten"), "FX005") == []
    assert findings(resnet18_captured, "FX005") == []
