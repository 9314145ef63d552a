"""replace_modules: type mapping and predicate, functional forms, in-place calls, string forms, errors, CLI."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from fxforge.cli import main
from fxforge.errors import EXIT_OK, EXIT_USAGE
from fxforge.passes import ORIGIN, PASS, PassError, apply_pass
from fxforge.pipeline import Pipeline
from fxforge.verify import verify

MAPPING = {nn.ReLU: nn.ReLU6}


def swap_modules(model: nn.Module, old: type, build) -> nn.Module:
    """The eager reference: a copy of ``model`` with every ``old`` child replaced by ``build(child)``."""
    model = copy.deepcopy(model)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is old:
                setattr(parent, name, build(child))
    return model


def module_calls(gm: fx.GraphModule, cls: type) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_module" and type(gm.get_submodule(str(n.target))) is cls]


def large_inputs(shape, scale: float = 8.0) -> tuple[torch.Tensor]:
    # large enough that some activations exceed 6, where ReLU and ReLU6 part
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(1)) * scale,)


# --------------------------------------------------------------------------------------------------
# torchvision models


def test_resnet18_relu_to_relu6_matches_an_eagerly_built_relu6_resnet(resnet18, capture_as):
    captured = capture_as(resnet18, torch.randn(1, 3, 64, 64), "torch")
    before = captured.graph_module.code
    relu_sites = module_calls(captured.graph_module, nn.ReLU)
    assert len(relu_sites) == 17  # BasicBlock calls its one ReLU twice: 1 stem + 8 blocks x 2

    result = apply_pass(captured.graph_module, "replace_modules", {"mapping": MAPPING})

    gm = result.graph_module
    assert result.changed and result.replaced == 17 and len(result.log) == 17
    assert not module_calls(gm, nn.ReLU)
    relu6_sites = module_calls(gm, nn.ReLU6)
    targets = [str(n.target) for n in relu6_sites]
    assert len(targets) == 17 and len(set(targets)) == 17  # one new module per call site
    assert {"layer1.0.relu", "layer1.0.relu_1"} <= set(targets)
    assert all(gm.get_submodule(t).inplace for t in targets)  # ResNet's inplace=True carried over
    assert all(n.meta[PASS] == "replace_modules" for n in relu6_sites)
    assert any("layer1.0.relu (module, call 2)" in line for line in result.log)

    # the input graph is untouched
    assert captured.graph_module.code == before
    assert len(module_calls(captured.graph_module, nn.ReLU)) == 17

    reference = swap_modules(resnet18, nn.ReLU, lambda old: nn.ReLU6(inplace=old.inplace))
    inputs = large_inputs((2, 3, 64, 64))
    check = verify(reference, gm, inputs=inputs)
    assert check.ok, check.problems
    # and the rewrite is not a no-op: the original differs, first at a replaced call site
    against_original = verify(captured, gm, inputs=inputs)
    assert not against_original.ok
    assert against_original.divergence is not None and against_original.divergence.pass_name == "replace_modules"


def test_vision_transformer_gelu_to_tanh_gelu(capture_as):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.VisionTransformer(
        image_size=32, patch_size=16, num_layers=1, num_heads=2, hidden_dim=32, mlp_dim=64
    ).eval()
    captured = capture_as(model, torch.randn(1, 3, 32, 32), "torch")
    assert len(module_calls(captured.graph_module, nn.GELU)) == 1

    result = apply_pass(captured.graph_module, "replace_modules", {"mapping": {nn.GELU: "GELU(approximate='tanh')"}})

    (site,) = module_calls(result.graph_module, nn.GELU)
    assert result.graph_module.get_submodule(str(site.target)).approximate == "tanh"
    assert result.replaced == 1 and "GELU(approximate='none') -> GELU(approximate='tanh')" in result.log[0]
    reference = swap_modules(model, nn.GELU, lambda old: nn.GELU(approximate="tanh"))
    inputs = large_inputs((2, 3, 32, 32), scale=3.0)
    assert verify(reference, result.graph_module, inputs=inputs).ok
    assert captured.graph_module.get_submodule(str(site.target)).approximate == "none"


# --------------------------------------------------------------------------------------------------
# functional forms and in-place calls


class FunctionalRelus(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = F.relu(x)
        b = torch.relu(a * 2)
        c = (b + 1).relu()
        d = F.relu(c - 3, inplace=True)  # writes a temporary nobody else reads
        return d * 1.5


class FunctionalRelu6s(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = F.relu6(x)
        b = F.relu6(a * 2)
        c = F.relu6(b + 1)
        d = F.relu6(c - 3)
        return d * 1.5


def test_functional_forms_are_replaced_by_module_calls(capture_as):
    captured = capture_as(FunctionalRelus(), large_inputs((4, 8)), "torch")

    result = apply_pass(captured.graph_module, "replace_modules", {"mapping": MAPPING})

    gm = result.graph_module
    assert result.replaced == 4
    forms = [line.split(")")[0].split("(")[1] for line in result.log]
    assert forms == ["F.relu", "torch.relu", "relu", "F.relu"]
    assert len(module_calls(gm, nn.ReLU6)) == 4
    assert not [n for n in gm.graph.nodes if n.op != "call_module" and "relu" in str(n.target)]
    assert not [n for n in gm.graph.nodes if n.target == "copy_"]  # nothing reads the in-place input later
    inputs = large_inputs((4, 8))
    assert verify(FunctionalRelu6s(), gm, inputs=inputs).ok
    # each new call stands for the functional call it replaced
    origins = {n.meta[ORIGIN] for n in module_calls(gm, nn.ReLU6)}
    assert origins == {n.name for n in captured.graph_module.graph.nodes if "relu" in str(n.target)}


class InplaceReadLater(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        z = y.relu_()  # y itself is read again below: it must hold the activated values
        return y + z


class InplaceReadLaterReference(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y = F.gelu(y)
        return y + y


def test_in_place_call_whose_input_is_read_later_writes_back(capture_as):
    captured = capture_as(InplaceReadLater(), large_inputs((3, 5), 2.0), "torch")

    # GELU has no in-place form: the result must be copied back into y, which is read again
    result = apply_pass(captured.graph_module, "replace_modules", {"mapping": {nn.ReLU: nn.GELU}})

    gm = result.graph_module
    (copy_node,) = [n for n in gm.graph.nodes if n.target == "copy_"]
    assert "writes back into its input" in result.log[0]
    assert copy_node.meta[ORIGIN] == "relu_"
    assert verify(InplaceReadLaterReference(), gm, inputs=large_inputs((3, 5), 2.0)).ok


def test_in_place_call_keeps_an_in_place_replacement(capture_as):
    captured = capture_as(InplaceReadLater(), large_inputs((3, 5)), "torch")

    result = apply_pass(captured.graph_module, "replace_modules", {"mapping": {"ReLU": "ReLU6"}})

    gm = result.graph_module
    (site,) = module_calls(gm, nn.ReLU6)
    assert gm.get_submodule(str(site.target)).inplace  # relu_ is ReLU(inplace=True): ReLU6 takes it over
    assert not [n for n in gm.graph.nodes if n.target == "copy_"]
    x = large_inputs((3, 5))[0]
    assert torch.equal(gm(x), 2 * F.relu6(x * 2))


class InplaceOnInput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu_(x) * 2


def test_in_place_call_on_a_graph_input_still_writes_the_callers_tensor(capture_as):
    captured = capture_as(InplaceOnInput(), large_inputs((3, 5), 2.0), "torch", check=False)

    result = apply_pass(captured.graph_module, "replace_modules", {"mapping": {nn.ReLU: nn.GELU}})

    x = large_inputs((3, 5), 2.0)[0]
    given = x.clone()
    out = result.graph_module(given)
    assert torch.equal(given, F.gelu(x))  # the caller sees the write, as with relu_
    assert torch.equal(out, 2 * F.gelu(x))


class TwoReaders(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        return self.act(y) + y


def test_in_place_replacement_of_an_out_of_place_call_is_made_out_of_place(capture_as):
    captured = capture_as(TwoReaders(), large_inputs((3, 5)), "torch")

    # an in-place ReLU6 here would change the `+ y` reader
    result = apply_pass(captured.graph_module, "replace_modules", {"mapping": {nn.ReLU: nn.ReLU6(inplace=True)}})

    (site,) = module_calls(result.graph_module, nn.ReLU6)
    assert result.graph_module.get_submodule(str(site.target)).inplace is False
    x = large_inputs((3, 5))[0]
    assert torch.equal(result.graph_module(x), F.relu6(x * 2) + x * 2)


def test_functional_false_leaves_functional_calls(capture_as):
    captured = capture_as(FunctionalRelus(), large_inputs((4, 8)), "torch")

    result = apply_pass(captured.graph_module, "replace_modules", {"mapping": MAPPING, "functional": False})

    assert not result.changed and result.replaced == 0


class SlopeFromGraph(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(x, 0.2) + F.leaky_relu(x, x.shape[0] * 0.1)


def test_functional_call_with_a_computed_argument_is_skipped_with_reason(capture_as):
    captured = capture_as(SlopeFromGraph(), torch.randn(4, 4), "torch")

    result = apply_pass(captured.graph_module, "replace_modules", {"mapping": {nn.LeakyReLU: nn.ReLU}})

    assert result.replaced == 1
    assert len(result.skipped) == 1 and "computed in the graph" in result.skipped[0]


# --------------------------------------------------------------------------------------------------
# predicates and factories


def test_predicate_with_replacement_selects_sites(resnet18, capture_as):
    captured = capture_as(resnet18, torch.randn(1, 3, 64, 64), "torch")
    seen: list[str] = []

    def in_layer4(name: str, module: nn.Module) -> bool:
        seen.append(name)
        return name.startswith("layer4") and isinstance(module, nn.ReLU)

    result = apply_pass(captured.graph_module, "replace_modules", {"predicate": in_layer4, "replacement": nn.Hardtanh})

    gm = result.graph_module
    assert result.replaced == 4  # two blocks, two calls each
    assert {str(n.target) for n in module_calls(gm, nn.Hardtanh)} == {
        "layer4.0.relu",
        "layer4.0.relu_1",
        "layer4.1.relu",
        "layer4.1.relu_1",
    }
    assert len(module_calls(gm, nn.ReLU)) == 13
    assert "conv1" in seen  # a predicate alone is asked about every module call


def test_predicate_narrows_a_mapping_and_factories_see_the_old_module(capture_as):
    captured = capture_as(FunctionalRelus(), large_inputs((4, 8)), "torch")
    built_from: list[nn.Module] = []

    def factory(old: nn.Module) -> nn.Module:
        built_from.append(old)
        return nn.LeakyReLU(0.5)

    result = apply_pass(
        captured.graph_module,
        "replace_modules",
        {"mapping": {nn.ReLU: factory}, "predicate": lambda name, module: not module.inplace},
    )

    assert result.replaced == 3  # the inplace=True call is left alone
    assert [type(m) for m in built_from] == [nn.ReLU] * 3
    assert len(module_calls(result.graph_module, nn.LeakyReLU)) == 3


def test_instances_are_copied_per_site(capture_as):
    captured = capture_as(FunctionalRelus(), large_inputs((4, 8)), "torch")
    prelu = nn.PReLU()

    result = apply_pass(captured.graph_module, "replace_modules", {"mapping": {nn.ReLU: prelu}})

    modules = [result.graph_module.get_submodule(str(n.target)) for n in module_calls(result.graph_module, nn.PReLU)]
    assert len(modules) == 4 and len({id(m.weight) for m in modules}) == 4
    assert all(m is not prelu for m in modules)


# --------------------------------------------------------------------------------------------------
# string forms (YAML / CLI)


@pytest.mark.parametrize(
    "value", ["ReLU6", "nn.ReLU6", "torch.nn.ReLU6", "torch.nn.modules.activation:ReLU6", "Hardtanh(0.0, 6.0)"]
)
def test_string_names_resolve(capture_as, value):
    captured = capture_as(FunctionalRelus(), large_inputs((4, 8)), "torch")

    result = apply_pass(captured.graph_module, "replace_modules", {"mapping": {"ReLU": value}})

    assert result.replaced == 4
    assert verify(FunctionalRelu6s(), result.graph_module, inputs=large_inputs((4, 8))).ok


def test_user_class_from_a_file(capture_as, tmp_path):
    source = tmp_path / "my_activations.py"
    source.write_text(
        "import torch\nfrom torch import nn\n\n"
        "class Capped(nn.Module):\n"
        "    def __init__(self, cap=6.0):\n        super().__init__()\n        self.cap = cap\n\n"
        "    def forward(self, x):\n        return x.clamp(0, self.cap)\n"
    )
    captured = capture_as(FunctionalRelus(), large_inputs((4, 8)), "torch")

    result = apply_pass(captured.graph_module, "replace_modules", {"mapping": {"ReLU": f"{source}:Capped(cap=6.0)"}})

    assert result.replaced == 4
    assert verify(FunctionalRelu6s(), result.graph_module, inputs=large_inputs((4, 8))).ok


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(torch.relu(x)))


class MixedReference(Mixed):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(F.relu6(x)))


def test_yaml_pipeline_with_string_mapping(capture_as, tmp_path):
    pipeline_file = tmp_path / "pipeline.yaml"
    pipeline_file.write_text(
        "passes:\n  - name: replace_modules\n"
        "    options: {mapping: {ReLU: ReLU6, GELU: \"GELU(approximate='tanh')\"}}\n"
    )
    model = Mixed().eval()
    captured = capture_as(model, large_inputs((2, 8)), "torch")

    run = Pipeline.from_file(pipeline_file).run(captured)

    assert run.steps[0].result.replaced == 2
    reference = MixedReference().eval()
    reference.load_state_dict(model.state_dict())
    reference.act = nn.GELU(approximate="tanh")
    assert verify(reference, run.graph_module, inputs=large_inputs((2, 8))).ok


# --------------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize(
    "options,needle",
    [
        ({"mapping": {"ReLU": "ReLU7"}}, "unknown module name 'ReLU7': torch.nn has no 'ReLU7'"),
        ({"mapping": {"Relu": "ReLU6"}}, "unknown module name 'Relu'"),
        ({"mapping": {"ReLU": "no_such_package.acts:Capped"}}, "cannot import 'no_such_package.acts'"),
        ({"mapping": {"ReLU": "torch.nn:NoSuchThing"}}, "has no attribute 'NoSuchThing'"),
        ({"mapping": {"ReLU": "GELU(approximate=tanh)"}}, "must be literals"),
        ({"mapping": {"ReLU": "torch:relu"}}, "not an nn.Module class"),
        ({"mapping": {"ReLU": 3}}, "is not a module class, module, factory or name"),
        ({"mapping": {"ReLU6()": "ReLU"}}, "must name a module class, without arguments"),
        ({}, "needs a mapping or a predicate"),
        ({"predicate": "builtins:callable"}, "a predicate needs a replacement"),
        ({"mapping": MAPPING, "replacement": nn.ReLU6}, "replacement goes with a predicate"),
        ({"mapping": {"ReLU": "Hardtanh(6.0, 0.0)"}}, "building the replacement"),
        ({"mapping": {"ReLU": lambda old: "ReLU6"}}, "returned a str, not an nn.Module"),
    ],
)
def test_bad_options_give_one_clear_error(capture_as, options, needle):
    captured = capture_as(FunctionalRelus(), large_inputs((4, 8)), "torch")
    before = captured.graph_module.code

    with pytest.raises(PassError) as info:
        apply_pass(captured.graph_module, "replace_modules", options)

    assert needle in info.value.message
    assert captured.graph_module.code == before


def test_unknown_name_hints_the_close_one():
    with pytest.raises(PassError) as info:
        apply_pass(fx.symbolic_trace(FunctionalRelus()), "replace_modules", {"mapping": {"ReLU": "Relu6"}})
    assert "did you mean 'ReLU6'" in info.value.hint


def test_predicate_that_raises_is_reported(capture_as):
    captured = capture_as(FunctionalRelus(), large_inputs((4, 8)), "torch")

    def broken(name: str, module: nn.Module) -> bool:
        raise KeyError(name)

    with pytest.raises(PassError, match="the predicate raised KeyError"):
        apply_pass(captured.graph_module, "replace_modules", {"predicate": broken, "replacement": nn.ReLU6})


def test_aten_graphs_are_refused_with_the_reason(capture_as):
    captured = capture_as(FunctionalRelus(), large_inputs((4, 8)), "aten")

    with pytest.raises(PassError, match="works on torch graphs, but this graph is aten"):
        apply_pass(captured.graph_module, "replace_modules", {"mapping": MAPPING})


# --------------------------------------------------------------------------------------------------
# CLI


def test_cli_optimize_with_a_mapping_option(capsys):
    code = main(
        ["optimize", "demo", "-p", "replace_modules", "--option", "replace_modules.mapping={ReLU: ReLU6}", "--json"]
    )
    out, _ = capsys.readouterr()

    assert code == EXIT_OK
    data = json.loads(out)
    (step,) = data["passes"]
    assert step["name"] == "replace_modules" and step["changed"] and step["replaced"] == 3
    # the demo calls self.relu twice and torch.relu once
    assert [line.split(":")[0] for line in step["log"]] == [
        "relu (module)",
        "relu (module, call 2)",
        "relu_2 (torch.relu)",
    ]


def test_cli_unknown_name_is_a_usage_error(capsys):
    code = main(["optimize", "demo", "-p", "replace_modules", "--option", "replace_modules.mapping={ReLU: ReLU7}"])
    _, err = capsys.readouterr()

    assert code == EXIT_USAGE
    assert "unknown module name 'ReLU7'" in err and "Traceback" not in err
