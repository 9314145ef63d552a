"""Notebook views (``_repr_html_`` and a short ``__repr__`` on every result), the CLI's exit codes for bad
input, and the example notebook run end to end by nbclient."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import fxforge
from fxforge.cli.app import main
from fxforge.optimize import fix
from fxforge.visual.render import load_output_dir

ROOT = Path(__file__).resolve().parents[2]


def page_model(path: Path) -> dict:
    """The graph model a written page carries (the JSON the viewer reads)."""
    raw = re.search(r'<script type="application/json" id="fxg-model">(.*?)</script>', path.read_text(), re.S)
    assert raw is not None, f"{path} has no graph model"
    return json.loads(raw.group(1))


def test_every_result_has_a_notebook_view(resnet_captures, tmp_path):
    captured = resnet_captures["torch"]
    result = fxforge.optimize(captured, ["fold_bn"], verify=True)
    objects = {
        "Captured": captured,
        "InspectReport": fxforge.inspect_graph(captured),
        "LintReport": fxforge.lint(captured),
        "OptimizeResult": result,
        "VerifyResult": result.pipeline.verification,
        "ExportResult": fxforge.export_model(captured, to="pt2", path=tmp_path / "m.pt2"),
        "BenchReport": fxforge.bench(captured, ["eager"], repeats=2, warmup=1),
        "QuantizeResult": fxforge.quantize(captured, "dynamic"),
        "FixResult": fix(captured, None),
    }
    for name, value in objects.items():
        short = repr(value)
        assert short.startswith(f"<{name}") and len(short) < 300, short
        page = value._repr_html_()
        assert "<table" in page or "<svg" in page, name
    assert "fold_bn" in objects["OptimizeResult"]._repr_html_() and "<iframe" in objects["OptimizeResult"]._repr_html_()
    assert "eager" in objects["BenchReport"]._repr_html_()
    assert "fold_bn" in objects["FixResult"]._repr_html_() and "fold_bn" in repr(objects["FixResult"])
    view = fxforge.show(captured)
    assert "<iframe" in view._repr_html_() and repr(view).startswith("<fxforge page")


def _run(args, capsys):
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines()


def test_graph_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cases = [
        ["graph", "nosuch:model", "-o", str(tmp_path / "g.html")],
        ["graph", "demo", "-o", str(blocker / "g.html")],
        ["graph", "demo", "--diff", str(tmp_path), "-o", str(tmp_path / "g.html")],
        ["graph", "demo", "--diff", str(tmp_path / "missing"), "-o", str(tmp_path / "g.html")],
        ["graph", "demo", "-o", str(tmp_path / "g.png")],
        ["report", "demo", "-p", "nosuch_pass", "-o", str(tmp_path / "r.html")],
    ]
    for args in cases:
        code, err = _run(args, capsys)
        assert code == 2, (args, err)
        assert err[0].startswith("error:") and len([line for line in err if line.startswith("error:")]) == 1


def test_graph_diff_refuses_an_output_of_the_model_built_with_other_arguments(tmp_path, capsys):
    """QA: a directory written from a 2-layer configuration diffed against the 3-layer one drew the missing layer
    as 56 'removed' nodes: the directory records the --model-arg values it was written from."""
    out = tmp_path / "out"
    resnet = ["torchvision:resnet18", "-i", "1x3x32x32"]
    assert main(["optimize", *resnet, "--model-arg", "num_classes=10", "-o", str(out)]) == 0
    capsys.readouterr()
    other = ["--model-arg", "num_classes=20", "--diff", str(out), "--trust-pickle", "-o", str(tmp_path / "x.html")]
    assert main(["graph", *resnet, *other]) == 2
    err = capsys.readouterr().err
    assert "built with --model-arg num_classes=10, not --model-arg num_classes=20" in err
    assert not (tmp_path / "x.html").exists()
    same = ["--model-arg", "num_classes=10", "--diff", str(out), "--trust-pickle", "-o", str(tmp_path / "d.html")]
    assert main(["graph", *resnet, *same]) == 0


def test_graph_cli_writes_html_svg_and_diff(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["optimize", "demo", "-p", "fold_bn", "-o", str(out)]) == 0
    assert (out / "report.html").exists()
    assert main(["graph", "demo", "--diff", str(out), "-o", str(tmp_path / "d.html")]) == 2  # model.pt is a pickle
    assert "--trust-pickle" in capsys.readouterr().err
    assert main(["graph", "demo", "--diff", str(out), "--trust-pickle", "-o", str(tmp_path / "d.html")]) == 0
    assert "removed" in capsys.readouterr().out
    # another model's output: a node-by-node diff of two models is nonsense, refused before anything is loaded
    assert main(["graph", "demo:mlp", "--diff", str(out), "--trust-pickle", "-o", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert f"{out} was written from demo, not demo:mlp" in err and not (tmp_path / "x.html").exists()
    assert f"hint: fxforge graph demo --diff {out}" in err
    with pytest.raises(fxforge.ModelSpecError) as refused:  # in Python, the call that diffs it, not the CLI's
        load_output_dir(str(out), model="demo:mlp", trust_pickle=True)
    assert refused.value.hint == f"fxforge.diff_html(fxforge.prepare('demo'), {str(out)!r})"
    # an output captured by torch.export: the model is captured the same way, unless --method says otherwise
    aten = tmp_path / "aten"
    assert main(["optimize", "demo", "--method", "export", "-p", "fold_bn", "-o", str(aten)]) == 0
    capsys.readouterr()
    assert main(["graph", "demo", "--diff", str(aten), "-o", str(tmp_path / "a.html"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    counts = data["counts"]
    assert counts["changed"] > 0 and counts["inserted"] == 0  # the folded convs, not every node removed and inserted
    assert data["hidden_nodes"] > 0  # the ATen graph's weights: in the details, not drawn
    assert main(["graph", "demo", "--diff", str(aten), "-o", str(tmp_path / "a.html"), "--force"]) == 0
    assert f"({data['nodes']} nodes," in capsys.readouterr().out  # the line and --json count the same nodes
    args = ["graph", "demo", "--method", "symbolic_trace", "--diff", str(aten), "-o", str(tmp_path / "b.html")]
    assert main(args) == 2
    assert "the rewritten graph is in the aten dialect, the original in the torch dialect" in capsys.readouterr().err
    from fxforge.visual.render import same_model_spec

    assert same_model_spec("models/net.py:build", "/elsewhere/net.py:build")  # optimize ran from another folder
    assert not same_model_spec("net.py:A", "net.py:B") and not same_model_spec("demo", "demo:mlp")
    pytest.importorskip("py_mini_racer")
    assert main(["graph", "demo", "-o", str(tmp_path / "g.svg")]) == 0
    svg = (tmp_path / "g.svg").read_text()
    assert svg.startswith("<svg") and svg.count('class="node') >= 10
    assert main(["graph", "demo", "-o", str(tmp_path / "g.svg")]) == 2  # exists: --force to replace


def test_example_notebook_runs(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    # the kernel's temporary directory: the tour's files are to be gone when it ends (it left 47 MB in /tmp per run)
    kernel_tmp = tmp_path / "tmp"
    kernel_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(kernel_tmp))
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(ROOT / "examples" / "tour.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    errors = [o for cell in notebook.cells for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []
    html = [o for cell in notebook.cells for o in cell.get("outputs", []) if "text/html" in o.get("data", {})]
    assert len(html) >= 6  # the tables and graphs the tour's cells end with
    left = sorted(path.name for path in kernel_tmp.iterdir() if not path.name.startswith("torchinductor_"))
    assert left == []  # torch's own compile cache aside


def test_report_profile_times_every_node_and_colours_the_graph(tmp_path, capsys):
    assert main(["report", "demo", "--profile", "-o", str(tmp_path / "r.html"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    model = page_model(tmp_path / "r.html")
    timed = [n for n in model["nodes"] if "ms" in n]
    computing = [n for n in model["nodes"] if n["op"] not in ("placeholder", "output") and not n.get("h")]
    assert out["profile"] == model["profile"] and model["profile"]["matched"] == len(timed) == len(computing)
    assert abs(sum(n["share"] for n in timed) - 1) < 1e-6
    assert "coloured by time" in (tmp_path / "r.html").read_text()
    # a saved profile (fxforge profile --json) colours the same way; both at once is a usage error
    assert main(["profile", "demo", "--json"]) == 0
    (tmp_path / "p.json").write_text(capsys.readouterr().out)
    assert main(["report", "demo", "--profile-file", str(tmp_path / "p.json"), "-o", str(tmp_path / "s.html")]) == 0
    assert page_model(tmp_path / "s.html")["profile"]["matched"] == len(computing)
    args = ["report", "demo", "--profile", "--profile-file", str(tmp_path / "p.json"), "-o", str(tmp_path / "x.html")]
    assert main(args) == 2
    assert "--profile-file" in capsys.readouterr().err
    # a profile of another model colours nothing: refused (as split does), nothing written
    other = tmp_path / "other.json"
    assert main(["profile", "demo:mlp", "--json"]) == 0
    other.write_text(capsys.readouterr().out)
    for command, option in (("report", "--profile-file"), ("graph", "--profile")):
        assert main([command, "demo", option, str(other), "-o", str(tmp_path / f"o_{command}.html")]) == 2
        assert "the profile names none of this graph's nodes" in capsys.readouterr().err
        assert not (tmp_path / f"o_{command}.html").exists()
    # nor does one of which a few nodes share this graph's names (QA: resnet18's conv1 and fc coloured demo's nodes
    # with resnet18's times and total)
    mixed = json.loads((tmp_path / "p.json").read_text())
    mixed["nodes"] = mixed["nodes"][:2] + [{**row, "name": f"elsewhere_{i}"} for i, row in enumerate(mixed["nodes"])]
    (tmp_path / "mixed.json").write_text(json.dumps(mixed))
    assert main(["graph", "demo", "--profile", str(tmp_path / "mixed.json"), "-o", str(tmp_path / "m.html")]) == 2
    assert "another model or capture" in capsys.readouterr().err
    # the eager backend's profile names nested modules by path (body.0), the graph their nodes (body_0)
    nested = tmp_path / "nested.py"
    nested.write_text(
        "import torch\nfrom torch import nn\n"
        "def build():\n    return nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), nn.Linear(4, 2)).eval()\n"
        "example_inputs = ['2x4']\n"
    )
    assert main(["profile", f"{nested}:build", "--backend", "eager", "--json"]) == 0
    (tmp_path / "eager.json").write_text(capsys.readouterr().out)
    args = ["graph", f"{nested}:build", "--profile", str(tmp_path / "eager.json"), "-o", str(tmp_path / "e.html")]
    assert main(args) == 0
    assert page_model(tmp_path / "e.html")["profile"]["matched"] == 3  # 0.0, 0.1 and 1


def test_report_with_quantize_shows_the_random_calibration_warning_in_the_page_not_as_a_raw_warning(tmp_path, capsys):
    """report --quantize printed Python's own warning (file:line, then the source line) on stderr."""
    import warnings

    with warnings.catch_warnings(record=True) as raised:
        warnings.simplefilter("always")
        assert main(["report", "demo:mlp", "--quantize", "dynamic", "-o", str(tmp_path / "r.html")]) == 0
    assert not [w for w in raised if w.category.__name__ == "RandomCalibrationWarning"]
    assert "fxf-warn" in (tmp_path / "r.html").read_text()  # the quantize section says accuracy is unknown


def test_report_json_carries_the_verification_a_ci_job_reads(tmp_path, capsys):
    """report --json had the page's node counts only: not whether the passes were verified."""
    assert main(["report", "demo", "-p", "fold_bn", "-o", str(tmp_path / "r.html"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["optimize"]["verify"]["ok"] is True and out["optimize"]["verify"]["trials"] >= 3
    assert out["optimize"]["failed_pass"] is None and isinstance(out["lint"], list)
    assert [step["name"] for step in out["optimize"]["steps"]] == ["fold_bn"]  # the change log (it was null)


RANDOM_MODEL = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x) + torch.rand_like(x)  # random: nothing can be verified against it


example_inputs = ["2x8"]
"""


def test_report_exits_1_when_its_verification_fails_as_optimize_does(tmp_path, capsys):
    """QA: report -p on a model whose verification failed exited 0 and said nothing, while its page said
    "Verification FAILED" and optimize --verify exited 1 on the same model."""
    (tmp_path / "rnd.py").write_text(RANDOM_MODEL)
    spec = f"{tmp_path / 'rnd.py'}:Net"
    page = tmp_path / "r.html"
    assert main(["report", spec, "-p", "exact", "-o", str(page)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("wrote ") and page.exists() and "FAILED" in page.read_text()  # the page is written
    failed = [line for line in out.splitlines() if line.startswith("verification FAILED")]
    assert len(failed) == 1 and "not deterministic" in failed[0], out
    assert main(["report", spec, "-p", "exact", "-o", str(tmp_path / "j.html"), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["optimize"]["verify"]["ok"] is False
    assert main(["optimize", spec, "-p", "exact", "--verify"]) == 1  # the same verdict
    capsys.readouterr()


def test_report_bench_names_the_machine_and_the_environment_every_relevant_cpu_flag(tmp_path, capsys, monkeypatch):
    """QA: the report's bench section had no machine line (the CPU, its features and measured peaks, which bench
    prints under its table), and its Environment section's flags left out amx_bf16, amx_int8, avx512_fp16,
    avx512bw and avx_vnni: it read a shorter list of its own."""
    from fxforge import machine

    every_flag = machine.CpuInfo("Test CPU 9000", list(machine.RELEVANT_FLAGS), 2, "AVX512")
    monkeypatch.setattr(machine, "cpu_info", lambda: every_flag)
    page = tmp_path / "r.html"
    args = ["report", "demo", "--bench", "-b", "eager", "--repeats", "2", "-o", str(page), "--json"]
    assert main(args) == 0
    bench = json.loads(capsys.readouterr().out)["bench"]
    assert bench["machine"].startswith("Test CPU 9000") and "peak GFLOP/s" in bench["machine"]
    text = page.read_text()
    assert f"machine: {bench['machine']}" in text  # as bench prints it under its table
    for flag in ("amx_bf16", "amx_int8", "avx512_fp16", "avx512bw", "avx_vnni"):
        assert text.count(flag) == 2, flag  # in the machine line and in the Environment section


def test_the_page_writers_never_replace_a_users_file(tmp_path):
    """QA: graph_html, graph_svg, diff_html and report defaulted to force=True and took any name: a page replaced
    the user's model.py. Only .html/.htm/.svg names, and an existing file only with force=True, as on the CLI."""
    import fxforge
    from fxforge.errors import FxforgeError

    captured = fxforge.prepare("demo")
    source = tmp_path / "model.py"
    source.write_text("import torch\n")
    page = tmp_path / "g.html"
    page.write_text("mine")
    for write in (
        lambda path: fxforge.graph_html(captured, path),
        lambda path: fxforge.graph_svg(captured, path),
        lambda path: fxforge.diff_html(captured, captured.graph_module, path),
        lambda path: fxforge.report(captured, path),
    ):
        with pytest.raises(FxforgeError, match=r"cannot tell what to write|a report is an HTML page"):
            write(source)
        with pytest.raises(FxforgeError, match="exists"):
            write(page)
    assert source.read_text() == "import torch\n" and page.read_text() == "mine"
    # a report is HTML: report.svg would have held a web page under a picture's name (the CLI refused it already)
    with pytest.raises(FxforgeError, match="a report is an HTML page"):
        fxforge.report(captured, tmp_path / "report.svg")
    assert not (tmp_path / "report.svg").exists()
    assert fxforge.graph_html(captured, page, force=True).path == page and page.read_text() != "mine"


def test_diff_html_takes_trust_pickle_as_its_hint_says(tmp_path):
    import fxforge

    captured = fxforge.prepare("demo")
    fxforge.optimize(captured, ["fold_bn"], output_dir=tmp_path / "o")
    view = fxforge.diff_html(captured, tmp_path / "o", tmp_path / "d.html", trust_pickle=True)
    assert view.path == tmp_path / "d.html" and view.model["counts"]["removed"] > 0  # the folded batch norm


def test_a_damaged_profile_file_is_one_error_line_for_report_graph_and_split(tmp_path, capsys):
    """QA: a time that is not a number, "modules": null or a null node ended report and graph in an internal error
    (exit 4), and negative or NaN times drew a page; split refused them. One check serves all three now."""
    assert main(["profile", "demo", "--json", "--repeats", "2", "--warmup", "1"]) == 0
    good = json.loads(capsys.readouterr().out)
    damaged = {
        "text time": {**good, "nodes": [{**good["nodes"][0], "time_ms": "abc"}, *good["nodes"][1:]]},
        "negative time": {**good, "nodes": [{**good["nodes"][0], "time_ms": -1.0}, *good["nodes"][1:]]},
        "null modules": {**good, "modules": None},
        "null node": {**good, "nodes": [None]},
    }
    for label, data in damaged.items():
        path = tmp_path / "p.json"
        path.write_text(json.dumps(data))
        for args in (
            ["report", "demo", "--profile-file", str(path), "-o", str(tmp_path / "r.html")],
            ["graph", "demo", "--profile", str(path), "-o", str(tmp_path / "g.html")],
            ["split", "demo", "--stages", "2", "--balance", "time", "--profile", str(path), "-o", str(tmp_path / "s")],
        ):
            assert main(args) == 2, (label, args[0])
            err = capsys.readouterr().err
            assert err.startswith("error: profile") and "internal error" not in err, (label, err)
        assert not [p for p in tmp_path.iterdir() if p.name != "p.json"], label


def test_a_profile_of_another_model_is_refused_alike_by_split_graph_and_report(tmp_path, capsys):
    """QA: a profile of a smaller model whose node names demo shares (conv1, relu) timed 2 of demo's 11 nodes:
    split refused it, graph --profile and report --profile-file drew a page coloured by it. One check, one line."""
    tiny = tmp_path / "tiny.py"
    tiny.write_text(
        "import torch\nfrom torch import nn\n"
        "class Tiny(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)\n"
        "    def forward(self, x):\n        return torch.relu(self.conv1(x))\n"
        "def build():\n    return Tiny().eval()\n"
        "example_inputs = ['1x3x32x32']\n"
    )
    assert main(["profile", f"{tiny}:build", "--json", "--repeats", "2", "--warmup", "1"]) == 0
    profile = tmp_path / "tiny.json"
    profile.write_text(capsys.readouterr().out)
    assert {row["name"] for row in json.loads(profile.read_text())["nodes"]} == {"conv1", "relu"}
    errors = []
    for args in (
        ["split", "demo", "--stages", "2", "--balance", "time", "--profile", str(profile), "-o", str(tmp_path / "s")],
        ["graph", "demo", "--profile", str(profile), "-o", str(tmp_path / "g.html")],
        ["report", "demo", "--profile-file", str(profile), "-o", str(tmp_path / "r.html")],
    ):
        assert main(args) == 2, args[0]
        errors.append([line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")])
    expected = "error: the profile times only 2 of this graph's 11 nodes: it was taken of another model or capture"
    assert errors == [[expected]] * 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.json", "tiny.py"]


def test_a_profile_timing_no_node_is_refused_by_graph_and_report_as_by_split(tmp_path, capsys):
    """QA: {"nodes": []} drew graph's page uncoloured, exit 0, where split refused it."""
    profile = tmp_path / "empty.json"
    profile.write_text('{"nodes": []}')
    for args in (
        ["graph", "demo", "--profile", str(profile), "-o", str(tmp_path / "g.html")],
        ["report", "demo", "--profile-file", str(profile), "-o", str(tmp_path / "r.html")],
    ):
        assert main(args) == 2, args[0]
        assert "error: the profile times no node, and this graph has 11" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.json"]
