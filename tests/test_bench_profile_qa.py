"""bench, profile and doctor after a QA pass: one error line and nothing else on stderr, options that would be
ignored are refused, and no impossible verdict or percentage."""

from __future__ import annotations

import json
import time

import pytest
import torch
from torch import fx, nn

from fxforge import machine
from fxforge.bench import Backend, bench
from fxforge.capture import capture
from fxforge.cli import main
from fxforge.errors import EXIT_OK, EXIT_USAGE, FxforgeError
from fxforge.profile import NodeTime, profile_model

# profile compares node times with a peak: a small one measured once, not 2 s per test
PEAK = machine.measure_peak(seconds=0.2, size=128)


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


class Reshapes(nn.Module):
    def forward(self, x):
        return x.view(7, -1)  # 2x16 has no 7 rows: fails inside the generated forward


def test_a_graph_failing_in_warm_up_is_one_row_and_nothing_on_stderr(capfd):
    model = nn.Sequential(nn.Linear(16, 16)).eval()
    captured = capture(model, (torch.randn(2, 16),))
    failing = Backend("failing", "generated code that raises", lambda c, s: fx.symbolic_trace(Reshapes()))
    report = bench(captured, ["eager", failing], repeats=2, peak=False)
    row = {r.backend: r for r in report.rows}["failing"]
    assert row.error.startswith("run failed:") and "[7, -1]" in row.error
    _, err = capfd.readouterr()
    # torch.fx prints the generated code and a traceback on its own; the row's reason is all that is said
    assert err == ""


def test_bench_refuses_options_it_would_ignore(capsys):
    code, out, err = run(capsys, "bench", "demo", "-b", "eager", "-p", "fold_bn", "--repeats", "2")
    assert code == EXIT_USAGE and "--passes applies to the fx backend only" in err and not out
    code, out, err = run(capsys, "bench", "--list-backends", "torchvision:resnet18", "--repeats", "2")
    assert code == EXIT_USAGE and "MODEL, --repeats" in err and not out
    code, out, _ = run(capsys, "bench", "--list-backends", "--json")
    assert code == EXIT_OK and '"backends"' in out


def test_bench_errors_are_the_first_line_on_stderr(capsys):
    # the progress bar, off when stderr is not a terminal, wrote an empty line before the error when it stopped
    for args in (["-p", "nosuch"], ["--device", "meta"]):
        code, _, err = run(capsys, "bench", "demo", "-b", "eager,fx", "--repeats", "2", *args)
        assert code == EXIT_USAGE and err.startswith("error:"), err


def _node(bound: str, fraction: float | None) -> NodeTime:
    return NodeTime("n", "call_module", "Conv2d", "n", "float32", 1.0, 0.5, 0, 0, 0, 0.0, None, bound, fraction)


def test_a_node_beyond_the_measured_limit_shows_why_not_a_percentage():
    assert _node("memory", 0.58).verdict == "memory (58%)"
    assert _node("memory", 1.19).verdict == "memory (>100%: in cache)"
    assert _node("compute", 1.3).verdict == "compute (>100%: peak measured low)"
    assert _node("", None).verdict == ""


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


def test_nodes_that_do_no_work_get_no_verdict():
    captured = capture(Small().eval(), (torch.randn(1, 3, 16, 16),), method="export")
    graph = captured.graph_module.graph
    idle = {n.name for n in graph.nodes if n.op == "get_attr" or n.target == "_guards_fn"}
    assert "_guards_fn" in idle  # torch.export's input guard: the case this test is about
    report = profile_model(captured, repeats=2, warmup=1, peak=PEAK)
    # not rows either (QA: BERT's weights' get_attr nodes among the slowest): their time, the interpreter's, is
    # left outside the nodes, which the report's overhead says
    assert not idle & {n.name for n in report.nodes}
    assert any(n.bound for n in report.nodes)


def test_an_aten_node_reads_its_weights_bytes_as_the_torch_dialect_does():
    """A weight is fetched by a get_attr node in the ATen dialect; the bytes a node moves count it as they count a
    module's parameters in the torch dialect (the roofline verdict depends on it)."""
    model = Small().eval()
    inputs = (torch.randn(1, 3, 16, 16),)
    moved = {}
    for method, target in (("symbolic_trace", "Conv2d"), ("export", "aten.conv2d.default")):
        report = profile_model(capture(model, inputs, method=method), repeats=1, warmup=0, peak=PEAK)
        moved[method] = next(n.bytes_moved for n in report.nodes if n.target == target)
    assert moved["export"] == moved["symbolic_trace"] > (8 * 3 * 3 * 3 + 8) * 4


class Embeds(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(100, 8)

    def forward(self, ids):
        return self.embedding(ids).sum(1)


def test_profile_names_the_inputs_with_their_dtype():
    captured = capture(Embeds().eval(), (torch.randint(0, 100, (2, 16)),))
    assert profile_model(captured, repeats=1, warmup=0, peak=PEAK).inputs == ["2x16:int64"]


def test_profile_refuses_a_trace_directory_with_a_trace_hint(tmp_path):
    captured = capture(Small().eval(), (torch.randn(1, 3, 16, 16),))
    with pytest.raises(FxforgeError, match="is a directory") as raised:
        profile_model(captured, repeats=1, trace=tmp_path, peak=PEAK)
    assert raised.value.hint.startswith("name a file, e.g. trace=") and "model.onnx" not in raised.value.hint


def test_profile_json_is_whole_and_refuses_options_that_shape_tables(capsys):
    code, out, err = run(capsys, "profile", "demo", "--json", "--top", "3", "--repeats", "1")
    assert code == EXIT_USAGE and "--top shapes the tables" in err and "every node" in err
    assert json.loads(out)["ok"] is False  # the error is the one JSON document, not a partial profile


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--leaf", "layer4"], "--leaf applies"),
        (["--wrap", "torch.flatten"], "--wrap applies"),
        (["--method", "export", "--concrete", "flag=true"], "--method, --concrete apply"),
        (["--check-batch", "2"], "--check-batch applies"),
    ],
)
def test_profile_eager_refuses_the_capture_options_it_would_ignore(capsys, options, named):
    """QA: profile --backend eager --leaf layer4 exited 0: eager profiling does not capture, so the capture's
    options were ignored, silently."""
    code, out, err = run(capsys, "profile", "demo", "--backend", "eager", "--repeats", "1", *options)
    assert code == EXIT_USAGE and not out, err
    assert err.startswith("error:") and named in err.splitlines()[0] and "to --backend fx" in err


def test_report_refuses_bench_options_without_bench(tmp_path, capsys):
    """QA: report -b eager,fx (or --repeats 3) without --bench exited 0 with no bench section."""
    for options, named in (
        (["-b", "eager,fx"], "--backends applies to --bench"),
        (["--repeats", "3"], "--repeats applies to --bench"),
        (["-b", "eager", "--repeats", "3"], "--backends, --repeats apply to --bench"),
    ):
        code, out, err = run(capsys, "report", "demo", *options, "-o", str(tmp_path / "r.html"))
        assert code == EXIT_USAGE and not out and err.splitlines()[0] == f"error: {named}", err
        assert not (tmp_path / "r.html").exists()


def test_profile_trace_and_report_make_missing_folders_as_every_output_does(tmp_path, capsys):
    """QA asked whether profile --trace and report -o should refuse a missing folder: export, optimize, graph and
    split make theirs (and remove them again when nothing is written), so these two do as well, as documented."""
    trace = tmp_path / "new" / "traces" / "t.json"
    code, _, err = run(capsys, "profile", "demo", "--repeats", "1", "--warmup", "0", "--trace", str(trace))
    assert code == EXIT_OK and trace.is_file() and json.loads(trace.read_text()), err
    page = tmp_path / "pages" / "of" / "r.html"
    code, _, err = run(capsys, "report", "demo", "-o", str(page))
    assert code == EXIT_OK and page.is_file(), err


def test_the_peak_takes_about_the_seconds_asked_for(monkeypatch):
    # the copy's fixed cost (filling a 768 MiB buffer) comes out of the budget instead of adding to it
    def slow_copy(budget: float) -> float:
        time.sleep(0.6)
        return 10.0

    monkeypatch.setattr(machine, "_copy_bandwidth", slow_copy)
    peak = machine.measure_peak(seconds=0.8, size=64)
    assert peak.bandwidth_gbs == 10.0 and 0.75 <= peak.seconds < 1.05, peak.seconds  # it was 0.6 + 0.6
    assert machine._rate(1.0, lambda: None, 0.0) > 0  # a budget spent by the copy still times one call


def test_the_fp32_peak_is_the_faster_of_torch_mm_and_onednn_and_says_so_when_they_differ(monkeypatch):
    """On an AMD EPYC with AVX-512, torch.mm (MKL) reached 210 GFLOP/s and oneDNN's matmul 455: a peak from
    torch.mm alone put ONNX Runtime's resnet18 at 200% of the machine's peak."""
    real = machine._onednn_fp32_rate
    assert real(torch.randn(64, 64), torch.randn(64, 64), 64, 0.01) >= 0  # runs in this torch, or says 0
    monkeypatch.setattr(machine, "_onednn_fp32_rate", lambda *args: 1e15)
    peak = machine.measure_peak(seconds=0.2, size=64)
    assert peak.gflops["fp32"] == 1e6 and peak.mm_fp32 is not None and peak.mm_fp32 < 1e6
    assert "oneDNN's matmul 1000000" in peak.notes[0]
    assert f"fp32 1000000 (torch.mm {peak.mm_fp32:.0f})" in machine.describe(peak)
    monkeypatch.setattr(machine, "_onednn_fp32_rate", lambda *args: 0.0)  # no oneDNN: torch.mm's figure, no note
    peak = machine.measure_peak(seconds=0.2, size=64)
    assert peak.gflops["fp32"] > 0 and peak.mm_fp32 is None and not peak.notes
    assert "torch.mm" not in machine.describe(peak)


def test_the_machine_line_counts_one_cpu_in_the_singular(monkeypatch):
    monkeypatch.setattr(machine, "cpu_info", lambda: machine.CpuInfo("a CPU", ["avx2"], 1, "AVX2"))
    assert "a CPU; 1 CPU, torch threads" in machine.describe()


def test_backends_that_run_on_the_cpu_whatever_the_model_say_so(capsys):
    """For a model on a GPU, bench leaves these out of its default set (they would time the CPU)."""
    code, out, _ = run(capsys, "bench", "--list-backends", "--json")
    listed = {b["name"]: b["cpu_only"] for b in json.loads(out)["backends"]}
    assert code == EXIT_OK
    assert {name for name, cpu_only in listed.items() if cpu_only} == {"onnxruntime", "int8", "ort_int8"}


def test_a_program_fixed_to_one_batch_says_which_batch_it_takes():
    """bench --batch 1,2 on a program exported for batch 2 said 'pass --input ... e.g. --input 1x3x224x224',
    which cannot help: the hint names the batch the program takes (QA finding)."""
    from fxforge.errors import InputSpecError
    from fxforge.runtime import run_reference

    class LoopsOverRows(torch.nn.Module):
        def forward(self, x):
            return torch.stack([row * i for i, row in enumerate(x)])

    program = torch.export.export(LoopsOverRows(), (torch.randn(2, 8),)).module()
    with pytest.raises(InputSpecError) as raised:
        run_reference(program, (torch.randn(1, 8),), {})
    assert raised.value.hint.startswith("the model takes batch 2 only") and "run it at batch 2," in raised.value.hint


def test_a_reason_that_ends_at_who_raised_says_what_was_raised():
    """QA: a bench row said "build failed: RuntimeError: backend='inductor' raised:" and stopped there."""
    from fxforge.errors import one_line_reason

    exc = RuntimeError(
        "backend='inductor' raised:\nRuntimeError: itensor_view_from_dense expects float tensor inputDouble\n\n"
        "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace"
    )
    assert one_line_reason(exc) == (
        "RuntimeError: backend='inductor' raised: RuntimeError: itensor_view_from_dense expects float tensor "
        "inputDouble"
    )
    assert one_line_reason(RuntimeError("plain\nsecond")) == "RuntimeError: plain"
