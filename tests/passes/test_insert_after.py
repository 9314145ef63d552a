"""insert_after: selectors, the five insertions, read-back of statistics, saving, both dialects, the CLI."""

from __future__ import annotations

import copy
import io
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fxforge.capture import capture
from fxforge.cli import main
from fxforge.errors import EXIT_OK, FxforgeError
from fxforge.passes import PassError, apply_pass
from fxforge.passes.insert_after import (
    GaussianNoise,
    InsertAfterError,
    NonFiniteError,
    StatsRecorder,
    collect_stats,
    reset_stats,
)
from fxforge.pipeline import Pipeline
from fxforge.verify import TOLERANCES, verify

NAME = "insert_after"
FP32_RTOL, FP32_ATOL = TOLERANCES[torch.float32]
RESNET18_RELU_CALLS = 17  # the stem's relu, then two calls of each BasicBlock's relu, 8 blocks


# --------------------------------------------------------------------------------------------------
# models


class Functional(nn.Module):
    """Functional ops of every form, and a module, so that each selector has something to find."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        a = F.relu(self.lin(x))
        b = torch.sigmoid(a)
        c = b.relu()
        return a + c


class LogNet(nn.Module):
    """NaN from log of a negative number, -Inf from log(0): silent for positive inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(torch.log(x))


class InplaceAlias(nn.Module):
    """``y = x.relu_()`` and ``x`` read again afterwards: a transform after ``y`` could not reach that read."""

    def forward(self, x):
        x = x * 1.0
        y = x.relu_()
        return y * 2 + x


class WithIntegers(nn.Module):
    def forward(self, x):
        return x.argmax(1), torch.tanh(x)


def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def module_path_of(gm, site: str) -> str:
    from fxforge.graphs import module_path

    return module_path(next(n for n in gm.graph.nodes if n.name == site))


# --------------------------------------------------------------------------------------------------
# shared captures of resnet18 (captures are never modified: passes work on copies)


@pytest.fixture(scope="module")
def resnet_model():
    torchvision = pytest.importorskip("torchvision")
    from tests.conftest import randomize_batchnorm

    torch.manual_seed(0)
    return randomize_batchnorm(torchvision.models.resnet18().eval())


@pytest.fixture(scope="module")
def resnet_inputs():
    return (torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0)),)


@pytest.fixture(scope="module")
def resnet_torch(resnet_model, resnet_inputs):
    return capture(resnet_model, resnet_inputs, method="symbolic_trace")


@pytest.fixture(scope="module")
def resnet_aten(resnet_model, resnet_inputs):
    return capture(resnet_model, resnet_inputs, method="export")


# --------------------------------------------------------------------------------------------------
# statistics on resnet18


def _hook_reference(model: nn.Module, batches: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every ReLU call's output (in call order), concatenated over the batches, computed eagerly with hooks."""
    calls: list[list[torch.Tensor]] = []
    per_batch: list[torch.Tensor] = []

    def record(module, args, output):
        per_batch.append(output.detach().clone().double().reshape(-1))

    handles = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, nn.ReLU)]
    try:
        with torch.no_grad():
            for batch in batches:
                per_batch.clear()
                model(batch)
                calls.append(list(per_batch))
    finally:
        for handle in handles:
            handle.remove()
    return [torch.cat([calls[b][i] for b in range(len(batches))]) for i in range(len(calls[0]))]


def test_stats_after_every_relu_of_resnet18_match_hooks(resnet_model, resnet_torch, resnet_inputs, run_verified):
    result = run_verified(resnet_torch, NAME, {"select": "type:ReLU"})
    gm = result.graph_module
    relu_calls = [n for n in resnet_torch.graph_module.graph.nodes if n.op == "call_module" and "relu" in n.target]
    assert len(relu_calls) == RESNET18_RELU_CALLS
    stats = result.artifacts["stats"]
    assert list(stats) == [n.name for n in relu_calls] and result.inserted == RESNET18_RELU_CALLS

    reset_stats(gm)  # verification ran the graph too; start counting from here
    batches = [resnet_inputs[0], torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))]
    with torch.no_grad():
        for batch in batches:
            assert torch.equal(gm(batch), resnet_torch.graph_module(batch))  # the recorders change nothing
    reference = _hook_reference(resnet_model, batches)
    assert len(reference) == RESNET18_RELU_CALLS

    for site, values in zip(stats, reference):
        got = stats[site]  # read live: the recorders counted the two batches above
        assert got.calls == 2 and got.count == values.numel() and got.nan_count == got.inf_count == 0
        expected = [values.min(), values.max(), values.mean(), values.std(correction=0)]
        for name, have, want in zip(("min", "max", "mean", "std"), (got.min, got.max, got.mean, got.std), expected):
            assert math.isclose(have, float(want), rel_tol=FP32_RTOL, abs_tol=FP32_ATOL), (site, name, have, want)
    assert collect_stats(gm).to_dict() == stats.to_dict()
    assert stats["layer1_0_relu_1"].module_path == "layer1.0.relu"


def test_aten_dialect_kind_and_name_selectors(resnet_torch, resnet_aten, resnet_inputs, run_verified):
    result = run_verified(resnet_aten, NAME, {"select": "kind:relu", "insert": "nan_guard"})
    assert result.inserted == RESNET18_RELU_CALLS and not result.skipped
    assert torch.equal(result.graph_module(*resnet_inputs), resnet_aten.graph_module(*resnet_inputs))

    # name globs select by owning module path in both dialects: the same 14 values of layer1
    paths = {}
    for dialect, captured in (("torch", resnet_torch), ("aten", resnet_aten)):
        found = run_verified(captured, NAME, {"select": "name:layer1.*"})
        paths[dialect] = sorted(s.module_path for s in found.artifacts["stats"].values())
        assert len(paths[dialect]) == 14 and all(p.startswith("layer1.") for p in paths[dialect])
    assert paths["torch"] == paths["aten"]
    assert paths["torch"].count("layer1.0") == 1  # the residual add, a functional node owned by the block


@pytest.mark.parametrize("selector", ["type:Conv2d", "type:torch.nn.Conv2d", "type:Conv*", "kind:conv"])
def test_type_selectors_find_every_conv(resnet_torch, selector):
    result = apply_pass(resnet_torch.graph_module, NAME, {"select": selector})
    assert result.inserted == 20  # 1 stem + 16 in blocks + 3 downsample convs


def test_type_selector_on_aten_ops_uses_the_owning_module(resnet_aten):
    result = apply_pass(resnet_aten.graph_module, NAME, {"select": ["type:BatchNorm2d", "type:Linear"]})
    assert result.inserted == 21
    assert {s.module_path for s in result.artifacts["stats"].values()} >= {"bn1", "fc", "layer4.1.bn2"}


# --------------------------------------------------------------------------------------------------
# selectors on functional ops


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_target_selector_on_functional_ops(capture_as, run_verified, dialect):
    captured = capture_as(Functional().eval(), torch.randn(2, 8), dialect)
    relus = run_verified(captured, NAME, {"select": "target:relu"})
    # F.relu and x.relu() in the torch dialect; both are aten.relu in the ATen dialect
    assert relus.inserted == 2, relus.log
    sigmoid = run_verified(captured, NAME, {"select": "target:sigmoid"})
    assert sigmoid.inserted == 1
    functions = run_verified(captured, NAME, {"select": "op:call_function"})
    expected = 3 if dialect == "torch" else 5  # relu, sigmoid, add / linear, relu, sigmoid, relu, add
    assert functions.inserted == expected, functions.log


def test_placeholder_selection_guards_the_inputs(capture_as):
    captured = capture_as(LogNet().eval(), torch.rand(2, 4) + 0.5, "torch")
    result = apply_pass(captured.graph_module, NAME, {"select": "op:placeholder", "insert": "nan_guard"})
    assert result.inserted == 1
    with pytest.raises(NonFiniteError, match="after node x"):
        result.graph_module(torch.full((2, 4), math.nan))


def test_nothing_matched_is_a_skip_with_a_suggestion(resnet_torch):
    result = apply_pass(resnet_torch.graph_module, NAME, {"select": "type:Conv2D"})
    assert not result.changed and result.graph_module.code == resnet_torch.graph_module.code
    assert len(result.skipped) == 1 and result.artifacts["inserted"] == {}
    assert result.skipped[0].startswith("no node matched select type:Conv2D (type:Conv2D: did you mean type:Conv2d")


def test_inserted_nodes_are_never_selected_again(capture_as):
    captured = capture_as(Functional().eval(), torch.randn(2, 8), "torch")
    once = apply_pass(captured.graph_module, NAME, {"select": "op:call_module"})
    twice = apply_pass(once.graph_module, NAME, {"select": "op:call_module", "insert": "nan_guard"})
    assert once.inserted == 1 and twice.inserted == 1
    assert any("itself inserted by insert_after" in s for s in twice.skipped)


# --------------------------------------------------------------------------------------------------
# the guard


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_nan_guard_names_the_first_node_with_nan(capture_as, run_verified, dialect):
    torch.manual_seed(0)
    captured = capture_as(LogNet().eval(), torch.rand(2, 4) + 0.5, dialect)
    good = torch.rand(2, 4) + 0.1  # the exported graph has a static batch of 2
    # verify's random inputs would be negative: log makes NaN of them, so it checks on positive ones
    result = run_verified(captured, NAME, {"select": "op:call_*", "insert": "nan_guard"}, inputs=(good,))
    gm = result.graph_module
    assert torch.equal(gm(good), captured.graph_module(good))  # silent while the values are finite

    bad = good.clone()
    bad[0, 0], bad[1, 1] = -1.0, 0.0
    with pytest.raises(NonFiniteError) as caught:
        gm(bad)
    log_node = next(n.name for n in captured.graph_module.graph.nodes if "log" in n.name)
    assert caught.value.node == log_node and f"after node {log_node}" in str(caught.value)
    assert caught.value.nan_count == 1 and caught.value.inf_count == 1
    assert isinstance(caught.value, RuntimeError) and isinstance(caught.value, FxforgeError)


def test_nan_guard_names_the_module_path(capture_as):
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), nn.Linear(4, 4)))
    captured = capture_as(model.eval(), torch.randn(2, 4), "torch")
    result = apply_pass(captured.graph_module, NAME, {"select": "name:1.*", "insert": "nan_guard"})
    with torch.no_grad():
        result.graph_module.get_submodule("1.1").weight[0, 0] = math.inf
    with pytest.raises(NonFiniteError, match=r"after node _1_1 \(module 1\.1\)"):
        result.graph_module(torch.ones(1, 4))


# --------------------------------------------------------------------------------------------------
# noise, clamp, callable


def _noisy(captured, seed, sigma=0.5):
    return apply_pass(
        captured.graph_module, NAME, {"select": "kind:relu", "insert": "noise", "sigma": sigma, "seed": seed}
    )


def test_noise_is_reproducible_per_seed_and_verify_blames_the_inserted_node(resnet_torch, resnet_inputs):
    (x,) = resnet_inputs
    first, again, other = _noisy(resnet_torch, 7), _noisy(resnet_torch, 7), _noisy(resnet_torch, 8)
    assert first.inserted == RESNET18_RELU_CALLS and not first.skipped  # in-place ReLUs: nothing reads around them
    with torch.no_grad():
        out_first, out_again, out_other = first.graph_module(x), again.graph_module(x), other.graph_module(x)
        clean = resnet_torch.graph_module(x)
        assert not torch.equal(first.graph_module(x), out_first)  # the stream moves on between calls
    assert torch.equal(out_first, out_again)
    assert not torch.equal(out_first, out_other) and not torch.allclose(out_first, clean)

    check = verify(resnet_torch, _noisy(resnet_torch, 7).graph_module)
    assert not check.ok and check.divergence is not None
    assert check.divergence.node == "relu_noise" and check.divergence.reference_node == "relu"
    assert check.divergence.pass_name == NAME


def test_noise_has_the_asked_sigma_and_independent_sites(capture_as):
    captured = capture_as(nn.Sequential(nn.Identity(), nn.ReLU(), nn.ReLU()).eval(), torch.randn(4, 8), "torch")
    result = apply_pass(captured.graph_module, NAME, {"select": "type:ReLU", "insert": "noise", "sigma": 0.1})
    assert any("drawn at random" in line for line in result.log)  # no seed given: one is drawn (not logged)
    modules = [m for m in result.graph_module.modules() if isinstance(m, GaussianNoise)]
    assert all(m.fxforge_insert["seed"] == result.artifacts["seed"] for m in modules)
    assert str(result.artifacts["seed"]) not in " ".join(result.log)
    zeros = torch.zeros(1000, 1000)
    with torch.no_grad():
        first, second = (m(zeros) for m in modules)
    assert abs(float(first.std()) - 0.1) < 0.002 and abs(float(second.std()) - 0.1) < 0.002
    assert abs(float(torch.corrcoef(torch.stack([first.flatten(), second.flatten()]))[0, 1])) < 0.01


def test_noise_skips_integer_values(capture_as):
    captured = capture_as(WithIntegers(), torch.randn(3, 5), "aten")
    result = apply_pass(captured.graph_module, NAME, {"select": "op:call_function", "insert": "noise", "sigma": 1.0})
    assert result.inserted == 1  # tanh only
    assert any("argmax" in s and "needs floating point values" in s and "torch.int64" in s for s in result.skipped)


class Flatten(nn.Module):
    def forward(self, x):
        return x.view(x.size(0), -1).tanh()


def test_non_tensor_values_are_refused(capture_as):
    captured = capture_as(Flatten(), torch.randn(2, 3, 4), "torch")
    result = apply_pass(captured.graph_module, NAME, {"select": "op:call_method", "insert": "nan_guard"})
    assert result.inserted == 2  # view and tanh
    assert result.skipped == ["size: it produces a size value, not a tensor"]
    with pytest.raises(InsertAfterError, match="stats after node n got int, not a tensor"):
        StatsRecorder("n")(3)


def test_clamp_bounds(capture_as):
    captured = capture_as(Functional().eval(), torch.randn(4, 8), "torch")
    options = {"select": "target:sigmoid", "insert": "clamp", "min": 0.6, "max": 0.8}  # sigmoid of relu >= 0.5
    result = apply_pass(captured.graph_module, NAME, options)
    clamp = result.graph_module.get_submodule(result.artifacts["inserted"]["sigmoid"])
    seen: list[torch.Tensor] = []
    clamp.register_forward_hook(lambda module, args, output: seen.append(output))
    with torch.no_grad():
        result.graph_module(torch.randn(256, 8) * 4)
    assert float(seen[0].min()) == pytest.approx(0.6) and float(seen[0].max()) == pytest.approx(0.8)
    assert result.log == ["inserted clamp after sigmoid as sigmoid_clamp"]


def test_clamp_and_callable_results(capture_as):
    captured = capture_as(Functional().eval(), torch.randn(4, 8), "torch")
    x = torch.randn(16, 8)
    lin = captured.graph_module.lin
    with torch.no_grad():
        for options, transform in [
            ({"insert": "clamp", "min": -0.2, "max": 0.3}, lambda t: t.clamp(-0.2, 0.3)),
            ({"insert": "clamp", "max": "1e-1"}, lambda t: t.clamp(max=0.1)),  # strings as from YAML/CLI
            ({"insert": "callable", "fn": double}, double),
            ({"insert": "callable", "fn": "torch:tanh"}, torch.tanh),
            ({"insert": "callable", "fn": lambda t: t - 1}, lambda t: t - 1),
        ]:
            result = apply_pass(captured.graph_module, NAME, {"select": "name:lin", **options})
            a = F.relu(transform(lin(x)))
            assert torch.allclose(result.graph_module(x), a + torch.sigmoid(a).relu()), options
    assert any("cannot be saved with torch.save" in s for s in result.skipped)  # the lambda


def test_transform_refused_where_an_alias_reads_the_storage_later(capture_as, run_verified):
    captured = capture_as(InplaceAlias(), torch.randn(3, 4), "torch")
    refused = apply_pass(captured.graph_module, NAME, {"select": "target:relu_", "insert": "clamp", "max": 0.5})
    assert not refused.changed and "reads its storage after it" in refused.skipped[0]
    observed = run_verified(captured, NAME, {"select": "target:relu_"})  # stats read the value: always fine
    assert observed.inserted == 1


# --------------------------------------------------------------------------------------------------
# statistics: numerics and edge cases


def test_stats_are_stable_far_from_zero_and_skip_non_finite_values():
    recorder = StatsRecorder("site")
    generator = torch.Generator().manual_seed(0)
    batches = [1e6 + torch.randn(1000, generator=generator, dtype=torch.float64) for _ in range(5)]
    batches.append(torch.tensor([math.nan, math.inf, -math.inf, 1e6], dtype=torch.float64))
    batches.append(torch.empty(0))
    for batch in batches:
        assert recorder(batch) is batch
    finite = torch.cat([b[torch.isfinite(b)] for b in batches])
    stats = collect_stats(nn.ModuleDict({"r": recorder}))["site"]
    assert stats.calls == 7 and stats.count == 5001 and stats.nan_count == 1 and stats.inf_count == 2
    assert stats.min == float(finite.min()) and stats.max == float(finite.max())
    assert stats.mean == pytest.approx(float(finite.mean()), rel=1e-12)
    assert stats.std == pytest.approx(float(finite.std(correction=0)), rel=1e-9)  # float32 sums would be ~1e-1 off

    recorder.half()  # casting a model must not turn the accumulators into fp16
    assert recorder.mean.dtype == torch.float64 and recorder.m2.dtype == torch.float64


def test_stats_before_any_call_and_reset():
    recorder = StatsRecorder("site")
    stats = collect_stats(nn.ModuleDict({"r": recorder}))
    assert stats["site"].count == 0 and stats["site"].mean is None and stats["site"].std is None
    recorder(torch.ones(3))
    assert stats["site"].mean == 1.0  # the mapping reads the recorder live
    stats.reset()
    assert stats["site"].calls == 0 and stats["site"].min is None


# --------------------------------------------------------------------------------------------------
# saving and reloading

_WITHOUT_FXFORGE = """
import sys
class _NoFxforge:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "fxforge":
            raise ImportError("fxforge is not installed here")
sys.meta_path.insert(0, _NoFxforge())
import torch
"""


def _run_without_fxforge(code: str, cwd: Path) -> str:
    script = _WITHOUT_FXFORGE + textwrap.dedent(code)
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _roundtrip(module: nn.Module) -> nn.Module:
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def _guarded_stats_clamp(capture_as):
    captured = capture_as(LogNet().eval(), torch.rand(2, 4) + 0.5, "torch")
    gm = captured.graph_module
    for options in (
        {"select": "name:lin", "insert": "clamp", "min": -1.0, "max": 1.0},
        {"select": "target:log", "insert": "nan_guard"},
        {"select": "name:lin", "insert": "stats"},
    ):
        gm = apply_pass(gm, NAME, options).graph_module
    return captured, gm


def test_reload_with_torch_load(capture_as):
    _, gm = _guarded_stats_clamp(capture_as)
    x = torch.rand(5, 4) + 0.1
    reloaded = _roundtrip(gm)
    assert torch.equal(reloaded(x), gm(x))
    stats = collect_stats(reloaded)
    assert stats["lin"].calls == 1 and stats["lin"].count == x.numel()
    reloaded(x)
    assert stats["lin"].calls == 2  # the reloaded recorder keeps counting
    with pytest.raises(RuntimeError, match="NaN or Inf after node log"):
        reloaded(-x)

    noisy = _noisy(capture_as(nn.Sequential(nn.ReLU()), torch.randn(2, 3), "torch"), seed=3).graph_module
    noisy(torch.zeros(2, 3))
    copy_of = _roundtrip(noisy)  # the generator's state travels with it: both continue the same stream
    assert torch.equal(copy_of(torch.zeros(2, 3)), noisy(torch.zeros(2, 3)))
    deep = copy.deepcopy(noisy)
    assert torch.equal(deep(torch.zeros(2, 3)), noisy(torch.zeros(2, 3)))


def test_aten_result_saved_by_reexport_keeps_its_insertions(capture_as, tmp_path):
    from fxforge.optimize import save_graph_module

    x = torch.rand(2, 4) + 0.5
    captured = capture_as(LogNet().eval(), x, "aten")
    gm = apply_pass(captured.graph_module, NAME, {"select": "target:log", "insert": "nan_guard"}).graph_module
    gm = apply_pass(gm, NAME, {"select": "target:linear", "insert": "stats"}).graph_module
    save_graph_module(gm, tmp_path, (x,), "aten")
    program = torch.export.load(str(tmp_path / "model.pt2")).module()
    assert torch.allclose(program(x), gm(x))
    assert collect_stats(program)["linear"].calls == 1
    with pytest.raises(RuntimeError, match="NaN or Inf after node log"):
        program(-x)


# --------------------------------------------------------------------------------------------------
# options: YAML, CLI, errors


def test_pipeline_file_with_string_options(capture_as, tmp_path):
    captured = capture_as(Functional().eval(), torch.randn(2, 8), "torch")
    (tmp_path / "p.yaml").write_text(
        "passes:\n"
        "  - name: insert_after\n"
        "    options: {select: [target:sigmoid, name:lin], insert: clamp, min: '-1e-1', max: 0.2}\n"
        "  - name: insert_after\n"
        "    options: {select: kind:relu, insert: callable, fn: 'torch.nn.functional:relu6'}\n"
    )
    result = Pipeline.from_file(tmp_path / "p.yaml").run(captured)
    assert [s.result.inserted for s in result.steps] == [2, 2]
    x = torch.randn(3, 8)
    a = F.relu6(F.relu(captured.graph_module.lin(x).clamp(-0.1, 0.2)))
    assert torch.allclose(result.graph_module(x), a + F.relu6(torch.sigmoid(a).clamp(-0.1, 0.2).relu()))


def test_cli_optimize_and_to_folder_outputs_load_without_fxforge(capsys, capture_as, tmp_path):
    # fxforge optimize with --option strings, as a user types them
    args = ["optimize", "demo", "-p", NAME, "--option", "insert_after.select=[type:ReLU, type:Linear]"]
    args += ["--option", "insert_after.insert=stats", "--verify", "-o", str(tmp_path / "demo"), "--json"]
    code = main(args)
    out, err = capsys.readouterr()
    assert code == EXIT_OK, err
    data = json.loads(out)
    step = data["passes"][0]
    assert step["name"] == NAME and step["inserted"] == 3 and data["verify"]["ok"]
    assert step["log"][0] == "inserted stats after relu as relu_stats"

    # a guard, a clamp and a recorder, saved with torch.save and with to_folder
    _, gm = _guarded_stats_clamp(capture_as)
    x = torch.rand(5, 4) + 0.1
    torch.save(gm, tmp_path / "model.pt")
    expected = gm(x)
    torch.save((x, expected), tmp_path / "data.pt")
    with pytest.warns(UserWarning, match="saved as pickled files"):  # the inserted modules: torch-only pickles
        gm.to_folder(tmp_path / "rewritten", "Rewritten")

    out = _run_without_fxforge(
        """
        demo = torch.load("demo/model.pt", weights_only=False)
        demo(torch.randn(2, 3, 32, 32))
        print("demo", sorted(name for name, _ in demo.named_children() if name.endswith("_stats")))
        model = torch.load("model.pt", weights_only=False)
        x, expected = torch.load("data.pt")
        assert torch.equal(model(x), expected)
        print("stats", int(model.lin_stats.calls), float(model.lin_stats.count), type(model.lin_stats).__name__)
        try:
            model(-x)
        except RuntimeError as exc:
            print("guard", exc)
        from rewritten import Rewritten
        folder = Rewritten()
        assert torch.equal(folder(x), expected)
        print("folder", int(folder.lin_stats.calls))
        """,
        tmp_path,
    )
    assert "demo ['fc_stats', 'relu_1_stats', 'relu_stats']" in out
    assert "stats 1 20.0 StatsRecorder" in out  # saved before any call; the guard trips before lin runs again
    assert "guard fxforge nan_guard: NaN or Inf after node log" in out
    assert "folder 2" in out  # to_folder wrote the state after one call; then one more


@pytest.mark.parametrize(
    "options,needle,hint",
    [
        ({"select": "type:ReLU", "insert": "stat"}, "cannot insert 'stat'", "did you mean 'stats'"),
        ({"select": "typ:ReLU"}, "unknown selector 'typ:ReLU'", "did you mean type:ReLU"),
        ({"select": "Conv2d"}, "unknown selector 'Conv2d'", "did you mean type:Conv2d"),
        ({"select": "kind:relux"}, "unknown node kind", "kinds: relu"),
        ({"select": []}, "needs select", "selectors:"),
        ({"select": ""}, "needs select", "selectors:"),
        ({"select": 1}, "select is a selector or a list of them, got 1 (int)", "selectors:"),  # not "needs select"
        ({"select": "type:ReLU", "insert": "clamp", "sigma": 1}, "option sigma is for insert=noise", None),
        ({"select": "type:ReLU", "insert": "noise"}, "needs epsilon (calibrated noise) or sigma > 0", "sigma: 0.1"),
        ({"select": "type:ReLU", "insert": "noise", "sigma": 0}, "needs sigma > 0, got 0", "sigma: 0.1"),
        ({"select": "type:ReLU", "insert": "clamp"}, "needs min, max or both", None),
        ({"select": "type:ReLU", "insert": "clamp", "min": 1, "max": 0}, "greater than max", None),
        ({"select": "type:ReLU", "insert": "clamp", "max": "high"}, "must be a number", None),
        (
            {"select": "type:ReLU", "insert": "callable", "fn": "nowhere.at_all:fn"},
            "cannot import 'nowhere.at_all'",
            None,
        ),
        ({"select": "type:ReLU", "insert": "callable", "fn": "torch"}, "is not of the form module:name", "e.g. fn:"),
        ({"select": "type:ReLU", "insert": "callable", "fn": 3}, "fn must be callable", None),
        ({"insert": "stats"}, "insert_after needs select", "selectors:"),  # not Python's "missing 1 required...
    ],
)
def test_bad_options_are_one_clear_error(resnet_torch, options, needle, hint):
    with pytest.raises(PassError) as caught:
        apply_pass(resnet_torch.graph_module, NAME, options)
    assert needle in caught.value.message
    if hint:
        assert hint in (caught.value.hint or "")


def test_input_graph_untouched(resnet_torch):
    gm = resnet_torch.graph_module
    code, children = gm.code, [name for name, _ in gm.named_children()]
    users = {n.name: sorted(u.name for u in n.users) for n in gm.graph.nodes}
    for insert in ({"insert": "stats"}, {"insert": "noise", "sigma": 1.0, "seed": 0}):
        apply_pass(gm, NAME, {"select": "kind:relu", **insert})
    assert gm.code == code and [name for name, _ in gm.named_children()] == children
    assert {n.name: sorted(u.name for u in n.users) for n in gm.graph.nodes} == users
