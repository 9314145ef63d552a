"""The Python API refuses the combinations of arguments the CLI refuses, with the CLI's message in Python's terms:
a check made in a CLI command alone let ``fxforge.X(...)`` ignore the useless argument without a word."""

from __future__ import annotations

import re

import pytest
import torch

import fxforge
from fxforge.errors import FxforgeError


def test_doctor_refuses_seconds_without_the_peak_it_would_time():
    with pytest.raises(FxforgeError, match=r"^seconds applies to the peak measurement, which peak=False skips"):
        fxforge.doctor(peak=False, seconds=5)


@pytest.mark.parametrize(
    ("mode", "data", "why"),
    [
        ("static", {"calibration": "random:2"}, "every batch comes from calibration random:2"),
        ("static", {"calibration": "TENSOR"}, "every batch comes from calibration$"),
        ("dynamic", {"eval_data": "TENSOR"}, "every batch comes from eval_data$"),
        ("qat-prepare", {}, "mode='qat-prepare' reads no data"),
    ],
)
def test_quantize_refuses_random_batches_where_none_is_drawn(mode, data, why):
    """quantize --random-batches with every batch read from data is refused; fxforge.quantize ran, ignoring it."""
    captured = fxforge.prepare("demo:mlp")
    data = {k: torch.randn(4, *captured.example_inputs[0].shape[1:]) if v == "TENSOR" else v for k, v in data.items()}
    with pytest.raises(FxforgeError) as refused:
        fxforge.quantize(captured, mode, random_batches=3, **data)
    message = refused.value.message
    assert message.startswith("random_batches sets how many random batches stand in for missing data")
    assert re.search(why, message), message


@pytest.mark.filterwarnings("ignore::fxforge.quantize.RandomCalibrationWarning")
def test_quantize_takes_random_batches_where_they_are_drawn():
    captured = fxforge.prepare("demo:mlp")
    result = fxforge.quantize(captured, "dynamic", random_batches=2)
    assert result.evaluation["samples"] == 2 * captured.example_inputs[0].shape[0]


@pytest.mark.parametrize(
    ("options", "named"),
    [({"cases": 3}, "cases has"), ({"rtol": 0.1, "atol": 0.1}, "rtol, atol have"), ({"seeds": [0, 1]}, "seeds has")],
)
def test_export_model_refuses_verification_options_without_verification(tmp_path, options, named):
    """export --no-verify --cases 3 is refused; export_model(verify_export=False, cases=3) wrote the file."""
    captured = fxforge.prepare("demo:mlp")
    with pytest.raises(FxforgeError, match=f"^{named} no effect with verify_export=False: nothing is verified"):
        fxforge.export_model(captured, "pt2", tmp_path / "m.pt2", verify_export=False, **options)
    assert not list(tmp_path.iterdir())


def test_split_refuses_cases_without_verification():
    with pytest.raises(FxforgeError, match=r"^cases has no effect with verify_stages=False: nothing is verified"):
        fxforge.split(fxforge.prepare("demo:mlp"), 2, verify_stages=False, cases=64)


def test_split_verifies_on_the_default_cases_when_not_told():
    captured = fxforge.prepare("demo:mlp")
    assert len(fxforge.split(captured, 2).verification.cases) >= 16


def test_bench_times_written_artifacts_next_to_eager(tmp_path):
    """bench --artifact had no fxforge.bench parameter: the API needed fxforge.bench's module (a private reach,
    since fxforge.bench is the function) and the CLI's own rule that the rows are then eager and the artifacts."""
    captured = fxforge.prepare("demo:mlp")
    fxforge.export_model(captured, "pt2", tmp_path / "m.pt2")
    report = fxforge.bench(captured, artifacts=tmp_path / "m.pt2", warmup=1, repeats=1, peak=False)
    assert [row.backend for row in report.rows] == ["eager", f"file:{tmp_path / 'm.pt2'}"]
    assert all(row.error is None for row in report.rows)


def test_bench_refuses_an_artifact_that_is_not_there_and_an_empty_backend_list(tmp_path):
    captured = fxforge.prepare("demo:mlp")
    with pytest.raises(FxforgeError, match=r"^artifacts .*nothing\.onnx: no such file or directory"):
        fxforge.bench(captured, artifacts=[tmp_path / "nothing.onnx"])
    # --backends "" is refused, where [] ran the whole default set
    with pytest.raises(FxforgeError, match=r"^backends names no backend; the known ones: eager, "):
        fxforge.bench(captured, [])


def test_report_refuses_bench_repeats_without_bench(tmp_path):
    """report --repeats without --bench is refused; fxforge.report(bench_repeats=5) wrote a page without timings."""
    with pytest.raises(FxforgeError, match=r"^bench_repeats applies to bench=True"):
        fxforge.report(fxforge.prepare("demo:mlp"), tmp_path / "r.html", bench_repeats=5)
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("name", ["replace_pattern", "insert_after"])
def test_report_refuses_a_pass_that_needs_options_and_says_where_they_go(name, tmp_path, capsys):
    """report runs each pass with its defaults; the pass's own hint offered --option, which report has not (QA)."""
    from fxforge.cli import main

    with pytest.raises(
        FxforgeError, match=f"^{name} needs .*: a report runs each pass with its default options"
    ) as info:
        fxforge.report(fxforge.prepare("demo:mlp"), tmp_path / "r.html", passes=["fold_bn", name])
    assert f"fxforge.Pipeline([('{name}'" in info.value.hint
    assert main(["report", "demo", "-p", name, "-o", str(tmp_path / "r.html")]) == 2
    assert f"fxforge optimize MODEL -p {name} --option {name}." in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


RULE_FILE = """\
import fxforge


@fxforge.register_rule("PARITY001", "parity-linear", "info", "a Linear layer", dialects=("torch",))
def linears(ctx):
    for node in ctx.graph.nodes:
        if node.op == "call_module" and type(ctx.gm.get_submodule(node.target)).__name__ == "Linear":
            yield node, f"{node.target} is a Linear"
"""


def test_lint_runs_a_rule_file_as_lint_rule_does(tmp_path):
    """lint --rule FILE.py:FUNCTION worked through fxforge.lint.rule and load_rule_reference, which `import fxforge`
    does not export: the decorator is fxforge.register_rule (as register_pass, register_backend), and fxforge.lint
    takes the references."""
    from fxforge.lint import RULES

    (tmp_path / "parity_rules.py").write_text(RULE_FILE)
    assert "register_rule" in fxforge.__all__
    captured = fxforge.prepare("demo:mlp")
    try:
        report = fxforge.lint(captured, select=["PARITY001"], rules=[f"{tmp_path / 'parity_rules.py'}:linears"])
        assert report.findings and {f.code for f in report.findings} == {"PARITY001"}
    finally:
        RULES.pop("PARITY001", None)
    with pytest.raises(FxforgeError) as refused:
        fxforge.lint(captured, rules=[f"{tmp_path / 'parity_rules.py'}:nothing"])
    assert "--rule" not in str(refused.value), refused.value  # said in Python's terms
