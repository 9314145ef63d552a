from __future__ import annotations

import pytest
import torch
from torch import fx, nn

from fxforge.lint import lint


class Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.spare = nn.Linear(4, 3)  # never called
        self.block = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))  # only block[0] is called
        self.scale = nn.Parameter(torch.ones(4))  # never read

    def forward(self, x):
        return self.block[0](self.fc(x))


class AllUsed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.fc(x) * self.scale


X = torch.randn(2, 4)


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_unused_submodules_and_parameters(capture_as, findings, dialect):
    found = findings(capture_as(Unused(), X, dialect), "FX006")
    messages = sorted(f.message for f in found)
    assert messages == [
        "parameter scale ((4,)) is never used by the graph",
        "submodule block.1 (Linear, 20 parameters) is never used by the graph",
        "submodule spare (Linear, 15 parameters) is never used by the graph",
    ]
    assert {(f.code, f.severity, f.node) for f in found} == {("FX006", "warning", None)}


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_all_parameters_used(capture_as, findings, dialect):
    assert findings(capture_as(AllUsed(), X, dialect), "FX006") == []


def test_skipped_without_original_model():
    report = lint(fx.symbolic_trace(Unused()), select=["FX006"])
    assert report.rules_run == ["FX006"] and report.findings == []


@pytest.mark.slow
@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_googlenet_aux_classifiers_unused_in_eval(capture_as, findings, dialect):
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.googlenet(aux_logits=True, init_weights=False).eval()
    found = findings(capture_as(model, torch.randn(1, 3, 64, 64), dialect), "FX006")
    assert [f.message.split(" (")[0] for f in found] == ["submodule aux1", "submodule aux2"]


def test_resnet18_uses_everything(findings, resnet18_captured):
    assert findings(resnet18_captured, "FX006") == []
