"""onednn_linear: float32 Linear layers computed by oneDNN's matmul; what it cannot take is kept and said."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxforge
from fxforge.capture import capture
from fxforge.graphs import node_kind
from fxforge.passes import ORIGIN, PASS, apply_pass, exact_passes
from fxforge.pipeline import Pipeline

NAME = "onednn_linear"
ONEDNN = torch.ops.mkldnn._linear_pointwise.default
pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch without oneDNN")


class Mixed(nn.Module):
    """A module Linear, a functional one, a hooked Linear and a float64 one, on 3-D and 1-D inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.hooked, self.b = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4, bias=False)
        self.w = nn.Parameter(torch.randn(16, 16))
        self.wide = nn.Linear(8, 8).double()
        self.hooked.register_forward_hook(lambda module, args, out: out * 2)

    def forward(self, x, flat):
        h = torch.relu(self.a(x))
        h = F.linear(h, self.w) + self.hooked(h)
        return self.b(h), self.a(flat), self.wide(x.double())


def _inputs():
    torch.manual_seed(0)
    return torch.randn(2, 5, 8), torch.randn(8)


def onednn_calls(gm) -> list:
    return [n for n in gm.graph.nodes if n.target is ONEDNN]


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_float32_linears_of_two_or_more_dimensions_are_rewritten_and_the_rest_kept(method):
    model = Mixed().eval()
    captured = capture(model, _inputs(), method=method)
    result = Pipeline([NAME], verify_each=True).run(captured)
    (step,) = result.steps
    assert step.result.changed and not step.rolled_back and result.verification.ok
    gm = result.graph_module
    calls = onednn_calls(gm)
    # a, the functional linear and b; not a's call on the 1-D input nor the float64 layer; the hooked module is one
    # call only when traced (torch.export inlines its hook into plain ops, and its linear is rewritten too)
    assert len(calls) == (3 if method == "symbolic_trace" else 4), gm.code
    assert all(n.meta[PASS] == NAME and ORIGIN in n.meta for n in calls)
    kept = [n for n in gm.graph.nodes if node_kind(gm, n) == "linear"]
    assert len(kept) == 2
    if method == "symbolic_trace":
        assert any(n.op == "call_module" and n.target == "hooked" for n in gm.graph.nodes)
    skipped = " ".join(step.result.skipped)
    assert "its input is not a float32 CPU tensor of 2 or more dimensions" in skipped
    assert ("module hooked runs hooks" in skipped) == (method == "symbolic_trace")
    expected = model(*_inputs())
    for got, want in zip(gm(*_inputs()), expected):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # float32 round-off: another summation order
    assert not any(onednn_calls(capture(model, _inputs(), method=method).graph_module))  # the model is untouched


def test_inference_only_a_bare_trace_is_told_to_record_shapes_and_export_refuses_what_it_cannot_express(tmp_path):
    """QA: a module in training mode was rewritten (no gradient flowed afterwards); a plain symbolic_trace graph
    was skipped with no word of what to do; ONNX and TorchScript export failed with unrelated messages; the rewritten
    layers counted 0 FLOPs."""
    from torch import fx

    from fxforge.errors import FxforgeError
    from fxforge.export import export_model
    from fxforge.inspect import inspect_graph

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    training = apply_pass(capture(model.train(), (torch.randn(2, 8),)).graph_module, NAME)
    assert not training.changed and "is in training mode (oneDNN's linear has no backward)" in training.skipped[0]
    bare = apply_pass(fx.symbolic_trace(model.eval()), NAME)
    assert not bare.changed and "capture with fxforge.capture, or run ShapeProp first" in bare.skipped[0]
    captured = capture(model.eval(), (torch.randn(2, 8),))
    rewritten = dataclasses.replace(captured, graph_module=apply_pass(captured.graph_module, NAME).graph_module)
    assert len(onednn_calls(rewritten.graph_module)) == 2
    assert inspect_graph(rewritten).totals["flops"] == inspect_graph(captured).totals["flops"] == 2 * 2 * (64 + 32)
    for to, suffix in (("onnx", "onnx"), ("torchscript", "pt")):
        with pytest.raises(FxforgeError, match=f"cannot export to {to}: the graph computes Linear layers with oneDNN"):
            export_model(rewritten, to, tmp_path / f"m.{suffix}")
    result = export_model(rewritten, "pt2", tmp_path / "m.pt2")
    assert result.ok and not any("custom operators" in note for note in result.notes)


def test_not_in_the_exact_group_and_a_noop_without_linears():
    assert NAME not in exact_passes()
    captured = capture(nn.Sequential(nn.ReLU()), (torch.randn(2, 4),))
    assert not apply_pass(captured.graph_module, NAME).changed


def test_a_rewritten_transformers_graph_exports_and_loads_with_plain_torch(tmp_path):
    """BERT (random weights, a small config) in the ATen dialect: every Linear rewritten, and the program still
    saves to model.pt2 (an empty scalar list did not serialise) and runs when torch.export loads it."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, vocab_size=100
    )
    model = transformers.BertModel(config).eval()
    captured = fxforge.prepare(model, ["1x16:int64"])
    assert captured.dialect == "aten"
    before = sum(node_kind(captured.graph_module, n) == "linear" for n in captured.graph_module.graph.nodes)
    result = fxforge.optimize(captured, ["exact", NAME], verify=True, output_dir=tmp_path / "out")
    assert result.ok and before == 2 * 6 + 1  # q, k, v, attention output, intermediate, output; the pooler
    assert len(onednn_calls(result.pipeline.graph_module)) == before
    loaded = torch.export.load(str(tmp_path / "out" / "model.pt2")).module()
    assert any(n.target is ONEDNN for n in loaded.graph.nodes)
    ids = captured.example_inputs[0]
    torch.testing.assert_close(loaded(ids)[0], model(ids).last_hidden_state, rtol=1e-4, atol=1e-5)
