"""replace_pattern: match counts, exact and non-exact rewrites, overlapping and escaping matches, both dialects."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from fxforge.cli import main
from fxforge.errors import EXIT_OK
from fxforge.passes import ORIGIN, PASS, PassError, apply_pass
from fxforge.verify import verify

aten = torch.ops.aten


def add_relu(x, y):
    return torch.relu(x + y)


def add_clamp(x, y):
    return torch.clamp(x + y, min=0)


def add_relu6(x, y):
    return F.relu6(x + y)


class Blocks(nn.Module):
    """``n`` residual blocks, each ending in relu(a + b): the pattern occurs ``n`` times, chained."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(8, 8) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for linear in self.linears:
            x = torch.relu(linear(x) + x)
        return x


class BlocksWithRelu6(Blocks):
    """What ``Blocks`` computes after relu(x + y) -> relu6(x + y): the eager reference."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for linear in self.linears:
            x = F.relu6(linear(x) + x)
        return x


def scaled(shape, scale: float = 5.0) -> tuple[torch.Tensor]:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(3)) * scale,)


def test_n_matches_are_reported_and_the_rewrite_verifies(capture_as, run_verified):
    captured = capture_as(Blocks(5).eval(), scaled((2, 8)), "torch")

    result = run_verified(captured, "replace_pattern", {"pattern": add_relu, "replacement": add_clamp})

    assert result.changed and result.replaced == 5 and result.artifacts["matches"] == 5
    assert len(result.log) == 5 and result.log[0].startswith("match 1 at relu:")
    gm = result.graph_module
    assert not [n for n in gm.graph.nodes if n.target is torch.relu]
    clamps = [n for n in gm.graph.nodes if n.target is torch.clamp]
    assert len(clamps) == 5
    # the replacement's output stands for the pattern's output; its intermediates stand for nothing
    assert [n.meta[ORIGIN] for n in clamps] == ["relu", "relu_1", "relu_2", "relu_3", "relu_4"]
    assert all(n.meta[PASS] == "replace_pattern" for n in clamps)
    new_adds = [n.args[0] for n in clamps]
    assert all(n.meta[ORIGIN] is None and n.meta[PASS] == "replace_pattern" for n in new_adds)


def test_non_exact_replacement_verifies_against_an_eager_reference_doing_the_same_math(capture_as):
    # seeded: with some weights (2 seeds in 40) no value reaches 6 and relu6 equals relu on this input
    torch.manual_seed(0)
    model = Blocks(4).eval()
    captured = capture_as(model, scaled((2, 8)), "torch")

    result = apply_pass(captured.graph_module, "replace_pattern", {"pattern": add_relu, "replacement": add_relu6})

    assert result.replaced == 4
    reference = BlocksWithRelu6(4).eval()
    reference.load_state_dict(model.state_dict())
    assert verify(reference, result.graph_module, inputs=scaled((2, 8))).ok
    # against the original it differs (values above 6), first at a rewritten node, named with the pass
    check = verify(captured, result.graph_module, inputs=scaled((2, 8)))
    assert not check.ok
    assert check.divergence is not None and check.divergence.pass_name == "replace_pattern"
    assert check.divergence.reference_node.startswith("relu")


def test_torchvision_resnet18_torch_dialect(resnet18, capture_as, run_verified):
    captured = capture_as(resnet18, torch.randn(1, 3, 64, 64), "torch")

    def flatten(x):
        return torch.flatten(x, 1)

    def reshape(x):
        return x.reshape(x.shape[0], -1)

    result = run_verified(captured, "replace_pattern", {"pattern": flatten, "replacement": reshape})

    assert result.replaced == 1
    assert [n.target for n in result.graph_module.graph.nodes if n.op == "call_method"] == ["reshape"]


def test_torchvision_resnet18_aten_dialect(resnet18, capture_as, run_verified):
    captured = capture_as(resnet18, torch.randn(1, 3, 64, 64), "aten")

    # every residual add (in place into a fresh BN output) followed by an in-place ReLU
    def pattern(x, y):
        return aten.relu_.default(aten.add_.Tensor(x, y))

    def replacement(x, y):
        return aten.relu.default(aten.add.Tensor(x, y))

    result = run_verified(captured, "replace_pattern", {"pattern": pattern, "replacement": replacement})

    assert result.replaced == 8
    targets = [n.target for n in result.graph_module.graph.nodes]
    assert aten.add_.Tensor not in targets and targets.count(aten.add.Tensor) == 8


def test_overload_packet_in_the_pattern_matches_any_overload(capture_as, run_verified):
    class TwoRelus(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x + x) + torch.relu(x * 3.0)

    captured = capture_as(TwoRelus(), scaled((3, 4)), "aten")

    def pattern(x):
        return aten.relu.default(x)

    def replacement(x):
        return aten.clamp_min.default(x, 0.0)

    result = run_verified(captured, "replace_pattern", {"pattern": pattern, "replacement": replacement})
    assert result.replaced == 2

    def packet_pattern(x, y):
        return aten.relu.default(aten.add(x, y))  # the packet: any overload of aten.add

    def packet_replacement(x, y):
        return aten.clamp_min.default(aten.add.Tensor(x, y), 0.0)

    packets = run_verified(captured, "replace_pattern", {"pattern": packet_pattern, "replacement": packet_replacement})
    assert packets.replaced == 1


# --------------------------------------------------------------------------------------------------
# overlapping, escaping and absent matches


class ReluChain(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.relu(torch.relu(x - 1)))


def double_relu(x):
    return torch.relu(torch.relu(x))


def single_relu(x):
    return torch.relu(x)


def silu(x):
    return F.silu(x)


def test_overlapping_matches_take_the_earlier_one(capture_as, run_verified):
    captured = capture_as(ReluChain(), scaled((3, 3)), "torch")

    result = run_verified(captured, "replace_pattern", {"pattern": double_relu, "replacement": single_relu})

    assert result.replaced == 1
    assert len(result.skipped) == 1 and "shares relu_1 with an earlier match" in result.skipped[0]
    relus = [n for n in result.graph_module.graph.nodes if n.target is torch.relu]
    assert len(relus) == 2  # relu(relu(x)) -> relu(x), then the third relu kept


class EscapingAdd(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        shared = x + y
        kept = torch.relu(shared) * shared  # the add is read outside relu(x + y)
        return kept + torch.relu(x + 2 * y)


def test_match_whose_intermediate_escapes_is_skipped(capture_as, run_verified):
    captured = capture_as(EscapingAdd(), (*scaled((2, 3)), *scaled((2, 3), 2.0)), "torch")

    result = run_verified(captured, "replace_pattern", {"pattern": add_relu, "replacement": add_clamp})

    assert result.replaced == 1
    assert len(result.skipped) == 1
    assert "its intermediate add is also used by mul" in result.skipped[0]


def test_no_match_leaves_the_graph_unchanged(capture_as):
    captured = capture_as(ReluChain(), scaled((3, 3)), "torch")

    def sigmoid_pattern(x):
        return torch.sigmoid(x)

    result = apply_pass(captured.graph_module, "replace_pattern", {"pattern": sigmoid_pattern, "replacement": silu})

    assert not result.changed and result.replaced == 0 and result.artifacts["matches"] == 0
    assert result.graph_module.code == captured.graph_module.code


class ReluOfRelu(nn.Module):
    def forward(self, t: torch.Tensor) -> torch.Tensor:
        r1 = torch.relu(t - 1)
        return r1 + torch.relu(r1)


def test_input_bound_to_a_node_the_match_would_replace_is_no_match(capture_as, run_verified):
    captured = capture_as(ReluOfRelu(), scaled((3, 3)), "torch")

    def sum_of_relus(x, y):
        return torch.relu(x) + torch.relu(y)

    def relu_of_sum(x, y):
        return torch.relu(x + y)

    # relu(x) <- r1 and relu(y) <- relu(r1) fit structurally, but y would be r1, which the match replaces
    result = run_verified(captured, "replace_pattern", {"pattern": sum_of_relus, "replacement": relu_of_sum})

    assert not result.changed


class SameAndDifferentOperands(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a + a) * (a + b) + torch.clamp(b, min=0.0) + torch.clamp(b, min=0)


def test_inputs_bind_consistently_and_literals_match_by_type(capture_as, run_verified):
    captured = capture_as(SameAndDifferentOperands(), (*scaled((2, 2)), *scaled((2, 2))), "torch")

    def doubled(x):
        return x + x

    def times_two(x):
        return x * 2

    doubled_result = run_verified(captured, "replace_pattern", {"pattern": doubled, "replacement": times_two})
    assert doubled_result.replaced == 1  # a + a, not a + b

    def clamp_int(x):
        return torch.clamp(x, min=0)

    clamp_result = run_verified(captured, "replace_pattern", {"pattern": clamp_int, "replacement": single_relu})
    assert clamp_result.replaced == 1  # min=0, not min=0.0: they promote integer inputs differently


def test_identity_replacement_reads_the_bound_input(capture_as, run_verified):
    class TimesOne(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sin(x) * 1 + x * 1

    captured = capture_as(TimesOne(), scaled((4,)), "torch")

    def times_one(x):
        return x * 1

    def identity(x):
        return x

    result = run_verified(captured, "replace_pattern", {"pattern": times_one, "replacement": identity})

    assert result.replaced == 2
    sin = next(n for n in result.graph_module.graph.nodes if n.target is torch.sin)
    assert sin.meta[ORIGIN] == "mul"  # sin's value now also stands for sin(x) * 1


def test_replacement_with_a_constant_gets_its_own_copy_per_match(capture_as, run_verified):
    captured = capture_as(Blocks(2).eval(), scaled((2, 8)), "torch")
    zero = torch.zeros(())

    def clamp_with_tensor(x, y):
        return torch.maximum(x + y, zero)

    result = run_verified(captured, "replace_pattern", {"pattern": add_relu, "replacement": clamp_with_tensor})

    assert result.replaced == 2
    constants = [n.target for n in result.graph_module.graph.nodes if n.op == "get_attr"]
    assert len(constants) == 2 and len(set(constants)) == 2


# --------------------------------------------------------------------------------------------------
# string forms and errors


def test_functions_named_by_file_and_function(capture_as, run_verified, tmp_path):
    source = tmp_path / "my_patterns.py"
    source.write_text(
        "import torch\n\n"
        "def pattern(x, y):\n    return torch.relu(x + y)\n\n"
        "def replacement(x, y):\n    return torch.clamp(x + y, min=0)\n"
    )
    captured = capture_as(Blocks(3).eval(), scaled((2, 8)), "torch")

    result = run_verified(
        captured, "replace_pattern", {"pattern": f"{source}:pattern", "replacement": f"{source}:replacement"}
    )

    assert result.replaced == 3


def test_dotted_module_reference(capture_as, run_verified, tmp_path, monkeypatch):
    (tmp_path / "rp_test_patterns.py").write_text(
        "import torch\n\ndef relu(x):\n    return torch.relu(x)\n\ndef clamp(x):\n    return torch.clamp(x, min=0)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    captured = capture_as(ReluChain(), scaled((3, 3)), "torch")

    result = run_verified(
        captured, "replace_pattern", {"pattern": "rp_test_patterns:relu", "replacement": "rp_test_patterns:clamp"}
    )

    assert result.replaced == 3


def two_outputs(x):
    return torch.relu(x), torch.sigmoid(x)


def unused_input(x, y):
    return torch.relu(x)


def with_module(x):
    return nn.ReLU()(x)


@pytest.mark.parametrize(
    "options,needle",
    [
        ({}, "needs a pattern and a replacement"),
        ({"pattern": add_relu}, "needs a pattern and a replacement"),
        ({"pattern": "no_such_module:f", "replacement": add_clamp}, "cannot import 'no_such_module'"),
        ({"pattern": "torch:no_such_function", "replacement": add_clamp}, "has no attribute 'no_such_function'"),
        ({"pattern": "relu", "replacement": add_clamp}, "is not of the form module:name"),
        ({"pattern": 3, "replacement": add_clamp}, "must be a function, an nn.Module or 'module:function'"),
        ({"pattern": two_outputs, "replacement": two_outputs}, "must return one tensor"),
        ({"pattern": unused_input, "replacement": add_clamp}, "pattern input 'y' is unused"),
        ({"pattern": add_relu, "replacement": single_relu}, "the pattern takes 2 inputs and the replacement 1"),
        ({"pattern": single_relu, "replacement": with_module}, "cannot trace the replacement"),
        ({"pattern": lambda x: x, "replacement": single_relu}, "would match every node"),
    ],
)
def test_bad_options_give_one_clear_error(capture_as, options, needle):
    captured = capture_as(ReluChain(), scaled((3, 3)), "torch")

    with pytest.raises(PassError) as info:
        apply_pass(captured.graph_module, "replace_pattern", options)

    assert needle in info.value.message


def test_pattern_with_modules_is_refused():
    class ReluModule(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.act = nn.ReLU()

        def forward(self, x):
            return self.act(x)

    with pytest.raises(PassError, match="patterns match calls on their inputs only"):
        apply_pass(
            fx.symbolic_trace(ReluChain()), "replace_pattern", {"pattern": ReluModule(), "replacement": single_relu}
        )


def test_dialect_mismatch_is_refused_with_a_hint(capture_as):
    on_aten = capture_as(ReluChain(), scaled((3, 3)), "aten")
    with pytest.raises(PassError, match="torch-level calls, but this graph is ATen") as info:
        apply_pass(on_aten.graph_module, "replace_pattern", {"pattern": double_relu, "replacement": single_relu})
    assert "torch.ops.aten" in info.value.hint

    on_torch = capture_as(ReluChain(), scaled((3, 3)), "torch")

    def aten_relu(x):
        return aten.relu.default(x)

    with pytest.raises(PassError, match="written with ATen ops, but this graph is torch-level"):
        apply_pass(on_torch.graph_module, "replace_pattern", {"pattern": aten_relu, "replacement": aten_relu})

    def packet_relu(x):
        return aten.relu(x)

    with pytest.raises(PassError, match="an ATen graph needs overloads"):
        apply_pass(on_aten.graph_module, "replace_pattern", {"pattern": aten_relu, "replacement": packet_relu})


def test_cli_optimize_with_pattern_files(capsys, tmp_path):
    source = tmp_path / "demo_patterns.py"
    source.write_text(
        "import torch\n\ndef pattern(x):\n    return torch.relu(x)\n\n"
        "def replacement(x):\n    return torch.clamp(x, min=0)\n"
    )
    args = ["optimize", "demo", "-p", "replace_pattern", "--verify", "--json"]
    args += ["--option", f"replace_pattern.pattern={source}:pattern"]
    args += ["--option", f"replace_pattern.replacement={source}:replacement"]

    code = main(args)
    out, _ = capsys.readouterr()

    assert code == EXIT_OK
    data = json.loads(out)
    (step,) = data["passes"]
    assert step["replaced"] == 1 and data["ok"] and step["verify"]["ok"]  # the demo's one torch.relu call
