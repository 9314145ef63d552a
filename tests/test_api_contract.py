"""The public Python API refuses what it cannot take in one line (an FxforgeError), as the CLI does (QA)."""

from __future__ import annotations

import collections

import pytest
import torch
from torch import nn

import fxforge
from fxforge.errors import FxforgeError


@pytest.fixture(scope="module")
def small():
    model = nn.Sequential(nn.Linear(4, 3)).eval()
    return model, fxforge.capture(model, (torch.randn(2, 4),))


@pytest.mark.parametrize(
    "call",
    [
        lambda m: fxforge.report(m),
        lambda m: fxforge.auto_optimize(m),
        lambda m: fxforge.bench(m),
        lambda m: fxforge.profile_model(m),
        lambda m: fxforge.plan_split(m, 2),
        lambda m: fxforge.inspect_graph(m),
        lambda m: fxforge.optimize(m, ["dead_code"]),
    ],
    ids=["report", "auto_optimize", "bench", "profile_model", "plan_split", "inspect_graph", "optimize"],
)
def test_functions_of_a_captured_model_refuse_a_plain_module(small, call):
    """report, auto_optimize, bench and profile_model raised "'Sequential' object has no attribute 'original'"."""
    with pytest.raises(FxforgeError, match="takes a captured model, not a Sequential"):
        call(small[0])


def test_capture_of_an_exported_program_says_how_to_use_one():
    """capture said "takes an nn.Module, not a ExportedProgram", with a hint about functions."""
    program = torch.export.export(torch.nn.Linear(4, 2), (torch.randn(2, 4),))
    with pytest.raises(FxforgeError, match="not an ExportedProgram") as info:
        fxforge.capture(program, (torch.randn(2, 4),))
    assert "torch.export.save" in info.value.hint and "fxforge.prepare('model.pt2')" in info.value.hint


def test_bad_arguments_are_named(small):
    _model, captured = small
    with pytest.raises(FxforgeError, match=r"budget must be a fxforge\.Budget, not a float"):
        fxforge.auto_optimize(captured, budget=0.01)
    with pytest.raises(FxforgeError, match="debug_model runs a module, not a str"):
        fxforge.debug_model("demo", (torch.randn(2, 4),))
    with pytest.raises(FxforgeError, match="depth must be an integer"):
        fxforge.inspect_graph(captured, depth="2")
    with pytest.raises(FxforgeError, match="batch sizes must be integers of at least 1"):
        fxforge.verify(captured, captured.graph_module, batch_sizes=[0])
    with pytest.raises(FxforgeError, match=r"Verifier\.check runs a model, not the spec or file"):
        fxforge.Verifier(captured).check("out/some_dir")
    with pytest.raises(ValueError, match="rtol must be a finite number >= 0"):
        fxforge.compare_outputs(torch.ones(2), torch.ones(2), rtol=-1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_inputs_on_a_missing_device_are_one_line():
    with pytest.raises(FxforgeError, match="cannot make inputs on cuda"):
        fxforge.make_inputs(["1x3"], device="cuda")


_Pair = collections.namedtuple("_Pair", "a b")


class _NamedOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(4, 4)

    def forward(self, x):
        return _Pair(self.l(x), x + 1)


def test_verify_takes_trust_pickle_as_its_error_says(tmp_path):
    """A directory with only model.pt: verify's error said "pass trust_pickle=True", which verify did not take."""
    captured = fxforge.capture(_NamedOutput().eval(), (torch.randn(2, 4),))
    fxforge.optimize(captured, ["dead_code"], output_dir=tmp_path / "out")
    assert not (tmp_path / "out" / "model.pt2").exists()  # a namedtuple output: only the pickle
    with pytest.raises(FxforgeError, match="trust_pickle=True"):
        fxforge.verify(captured, tmp_path / "out")
    assert fxforge.verify(captured, tmp_path / "out", trust_pickle=True).ok


def test_result_reprs_claim_only_what_was_done(tmp_path):
    """QA: "<OptimizeResult ok: 1 passes, changed by replace_modules>" after that pass was rolled back, with no word
    that nothing was verified; an export written without verification read "ok"."""
    captured = fxforge.prepare("demo")
    undone = fxforge.optimize(captured, [("replace_modules", {"mapping": {nn.ReLU: nn.ReLU6}})], verify=True,
                              keep_going=True)  # fmt: skip
    assert "changed by none, rolled back replace_modules" in repr(undone) and "1 pass," in repr(undone)
    assert "not verified" in repr(fxforge.optimize(captured, ["fold_bn"], verify=False))
    exported = fxforge.export_model(captured, "pt2", tmp_path / "m.pt2", verify_export=False)
    assert "written, not verified" in repr(exported)


class _Keyword(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(4, 4)

    def forward(self, x, y=None):
        out = self.l(x)
        return out + y if y is not None else out


def test_an_output_of_a_model_with_keyword_tensors_says_inputs_txt_lacks_them(tmp_path):
    """QA: inputs.txt held only the positional 2x4, with no note, and verifying the directory by spec ran the model
    without ``y``. The note says so and names the check that passes them."""
    torch.manual_seed(0)
    model = _Keyword().eval()
    captured = fxforge.capture(model, (torch.randn(2, 4),), example_kwargs={"y": torch.randn(2, 4)})
    result = fxforge.optimize(captured, ["dead_code"], output_dir=tmp_path / "out")
    assert any("keyword tensor inputs y are not" in note for note in result.notes)
    assert fxforge.verify(captured, tmp_path / "out").ok


class _Noisy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(4, 4)

    def forward(self, x):
        return self.l(x) + torch.rand_like(x)


def test_bench_and_quantize_say_a_random_model_is_random():
    """QA: eager's own row was "beyond tolerance" of eager with no note, and quantize's agreement (81%) was put
    down to int8, while capture had found the model random."""
    captured = fxforge.capture(_Noisy(), (torch.randn(2, 4),))
    assert any("the model is random" in note for note in captured.record.notes)
    row = fxforge.bench(captured, ["eager"], repeats=2, warmup=1, peak=False).rows[0]
    assert any("model's own randomness" in note for note in row.notes)
    quantized = fxforge.quantize(captured, "dynamic")
    assert any("counts its own randomness" in warning for warning in quantized.warnings)
    assert "1 layer int8" in repr(quantized)


def test_a_model_with_lazy_modules_is_refused_for_what_it_is():
    """QA: nn.LazyLinear read as "the model rejected the example inputs (3x4): ValueError: uninitialized parameter",
    from fxforge's own size check; the model ran on those inputs."""
    model = nn.Sequential(nn.LazyLinear(3)).eval()
    with pytest.raises(FxforgeError, match="lazy modules") as info:
        fxforge.capture(model, (torch.randn(3, 4),))
    assert "call the model once" in info.value.hint
    assert nn.parameter.is_lazy(model[0].weight)  # fxforge did not make them on the caller's model


def test_quantize_refusals_fit_the_model_and_mode():
    """QA: a float64 model in dynamic mode got "or try --mode dynamic"; a model with a keyword input failed with
    "example input of type NoneType cannot be described by a spec"."""
    doubled = nn.Sequential(nn.Linear(4, 4)).double().eval()
    with pytest.raises(FxforgeError) as info:
        fxforge.quantize(fxforge.capture(doubled, (torch.randn(2, 4, dtype=torch.float64),)), "dynamic")
    assert "model.float()" in info.value.hint and "--mode" not in info.value.hint
    captured = fxforge.capture(_Keyword().eval(), (torch.randn(2, 4),), example_kwargs={"y": torch.randn(2, 4)})
    with pytest.raises(FxforgeError, match="takes y by keyword"):
        fxforge.quantize(captured, "dynamic")


def test_an_onnx_file_onnx_runtime_cannot_run_is_an_export_error(tmp_path):
    """QA: a bfloat16 model's ONNX file (no bf16 Gemm in ONNX Runtime's CPU kernels) was reported as "cannot read
    <staging path>: ... (hint: is the file corrupt?)", a ModelSpecError, exit 2."""
    pytest.importorskip("onnxruntime")
    from fxforge.export import ExportError

    model = nn.Sequential(nn.Linear(4, 4)).bfloat16().eval()
    captured = fxforge.capture(model, (torch.randn(2, 4, dtype=torch.bfloat16),))
    with pytest.raises(ExportError, match="does not load back in ONNX Runtime") as info:
        fxforge.export_model(captured, "onnx", tmp_path / "m.onnx")
    assert "partial" not in info.value.message and "corrupt" not in str(info.value.hint)
    assert list(tmp_path.iterdir()) == []


def test_export_options_of_another_format_are_refused(small, tmp_path):
    """QA: export_model(to="pt2", opset=17) and script=True ran without a word."""
    _model, captured = small
    with pytest.raises(FxforgeError, match="opset applies to onnx, not pt2"):
        fxforge.export_model(captured, "pt2", tmp_path / "m.pt2", opset=17)
    with pytest.raises(FxforgeError, match="script applies to torchscript, not pt2"):
        fxforge.export_model(captured, "pt2", tmp_path / "m.pt2", script=True)


def test_a_mismatch_of_dict_keys_names_them():
    """QA: verify said only "output: keys differ"."""
    problems = fxforge.compare_outputs({"a": torch.ones(1), "b": torch.ones(1)}, {"a": torch.ones(1)}).problems
    assert problems == ["output: keys differ (missing 'b')"]


def test_prepare_takes_example_tensors_as_well_as_shape_specs():
    """QA (2026-11-28): fxforge.prepare(model, (x,)) -- the first thing a torch user types -- gave a TypeError from
    the spec parser's regex. Tensors are the example inputs, used as they are; the caller's are not changed."""
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
    x = torch.randn(2, 4)
    before = x.clone()
    for inputs in (x, (x,), [x]):
        captured = fxforge.prepare(model, inputs)
        assert len(captured.example_inputs) == 1 and torch.equal(captured.example_inputs[0], x)
    assert torch.equal(x, before)
    with pytest.raises(
        FxforgeError, match=r"inputs are shape specs such as '1x3x224x224' \(got a value of type int\)"
    ) as error:
        fxforge.verify_specs(model, model, [4])
    assert "fxforge.capture(model, (x,))" in error.value.hint
    # QA: a numpy array, an int and a dict gave Python's own errors; a mix of tensors and specs blamed the tensors
    import numpy

    for inputs in (numpy.zeros((2, 4)), 3, {"x": x}):
        with pytest.raises(FxforgeError, match=f"got a value of type {type(inputs).__name__} \\(hint"):
            fxforge.prepare(model, inputs)
    with pytest.raises(FxforgeError, match="inputs mix example tensors with str values") as error:
        fxforge.prepare(model, [x, "2x4"])
    assert "fxforge.capture(model, (x, 3), example_kwargs=" in error.value.hint
