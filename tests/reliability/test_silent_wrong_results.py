"""Each result fxforge once reported as verified, or as equal, although it was wrong (issue: proof you can trust).

Every test reproduces the original report and asserts the fixed behaviour.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from reliability_models import (
    AllNaN,
    AsInt64,
    ConvBN,
    GatedBlock,
    Identity,
    LoopThenFlag,
    Masked,
    NoFlopFormula,
    RandomOutput,
)

import fxforge
from fxforge.cli import main
from fxforge.errors import EXIT_CAPTURE, EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, InputSpecError
from fxforge.export import ExportError, export_model
from fxforge.inputs import DISTRIBUTIONS
from fxforge.lint import lint
from fxforge.passes import apply_pass
from fxforge.quantize import load_calibration
from fxforge.verify import DEFAULT_CASES, verify

MODELS = str(Path(__file__).parent / "reliability_models.py")


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# 1. a traced data-dependent branch was "verified" -------------------------------------------------


def test_trace_of_a_data_dependent_branch_is_an_error_naming_the_line(tmp_path):
    captured = fxforge.prepare(GatedBlock(), ["1x8"])
    with pytest.raises(ExportError) as info:
        export_model(captured, "torchscript", tmp_path / "m.pt")
    assert "reliability_models.py" in info.value.message and "x.mean() > 0" in info.value.message
    assert list(tmp_path.iterdir()) == []


def test_allowed_anyway_the_frozen_branch_fails_verification(tmp_path):
    captured = fxforge.prepare(GatedBlock(), ["1x8"])
    result = export_model(captured, "torchscript", tmp_path / "m.pt", allow_trace_warnings=True)
    # positive and negative inputs are among the cases, so both branches are exercised whatever the trace froze
    assert not result.ok and result.path is None and list(tmp_path.iterdir()) == []


def test_cli_export_of_the_traced_branch_exits_3_and_writes_nothing(capsys, tmp_path):
    code, out, err = run(capsys, "export", f"{MODELS}:gated_block", "-i", "1x8", "-o", str(tmp_path / "m.pt"))
    assert code == EXIT_CAPTURE and "verified" not in out and "x.mean() > 0" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_auto_never_chooses_the_trace_of_a_data_dependent_model(tmp_path):
    captured = fxforge.prepare(GatedBlock(), ["1x8"])
    result = fxforge.auto_optimize(captured, tmp_path / "out", backends=["eager", "torchscript"], repeats=2)
    torchscript = next(c for c in result.candidates if c.name == "torchscript")
    assert torchscript.status == "failed" and "trace fixed a value" in torchscript.reason
    assert result.chosen == "eager"


def test_verification_tries_at_least_16_varied_cases_and_says_which():
    model = ConvBN().eval()
    captured = fxforge.prepare(model, ["1x3x16x16"])
    folded = apply_pass(captured.graph_module, "fold_bn").graph_module
    check = verify(captured, folded)
    assert check.ok and check.trials >= DEFAULT_CASES >= 16
    assert check.batch_sizes == [1, 2] and set(check.distributions) == set(DISTRIBUTIONS)
    assert len(check.cases) == check.trials and "batch 2" in " ".join(check.cases)
    described = check.describe_inputs()
    assert "16 cases" in described and "batch 1, 2" in described and "negative" in described


def test_verification_catches_what_one_shape_and_one_distribution_miss():
    """A rewrite that is only right for positive inputs passes three N(0, 1) batches half the time; it fails here."""

    class PositivePart(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x)

    class Wrong(torch.nn.Module):
        def forward(self, x):
            return x.abs()  # equal to relu on positive inputs only

    check = verify(PositivePart(), Wrong(), input_specs=[fxforge.parse_input_spec("1x4")])
    assert not check.ok and any("negative" in problem for problem in check.problems)


# 2. fold_bn on a model left in training mode ------------------------------------------------------


def test_fold_bn_refuses_a_training_mode_batchnorm_and_says_how_to_fix_it():
    model = ConvBN().train()
    captured = fxforge.prepare(model, ["2x3x8x8"])
    assert model.training, "prepare switched the caller's model to eval mode"
    assert any("training mode" in note for note in captured.record.notes)
    result = apply_pass(captured.graph_module, "fold_bn")
    assert not result.changed and any("eval()" in reason for reason in result.skipped)
    findings = [f for f in lint(captured).findings if f.code == "FX008"]
    assert findings and all("eval()" in f.message for f in findings)


# 3. concrete_args on the torch.export fallback ---------------------------------------------------


@pytest.mark.parametrize("flag", [False, True])
def test_concrete_args_are_honoured_when_capture_falls_back_to_export(flag):
    model = LoopThenFlag().eval()
    x = torch.ones(2, 3)
    captured = fxforge.capture(model, (x,), concrete_args={"flag": flag})
    assert captured.record.method == "torch.export" and captured.record.ok
    with torch.no_grad():
        expected = model(x, flag)
        assert torch.allclose(captured.graph_module(x, flag=flag), expected)
    assert verify(captured, captured.graph_module).ok


def test_concrete_args_are_honoured_by_symbolic_trace_too():
    class Flagged(torch.nn.Module):
        def forward(self, x, flag=True):
            return x * 2 if flag else x * 3

    captured = fxforge.capture(Flagged(), (torch.ones(2),), concrete_args={"flag": False})
    assert captured.record.method == "symbolic_trace" and captured.record.ok
    assert torch.equal(captured.graph_module(torch.ones(2)), torch.full((2,), 3.0))


# 4. a pipeline file's verify: true ----------------------------------------------------------------


def test_pipeline_file_verify_true_is_honoured_without_the_flag(capsys, tmp_path):
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text("passes: [fold_bn]\nverify: true\n")
    code, out, err = run(capsys, "optimize", "demo", "--pipeline", str(pipeline), "--json")
    assert code == EXIT_OK, err
    data = json.loads(out)
    assert data["passes"][0]["verify"]["ok"] and data["verify"]["trials"] >= 16
    # and --no-verify still turns it off
    code, out, _ = run(capsys, "optimize", "demo", "--pipeline", str(pipeline), "--no-verify", "--json")
    assert code == EXIT_OK and json.loads(out)["verify"] is None


# 5. ops with no FLOP formula ----------------------------------------------------------------------


def test_ops_without_a_flop_formula_are_listed(capsys):
    report = fxforge.inspect_graph(fxforge.prepare(NoFlopFormula(), ["8x8"]))
    unknown = report.totals["flops_unknown_ops"]
    assert any("cdist" in op for op in unknown) and any("fft" in op for op in unknown)
    assert all(node.flops_unknown == [] for node in report.nodes if node.op in ("placeholder", "output"))
    code, out, _ = run(capsys, "inspect", f"{MODELS}:NoFlopFormula", "-i", "8x8")
    assert code == EXIT_OK and "FLOPs unknown" in out and "cdist" in out


def test_common_models_have_no_unknown_flops():
    report = fxforge.inspect_graph(fxforge.prepare("torchvision:resnet18", ["1x3x64x64"]))
    assert report.totals["flops_unknown_ops"] == []
    # an exported transformer: its aten._assert_tensor_metadata checks are no computation gap
    bert = {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 32}
    captured = fxforge.prepare("transformers:BertModel", ["1x8:int64", "1x8:int64"], model_kwargs=bert)
    assert fxforge.inspect_graph(captured).totals["flops_unknown_ops"] == []


# 6. keyword inputs were silently not verified -----------------------------------------------------


def test_optimize_verifies_a_model_captured_with_keyword_inputs():
    captured = fxforge.capture(Masked().eval(), (torch.randn(2, 4),), example_kwargs={"mask": torch.ones(2, 4)})
    result = fxforge.optimize(captured, ["dead_code", "cse"], verify=True)
    assert result.pipeline.ok and result.pipeline.verification is not None
    assert result.pipeline.verification.trials >= 16


def test_verify_runs_keyword_inputs_through_both_models():
    captured = fxforge.capture(Masked().eval(), (torch.randn(2, 4),), example_kwargs={"mask": torch.ones(2, 4)})

    class IgnoresMask(torch.nn.Module):
        def __init__(self, lin):
            super().__init__()
            self.lin = lin

        def forward(self, x, mask=None):
            return self.lin(x)

    assert not verify(captured, IgnoresMask(captured.original.lin)).ok


# 7. dtypes ----------------------------------------------------------------------------------------


def test_a_dtype_change_is_a_mismatch_unless_allowed():
    x = (torch.full((3,), 2.0),)
    check = verify(Identity(), AsInt64(), x)
    assert not check.ok and "dtype int64 != float32" in check.problems[0]
    assert verify(Identity(), AsInt64(), x, allow_dtype_change=True).ok


# 8. all-NaN outputs -------------------------------------------------------------------------------


def test_an_all_nan_reference_is_not_a_match():
    check = verify(AllNaN(), AllNaN(), input_specs=[fxforge.parse_input_spec("3")])
    assert not check.ok and "NaN" in check.problems[0]


def test_some_nan_in_the_reference_is_a_warning():
    class HalfNaN(torch.nn.Module):
        def forward(self, x):
            return torch.cat([x, x * float("nan")])

    check = verify(HalfNaN(), HalfNaN(), input_specs=[fxforge.parse_input_spec("3")])
    assert check.ok and check.warnings and "NaN" in check.warnings[0]


# 9. vacuous checks --------------------------------------------------------------------------------


def test_check_batch_zero_or_negative_is_refused(capsys):
    for value in ("0", "-3"):
        code, _, err = run(capsys, "inspect", "demo", "--check-batch", value)
        assert code == EXIT_USAGE and "Traceback" not in err
    with pytest.raises(InputSpecError):
        fxforge.prepare("demo", check_batch=0)


def test_zero_random_calibration_batches_are_refused(capsys):
    with pytest.raises(InputSpecError):
        load_calibration("random:0", (torch.randn(1, 3),))
    code, _, err = run(capsys, "quantize", "demo", "--calib", "random:0")
    assert code == EXIT_USAGE and "random:N needs N >= 1" in err


# 10. a random reference -------------------------------------------------------------------------


def test_a_random_reference_is_reported_as_such_not_blamed_on_a_pass():
    captured = fxforge.capture(RandomOutput(), (torch.randn(4, 8),), check=False)
    result = fxforge.optimize(captured, ["remove_dropout"], verify=True)
    assert not result.pipeline.ok and result.pipeline.failed_pass is None
    assert "not deterministic" in result.pipeline.problem
    assert verify(captured, captured.graph_module).nondeterministic


def test_cli_says_the_model_is_random(capsys):
    code, out, _ = run(capsys, "optimize", f"{MODELS}:RandomOutput", "-i", "4x8", "-p", "remove_dropout", "--verify")
    assert code == EXIT_FINDINGS and "not deterministic" in out and "after pass" not in out
