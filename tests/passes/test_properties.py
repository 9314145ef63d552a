"""Property tests: every registered exact pass, alone and all in sequence, preserves outputs on random models.

Hypothesis builds small models from conv / transposed conv / linear / BatchNorm (random statistics) /
activation / dropout (eval) / identity / ``x * 1`` / ``x + 0`` blocks, residual and branching blocks
(a conv output with a second user, a conv module called twice, one activation computed twice), back-to-back
conv pairs (merge_convs), parallel linears (merge_parallel_linears) and parameter-only arithmetic (fold_constants),
with random channel counts, kernel sizes, strides, padding, groups and bias. Each model is captured in both
dialects; each exact pass (the ``EXACT`` list of tests/test_passes_torchvision.py, as far as it is registered)
must leave the captured graph untouched and produce a graph that ``verify`` finds equal, and so must the whole
list run as one pipeline, after which no inactive dropout and no foldable BatchNorm may be left.

The examples are derandomised, so CI sees the same models on every run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from torch import nn

from fxforge.capture import Captured, capture
from fxforge.graphs import node_kind
from fxforge.passes import PASSES, all_passes
from fxforge.pipeline import Pipeline
from fxforge.verify import verify

DIALECTS = {"torch": "symbolic_trace", "aten": "export"}
ACTIVATIONS = {"relu": nn.ReLU, "relu6": nn.ReLU6, "gelu": nn.GELU, "sigmoid": nn.Sigmoid, "hardswish": nn.Hardswish}
MAX_SIZE = 10  # spatial size cap: keeps every example's tensors tiny
PROPERTY_SETTINGS = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def exact_pass_names() -> list[str]:
    """The EXACT list of tests/test_passes_torchvision.py, in its order, limited to registered passes.

    Read from the file rather than imported: that module imports the suite-level conftest by name, which
    the conftest of this directory shadows.
    """
    source = (Path(__file__).parents[1] / "test_passes_torchvision.py").read_text()
    for statement in ast.parse(source).body:
        if isinstance(statement, ast.Assign) and any(getattr(t, "id", None) == "EXACT" for t in statement.targets):
            names = ast.literal_eval(statement.value)
            break
    else:
        raise AssertionError("tests/test_passes_torchvision.py has no EXACT list")
    all_passes()
    return [name for name in names if name in PASSES]


EXACT = exact_pass_names()


# --------------------------------------------------------------------------------------------------
# random models


def _random_bn(module: nn.modules.batchnorm._BatchNorm, generator: torch.Generator) -> nn.Module:
    n = module.num_features
    with torch.no_grad():
        module.running_mean.copy_(torch.randn(n, generator=generator))
        module.running_var.copy_(torch.rand(n, generator=generator) + 0.25)
        if module.affine:
            module.weight.copy_(torch.randn(n, generator=generator))
            module.bias.copy_(torch.randn(n, generator=generator))
    return module


class RandomModel(nn.Module):
    """Runs ``blocks`` (``(kind, parameters)`` tuples, see :func:`programs`) one after the other."""

    def __init__(self, channels: int, blocks: list[tuple], seed: int):
        super().__init__()
        torch.manual_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        self.kinds = [kind for kind, _ in blocks]
        self.layers = nn.ModuleList()
        for kind, params in blocks:
            layer, channels = self._build(kind, params, channels, generator)
            self.layers.append(layer)

    @staticmethod
    def _build(kind: str, p: dict, c: int, generator: torch.Generator) -> tuple[nn.Module, int]:
        if kind == "conv":
            conv = nn.Conv2d(c, p["out"], p["k"], p["stride"], p["pad"], groups=p["groups"], bias=p["bias"])
            return conv, p["out"]
        if kind == "conv_transpose":
            return nn.ConvTranspose2d(c, p["out"], p["k"], p["stride"], groups=p["groups"], bias=p["bias"]), p["out"]
        if kind == "bn":
            return _random_bn(nn.BatchNorm2d(c, affine=p["affine"]), generator), c
        if kind == "act":
            return ACTIVATIONS[p["name"]](), c
        if kind == "dropout":
            return nn.Dropout(0.5), c
        if kind == "identity":
            return nn.Identity(), c
        if kind in ("residual", "reused_output", "shared_conv"):  # c -> c, same spatial size
            block = nn.Module()
            block.conv = nn.Conv2d(c, c, p["k"], padding=p["k"] // 2, groups=p["groups"], bias=p["bias"])
            block.bn = _random_bn(nn.BatchNorm2d(c), generator)
            return block, c
        if kind == "conv_pair":  # kxk then 1x1, or 1x1 then kxk, nothing between
            block = nn.Module()
            first, second = p["first"], p["second"]
            block.first = nn.Conv2d(c, first["out"], first["k"], first["stride"], first["pad"], bias=first["bias"])
            block.second = nn.Conv2d(first["out"], second["out"], second["k"], second["stride"], second["pad"])
            return block, second["out"]
        if kind == "affine":  # per-channel scale and shift computed from parameters alone
            block = nn.Module()
            block.scale = nn.Parameter(torch.randn(c, 1, 1, generator=generator))
            block.shift = nn.Parameter(torch.randn(c, 1, 1, generator=generator))
            return block, c
        if kind == "twin_activation":
            return ACTIVATIONS[p["name"]](), c
        if kind == "parallel_linears":  # two linears over the last (width) dimension, both reading x
            block = nn.Module()
            block.a = nn.Linear(p["width"], p["width"], bias=p["bias"])
            block.b = nn.Linear(p["width"], p["width"], bias=p["bias"])
            return block, c
        if kind == "head":
            block = nn.Module()
            block.fc = nn.Linear(p["features"], p["out"], bias=p["bias"])
            block.bn = _random_bn(nn.BatchNorm1d(p["out"]), generator)
            return block, p["out"]
        return nn.Module(), c  # blocks with no parameters: x * 1, x + 0, F.dropout

    def forward(self, x):
        for kind, layer in zip(self.kinds, self.layers):
            if kind in ("conv", "conv_transpose", "bn", "act", "dropout", "identity"):
                x = layer(x)
            elif kind == "functional_dropout":
                x = F.dropout(x, 0.3, self.training)
            elif kind == "mul_one":
                x = x * 1
            elif kind == "add_zero":
                x = 0 + x
            elif kind == "residual":
                x = x + layer.bn(layer.conv(x))
            elif kind == "reused_output":  # the conv output has a second user: BN must not fold
                y = layer.conv(x)
                x = layer.bn(y) + y
            elif kind == "shared_conv":  # one conv module, two calls: BN must not fold
                x = layer.bn(layer.conv(x)) + layer.conv(x).sigmoid()
            elif kind == "conv_pair":
                x = layer.second(layer.first(x))
            elif kind == "affine":
                x = x * layer.scale.exp() + layer.shift * 2
            elif kind == "twin_activation":  # the same pure call twice
                x = layer(x) * layer(x)
            elif kind == "parallel_linears":  # merge_parallel_linears: one wider linear, split
                x = layer.a(x) * layer.b(x).transpose(-1, -2).sigmoid()
            elif kind == "head":
                x = layer.bn(layer.fc(x.flatten(1))).relu()
        return x


def _divisors(n: int) -> list[int]:
    return [g for g in (1, 2, 3) if n % g == 0]


@st.composite
def programs(draw) -> tuple[int, int, list[tuple], int]:
    """(channels, size, blocks, seed): a model that keeps every intermediate tensor small and non-empty."""
    channels = c = draw(st.integers(1, 6))
    size = h = draw(st.integers(3, 7))
    blocks: list[tuple] = []
    kinds = ["conv", "conv", "conv_transpose", "bn", "act", "dropout", "functional_dropout", "identity"]
    kinds += ["mul_one", "add_zero", "residual", "reused_output", "shared_conv", "conv_pair", "affine"]
    kinds += ["twin_activation", "parallel_linears"]
    for _ in range(draw(st.integers(1, 7))):
        kind = draw(st.sampled_from(kinds))
        params: dict = {}
        if kind in ("conv", "conv_transpose"):
            groups = draw(st.sampled_from(_divisors(c)))
            params = {"groups": groups, "out": groups * draw(st.integers(1, 3)), "bias": draw(st.booleans())}
            if kind == "conv":
                params["pad"] = draw(st.integers(0, 1))
                params["k"] = draw(st.integers(1, min(3, h + 2 * params["pad"])))
                params["stride"] = draw(st.integers(1, 2))
                h = (h + 2 * params["pad"] - params["k"]) // params["stride"] + 1
            else:
                params["stride"] = draw(st.integers(1, 2))
                params["k"] = draw(st.integers(1, 3))
                if (h - 1) * params["stride"] + params["k"] > MAX_SIZE:
                    params["stride"], params["k"] = 1, 1
                h = (h - 1) * params["stride"] + params["k"]
            c = params["out"]
            if draw(st.booleans()):  # half the convs get a BN right after: the pattern fold_bn exists for
                blocks.append((kind, params))
                kind, params = "bn", {}
        if kind == "bn":
            params = {"affine": draw(st.booleans())}
        elif kind in ("act", "twin_activation"):
            params = {"name": draw(st.sampled_from(sorted(ACTIVATIONS)))}
        elif kind == "conv_pair":
            # a spatial conv and a 1x1 stride-1 unpadded one, in either order; merge_convs decides the rest
            spatial = {"pad": draw(st.integers(0, 1)), "stride": draw(st.integers(1, 2))}
            spatial["k"] = draw(st.integers(1, min(3, h + 2 * spatial["pad"])))
            pointwise = {"k": 1, "stride": 1, "pad": 0}
            first, second = (spatial, pointwise) if draw(st.booleans()) else (pointwise, spatial)
            first["out"], second["out"] = draw(st.integers(1, 6)), draw(st.integers(1, 6))
            first["bias"] = draw(st.booleans())
            params = {"first": first, "second": second}
            h = (h + 2 * spatial["pad"] - spatial["k"]) // spatial["stride"] + 1
            c = second["out"]
        elif kind == "parallel_linears":
            params = {"width": h, "bias": draw(st.booleans())}
        elif kind in ("residual", "reused_output", "shared_conv"):
            params = {"k": draw(st.sampled_from([1, 3])), "groups": draw(st.sampled_from(_divisors(c)))}
            params["bias"] = draw(st.booleans())
        blocks.append((kind, params))
    if draw(st.booleans()):
        out = draw(st.integers(1, 5))
        blocks.append(("head", {"features": c * h * h, "out": out, "bias": draw(st.booleans())}))
    return channels, size, blocks, draw(st.integers(0, 2**16))


def _capture(program: tuple[int, int, list[tuple], int], dialect: str) -> Captured:
    channels, size, blocks, seed = program
    model = RandomModel(channels, blocks, seed).eval()
    inputs = (torch.randn(2, channels, size, size, generator=torch.Generator().manual_seed(seed)),)
    captured = capture(model, inputs, method=DIALECTS[dialect])
    assert captured.record.ok, captured.record.checks
    return captured


def _run_checked(captured: Captured, names: list[str]):
    before = captured.graph_module.code
    result = Pipeline(names, lint_between=False).run(captured)
    assert captured.graph_module.code == before, f"{names} modified the captured graph"
    check = verify(captured, result.graph_module, seeds=(0,))
    # a drawn model whose output is the same for every input (a 1-wide head behind a ReLU that is always 0) cannot
    # show whether a pass kept its outputs: verify says so, and the example is dropped rather than counted
    assume(not check.unverifiable)
    assert check.ok, (names, check.divergence.describe() if check.divergence else check.problems)
    return result


def _foldable_batch_norms(gm) -> list[str]:
    """BNs right after a conv/linear whose output nothing else reads and whose module nothing else calls."""
    calls: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            calls[str(node.target)] = calls.get(str(node.target), 0) + 1
    left = []
    for node in gm.graph.nodes:
        if node_kind(gm, node) != "batch_norm" or not node.args:
            continue
        producer = node.args[0]
        if node_kind(gm, producer) not in ("conv", "conv_transpose", "linear") or len(producer.users) != 1:
            continue
        if producer.op == "call_module" and calls[str(producer.target)] > 1:
            continue
        if producer.op == "call_function" and any(len(w.users) > 1 for w in producer.all_input_nodes[1:]):
            continue  # ATen: a shared conv shows as shared weight fetches
        left.append(node.name)
    return left


@pytest.mark.parametrize("dialect", DIALECTS)
@PROPERTY_SETTINGS
@given(program=programs())
def test_every_exact_pass_preserves_outputs(dialect: str, program):
    captured = _capture(program, dialect)
    for name in EXACT:
        if dialect in PASSES[name].dialects:
            _run_checked(captured, [name])


@pytest.mark.parametrize("dialect", DIALECTS)
@PROPERTY_SETTINGS
@given(program=programs())
def test_all_exact_passes_in_sequence_preserve_outputs(dialect: str, program):
    captured = _capture(program, dialect)
    names = [name for name in EXACT if dialect in PASSES[name].dialects]
    gm = _run_checked(captured, names).graph_module
    assert not any(node_kind(gm, n) == "dropout" for n in gm.graph.nodes)
    assert _foldable_batch_norms(gm) == []


def test_the_exact_passes_are_found():
    # guards the file parsing above: an empty list would make every property hold vacuously
    assert {"fold_bn", "remove_dropout", "remove_identity", "dead_code"} <= set(EXACT)


def test_a_pass_that_writes_into_a_stored_tensor_is_an_error_not_silence():
    """QA: a plug-in pass that scaled a conv's weight in place changed the user's model (the pass's copy shares its
    tensors), and only verification's mismatch hinted at it. apply_pass names the tensors written."""
    import fxforge
    from fxforge.passes import PASSES, PassError, PassResult, register_pass

    @register_pass("_test_scales_in_place", summary="writes into a weight", guarantees="none")
    def scales_in_place(gm, options):
        with torch.no_grad():
            gm.get_submodule("0").weight.mul_(2)
        result = PassResult("_test_scales_in_place", gm)
        result.changed = True
        return result

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)).eval()
    captured = fxforge.capture(model, (torch.randn(1, 3, 8, 8),))
    try:
        with pytest.raises(PassError, match=r"wrote into stored tensors in place \(0\.weight\)"):
            fxforge.apply_pass(captured.graph_module, "_test_scales_in_place")
    finally:
        PASSES.pop("_test_scales_in_place")
