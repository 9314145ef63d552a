"""inspect_graph: node fields, FLOPs checked by hand, module summaries, meta device, both dialects."""

from __future__ import annotations

import collections
import dataclasses
import json
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import fxforge
from fxforge.capture import capture
from fxforge.errors import InputSpecError
from fxforge.graphs import ATEN, TORCH
from fxforge.inputs import InputSpec, make_inputs
from fxforge.inspect import InspectReport, NodeInfo, inspect_graph
from fxforge.models import load_model

TRICKY = Path(__file__).parent / "tricky_models.py"


@pytest.fixture(autouse=True)
def _fixed_seed() -> None:
    torch.manual_seed(0)  # every test draws the same random tensors, run alone or in any order


def conv_flops(c_in: int, c_out: int, kernel: int, h_out: int, w_out: int, batch: int = 1) -> int:
    """2 FLOPs per multiply-add: every output element sums c_in * k * k products."""
    return 2 * batch * c_out * h_out * w_out * c_in * kernel * kernel


def node(report: InspectReport, name: str) -> NodeInfo:
    return next(n for n in report.nodes if n.name == name)


@pytest.fixture(scope="module")
def demo_report() -> InspectReport:
    loaded = load_model("demo")
    return inspect_graph(capture(loaded, make_inputs(loaded.default_inputs)))


@pytest.fixture(scope="module")
def resnet18():
    pytest.importorskip("torchvision")
    loaded = load_model("torchvision:resnet18")
    return loaded, make_inputs(loaded.default_inputs)


@pytest.fixture(scope="module")
def resnet18_report(resnet18) -> InspectReport:
    loaded, inputs = resnet18
    return inspect_graph(capture(loaded, inputs, check=False), depth=2)


# --------------------------------------------------------------------------------------------------
# demo


def test_demo_node_fields(demo_report: InspectReport):
    assert demo_report.dialect == TORCH
    assert demo_report.nodes[0].op == "placeholder" and demo_report.nodes[-1].op == "output"
    x = node(demo_report, "x")
    assert x.shape == [1, 3, 32, 32] and x.dtype == "float32" and x.activation_bytes == 3 * 32 * 32 * 4
    conv1 = node(demo_report, "conv1")
    assert (conv1.op, conv1.target, conv1.module) == ("call_module", "conv1", "conv1")
    assert conv1.shape == [1, 16, 32, 32] and conv1.dtype == "float32"
    assert conv1.params == 16 * 3 * 3 * 3  # no bias
    assert conv1.flops == conv_flops(3, 16, 3, 32, 32) == 884_736
    assert conv1.activation_bytes == 16 * 32 * 32 * 4
    fc = node(demo_report, "fc")
    assert fc.params == 32 * 10 + 10 and fc.flops == 2 * 32 * 10 and fc.shape == [1, 10]
    relu = next(n for n in demo_report.nodes if n.target == "torch.relu")
    assert relu.op == "call_function" and relu.flops == 0 and relu.params == 0
    output = demo_report.nodes[-1]
    assert output.shape == [1, 10] and output.activation_bytes == 0


def test_demo_totals(demo_report: InspectReport):
    totals = demo_report.totals
    assert totals["params"] == sum(p.numel() for p in load_model("demo").module.parameters()) == 5_498
    assert totals["param_bytes"] == 4 * 5_498
    assert totals["nodes"] == len(demo_report.nodes)
    assert totals["flops"] == sum(n.flops for n in demo_report.nodes)
    assert totals["macs"] == totals["flops"] // 2
    assert totals["flops"] == conv_flops(3, 16, 3, 32, 32) + conv_flops(16, 32, 3, 32, 32) + 2 * 32 * 10
    assert demo_report.input_shapes == [[1, 3, 32, 32]]
    assert "def forward" in demo_report.code
    assert demo_report.capture["method"] == "symbolic_trace"


def test_report_is_json_serialisable(demo_report: InspectReport):
    data = json.loads(json.dumps(demo_report.to_dict()))
    assert data["totals"]["params"] == 5_498
    assert {"name", "op", "target", "module", "shape", "dtype", "params", "flops", "activation_bytes"} <= set(
        data["nodes"][1]
    )


def test_a_container_output_gives_each_tensors_dtype_and_key():
    """QA: topk's (float values, int64 indices) was said to be float32, and nothing said which shape was which key."""

    class TopK(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            values, indices = torch.topk(x, 2)
            return {"values": values, "indices": indices.to(torch.int32) * 0 + indices.to(torch.int32)}

    report = inspect_graph(capture(TopK(), (torch.randn(3, 5),)))
    topk = node(report, "topk")
    assert topk.shape == [[3, 2], [3, 2]] and topk.dtype == "float32, int64" and topk.output_keys == ["[0]", "[1]"]
    output = node(report, "output")
    assert output.dtype == "float32, int32" and output.output_keys == ["['values']", "['indices']"]
    assert node(report, "x").output_keys == [] and node(report, "x").dtype == "float32"
    assert json.loads(json.dumps(report.to_dict()))["nodes"][-1]["output_keys"] == ["['values']", "['indices']"]


def test_include_code_and_other_inputs():
    loaded = load_model("demo")
    captured = capture(loaded, make_inputs(loaded.default_inputs))
    report = inspect_graph(captured, include_code=False, inputs=[torch.randn(4, 3, 16, 16)])
    assert report.code == ""
    assert report.input_shapes == [[4, 3, 16, 16]]
    assert node(report, "conv1").flops == conv_flops(3, 16, 3, 16, 16, batch=4)


# --------------------------------------------------------------------------------------------------
# resnet18


def test_resnet18_conv_flops_by_hand(resnet18_report: InspectReport):
    conv1 = node(resnet18_report, "conv1")  # 7x7 stride 2: 224 -> 112
    assert conv1.shape == [1, 64, 112, 112]
    assert conv1.flops == conv_flops(3, 64, 7, 112, 112) == 236_027_904
    assert conv1.params == 64 * 3 * 7 * 7
    downsample = node(resnet18_report, "layer2_0_downsample_0")  # 1x1 stride 2: 56 -> 28
    assert downsample.flops == conv_flops(64, 128, 1, 28, 28)
    fc = node(resnet18_report, "fc")
    assert fc.flops == 2 * 512 * 1000 and fc.params == 512 * 1000 + 1000


def test_resnet18_totals(resnet18_report: InspectReport):
    assert resnet18_report.totals["params"] == 11_689_512
    assert abs(resnet18_report.totals["macs"] - 1.814e9) / 1.814e9 < 0.01


def test_module_summary(resnet18, resnet18_report: InspectReport):
    model = resnet18[0].module
    modules = {m.path: m for m in resnet18_report.modules}
    assert {"conv1", "layer1", "layer1.0", "layer4.1", "fc"} <= set(modules)
    assert all(m.depth <= 2 and m.depth == m.path.count(".") + 1 for m in modules.values())
    layer1 = modules["layer1"]
    assert layer1.type == "Sequential" and layer1.depth == 1
    assert layer1.params == sum(p.numel() for p in model.layer1.parameters())
    assert layer1.nodes == 14  # 2 blocks of conv, bn, relu, conv, bn, add, relu
    assert modules["layer1.0"].flops == sum(n.flops for n in resnet18_report.nodes if n.module.startswith("layer1.0."))
    top = [m for m in resnet18_report.modules if m.depth == 1]
    assert sum(m.params for m in top) == 11_689_512
    assert sum(m.flops for m in top) == resnet18_report.totals["flops"]


@pytest.mark.parametrize("depth", [0, 1, 2, 4, 5])
def test_module_summary_depth_limit(resnet18, depth: int):
    loaded, inputs = resnet18
    report = inspect_graph(capture(loaded, inputs, check=False), depth=depth, include_code=False)
    depths = {m.depth for m in report.modules}
    assert depths == set(range(1, min(depth, 4) + 1))  # resnet18's deepest path: layer2.0.downsample.0
    assert report.totals["params"] == 11_689_512  # totals do not depend on the depth


def test_meta_device_model():
    pytest.importorskip("torchvision")
    loaded = load_model("torchvision:resnet18", device="meta")
    captured = capture(loaded, make_inputs(loaded.default_inputs, device="meta"))
    report = inspect_graph(captured)
    assert report.totals["params"] == 11_689_512
    assert abs(report.totals["macs"] - 1.814e9) / 1.814e9 < 0.01
    assert node(report, "conv1").shape == [1, 64, 112, 112] and node(report, "conv1").flops == 236_027_904
    assert any("meta" in note for note in report.capture["notes"])


def test_aten_dialect_totals_equal_torch_dialect(resnet18, resnet18_report: InspectReport):
    loaded, inputs = resnet18
    exported = capture(loaded, inputs, method="export", check=False)
    assert exported.dialect == ATEN
    report = inspect_graph(exported, depth=2)
    assert report.dialect == ATEN and report.capture["method"] == "torch.export"
    for key in ("params", "param_bytes", "flops", "macs"):
        assert report.totals[key] == resnet18_report.totals[key], key
    conv = next(n for n in report.nodes if n.target == "aten.conv2d.default")
    assert conv.module == "conv1" and conv.flops == 236_027_904 and conv.shape == [1, 64, 112, 112]
    weight = next(n for n in report.nodes if n.op == "get_attr" and n.target == "conv1.weight")
    assert weight.params == 64 * 3 * 7 * 7
    # a weight is no activation: its row showed the weight's bytes, which the total left out
    assert weight.activation_bytes == 0
    assert report.totals["activation_bytes"] == resnet18_report.totals["activation_bytes"]
    modules = {m.path: m for m in report.modules}
    torch_modules = {m.path: m for m in resnet18_report.modules}
    for path in ("conv1", "layer1", "layer2.0", "fc"):
        assert modules[path].params == torch_modules[path].params
        assert modules[path].flops == torch_modules[path].flops
        assert modules[path].nodes == torch_modules[path].nodes  # one ATen op per module call here
        assert modules[path].activation_bytes == torch_modules[path].activation_bytes
    # torch.export drops parameter-less submodules (every ReLU): their rows are counted from the graph's nodes
    assert "relu" in modules and not hasattr(exported.graph_module, "relu")
    for path in modules.keys() & torch_modules.keys():
        assert modules[path].params == torch_modules[path].params, path


@pytest.mark.parametrize("method", ["auto", "export"])
def test_wrong_input_shape_is_an_input_error(resnet18, method: str):
    loaded, inputs = resnet18
    captured = capture(loaded, inputs, method=method, check=False)
    with pytest.raises(InputSpecError) as info:
        inspect_graph(captured, inputs=[torch.randn(1, 4, 64, 64)])
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    assert "the graph failed at node" in info.value.message
    assert info.value.hint and "check the inputs" in info.value.hint  # the Python wording: no CLI option here


def test_missing_input_is_an_input_error():
    loaded = load_model("demo")
    captured = capture(loaded, make_inputs(loaded.default_inputs))
    with pytest.raises(InputSpecError, match="needs an input for 'x'"):
        inspect_graph(captured, inputs=[])


# --------------------------------------------------------------------------------------------------
# state


@pytest.mark.parametrize("method", ["auto", "export"])
def test_inspect_changes_neither_buffers_nor_inputs(method: str):
    model = load_model(f"{TRICKY}:CallCounter").module
    inputs = torch.ones(2, 8)
    captured = capture(model, inputs, method=method)
    report = inspect_graph(captured)
    inspect_graph(captured)
    assert model.calls.item() == 0
    assert torch.equal(inputs, torch.ones(2, 8))
    assert report.totals["params"] == 72


def test_inspect_does_not_change_an_input_written_in_place():
    model = load_model(f"{TRICKY}:InputMutation").module
    inputs = torch.ones(2, 8)
    captured = capture(model, inputs)
    inspect_graph(captured)
    assert torch.equal(inputs, torch.ones(2, 8))


# --------------------------------------------------------------------------------------------------
# attention: counted on the CPU as on meta


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_attention_flops(device: str):
    model = load_model(f"{TRICKY}:Attention", device=device).module
    q, k, v = make_inputs(
        [InputSpec((1, 2, 10, 16)), InputSpec((1, 2, 12, 16)), InputSpec((1, 2, 12, 16))], device=device
    )
    report = inspect_graph(capture(model, (q, k, v)))
    # q @ k^T: 2 * 2 heads * 10 * 12 * 16; weights @ v: the same
    assert report.totals["flops"] == 2 * (2 * 2 * 10 * 12 * 16)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_multihead_attention_flops(device: str):
    model = load_model(f"{TRICKY}:MultiheadSelfAttention", device=device).module
    inputs = make_inputs([InputSpec((1, 10, 32))], device=device)
    fastpath = torch.backends.mha.get_fastpath_enabled()
    report = inspect_graph(capture(model, inputs))
    in_projection = 2 * 10 * 32 * (3 * 32)
    attention = 2 * (2 * 10 * 10 * 32)  # summed over the 4 heads of width 8
    out_projection = 2 * 10 * 32 * 32
    assert report.totals["flops"] == in_projection + attention + out_projection
    assert torch.backends.mha.get_fastpath_enabled() == fastpath  # restored


def test_vit_flops_on_cpu_match_published_figure():
    pytest.importorskip("torchvision")
    loaded = load_model("torchvision:vit_b_32")
    report = inspect_graph(capture(loaded, make_inputs(loaded.default_inputs), check=False), include_code=False)
    assert abs(report.totals["macs"] / 1e9 - 4.409) <= 0.0005  # torchvision's published GFLOPS (MACs)


def test_api_results_have_short_reprs_and_inspect_refuses_a_negative_depth():
    """A notebook prints the last value of a cell: PassResult, PipelineResult, SplitResult and LoadedModel
    printed whole GraphModules (3-7 KB each)."""
    from fxforge.errors import FxforgeError
    from fxforge.passes import apply_pass

    captured = fxforge.prepare("demo")
    results = [
        apply_pass(captured.graph_module, "fold_bn"),
        fxforge.optimize(captured, ["fold_bn"], verify=True).pipeline,
        fxforge.split(captured, 2),
        fxforge.load_model("demo"),
    ]
    for result in results:
        text = repr(result)
        assert text.startswith("<") and len(text) < 300 and "GraphModule" not in text, text
    assert repr(results[0]) == "<PassResult fold_bn: 2 rewrites, 2 removed, 5088 params folded>"
    with pytest.raises(FxforgeError, match="depth must be an integer of at least 0"):
        fxforge.inspect_graph(captured, depth=-1)


class _LayersInAList(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(3)])
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_a_module_list_gets_its_row_and_the_rows_at_a_depth_add_up(method):
    """A ModuleList is never called, so no node's module stack names it: its row was missing, and at --depth 1
    the table showed only the head (18 of 234 parameters)."""
    captured = capture(_LayersInAList().eval(), (torch.randn(2, 8),), method=method)
    report = inspect_graph(captured, depth=1)
    rows = {m.path: m for m in report.modules}
    assert set(rows) == {"blocks", "head"}
    assert rows["blocks"].type == "ModuleList" and rows["blocks"].params == 3 * 72
    assert sum(m.params for m in rows.values()) == report.totals["params"]


def test_bert_layers_sit_under_their_module_list():
    captured = fxforge.prepare("transformers:BertModel", model_kwargs={"num_hidden_layers": 2}, inputs=["1x8:int64"])
    rows = {m.path: m for m in inspect_graph(captured, depth=3).modules}
    assert rows["encoder.layer"].type == "ModuleList" and rows["encoder.layer"].depth == 2
    layers = [rows["encoder.layer.0"], rows["encoder.layer.1"]]
    assert rows["encoder.layer"].params == sum(layer.params for layer in layers) > 0
    assert rows["encoder.layer"].flops == sum(layer.flops for layer in layers) > 0


def test_inspect_and_lint_of_something_not_captured_say_what_to_do():
    """inspect_graph(symbolic_trace(model)) was "AttributeError: 'ResNet' object has no attribute 'graph_module'"."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(fxforge.FxforgeError, match="inspect_graph takes a captured model, not a GraphModule") as info:
        inspect_graph(torch.fx.symbolic_trace(model))
    assert "fxforge.capture(model, example_inputs)" in info.value.hint
    with pytest.raises(fxforge.FxforgeError, match="lint takes a captured graph, not a Sequential"):
        fxforge.lint(model)
    assert fxforge.lint(torch.fx.symbolic_trace(model)).rules_run  # a GraphModule is a graph: linted


class _DictOutput(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = self.fc(x)
        return {"logits": y, "pooled": y.sum(-1)}


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_a_dict_output_has_its_shapes_in_both_dialects(method: str):
    """The torch dialect's output node of a dict-returning model showed no shape (tuples only were read)."""
    report = inspect_graph(capture(_DictOutput().eval(), (torch.randn(2, 8),), method=method))
    output = next(node for node in report.nodes if node.op == "output")
    assert output.shape == [[2, 4], [2]] and output.dtype == "float32"


@dataclasses.dataclass
class _Settings:
    scale: float
    names: dict

    def __post_init__(self) -> None:
        self.names.setdefault("checked", True)  # writes to its dict, as transformers' config validators do


@torch.fx.wrap
def _scaled(x: torch.Tensor, settings: _Settings) -> torch.Tensor:
    return x * settings.scale


class _PassesItsSettings(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.settings = _Settings(2.0, {"a": 1})
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _scaled(self.lin(x), self.settings)


def test_a_graph_that_rebuilds_a_dataclass_runs_node_by_node():
    """QA: symbolic tracing rebuilds a dataclass argument in the graph (a traced T5 calls ``T5Config(...)``) with
    fx's immutable dicts, which torch's Interpreter passes on as they are: its validator wrote to one, and inspect,
    profile, graph and split of the model ended in an internal error though the GraphModule runs."""
    captured = capture(_PassesItsSettings(), (torch.randn(2, 4),))
    assert any(node.target is _Settings for node in captured.graph_module.graph.nodes)
    report = inspect_graph(captured)
    assert report.totals["flops"] > 0 and list(report.nodes[-2].shape) == [2, 4]
    profiled = fxforge.profile_model(captured, repeats=1, warmup=0)
    assert profiled.total_ms > 0 and any(node.name == "_scaled" for node in profiled.nodes)


def test_a_tied_weight_counts_once_in_a_loaded_program(tmp_path):
    """QA: an embedding tied to the output head counted once in the model and twice in its model.pt2, whose
    module holds two Parameter objects over one storage."""
    from fxforge.export import export_model

    class TiedLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = torch.nn.Embedding(20, 8), torch.nn.Linear(8, 20, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, ids):
            return self.head(self.emb(ids))

    ids = torch.randint(0, 20, (2, 5))
    model = TiedLM().eval()
    export_model(model, "pt2", tmp_path / "tied.pt2", example_inputs=(ids,))
    loaded = load_model(str(tmp_path / "tied.pt2"))
    for captured in (capture(model, (ids,)), capture(loaded, (ids,))):
        assert inspect_graph(captured).totals["params"] == 160


class _WithScriptedLinear(nn.Module):
    def __init__(self):
        super().__init__()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.jit.script is deprecated: the user's choice here
            self.s = torch.jit.script(nn.Linear(8, 8))
        self.l = nn.Linear(8, 8)

    def forward(self, x):
        return self.l(self.s(x))


def test_a_scripted_submodules_weights_are_counted():
    """QA: tracing reads a torch.jit.script submodule as its C++ object (get_attr s._c): its 72 weights counted 0, in
    its row and in the total."""
    report = inspect_graph(fxforge.capture(_WithScriptedLinear().eval(), (torch.randn(2, 8),)))
    rows = {m.path: m.params for m in report.modules}
    assert rows["s"] == 72 and rows["l"] == 72 and report.totals["params"] == 144


class _NamedOutput(nn.Module):
    Out = collections.namedtuple("Out", "logits features")

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return self.Out(y.relu(), y)


def test_a_namedtuple_output_adds_no_activation_bytes_of_its_own():
    """QA: the node building the namedtuple counted the bytes of the two tensors it holds, already counted at the
    nodes that made them (the total read 256 B for two 2x8 float32 tensors)."""
    report = inspect_graph(fxforge.capture(_NamedOutput().eval(), (torch.randn(2, 8),)))
    by_name = {n.name: n.activation_bytes for n in report.nodes}
    built = [n for n in report.nodes if n.op == "call_function" and "Out" in n.target]
    assert len(built) == 1 and built[0].activation_bytes == 0
    assert report.totals["activation_bytes"] == by_name["lin"] + by_name["relu"] == 2 * 64


class _Branching(nn.Module):
    """A value-dependent branch written as torch.cond, as capture's own hint suggests: the true branch calls a
    Linear (whose weight and bias the exported graph passes to the branch as operands), the false one only scales."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda y: self.lin(y), lambda y: y * 2, (x,))


@pytest.mark.parametrize("sign, flops", [(1.0, 2 * 2 * 8 * 8), (-1.0, 0)])
def test_a_torch_cond_counts_the_branch_the_input_takes(sign, flops):
    """QA: inspect, graph, split and optimize's report.html ended in "internal error: NotImplementedError: There was
    no rule registered for HigherOrderOperator cond" on every exported graph holding a torch.cond."""
    x = torch.full((2, 8), sign)
    report = inspect_graph(fxforge.capture(_Branching().eval(), (x,), method="export"), inputs=(x,))
    cond = next(n for n in report.nodes if n.name == "cond")
    assert cond.flops == flops and report.totals["flops"] == flops and cond.flops_unknown == []
    assert cond.params == 0 and report.totals["params"] == 72  # the Linear's weights, counted once


def test_lint_says_it_did_not_look_inside_a_torch_conds_branches():
    """QA: a redundant relu and a duplicate sigmoid inside the branches went unreported, and nothing said the
    branches were not examined."""
    report = fxforge.lint(fxforge.capture(_Branching().eval(), (torch.ones(2, 8),), method="export"))
    assert report.graphs_not_linted == ["true_graph_0", "false_graph_0"]
    assert report.to_dict()["graphs_not_linted"] == ["true_graph_0", "false_graph_0"]
    plain = fxforge.capture(nn.Linear(8, 8).eval(), (torch.ones(2, 8),), method="export")
    assert fxforge.lint(plain).graphs_not_linted == []


class _NestedBranching(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Branching()

    def forward(self, x):
        return torch.cond(x.abs().sum() >= 0, lambda y: self.inner(y), lambda y: y * 2, (x,))


class _LeafWithACond(nn.Module):
    """symbolic_trace keeps the branching submodule as a leaf, which then runs eagerly under inspect's counters."""

    def __init__(self):
        super().__init__()
        self.gate, self.head = _Branching(), nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.gate(x))


@pytest.mark.parametrize("model_type, method", [(_NestedBranching, "export"), (_LeafWithACond, "symbolic_trace")])
def test_a_torch_cond_inspect_cannot_count_is_listed_not_an_internal_error(model_type, method):
    """QA (regression hunt): a cond nested in a branch, or run by a leaf, reached the op recorder, which had no rule
    for it: the same internal error. It runs uncounted, and is named among the ops without a FLOP formula."""
    x = torch.ones(2, 8)
    captured = fxforge.capture(model_type().eval(), (x,), method=method)
    report = inspect_graph(captured, inputs=(x,))
    assert report.totals["flops_unknown_ops"] == ["higher_order.cond"]
