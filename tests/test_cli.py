"""The CLI: each command on real models, --json contracts, one-line errors and exit codes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fxforge.cli import main
from fxforge.errors import EXIT_CAPTURE, EXIT_FINDINGS, EXIT_OK, EXIT_USAGE

TRICKY = str(Path(__file__).parent / "cli_models.py")


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_resnet18_json_contract(capsys):
    code, out, _err = run(capsys, "inspect", "torchvision:resnet18", "--json")
    assert code == EXIT_OK
    data = json.loads(out)  # stdout holds JSON and nothing else
    assert data["totals"]["params"] == 11_689_512
    assert abs(data["totals"]["macs"] - 1.814e9) / 1.814e9 < 0.01
    assert data["totals"]["nodes"] == len(data["nodes"])
    assert data["capture"]["method"] == "symbolic_trace" and data["capture"]["leaves"] == []
    conv1 = next(n for n in data["nodes"] if n["name"] == "conv1")
    assert conv1["shape"] == [1, 3 * 0 + 64, 112, 112] and conv1["params"] == 9408 and conv1["flops"] > 0
    assert set(conv1) >= {"name", "op", "target", "shape", "flops", "params"}


def test_inspect_tables(capsys):
    code, out, _ = run(capsys, "inspect", "demo", "--nodes", "--code")
    assert code == EXIT_OK
    assert "Modules" in out and "Nodes" in out and "def forward" in out
    assert "5,498 parameters" in out


def test_inspect_meta_device(capsys):
    code, out, _ = run(capsys, "inspect", "torchvision:resnet18", "--device", "meta", "--json")
    data = json.loads(out)
    assert code == EXIT_OK and data["totals"]["params"] == 11_689_512
    assert any("meta" in note for note in data["capture"]["notes"])


def test_inspect_user_file_with_leaf(capsys):
    code, out, _ = run(capsys, "inspect", f"{TRICKY}:GatedNet", "--input", "2x8", "--json")
    data = json.loads(out)
    assert code == EXIT_OK and data["capture"]["leaves"] == ["gate"]


@pytest.mark.parametrize(
    "args,code,needle",
    [
        (["inspect", "torchvision:resnet1800"], EXIT_USAGE, "torchvision has no model named 'resnet1800'"),
        (["inspect", "torchvision:resnet18", "-i", "1x4x64x64"], EXIT_USAGE, "rejected the example inputs"),
        (["inspect", "demo", "-i", "1xx3"], EXIT_USAGE, "cannot parse input spec"),
        (["inspect", "demo", "-i", "1x4x32x32"], EXIT_USAGE, "demo takes --input 1x3x32x32 by default"),
        (["inspect", "missing_file.py:f"], EXIT_USAGE, "file not found"),
        (["inspect", "nonsense-spec"], EXIT_USAGE, "unknown model spec"),
        (["verify", "demo", "./out_missing/"], EXIT_USAGE, "no such file or directory: ./out_missing/"),
        (["optimize", "demo", "-p", "fold_bm", "-o", "unused"], EXIT_USAGE, "unknown pass 'fold_bm'"),
        (["optimize", "demo", "-p", "", "-o", "unused"], EXIT_USAGE, "--passes names no pass"),  # ran 'exact'
        (["lint", "demo", "--select", "FX999"], EXIT_USAGE, "unknown lint rule"),
        (["inspect", f"{TRICKY}:RootBranch", "-i", "2x8"], EXIT_CAPTURE, "cli_models.py:"),
        (["inspect", f"{TRICKY}:KeywordOnly", "-i", "2x8"], EXIT_USAGE, "forward takes x by keyword only"),
        (["inspect", f"{TRICKY}:RootNumpy", "-i", "2x8"], EXIT_CAPTURE, "RootNumpy.forward itself, which cannot"),
        # QA: the hints asked for a shape, and for max=999 with a vocabulary of 100
        (["inspect", f"{TRICKY}:TakesACount", "-i", "2x8"], EXIT_USAGE, "fix a constant with --concrete n=VALUE"),
        (["inspect", f"{TRICKY}:SmallVocabulary", "-i", "1x16:int64:max=500"], EXIT_USAGE, "1x16:int64:max=99\n"),
        (["inspect", f"{TRICKY}:SmallVocabulary", "-i", "4x32"], EXIT_USAGE, "dtype, e.g. --input 4x32:int64:max=99"),
        (["inspect", f"{TRICKY}:TakesACount", "-i", "2x8", "--concrete", "k=1"], EXIT_USAGE, "forward takes x, n\n"),
        (["inspect", f"{TRICKY}:TakesAMode", "-i", "2x8"], EXIT_USAGE, "fix a constant with --concrete mode=VALUE"),
    ],
)
def test_bad_input_gives_one_clear_line(capsys, args, code, needle):
    exit_code, out, err = run(capsys, *args)
    assert exit_code == code
    assert needle in err
    assert "Traceback" not in err and "Traceback" not in out
    assert err.count("\n") <= 4  # an error line and a hint, wrapped at most once each


def test_odd_files_are_one_line_each(capsys, tmp_path):
    """A FIFO hung forever; a bare pickle stream printed torch's two-line protocol warning before the refusal; an
    empty directory was said to lack model.pt alone; a damaged model.pt2 was named by its directory."""
    import os
    import pickle

    os.mkfifo(tmp_path / "pipe.pt2")
    code, _, err = run(capsys, "inspect", str(tmp_path / "pipe.pt2"))
    assert code == EXIT_USAGE and "is not a regular file" in err
    with (tmp_path / "raw.pt").open("wb") as file:
        pickle.dump({"weights": [1.0]}, file, protocol=4)
    code, _, err = run(capsys, "inspect", str(tmp_path / "raw.pt"))
    assert code == EXIT_USAGE and err.startswith("error:") and "holds a pickled module" in err and "Warning" not in err
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "inspect", str(tmp_path / "empty"))
    assert code == EXIT_USAGE and "holds no model (model.pt, model.pt2" in err
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.pt2").write_bytes(b"PK\x03\x04 damaged")
    code, _, err = run(capsys, "inspect", str(tmp_path / "out"))
    assert code == EXIT_USAGE and "out/model.pt2" in err


def test_corrupt_model_file(capsys, tmp_path):
    bad = tmp_path / "model.pt"
    bad.write_bytes(b"\x00\x01 definitely not a checkpoint" * 10)
    code, _, err = run(capsys, "inspect", str(bad))
    assert code == EXIT_USAGE and "cannot read" in err and "Traceback" not in err


def test_lint_exit_codes(capsys):
    code, out, _ = run(capsys, "lint", "torchvision:resnet18", "--json")
    data = json.loads(out)
    assert data["counts"]["warning"] == 0 and data["counts"]["error"] == 0
    assert code == EXIT_OK
    code_info, _, _ = run(capsys, "lint", "torchvision:resnet18", "--fail-on", "info")
    expected = EXIT_FINDINGS if data["counts"]["info"] else EXIT_OK
    assert code_info == expected


def test_lint_rules_listing(capsys):
    code, out, _ = run(capsys, "lint", "--rules", "--json")
    rules = json.loads(out)
    assert code == EXIT_OK and {"FX000", "FX001"} <= {r["code"] for r in rules}


def test_passes_listing(capsys):
    code, out, _ = run(capsys, "passes", "--json")
    names = {p["name"] for p in json.loads(out)}
    assert code == EXIT_OK and "fold_bn" in names


def test_optimize_then_verify(capsys, tmp_path):
    out_dir = tmp_path / "r18"
    code, out, err = run(
        capsys,
        "optimize",
        "torchvision:resnet18",
        "-i",
        "1x3x64x64",
        "-p",
        "fold_bn",
        "--verify",
        "-o",
        str(out_dir),
        "--json",
    )
    assert code == EXIT_OK, err
    data = json.loads(out)
    assert data["passes"][0]["name"] == "fold_bn" and data["passes"][0]["changed"]
    assert data["verify"]["ok"] and data["verify"]["max_abs_err"] < 1e-3
    assert (out_dir / "model.pt").exists()
    code, out, _ = run(capsys, "verify", "torchvision:resnet18", str(out_dir), "--json")
    assert code == EXIT_OK and json.loads(out)["ok"]


def test_verify_mismatch_exit_code(capsys):
    code, out, _ = run(capsys, "verify", "demo", "demo", "--seed", "0", "--json")
    assert code == EXIT_OK and json.loads(out)["ok"]
    code, out, _ = run(capsys, "verify", f"{TRICKY}:Relu", f"{TRICKY}:ReluClamped", "-i", "4x8", "--json")
    assert code == EXIT_FINDINGS and not json.loads(out)["ok"]


def test_optimize_refuses_to_overwrite(capsys, tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "keep").write_text("x")
    code, _, err = run(capsys, "optimize", "demo", "-p", "fold_bn", "-o", str(tmp_path / "o"))
    assert code == EXIT_USAGE and "not empty" in err
    assert (tmp_path / "o" / "keep").read_text() == "x"


def test_console_script_runs():
    exe = Path(sys.executable).parent / "fxforge"
    result = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True)
    assert "fxforge" in result.stdout
    result = subprocess.run([str(exe), "inspect", "torchvision:nope"], capture_output=True, text=True)
    assert result.returncode == EXIT_USAGE and result.stderr.startswith("error:")


NOISY_MODEL = """
import torch
from torch import nn
print("hello from import")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        print("forward called")
        return self.fc(x)


def build():
    print("building")
    return Net()
"""


@pytest.mark.parametrize("command", ["inspect", "lint", "verify", "export", "debug"])
def test_json_stdout_holds_only_json_when_the_users_code_prints(capsys, tmp_path, command):
    """--json promises one JSON document on stdout and nothing else; a print in the user's file (at import, in
    the factory, in forward) goes to stderr instead of breaking it."""
    path = tmp_path / f"noisy_{command}.py"  # one file per case: each imports it afresh and prints on import
    path.write_text(NOISY_MODEL)
    spec = f"{path}:build"
    extra = {
        "inspect": [],
        "lint": [],
        "verify": [spec],
        "export": ["--to", "onnx", "-o", str(tmp_path / "out.onnx")],
        "debug": ["--stats"],
    }[command]
    code, out, err = run(capsys, command, spec, *extra, "-i", "2x4", "--json")
    assert code in (EXIT_OK, EXIT_FINDINGS), err
    json.loads(out)
    assert "hello from import" in err and "forward called" in err


def test_rejected_inputs_are_echoed_as_given_dtype_included(capsys):
    code, _, err = run(capsys, "inspect", "demo", "-i", "1x3x8x8:int64")
    assert code == EXIT_USAGE and "the model rejected the example inputs (1x3x8x8:int64)" in err


def test_a_full_disk_is_one_error_line_and_exit_2_not_an_internal_error(capsys, tmp_path, monkeypatch):
    """optimize and quantize on a full disk printed "internal error: OSError: [Errno 28] ... please report it"."""
    import errno

    real_write_text = Path.write_text

    def full_disk(self, *args, **kwargs):
        if self.suffix == ".html":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    assert main(["optimize", "demo", "-p", "fold_bn", "-o", str(tmp_path / "out")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("error: the system refused: No space left on device") and "internal error" not in err
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_optimize_names_the_users_line_that_kept_model_pt2_from_being_written(capsys, tmp_path):
    output = str(tmp_path / "o")
    code, out, _ = run(capsys, "optimize", f"{TRICKY}:GatedNet", "-i", "2x8", "-p", "dead_code", "-o", output)
    assert code == EXIT_OK
    out = " ".join(out.split())  # rich wraps the line
    assert "not written: model.pt2: data-dependent control flow at " in out
    assert "cli_models.py:11 `if x.mean() > 0:" in out


def test_specs_are_printed_as_written_not_as_emoji_or_markup(capsys, tmp_path):
    """``rnd.py:zero`` printed as ``rnd.py0️⃣`` (rich's emoji codes), and ``[x]`` in a path would be markup."""
    model = tmp_path / "net[x].py"
    model.write_text("from torch import nn\n\ndef zero():\n    return nn.Linear(8, 8)\n")
    spec = f"{model}:zero"
    code, out, _ = run(capsys, "verify", spec, spec, "-i", "2x8")
    assert code == EXIT_OK and f"{spec} matches {spec}" in " ".join(out.split())


def test_a_batch_both_sides_reject_is_said_to_be_rejected_by_the_model(capsys, tmp_path):
    """verify said "not tried: batch 2: the candidate rejects it" when the model itself takes batch 1 only."""
    model = tmp_path / "b1.py"
    model.write_text(
        "from torch import nn\n\nclass B(nn.Linear):\n    def forward(self, x):\n"
        "        assert x.shape[0] == 1, 'batch 1 only'\n        return super().forward(x)\n\n"
        "def build():\n    return B(8, 8)\n"
    )
    code, out, _ = run(capsys, "verify", f"{model}:build", f"{model}:build", "-i", "1x8")
    assert code == EXIT_OK and "not tried: batch 2: the model rejects it" in out


def test_debug_may_follow_the_command_as_the_internal_error_hint_suggests(capsys):
    """'rerun with --debug' added at the end was "No such option '--debug'": it is a global option, moved."""
    assert main(["inspect", "demo", "--debug"]) == 0
    assert "captured by symbolic_trace" in capsys.readouterr().out


def test_piped_output_is_120_columns_unless_columns_says_otherwise(monkeypatch):
    """A wide table piped to a file was cut at 120 columns; ``COLUMNS`` keeps it whole (and a nonsense value is
    ignored, not an error)."""
    from fxforge.cli.options import PIPED_WIDTH, _piped_width

    for value, width in (("", PIPED_WIDTH), ("abc", PIPED_WIDTH), ("0", PIPED_WIDTH), ("220", 220)):
        monkeypatch.setenv("COLUMNS", value)
        assert _piped_width() == width
    # ATen targets and module paths: a table wider than 120 columns, whole in a new process
    command = ["inspect", "demo:convnet", "--nodes", "--method", "export"]
    env = {**os.environ, "COLUMNS": "220"}
    result = subprocess.run([sys.executable, "-m", "fxforge", *command], capture_output=True, text=True, env=env)
    assert result.returncode == EXIT_OK
    assert 120 < max(len(line) for line in result.stdout.splitlines()) <= 220


def test_a_piped_table_wider_than_120_columns_is_printed_whole():
    """QA: piped, a table wider than 120 columns lost its last column and border (rich crops what does not fit):
    without COLUMNS the console widens for the table; the text around it keeps 120 columns."""
    command = [sys.executable, "-m", "fxforge", "inspect", "demo:convnet", "--nodes", "--method", "export"]
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    assert result.returncode == EXIT_OK
    table = [line for line in result.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert table and max(len(line) for line in table) > 120
    assert all(line.rstrip()[-1] in "┓┃┩│┘" for line in table)


def test_a_piped_table_of_long_text_wraps_at_200_columns():
    """QA: ``fxforge passes | less`` printed lines of ~2,900 characters (every pass's guarantees on one line): a
    table widens whole only up to PIPED_MAX_WIDTH; past it, its text cells wrap and its borders stay closed."""
    from fxforge.cli.options import PIPED_MAX_WIDTH

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    result = subprocess.run([sys.executable, "-m", "fxforge", "passes"], capture_output=True, text=True, env=env)
    assert result.returncode == EXIT_OK
    table = [line for line in result.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert len(table) > 20 and 120 < max(len(line) for line in table) <= PIPED_MAX_WIDTH
    assert all(line.rstrip()[-1] in "┓┃┩│┘" for line in table)


def test_messages_name_the_options_the_user_typed(capsys):
    """One mistake, each user's own words: the command line's options there, the Python parameters in Python."""
    import fxforge
    from fxforge.errors import FxforgeError

    code, _, err = run(capsys, "inspect", f"{TRICKY}:Relu")
    assert code == EXIT_USAGE and "hint: pass --input, e.g. --input 1x3x224x224" in err
    with pytest.raises(FxforgeError) as raised:
        fxforge.prepare(f"{TRICKY}:Relu")
    assert "fxforge.prepare(model, '1x3x224x224')" in raised.value.hint and "--input" not in str(raised.value)

    code, _, err = run(capsys, "split", "demo", "-n", "2", "--balance", "time")
    assert code == EXIT_USAGE and "error: --balance time needs node times: pass --profile profile.json" in err
    captured = fxforge.prepare("demo")
    with pytest.raises(FxforgeError, match=r"^balance='time' needs node times: pass profile='profile.json'"):
        fxforge.split(captured, balance="time")
    with pytest.raises(FxforgeError, match=r"^stages must be at least 1, got 0"):
        fxforge.split(captured, stages=0)
    with pytest.raises(FxforgeError) as raised:
        fxforge.prepare("demo", check_batch=0)
    assert str(raised.value) == "check_batch must be at least 1, got 0 (hint: e.g. check_batch=2)"
    with pytest.raises(FxforgeError, match="constructor rejected model_kwargs"):
        fxforge.prepare("demo", model_kwargs={"nope": 1})
    with pytest.raises(FxforgeError, match=r"^concrete_args 'nope': demo's forward has no argument"):
        fxforge.prepare("demo", concrete_args={"nope": 1})


def test_a_flag_is_named_without_a_value_on_the_command_line(capsys, tmp_path):
    import fxforge
    from fxforge.errors import FxforgeError

    page = tmp_path / "r.html"
    page.write_text("mine")
    code, _, err = run(capsys, "graph", "demo", "-o", str(page))
    assert code == EXIT_USAGE and "hint: pass --force to replace it" in err
    with pytest.raises(FxforgeError, match=r"pass force=True to replace it"):
        fxforge.graph_html(fxforge.prepare("demo"), page, force=False)
    assert page.read_text() == "mine"


def test_optimize_says_when_the_capture_could_not_be_checked(capsys, tmp_path):
    """numpy's random numbers in forward: the graph holds the one drawn while tracing, so it was never compared
    with the model; optimize (without --verify) wrote it silently, and the note blamed training mode for a model in
    eval mode (QA finding)."""
    (tmp_path / "noisy.py").write_text(
        "import numpy as np\nimport torch\nfrom torch import nn\n"
        "class Noisy(nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x + float(np.random.rand())\n"
        "def build():\n    return Noisy().eval()\n"
    )
    code, out, _ = run(capsys, "optimize", f"{tmp_path / 'noisy.py'}:build", "-i", "2x3", "-o", str(tmp_path / "o"))
    assert code == EXIT_OK
    text = " ".join(out.split())
    assert "capture: output check skipped: the model is random" in text
    assert "draws random numbers outside torch" in text and "call model.eval()" not in text


def test_a_pickle_refusal_names_the_parameter_in_python(capsys, tmp_path):
    import torch

    import fxforge
    from fxforge.errors import ModelSpecError

    torch.save(torch.nn.Linear(2, 2), tmp_path / "m.pt")
    with pytest.raises(ModelSpecError) as raised:
        fxforge.load_model(str(tmp_path / "m.pt"), trust_pickle=False)
    assert "pass trust_pickle=True" in raised.value.hint
    code, _, err = run(capsys, "inspect", str(tmp_path / "m.pt"), "-i", "1x2")
    assert code == EXIT_USAGE and "pass --trust-pickle" in err


def test_report_and_graph_take_a_profile_as_the_cli_does(tmp_path):
    """report(profile=True) and a profile file's path raised a bare ValueError; only the CLI could (QA finding)."""
    import fxforge
    from fxforge.errors import FxforgeError

    captured = fxforge.prepare("demo")
    fxforge.report(captured, tmp_path / "r.html", profile=True)
    assert "coloured by time" in (tmp_path / "r.html").read_text()
    profile_file = tmp_path / "profile.json"
    profile_file.write_text(json.dumps(fxforge.profile_model(captured, repeats=1, warmup=0, peak=False).to_dict()))
    fxforge.graph_html(captured, tmp_path / "g.html", profile=str(profile_file))
    assert "coloured by time" in (tmp_path / "g.html").read_text()
    profile_file.write_text("{}")
    with pytest.raises(FxforgeError, match="has no 'nodes' list"):
        fxforge.graph_html(captured, tmp_path / "g.html", profile=profile_file)
    with pytest.raises(FxforgeError, match=r"a profile is fxforge\.profile_model's result"):
        fxforge.graph_html(captured, tmp_path / "g.html", profile=3)


def test_the_graph_page_says_what_bounds_each_profiled_node():
    """QA: graph --profile and report coloured nodes by time but showed no bound, which profile's table prints:
    each judged node carries the profile's verdict (``bd``), and a profile file without verdicts its bare bound."""
    import fxforge
    from fxforge.machine import Peak
    from fxforge.visual.graph import graph_model

    captured = fxforge.prepare("demo")
    peak = Peak(gflops={"fp32": 50.0}, bandwidth_gbs=10.0, threads=1)
    profile = fxforge.profile_model(captured, repeats=1, warmup=0, peak=peak)
    judged = {n.name: n.verdict for n in profile.nodes if n.bound}
    assert judged, "nothing judged: the test checks nothing"
    drawn = {n["n"]: n.get("bd") for n in graph_model(captured, profile=profile)["nodes"]}
    assert {name: drawn[name] for name in judged} == judged
    for verdict in ("missing", None):  # QA: a null verdict showed no bound at all
        older = profile.to_dict()
        for row in older["nodes"]:
            if verdict == "missing":
                del row["verdict"]
            else:
                row["verdict"] = verdict
        drawn = {n["n"]: n.get("bd") for n in graph_model(captured, profile=older)["nodes"]}
        assert {name: drawn[name] for name in judged} == {n.name: n.bound for n in profile.nodes if n.bound}


@pytest.mark.parametrize(
    ("args", "code"),
    [(["inspect", "nosuch:model"], 2), (["inspect", "demo", "--bogus"], 2), (["verify", "demo", "nosuch.pt"], 2)],
)
def test_a_failing_json_command_prints_its_error_as_the_document(capsys, args, code):
    """QA: stdout was empty, and a script parsing it got a JSONDecodeError instead of the reason."""
    assert main([*args, "--json"]) == code
    out, err = capsys.readouterr()
    document = json.loads(out)
    assert document["ok"] is False and document["exit_code"] == code and document["error"]
    assert document["error"] in " ".join(err.split()) or document["error"] in err


def test_a_reader_that_stops_reading_does_not_change_the_exit_code():
    """``fxforge verify A B | head -1`` exited 1 (rich's broken-pipe exit), which reads as a mismatch (QA)."""
    import subprocess
    import sys

    process = subprocess.Popen(
        [sys.executable, "-m", "fxforge", "inspect", "demo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    process.stdout.close()  # the reader is gone before the first line is written
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err.decode()[-500:]
    assert b"Traceback" not in err


def test_token_ids_past_the_embedding_get_a_hint_about_their_range(capsys, tmp_path):
    source = tmp_path / "tokens.py"
    source.write_text(
        "import torch\nfrom torch import nn\n\n"
        "def build():\n    return nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 2))\n"
    )
    code = main(["inspect", f"{source}:build", "-i", "1x12:int64:max=100"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and "index out of range" in err and "max=" in err and "1x3x224x224" not in err
    # the ids that were drawn, since max= is what the error is about (the spec's max= is not in the tensors)
    drawn = re.search(r"1x12:int64 with values (\d+)\.\.(\d+)", err)
    assert drawn and int(drawn.group(2)) >= 50, err


_EXITS = """
import sys
import torch
from torch import nn


class Exits(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        sys.exit(CODE)


def build():
    return Exits()


def exits_pass(gm, options):
    sys.exit(CODE)
"""


@pytest.mark.parametrize("code", ["None", "1", "3"])
def test_sys_exit_in_the_models_code_is_an_error_not_an_exit_code(capsys, tmp_path, code):
    """QA: sys.exit() in a forward made inspect exit 0 with no output (no JSON document either), sys.exit(1) read as
    verify's "mismatch", sys.exit(3) as a capture failure; a pass calling it ended optimize silently. Each is now
    one error line naming the line that called it, exit 2."""
    (tmp_path / "exits.py").write_text(_EXITS.replace("CODE", code))
    spec = str(tmp_path / "exits.py:build")
    status, out, err = run(capsys, "inspect", spec, "-i", "2x4")
    assert status == EXIT_USAGE and f"called sys.exit({code})" in err and "exits.py:13" in err and not out
    status, out, _ = run(capsys, "verify", spec, spec, "-i", "2x4", "--json")
    assert status == EXIT_USAGE and json.loads(out)["error"].startswith("the code fxforge ran called sys.exit")
    if code != "1":
        return  # a pass's name is registered once per process (from one file)
    passes = f"{tmp_path / 'exits.py'}:exits_pass"
    status, _, err = run(capsys, "optimize", "demo", "-p", passes, "-o", str(tmp_path / "out"))
    assert status == EXIT_USAGE and "called sys.exit" in err and not (tmp_path / "out").exists()


def test_a_closed_stdout_or_stderr_is_no_traceback():
    """QA: ``fxforge inspect demo >&-`` failed at import (sys.stdout is None) with a traceback and exit 1; with stderr
    closed it printed nothing and exited 1. What goes to a closed stream is discarded; the exit code is the
    command's."""
    command = f"{sys.executable} -m fxforge inspect demo"
    closed_out = subprocess.run(f"{command} >&-", shell=True, capture_output=False, stderr=subprocess.PIPE, text=True)
    assert closed_out.returncode == EXIT_OK and "Traceback" not in closed_out.stderr, closed_out.stderr[-800:]
    closed_err = subprocess.run(f"{command} 2>&-", shell=True, stdout=subprocess.PIPE, text=True)
    assert closed_err.returncode == EXIT_OK and "Total:" in closed_err.stdout


def test_a_pass_that_leaves_an_invalid_graph_is_one_error_line(capsys, tmp_path):
    """QA: torch.fx's lint appends the whole graph to its message, and optimize printed it: a 15-line error."""
    (tmp_path / "cycle.py").write_text(
        "def cycle(gm, options):\n"
        "    from fxforge.passes import PassResult\n"
        "    relu = next(n for n in gm.graph.nodes if n.op == 'call_module' and n.target == 'relu')\n"
        "    relu.args = (relu,)\n"
        "    return PassResult('cycle', gm)\n"
    )
    status, _, err = run(capsys, "optimize", "demo", "-p", f"{tmp_path / 'cycle.py'}:cycle", "-o", str(tmp_path / "o"))
    assert status == EXIT_USAGE and "left an invalid graph" in err and len(err.strip().splitlines()) <= 2, err


def test_lint_says_what_capture_kept_as_one_call(tmp_path, capsys):
    """QA: a submodule made a leaf (its code branches on values) hid a dropout, a foldable BatchNorm and a double
    relu from lint, which printed only "All checks passed!"."""
    path = tmp_path / "gated.py"
    path.write_text(
        "import torch\nfrom torch import nn\n"
        "class Gate(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.bn = nn.BatchNorm1d(4)\n"
        "    def forward(self, x):\n        y = self.bn(x)\n        return y.relu().relu() if y.mean() > 0 else y\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.lin, self.gate = nn.Linear(4, 4), Gate()\n"
        "    def forward(self, x):\n        return self.gate(self.lin(x))\n"
        "example_inputs = ['2x4']\n"
    )
    _, out, _ = run(capsys, "lint", f"{path}:Net")
    assert "not linted inside: submodule gate" in out
    _, out, _ = run(capsys, "lint", f"{path}:Net", "--json")
    assert json.loads(out)["capture"]["leaves"] == ["gate"]


def test_output_options_that_would_do_nothing_are_said(capsys):
    """QA: ``lint demo -o out`` without --fix exited 1 and wrote nothing, without a word; ``optimize`` without -o
    ran and wrote nothing, exit 0, without a word either."""
    code, _, err = run(capsys, "lint", "demo", "-o", "out/never")
    assert code == EXIT_USAGE and "-o applies to lint --fix" in err
    code, _, err = run(capsys, "optimize", "demo", "-p", "fold_bn")
    assert code == EXIT_OK and "nothing written: pass -o OUTDIR" in err


def test_debug_shows_the_traceback_and_keeps_the_exit_code_and_json(capsys, monkeypatch):
    """QA: --debug (or FXFORGE_DEBUG=1) re-raised: exit 1 (read as "findings") and no JSON document."""
    assert main(["--debug", "inspect", "nosuch:x", "--json"]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert json.loads(out)["exit_code"] == EXIT_USAGE and "Traceback" in err
    monkeypatch.setenv("FXFORGE_DEBUG", "1")
    assert main(["inspect", "nosuch:x"]) == EXIT_USAGE


def test_json_stdout_holds_only_the_document_when_the_model_writes_to_descriptor_1(tmp_path):
    """QA: Python's redirection alone let os.write(1, ...) and print(file=sys.__stdout__) into the document; a print
    of an atexit handler came after it."""
    source = tmp_path / "noisy.py"
    source.write_text(
        "import atexit, os, sys, torch\n"
        "atexit.register(lambda: print('AT EXIT'))\n"
        "def build():\n"
        "    os.write(1, b'RAW FD1 WRITE\\n')\n"
        "    print('dunder', file=sys.__stdout__)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(4, 4))\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "fxforge", "inspect", f"{source}:build", "-i", "2x4", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-500:]
    assert json.loads(done.stdout)["dialect"] == "torch"
    assert "RAW FD1 WRITE" in done.stderr and "dunder" in done.stderr and "AT EXIT" in done.stderr


def test_a_keyword_only_constant_is_pointed_at_concrete_and_keeps_the_positional_inputs(capsys, tmp_path):
    """QA: for forward(self, x, *, scale) the hint was fxforge.capture(model, (), example_kwargs=...), which drops
    x, and said nothing of --concrete scale=3, which works."""
    model_file = tmp_path / "kw.py"
    model_file.write_text(
        "import torch\nfrom torch import nn\n\n\nclass KwOnly(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.linear = nn.Linear(8, 4)\n\n    def forward(self, x, *, scale):\n"
        "        return self.linear(x) * scale\n"
    )
    code, _, err = run(capsys, "inspect", f"{model_file}:KwOnly", "-i", "2x8")
    said = " ".join(err.split())
    assert code == EXIT_USAGE and "--concrete scale=VALUE" in said and "fxforge.capture(model, (x, ...)," in said
    code, _, _ = run(capsys, "inspect", f"{model_file}:KwOnly", "-i", "2x8", "--concrete", "scale=3")
    assert code == 0


def test_verify_of_a_file_written_with_concrete_values_says_so_and_another_signature_is_rejected(capsys, tmp_path):
    """QA: a .pt2 exported with --concrete scale=true, verified against its model, was a bare MISMATCH (the model
    ran with scale=False); a candidate taking another number of inputs was a MISMATCH, not a refusal of the inputs."""
    model_file = tmp_path / "scaled.py"
    model_file.write_text(
        "import torch\nfrom torch import nn\n\n\nclass Scaled(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.linear = nn.Linear(4, 4)\n\n"
        "    def forward(self, x, scale: bool = False):\n        y = self.linear(x)\n"
        "        return y * 2 if scale else y\n\n\nclass Two(nn.Module):\n"
        "    def forward(self, x, y):\n        return x + y\n"
    )
    program = str(tmp_path / "scaled.pt2")
    code, _, _ = run(capsys, "export", f"{model_file}:Scaled", "-i", "2x4", "--concrete", "scale=true", "-o", program)
    assert code == 0
    code, out, _ = run(capsys, "verify", f"{model_file}:Scaled", program, "-i", "2x4")
    said = " ".join(out.split())
    assert code == 1 and "MISMATCH" in said and "forward's defaults (scale=False)" in said, said
    assert "--concrete scale=VALUE" in said
    code, out, _ = run(capsys, "verify", f"{model_file}:Scaled", program, "-i", "2x4", "--concrete", "scale=true")
    assert code == 0 and out.startswith("OK")
    code, out, _ = run(capsys, "verify", f"{model_file}:Two", program, "-i", "2x4", "-i", "2x4")
    said = " ".join(out.split())
    assert code == 1 and said.startswith("REJECTED") and "takes 1 input (x), got 2" in said, said
    assert "the two do not take the same inputs" in said and "hint:" not in said


def test_help_survives_python_OO():
    """Under ``python -OO`` (PYTHONOPTIMIZE=2) docstrings are dropped, and ``fxforge --help`` listed bare command
    names, ``fxforge inspect --help`` no description: the help is read from the source then."""
    expected = {
        "--help": ["Capture, inspect, lint", "inspect       Show a model's graph"],
        "inspect --help": ["Show a model's graph: shapes"],
    }
    for args, lines in expected.items():
        done = subprocess.run(
            [sys.executable, "-OO", "-m", "fxforge", *args.split()], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0 and all(line in done.stdout for line in lines), done.stdout + done.stderr


def test_python_warnings_are_one_line_each_once(capsys):
    """QA: torch's "All inputs of this cat operator must share the same quantization parameters" came three times
    during a ViT's quantize, each with a line of generated code; a warning is one ``warning:`` line, once."""
    import warnings

    from fxforge.cli.options import warnings_as_lines

    with warnings_as_lines():
        warnings.simplefilter("always")
        for _ in range(3):
            warnings.warn(
                "All inputs of this cat operator must share [the same]\nparameters. (Triggered internally at "
                "/__w/pytorch/pytorch/aten/src/ATen/native/quantized/cpu/TensorShape.cpp:167.)",
                stacklevel=1,
            )
        warnings.warn("old API", DeprecationWarning, stacklevel=1)
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "warning: All inputs of this cat operator must share [the same] parameters.",
        "warning: DeprecationWarning: old API",
    ]
    shown_by = warnings.showwarning
    with warnings_as_lines(enabled=False):  # --debug: Python's own form, with where it came from
        assert warnings.showwarning is shown_by


def test_a_crash_in_native_code_says_where(tmp_path):
    """QA: a model that crashes the process (a segfault in native code) left no word at all."""
    (tmp_path / "crashes.py").write_text(
        "import ctypes\n"
        "import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        ctypes.string_at(0)  # a crash in native code\n"
        "        return x\n"
        "def net():\n"
        "    return Net()\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "fxforge", "inspect", "crashes.py:net", "--input", "2x4"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == -11, done.stderr[-2000:]
    assert "Fatal Python error: Segmentation fault" in done.stderr
    assert 'crashes.py", line 5 in forward' in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "demo", "--batch", "99999999999"],
        ["profile", "demo", "--batch", "99999999999"],
        ["profile", "demo", "--batch", "99999999999", "--backend", "eager"],  # was an allocator error, exit 4
    ],
)
def test_a_batch_too_large_for_the_machine_names_batch(capsys, args):
    """QA: the hint said "use a smaller --input" for inputs the --batch made too large."""
    code, _, err = run(capsys, *args)
    assert code == EXIT_USAGE, err
    assert "more than this machine's" in err and "hint: use a smaller --batch than 99999999999" in err
    assert "--input" not in err


@pytest.mark.parametrize("names", ["", " , "])
def test_bench_backends_naming_none_is_refused_with_the_known_names(capsys, names):
    """QA: --backends "" (an unset shell variable) ran the default set, as if the option were left out."""
    code, out, err = run(capsys, "bench", "demo", "--backends", names)
    assert code == EXIT_USAGE and out == ""
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--backends names no backend" in errors[0] and "eager, fx" in errors[0]


@pytest.mark.parametrize("args", [["--rules", "demo"], ["demo", "--rules", "--select", "FX001"]])
def test_lint_rules_refuses_a_model_it_would_not_lint(capsys, args):
    """QA: ``lint --rules MODEL`` listed the rules and said nothing of the model, which it did not lint."""
    code, out, err = run(capsys, "lint", *args)
    assert code == EXIT_USAGE and out == ""
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--rules lists the rules and lints no model" in errors[0] and "MODEL" in errors[0]


@pytest.mark.parametrize(
    "output,flags",
    [("m.onnx", ["--no-freeze", "--no-optimize"]), ("m.pt2", ["--no-optimize"]), ("m.onnx", ["--no-optimize"])],
)
def test_export_refuses_torchscript_options_for_another_format(capsys, tmp_path, output, flags):
    """QA: --no-freeze and --no-optimize were ignored, silently, for onnx and pt2 (as --script is refused)."""
    code, out, err = run(capsys, "export", "demo", "-o", str(tmp_path / output), *flags)
    assert code == EXIT_USAGE and out == ""
    fmt = output.rsplit(".", 1)[1]
    assert err.splitlines()[0] == f"error: {flags[0]} applies to torchscript, not {fmt}"
    assert not (tmp_path / output).exists()


@pytest.mark.parametrize("command", [["graph", "demo"], ["export", "demo"]])
def test_a_file_output_spelt_as_a_directory_is_refused(capsys, tmp_path, command):
    """QA: ``graph MODEL -o name.html/`` dropped the slash and wrote the file name.html."""
    output = tmp_path / ("name.html" if command[0] == "graph" else "name.onnx")
    code, out, err = run(capsys, *command, "-o", f"{output}/")
    assert code == EXIT_USAGE and out == ""
    expected = f"error: {output}/ ends with a slash, which names a directory, but this output is a file"
    assert err.splitlines()[0] == expected
    assert list(tmp_path.iterdir()) == []


def test_optimize_of_a_random_model_prints_no_empty_pass_table(capsys, tmp_path):
    """A reference that cannot be verified stops optimize --verify before any pass runs: it printed the header of an
    empty "Passes on" table above the reason, as if the passes had been listed and none had run (doc audit)."""
    (tmp_path / "rnd.py").write_text(
        "import torch\n"
        "class Noisy(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x + torch.rand_like(x)\n"
    )
    code, out, _ = run(
        capsys, "optimize", f"{tmp_path / 'rnd.py'}:Noisy", "-i", "2x3", "--verify", "-o", str(tmp_path / "o")
    )
    assert code == EXIT_FINDINGS
    assert "Passes on" not in out
    assert "CANNOT VERIFY: the reference is not deterministic" in out and "nothing was written" in out
    assert not (tmp_path / "o").exists()


def test_verify_mismatch_names_the_batch_a_static_candidate_left_out(capsys, tmp_path):
    """A program exported at batch 1 is compared at batch 1 only: the OK line named batch 2 as not tried, a MISMATCH
    did not, as if every batch had been compared (doc audit: verify.md says the result names the batch left out)."""
    (tmp_path / "two.py").write_text(
        "import torch\n"
        "class Double(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x * 2\n"
        "class Triple(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x * 3\n"
        "example_inputs = ['1x4']\n"
    )
    program = str(tmp_path / "triple.pt2")
    code, _, _ = run(capsys, "export", f"{tmp_path / 'two.py'}:Triple", "--to", "pt2", "-o", program)
    assert code == EXIT_OK
    code, out, _ = run(capsys, "verify", f"{tmp_path / 'two.py'}:Double", program)
    assert code == EXIT_FINDINGS
    text = " ".join(out.split())
    assert "MISMATCH" in text and "not tried: batch 2: the candidate rejects it" in text


# Where a hint sends the user to another program or command (fxforge inspect --device meta, torchrun --nproc-per-node),
# its options are that one's, not the running command's.
_ELSEWHERE = re.compile(r"\b(?:fxforge|torchrun|pip)\b[^,;()]*")


def hint_options_the_command_lacks(command: str, err: str) -> list[str]:
    """The --options a hint in ``err`` offers that ``fxforge command`` does not take: a hint must offer only what
    the command running takes (QA: debug was offered --concrete, which it has not)."""
    return options_the_command_lacks(command, next((line for line in err.splitlines() if line.startswith("hint:")), ""))


def options_the_command_lacks(command: str, advice: str) -> list[str]:
    """The --options ``advice`` (a hint, a failed row's reason) offers that ``fxforge command`` does not take."""
    from fxforge.cli.app import cli

    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", _ELSEWHERE.sub("", advice)))
    taken = {flag for param in cli.commands[command].params for flag in (*param.opts, *param.secondary_opts)}
    return sorted(named - taken)


NON_TENSOR_EXAMPLE = """\
from torch import nn

class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, scale):
        return self.lin(x) * scale

example_inputs = ["2x8", 3.0]
"""


@pytest.mark.parametrize(
    "args,needle",
    [
        (["inspect", f"{TRICKY}:KeywordScale", "-i", "2x8"], "--concrete scale=VALUE"),
        (["profile", f"{TRICKY}:KeywordScale", "-i", "2x8"], "--concrete scale=VALUE"),
        # eager refuses --concrete: the hint offers it with the backend that takes it
        (["profile", f"{TRICKY}:KeywordScale", "-i", "2x8", "--backend", "eager"], "(with --backend fx)"),
        (["debug", f"{TRICKY}:KeywordScale", "-i", "2x8", "--nan"], "fxforge.debug_model(model, (x, ...)"),
        (["debug", "{tmp}/scaled.py:Scaled", "--nan"], "give a non-tensor argument a default"),
        (["inspect", "{tmp}/scaled.py:Scaled"], "--concrete NAME=VALUE"),
    ],
)
def test_a_hint_offers_only_options_the_command_takes(capsys, tmp_path, args, needle):
    (tmp_path / "scaled.py").write_text(NON_TENSOR_EXAMPLE)
    args = [arg.replace("{tmp}", str(tmp_path)) for arg in args]
    code, _, err = run(capsys, *args)
    assert code == EXIT_USAGE and needle in " ".join(err.split())
    assert hint_options_the_command_lacks(args[0], err) == []


def test_a_failed_export_reached_from_another_command_offers_export_options_as_fxforge_exports(capsys, tmp_path):
    """bench's torchscript row and optimize --auto's torchscript candidate export the model, and fail as export does:
    their reason offered export's --script and --allow-trace-warnings, and bench's --artifact, as the running
    command's own (optimize has none of them); said as fxforge export's and fxforge bench's."""
    model = [f"{TRICKY}:GatedNet", "-i", "2x8"]  # the gate is a leaf, whose branch the trace fixes
    code, out, _ = run(capsys, "bench", *model, "--backends", "torchscript", "--repeats", "1", "--json")
    assert code == EXIT_OK
    bench_reason = json.loads(out)["rows"][0]["error"]
    out_dir = str(tmp_path / "auto")
    code, out, _ = run(capsys, "optimize", *model, "--auto", "--backends", "torchscript,eager", "-o", out_dir, "--json")
    assert code == EXIT_OK
    auto_reason = next(c for c in json.loads(out)["candidates"] if c["name"] == "torchscript")["reason"]
    for command, reason in [("bench", bench_reason), ("optimize", auto_reason)]:
        assert "fxforge export --script" in reason and "fxforge export --allow-trace-warnings" in reason, reason
        assert options_the_command_lacks(command, reason) == [], reason
    assert "time the file with --artifact FILE" in bench_reason  # bench's own option
    assert "time the file with fxforge bench --artifact FILE" in auto_reason


def test_a_hint_reached_from_export_itself_offers_its_options_plainly(capsys, tmp_path):
    target = str(tmp_path / "g.pt")
    code, _, err = run(capsys, "export", f"{TRICKY}:GatedNet", "-i", "2x8", "--to", "torchscript", "-o", target)
    assert code == EXIT_CAPTURE
    hint = " ".join(err.split())
    assert "export with --script" in hint and "pass --allow-trace-warnings" in hint and "fxforge export" not in hint


def test_a_busy_machine_offers_fewer_threads_only_where_the_command_takes_them(capsys, tmp_path, monkeypatch):
    """report --bench has no --threads; its page told the user to rerun with --threads 1."""
    import torch

    from fxforge.machine import Load

    monkeypatch.setattr(Load, "busy", lambda self, own_threads: True)
    model = [f"{TRICKY}:GatedNet", "-i", "2x8"]
    # fewer threads are offered from two up
    code, out, _ = run(capsys, "bench", *model, "--backends", "eager", "--repeats", "5", "--threads", "2", "--json")
    assert code == EXIT_OK
    warning = json.loads(out)["noise_warning"]
    assert "--threads 1" in warning, warning
    page = tmp_path / "r.html"
    torch.set_num_threads(2)  # report times with torch's threads (the tests' one: nothing fewer to offer)
    try:
        code, _, _ = run(capsys, "report", *model, "--bench", "--backends", "eager", "--repeats", "5", "-o", str(page))
    finally:
        torch.set_num_threads(1)  # as conftest sets it
    assert code == EXIT_OK
    text = page.read_text().replace("&#x27;", "'")
    assert "2 of it this run's at most" in text  # the warning that offered --threads 1
    assert "rerun with nothing else running" in text and "--threads" not in text


def test_a_fixed_batch_hint_offers_the_batch_as_each_command_takes_it(capsys, tmp_path):
    program = str(tmp_path / "d2.pt2")
    assert run(capsys, "export", "demo", "-i", "2x3x32x32", "--to", "pt2", "-o", program, "--no-verify")[0] == EXIT_OK
    for args, way in [
        (["debug", program, "-i", "3x3x32x32", "--nan"], "(an --input of batch 2)"),  # debug has no --batch
        (["profile", program, "-i", "3x3x32x32", "--backend", "eager"], "(--batch 2)"),
    ]:
        code, _, err = run(capsys, *args)
        assert code == EXIT_USAGE and way in " ".join(err.split()), err
        assert hint_options_the_command_lacks(args[0], err) == []


def test_a_pass_checked_on_huge_outputs_shows_its_relative_error_beside_the_absolute(capsys, tmp_path):
    """QA (timm mobileone_s0, random weights): fold_bn's column read "ok 9.7e+09", alarming, where the outputs were
    1e17 and the relative error 8e-7: an absolute error of 1 or more comes with the relative one."""
    (tmp_path / "big.py").write_text(
        "import torch\nfrom torch import nn\n"
        "class Big(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.l, self.bn = nn.Linear(16, 16), nn.BatchNorm1d(16)\n"
        "        with torch.no_grad():\n"
        "            self.l.weight.mul_(1e10)\n"
        "            self.bn.running_var.fill_(1e-6)\n"
        "        self.eval()\n"
        "    def forward(self, x):\n"
        "        return self.bn(self.l(x))\n"
    )
    code, out, _ = run(capsys, "optimize", f"{tmp_path / 'big.py'}:Big", "-i", "4x16", "-p", "fold_bn", "--verify")
    assert code == 0
    assert re.search(r"ok \d\.\de\+\d\d, rel \de-\d\d \(1 case\)", out), out
