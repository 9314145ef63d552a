from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fxforge.lint import lint
from fxforge.passes import apply_pass


class Pair(nn.Module):
    def __init__(self, first: nn.Module, second: nn.Module, between=None, reuse: bool = False):
        super().__init__()
        self.first, self.second = first, second
        self.between = between
        self.reuse = reuse

    def forward(self, x):
        y = self.first(x)
        z = self.second(self.between(y) if self.between is not None else y)
        return (z, y) if self.reuse else z


def conv(cin, cout, k, **kwargs):
    return nn.Conv2d(cin, cout, k, **kwargs)


X = torch.randn(2, 3, 9, 9)

MERGEABLE = {
    "kxk then 1x1": (conv(3, 8, 3, stride=2, padding=1), conv(8, 4, 1), "1x1 stride-1 unpadded conv after a 3x3"),
    "1x1 then unpadded kxk": (conv(3, 8, 1), conv(8, 4, 3), "3x3 unpadded conv after a 1x1"),
    "bias-free 1x1 then padded kxk": (conv(3, 8, 1, bias=False), conv(8, 4, 3, padding=1), "bias-free 1x1"),
    # a strided 1x1 keeps every other output of the kxk: the kxk with twice its stride
    "kxk then strided 1x1": (conv(3, 8, 3), conv(8, 4, 1, stride=2), "one 3x3 conv with stride 2x2"),
    # each output group of the 1x1 reads its middle block, which reads every input: one dense conv
    "grouped 1x1 after ungrouped kxk": (conv(3, 6, 3), conv(6, 4, 1, groups=2), "1x1 stride-1 unpadded"),
    # an unpadded second conv reads the first's (padded) input through both kernels: one 5x5 conv
    "kxk then unpadded kxk": (conv(3, 8, 3, padding=1), conv(8, 4, 3), "one 5x5 conv (the kernels composed"),
}
NOT_MERGEABLE = {
    "1x1 with bias then padded kxk": (conv(3, 8, 1), conv(8, 4, 3, padding=1)),
    # the second conv's zero padding is not the first conv of anything: no conv of the input computes it
    "kxk then padded kxk": (conv(3, 8, 3), conv(8, 4, 3, padding=1)),
    "kxk then reflect-padded kxk": (conv(3, 8, 3), conv(8, 4, 3, padding=1, padding_mode="reflect")),
    "strided 1x1 then padded kxk": (conv(3, 8, 1, stride=2, bias=False), conv(8, 4, 3, padding=1)),
}


@pytest.mark.parametrize("dialect", ["torch", "aten"])
@pytest.mark.parametrize("case", sorted(MERGEABLE))
def test_exactly_mergeable_convs(capture_as, findings, dialect, case):
    first, second, reason = MERGEABLE[case]
    found = findings(capture_as(Pair(first, second).eval(), X, dialect), "FX009")
    names = {"torch": ("first", "second"), "aten": ("conv2d", "conv2d_1")}[dialect]
    assert [(f.code, f.node, f.fix) for f in found] == [("FX009", names[1], "merge_convs")]
    assert found[0].message.startswith(f"{names[0]} and {names[1]} can be merged") and reason in found[0].message


# Exact, but the merged layer is larger: merge_convs merges it only with allow_larger, which lint --fix does not set.
# A depthwise 3x3 then a 1x1 (ShuffleNet, MobileNet): 72 + 64 weights now, a dense 3x3 of 8 * 8 * 9 = 576 merged.
LARGER = (conv(8, 8, 3, padding=1, groups=8), conv(8, 8, 1))
X8 = torch.randn(2, 8, 9, 9)


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_pair_whose_merge_is_larger_is_not_reported(capture_as, findings, dialect):
    captured = capture_as(Pair(*LARGER).eval(), X8, dialect)
    assert findings(captured, "FX009") == []
    # the pass agrees: refused with its defaults, merged with allow_larger (so the rule's silence is that choice)
    assert not apply_pass(captured.graph_module, "merge_convs").changed
    assert apply_pass(captured.graph_module, "merge_convs", {"allow_larger": True}).changed


@pytest.mark.parametrize("dialect", ["torch", "aten"])
@pytest.mark.parametrize("case", [*sorted(MERGEABLE), "larger"])
def test_every_finding_is_cleared_by_merge_convs(capture_as, dialect, case):
    """What lint --fix relies on: merge_convs with its default options leaves no FX009 finding behind."""
    first, second = LARGER if case == "larger" else MERGEABLE[case][:2]
    captured = capture_as(Pair(first, second).eval(), X8 if case == "larger" else X, dialect)
    merged = apply_pass(captured.graph_module, "merge_convs").graph_module
    assert lint(merged, select=["FX009"]).findings == []


@pytest.mark.parametrize("dialect", ["torch", "aten"])
@pytest.mark.parametrize("case", sorted(NOT_MERGEABLE))
def test_not_exactly_mergeable(capture_as, findings, dialect, case):
    first, second = NOT_MERGEABLE[case]
    assert findings(capture_as(Pair(first, second).eval(), X, dialect), "FX009") == []


def test_mergeable_claim_is_exact():
    """The claim behind the padded case: merged weights W2 @ W1 reproduce the pair exactly."""
    first, second, _ = MERGEABLE["bias-free 1x1 then padded kxk"]
    merged = torch.einsum("ockl,ci->oikl", second.weight, first.weight[:, :, 0, 0])
    with torch.no_grad():
        torch.testing.assert_close(F.conv2d(X, merged, second.bias, padding=1), second(first(X)))


def test_composed_kernel_claim_is_exact():
    """The claim behind kxk then kxk: the second kernel's tap t and the first's tap a land at t + a of a 5x5
    conv with the first conv's padding; every tap reads the first conv's bias."""
    first, second, _ = MERGEABLE["kxk then unpadded kxk"]
    merged = torch.zeros(4, 3, 5, 5)
    for t in range(3):
        for u in range(3):
            merged[:, :, t : t + 3, u : u + 3] += torch.einsum("om,mikl->oikl", second.weight[:, :, t, u], first.weight)
    bias = second.weight.sum(dim=(2, 3)) @ first.bias + second.bias
    with torch.no_grad():
        torch.testing.assert_close(F.conv2d(X, merged, bias, padding=1), second(first(X)))


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_linear_then_linear(capture_as, findings, dialect):
    found = findings(capture_as(Pair(nn.Linear(4, 16), nn.Linear(16, 2)), torch.randn(3, 4), dialect), "FX009")
    assert len(found) == 1 and "linear after linear" in found[0].message
    assert "(96 weights now, 8 merged)" in found[0].message


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_something_between_or_other_users(capture_as, findings, dialect):
    first, second, _ = MERGEABLE["kxk then 1x1"]
    assert findings(capture_as(Pair(first, second, between=nn.ReLU()).eval(), X, dialect), "FX009") == []
    assert findings(capture_as(Pair(first, second, reuse=True).eval(), X, dialect), "FX009") == []


def test_functional_conv_with_stored_weights(capture_as, findings):
    class Functional(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Parameter(torch.randn(8, 3, 3, 3))
            self.w2 = nn.Parameter(torch.randn(4, 8, 1, 1))

        def forward(self, x):
            return F.conv2d(F.conv2d(x, self.w1, padding=1), self.w2)

    found = findings(capture_as(Functional(), X, "torch"), "FX009")
    assert [f.node for f in found] == ["conv2d_1"]


def test_resnet18_has_none(findings, resnet18_captured):
    assert findings(resnet18_captured, "FX009") == []
