from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import fx, nn

from fxforge.api import prepare
from fxforge.capture import capture
from fxforge.errors import FxforgeError
from fxforge.lint import lint
from fxforge.quantize import RandomCalibrationWarning, quantize

X = torch.randn(2, 3, 8, 8)


class MethodFlatten(nn.Module):
    """``x.flatten(1)`` has no int8 form in FX graph mode: it runs in float between two int8 layers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.pool(self.conv(x)).flatten(1))


class FunctionFlatten(MethodFlatten):
    """``torch.flatten`` stays int8."""

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.conv(x)), 1))


class TorchReluAfterBatchNorm(nn.Module):
    """``torch.relu`` does not fuse into the conv-BN before it (``F.relu`` and ``nn.ReLU`` do)."""

    def __init__(self, relu=torch.relu) -> None:
        super().__init__()
        self.conv, self.bn, self.relu = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), relu
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.head(self.relu(self.bn(self.conv(x))))


class ThreeConvs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2, self.conv3 = nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 3), nn.Conv2d(4, 4, 3)

    def forward(self, x):
        return self.conv3(self.conv2(self.conv1(x)))


def _int8(model: nn.Module, float_layers=()) -> fx.GraphModule:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RandomCalibrationWarning)
        return quantize(capture(model.eval(), (X,)), "static", calibration="random:2", float_layers=float_layers).model


def _int8_by_torch(model: nn.Module) -> fx.GraphModule:
    """Quantized by torch's FX graph mode as it comes, as a graph quantized outside fxforge would be: fxforge's
    quantize respells ``Tensor.flatten`` and ``torch.relu`` first, so its own output has neither round trip."""
    from torch.ao.quantization.qconfig_mapping import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FX graph mode's deprecation notices
        prepared = prepare_fx(model.eval(), get_default_qconfig_mapping("x86"), (X,))
        prepared(X)
        return convert_fx(prepared)


def _by_hand(build) -> fx.GraphModule:
    """A graph written node by node: x -> quantize_per_tensor, then whatever ``build`` adds."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    q = graph.call_function(torch.quantize_per_tensor, (x, 0.1, 0, torch.quint8))
    graph.output(build(graph, q))
    return fx.GraphModule(nn.Module(), graph)


def _requantize(graph: fx.Graph, value: fx.Node) -> fx.Node:
    return graph.call_function(torch.quantize_per_tensor, (value, 0.05, 0, torch.quint8))


def test_method_flatten_between_int8_layers(findings):
    assert findings(_int8(MethodFlatten()), "FX013") == []  # fxforge's quantize spells it torch.flatten
    found = findings(_int8_by_torch(MethodFlatten()), "FX013")
    assert len(found) == 1
    assert found[0].severity == "info" and found[0].node.startswith("quantize_per_tensor")
    message = found[0].message
    assert "-> flatten ->" in message and "round trip" in message and "torch.flatten(x, 1)" in message


def test_function_flatten_stays_int8(findings):
    assert findings(_int8(FunctionFlatten()), "FX013") == []


def test_torch_relu_that_does_not_fuse(findings):
    assert findings(_int8(TorchReluAfterBatchNorm()), "FX013") == []  # fxforge's quantize spells it F.relu
    found = findings(_int8_by_torch(TorchReluAfterBatchNorm()), "FX013")
    assert len(found) == 1 and "(torch.relu)" in found[0].message and "F.relu or nn.ReLU" in found[0].message
    assert findings(_int8(TorchReluAfterBatchNorm(nn.ReLU())), "FX013") == []  # fused: ConvReLU2d


def test_direct_dequantize_quantize(findings):
    def build(graph, q):
        return graph.call_method("dequantize", (_requantize(graph, graph.call_method("dequantize", (q,))),))

    found = findings(_by_hand(build), "FX013")
    assert [f.node for f in found] == ["quantize_per_tensor_1"]
    assert "feeds quantize_per_tensor_1 directly" in found[0].message


def test_float_layer_kept_on_purpose_is_not_a_round_trip(findings):
    gm = _int8(ThreeConvs(), float_layers=["conv2"])
    assert type(gm.get_submodule("conv2")) is nn.Conv2d  # float, between two int8 convs
    assert findings(gm, "FX013") == []


def test_float_value_used_elsewhere(findings):
    def build(graph, q):
        relu = graph.call_function(torch.relu, (graph.call_method("dequantize", (q,)),))
        return (graph.call_method("dequantize", (_requantize(graph, relu),)), relu)  # relu also an output

    assert findings(_by_hand(build), "FX013") == []


def test_other_float_input_enters_the_region(findings):
    def build(graph, q):
        y = graph.placeholder("y")
        total = graph.call_function(torch.add, (graph.call_method("dequantize", (q,)), y))
        return graph.call_method("dequantize", (_requantize(graph, total),))

    assert findings(_by_hand(build), "FX013") == []


def test_float_resnet18_has_none(findings, resnet18_captured):
    if resnet18_captured.dialect == "torch":
        assert findings(resnet18_captured, "FX013") == []
    else:  # torch dialect only
        assert "FX013" not in lint(resnet18_captured).rules_run


def test_int8_resnet18_has_none(findings, resnet18_model):
    assert findings(_int8(resnet18_model), "FX013") == []


def test_not_run_on_aten_graphs():
    captured = capture(MethodFlatten().eval(), (X,), method="export")
    report = lint(captured)
    assert captured.dialect == "aten" and "FX013" not in report.rules_run
    skipped = "FX013 int8-round-trip needs the torch dialect, not aten (capture with method='symbolic_trace')"
    assert skipped in report.rules_skipped
    # selected alone, it said "All checks passed!" with no rule run (QA)
    with pytest.raises(FxforgeError, match="no selected rule runs on this graph: FX013 int8-round-trip needs"):
        lint(captured, select=["FX013"])


def test_not_run_where_symbolic_trace_failed_says_where_it_stopped_not_to_use_it():
    """Regression QA: the advice "capture with method='symbolic_trace'" was given where that capture had failed."""
    tricky = Path(__file__).parent.parent / "tricky_models.py"
    captured = prepare(f"{tricky}:LenOfTensor", ["2x8"])
    assert captured.dialect == "aten"
    skipped = next(s for s in lint(captured).rules_skipped if s.startswith("FX013"))
    assert "symbolic_trace cannot capture this model: it stopped at" in skipped and "len(x)" in skipped
    assert "capture with" not in skipped


def test_not_run_where_symbolic_trace_failed_without_a_location_says_why():
    """QA: a transformers model's trace fails in a wrapper with no line of the user's (GPT-2: "co_varnames is too
    small"), and the note ended "it stopped)", saying nothing; the error is named instead."""
    tricky = Path(__file__).parent.parent / "tricky_models.py"
    captured = prepare(f"{tricky}:LenOfTensor", ["2x8"])
    failed = captured.record.trace_failure
    failed.location = None
    skipped = next(s for s in lint(captured).rules_skipped if s.startswith("FX013"))
    assert f"it stopped with {failed.error})" in skipped


def test_not_run_on_a_loaded_aten_graph_does_not_advise_a_capture_method():
    """QA: on an optimize output's model.pt2 the note said "capture with --method symbolic_trace"; a graph is not
    captured again, so the option was ignored and the same note given again."""
    program = torch.export.export(MethodFlatten().eval(), (X,)).module()
    captured = capture(program, (X,))
    assert captured.dialect == "aten" and captured.record.method == "loaded"
    skipped = next(s for s in lint(captured).rules_skipped if s.startswith("FX013"))
    assert "capture with" not in skipped and "already an aten graph" in skipped
