"""Notebook views of the results that had none: profile, debug and doctor reports (their ``_repr_html_`` and short
``__repr__``), and the display functions of split plans, split results and pipeline runs, on real objects; and the
depth a graph page (what ``fxforge.show`` displays, ``fxforge graph`` writes) opens at."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ElementTree

import pytest
import torch
from torch import nn

import fxforge
from fxforge import display, machine
from fxforge.cli import main
from fxforge.debug import debug_model
from fxforge.doctor import AVAILABLE, doctor
from fxforge.profile import profile_model
from fxforge.visual.page import GraphView, script_json

PEAK = machine.measure_peak(seconds=0.2, size=128)


def well_formed(page: str) -> ElementTree.Element:
    """The card parsed as XML: an unescaped ``<root>`` or a tag left open fails here, as it would break the
    notebook's page around it."""
    return ElementTree.fromstring(f"<div>{page}</div>")


def tables(page: str) -> list[list[list[str]]]:
    """The body rows of every table of a card, in order, as the text of their cells."""
    return [
        [["".join(cell.itertext()) for cell in row] for row in body.iter("tr")]
        for body in well_formed(page).iter("tbody")
    ]


def cells(page: str) -> list[list[str]]:
    """The body rows of all a card's tables."""
    return [row for rows in tables(page) for row in rows]


def assert_short_repr(value: object, name: str) -> str:
    text = repr(value)
    assert text.startswith(f"<{name}") and text.endswith(">"), text
    assert "\n" not in text and len(text) < 300, text
    return text


@pytest.fixture(scope="module")
def demo():
    return fxforge.prepare("demo")


class Gate(nn.Module):
    def forward(self, x):
        return torch.log(x - 0.5)  # NaN wherever x < 0.5


def test_profile_report_shows_its_hottest_nodes_and_modules_with_shares(demo):
    report = profile_model(demo, repeats=2, warmup=1, peak=PEAK)
    text = assert_short_repr(report, "ProfileReport")
    hottest = report.top(1)[0]
    assert f"hottest {hottest.name}" in text and f"{len(report.nodes)} nodes" in text
    node_rows, module_rows = tables(report._repr_html_())
    assert node_rows[0][0] == hottest.name and node_rows[0][3] == f"{hottest.share:.1%}"
    assert len(node_rows) == min(15, len(report.nodes))
    times = [float(row[2]) for row in node_rows]
    assert times == sorted(times, reverse=True)
    top_modules = {m.path for m in report.modules if "." not in m.path}
    assert top_modules and top_modules == {row[0] for row in module_rows}


def test_debug_report_shows_the_first_nan_and_the_statistics():
    model = nn.Sequential(nn.Linear(8, 8), Gate(), nn.Linear(8, 2)).eval()
    report = debug_model(model, (torch.randn(4, 8),), stats=True, cases=2)
    text = assert_short_repr(report, "DebugReport")
    assert "NaN/Inf first in 1 (Gate)" in text and "2 cases" in text
    page = report._repr_html_()
    rows = cells(page)
    assert ["first NaN/Inf", report.nan.describe()] in rows
    stats = {row[0]: row for row in rows if row and row[0] in {"<root>", "0", "1", "2"}}
    assert set(stats) == {"<root>", "0", "1", "2"}  # <root> escaped: the page parsed
    assert int(stats["1"][7]) == report.stats["1"].nan_count > 0
    # statistics alone look for no first NaN: the view counts the modules whose outputs held one instead
    stats_only = debug_model(model, (torch.randn(4, 8),), nan=False, stats=True)
    poisoned = sum(1 for s in stats_only.stats.values() if s.nan_count or s.inf_count)
    assert f"NaN/Inf in the output of {poisoned} modules" in assert_short_repr(stats_only, "DebugReport")
    assert poisoned == 3  # the Gate, the Linear after it and the Sequential around them


def test_a_clean_debug_report_says_so():
    report = debug_model(nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval(), (torch.randn(2, 4),))
    assert "no NaN or Inf" in assert_short_repr(report, "DebugReport")
    assert "No NaN or Inf in any module's output." in "".join(well_formed(report._repr_html_()).itertext())


def test_doctor_report_shows_every_feature_with_why_not():
    report = doctor(peak=False)
    report.features["export onnx"], report.reasons["export onnx"] = "missing-extra", "pip install 'fxforge[onnx]'"
    text = assert_short_repr(report, "DoctorReport")
    available = sum(1 for state in report.features.values() if state == AVAILABLE)
    assert f"{available} of {len(report.features)} features available" in text
    rows = {row[0]: row for row in cells(report._repr_html_())}
    assert set(report.features) <= set(rows)
    assert rows["export onnx"][1:] == ["missing-extra", "pip install 'fxforge[onnx]'"]
    assert 'class="fxf-warn">missing-extra<' in report._repr_html_()


@pytest.fixture(scope="module")
def split_dir(demo, tmp_path_factory):
    directory = tmp_path_factory.mktemp("split") / "demo-2"
    return fxforge.split(demo, 2, output_dir=directory, model_name="demo"), directory


def test_split_plan_and_result_show_stages_and_cuts(demo, split_dir):
    plan = fxforge.plan_split(demo, stages=3)
    text = display.split_plan_repr(plan)
    assert text.startswith("<SplitPlan") and "3 stages balanced by flops" in text and len(text) < 300
    mean = display.number(round(plan.total_cost / 3))
    assert f"/ mean {mean})" in display.split_plan_html(plan) and mean[-1] in "KMGT"  # 8.36K, not 8363
    rows = cells(display.split_plan_html(plan))
    stage_rows = [row for row in rows if row and row[0] in {"0", "1", "2"}]
    assert [row[1] for row in stage_rows] == [str(stage.nodes) for stage in plan.stages]
    cut_rows = [row for row in rows if row and "|" in row[0]]
    assert [row[0] for row in cut_rows] == ["0|1", "1|2"]
    assert all(t.name in cut_rows[0][2] for t in plan.cuts[0].tensors)

    result, directory = split_dir
    page = display.split_result_html(result)
    assert "verified" in page and f"wrote {directory}/" in page and "plan.json" in page
    assert len([row for row in cells(page) if row and row[0] == "0|1"]) == 1


def test_pipeline_run_shows_throughput_and_the_check(split_dir):
    _, directory = split_dir
    run = fxforge.run_pipeline(directory, microbatches=2, schedules=["gpipe"], repeats=1, warmup=0)
    text = display.pipeline_run_repr(run)
    assert text.startswith("<PipelineRun 2 stages on cpu (gloo)") and "gpipe" in text and len(text) < 300
    assert ("verified" in text) == run.check.ok
    rows = cells(display.pipeline_run_html(run))
    labels = [row[0] for row in rows]
    assert "pipeline, gpipe" in labels
    assert sum(label.startswith("one process, unsplit") for label in labels) == len(run.baselines) > 0
    gpipe = rows[labels.index("pipeline, gpipe")]
    assert gpipe[2] == f"{run.schedules[0].samples_per_s:.1f}"


NESTED_MODEL = """
import torch
from torch import nn


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner, self.fc = Inner(), nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(self.inner(x)).sigmoid()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block, self.head = Block(), nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.block(x))
"""


@pytest.fixture(scope="module")
def nested_spec(tmp_path_factory):
    path = tmp_path_factory.mktemp("nested") / "nested.py"
    path.write_text(NESTED_MODEL)
    return f"{path}:Net"


def page_model(page: str) -> dict:
    raw = re.search(r'<script type="application/json" id="fxg-model">(.*?)</script>', page, re.S)
    assert raw is not None
    return json.loads(raw.group(1))


def test_a_graph_page_asked_to_open_too_deep_opens_at_its_deepest_level(nested_spec, tmp_path, capsys):
    captured = fxforge.prepare(nested_spec, ["2x4"])
    deepest = max(m["depth"] for m in fxforge.graph_html(captured).model["modules"])
    assert deepest == 2  # block, block.inner
    view = fxforge.graph_html(captured, tmp_path / "deep.html", depth=99)
    assert view.model["depth"] == deepest == page_model(view.path.read_text())["depth"]
    assert fxforge.graph_html(captured, depth=1).model["depth"] == 1  # a depth within range is kept
    # what `fxforge graph` prints is the depth the page opens at
    assert main(["graph", nested_spec, "-i", "2x4", "--depth", "99", "-o", str(tmp_path / "cli.html")]) == 0
    out = capsys.readouterr().out
    assert f"opens at depth {deepest}" in out and "depth 99" not in out


def test_a_small_page_states_its_size_in_kib(nested_spec):
    pytest.importorskip("py_mini_racer")  # graph_svg's layout engine: the `visual` extra
    captured = fxforge.prepare(nested_spec, ["2x4"])
    svg = fxforge.graph_svg(captured, depth=1)
    text = repr(GraphView(svg, fxforge.graph_html(captured).model, title="nested"))
    assert 1024 < len(svg.encode()) < 1024 * 1024  # a picture of a few KiB, which read "0.0 MB"
    assert f"{len(svg.encode()) / 1024:.1f} KiB" in text and " MB" not in text, text


def test_the_depth_menu_is_never_blank(nested_spec, tmp_path):
    from browser_helpers import PageRecord, browser, browser_or_skip, open_page

    browser_or_skip()
    view = fxforge.graph_html(fxforge.prepare(nested_spec, ["2x4"]))
    # a page whose model asks for more than its deepest level, as one written before the clamp in Python did
    model = page_model(view.html)
    model["depth"] = 99
    original = re.search(r'(<script type="application/json" id="fxg-model">)(.*?)(</script>)', view.html, re.S)
    path = tmp_path / "unclamped.html"
    path.write_text(view.html.replace(original.group(0), original.group(1) + script_json(model) + original.group(3)))
    record = PageRecord()
    with browser() as context:
        page = open_page(context, path, record)
        menu = "document.querySelector('select.fxg-depth').value"
        assert page.evaluate(menu) == "2"
        nodes_open = page.locator("#fxg-graph g.node").count()
        page.evaluate("window.fxgraph.setDepth(99)")
        assert page.evaluate(menu) == "2"
        page.evaluate("window.fxgraph.setDepth(0)")
        assert page.evaluate(menu) == "0"
        page.wait_for_function(f"document.querySelectorAll('#fxg-graph g.node').length < {nodes_open}")
    assert record.console_errors == [] and record.requests == []


# QA of the notebook views, 2026-11-27: what a notebook user saw wrong.


def test_the_bench_view_says_which_rows_are_wrong(demo):
    """A backend returning NaN showed as a normal row (a speedup, no status) and its repr as a plain timing."""
    from fxforge.bench import BenchReport, BenchRow

    eager, wrong = BenchRow("eager", batch=1), BenchRow("nan_backend", batch=1)
    eager.set_rounds([2.0, 2.1, 2.2])
    wrong.set_rounds([1.0, 1.1, 1.2])
    eager.within_tolerance, eager.max_abs_err = True, 0.0
    wrong.within_tolerance, wrong.max_abs_err, wrong.gflops, wrong.peak_fraction = False, float("inf"), 5.0, 0.02
    report = BenchReport([eager, wrong], threads=1, warmup=1, repeats=3, inputs=["1x3"], memory="-")
    rows = {row[0]: row for row in cells(report._repr_html_())}
    assert "beyond tol" in rows["nan_backend"] and "ok" in rows["eager"]
    assert "5 (2%)" in rows["nan_backend"]  # GFLOP/s and its share of the peak, as the CLI's table has them
    assert "nan_backend 1.10 ms beyond tol" in assert_short_repr(report, "BenchReport")
    assert report._repr_html_().count("Bench</h") == 1  # one heading, not the card's over the section's


def test_a_bench_of_many_backends_and_batches_has_a_short_repr():
    """QA: 9 backends at 2 batches made a 600-character repr; above 6 rows it says the fastest matching row per
    batch and how many were timed."""
    from fxforge.bench import BenchReport, BenchRow

    rows = []
    for batch in (1, 8):
        for index, backend in enumerate(["eager", "fx", "torchscript", "compile", "onnxruntime", "int8", "bf16"]):
            row = BenchRow(backend, batch=batch)
            row.set_rounds([10.0 * batch - index] * 3)
            row.within_tolerance = backend not in ("int8", "bf16")  # the fastest two are wrong: never "fastest"
            rows.append(row)
    report = BenchReport(rows, threads=2, warmup=1, repeats=3, inputs=["1x3"], memory="-")
    text = assert_short_repr(report, "BenchReport")
    assert "batch 1: fastest onnxruntime 6.00 ms, 7 backends (2 failed or beyond tol)" in text, text
    assert "batch 8: fastest onnxruntime 76.00 ms" in text, text


def test_the_inspect_view_shows_the_depth_the_report_was_made_at():
    """The view cut at depth 2 whatever the report held: a BERT layer (depth 3) never showed."""
    model = nn.Sequential(nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.ReLU())))
    captured = fxforge.capture(model, (torch.randn(1, 4),))
    deep = fxforge.inspect_graph(captured, depth=3)
    assert "0.0.0" in [row[0] for row in cells(deep._repr_html_())]
    shallow = fxforge.inspect_graph(captured, depth=1)
    assert "0.0.0" not in [row[0] for row in cells(shallow._repr_html_())]


def test_show_draws_a_quantize_result_and_qat_is_not_called_int8():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    captured = fxforge.capture(model, (torch.randn(2, 8),))
    with pytest.warns(Warning):  # random calibration is said
        static = fxforge.quantize(captured, "static", random_batches=2)
    page = fxforge.show(static)
    assert isinstance(page, GraphView) and "quantize_per_tensor" in page.html
    assert "still float" in repr(fxforge.quantize(captured, "qat-prepare"))


def test_an_optimize_that_changed_nothing_draws_no_diff(demo):
    """A diff of no change embedded the whole graph page (1.8 MB) all the same."""
    unchanged = fxforge.optimize(demo, [])
    assert "<iframe" not in unchanged._repr_html_() and "No pass changed the graph" in unchanged._repr_html_()
    changed = fxforge.optimize(demo, ["fold_bn"])
    assert changed.pipeline.steps[0].result.changed and "<iframe" in changed._repr_html_()


def test_a_card_brings_its_own_background():
    """On a dark notebook theme the cards' dark text sat on a transparent card, on a near-black page."""
    css = display.card("x", "y").split("</style>")[0]
    rule = next(line for line in css.split("}") if line.lstrip("<style>\n").startswith(".fxf-card{"))
    assert "background:#fff" in rule and "color:#1f2933" in rule


def test_a_failed_verification_repr_says_why_where_no_node_does():
    """QA: a random model's result read "<VerifyResult FAILED: 16 cases ..., max abs err 0>": no reason."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))  # training mode: random
    text = assert_short_repr(fxforge.verify(model, model, example=((torch.randn(2, 4),), {})), "VerifyResult")
    assert text.startswith("<VerifyResult CANNOT VERIFY") and "the reference is not deterministic" in text, text
