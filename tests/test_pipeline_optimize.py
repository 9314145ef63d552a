"""Pipeline and optimize: copies not mutations, change log, pipeline files, atomic output, reload with torch alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import fxforge
from fxforge.errors import FxforgeError
from fxforge.graphs import node_kind
from fxforge.optimize import atomic_directory, optimize
from fxforge.passes import PassError, apply_pass, get_pass
from fxforge.pipeline import Pipeline

X = (torch.randn(1, 3, 64, 64),)


def _bn_count(gm) -> int:
    return sum(1 for n in gm.graph.nodes if node_kind(gm, n) == "batch_norm")


def test_apply_pass_never_mutates_the_input(resnet18):
    captured = fxforge.capture(resnet18, X)
    before_weight = resnet18.conv1.weight.detach().clone()
    result = apply_pass(captured.graph_module, "fold_bn")
    assert result.changed and _bn_count(result.graph_module) == 0
    assert _bn_count(captured.graph_module) == 20
    assert torch.equal(resnet18.conv1.weight, before_weight)


def test_inplace_pass_changes_graph_but_not_user_parameters(resnet18):
    captured = fxforge.capture(resnet18, X)
    before_weight = resnet18.conv1.weight.detach().clone()
    apply_pass(captured.graph_module, "fold_bn", inplace=True)
    assert _bn_count(captured.graph_module) == 0
    # the folded conv got new Parameters: the user's model still has its own weights
    assert torch.equal(resnet18.conv1.weight, before_weight)


def test_unknown_pass_suggests_a_close_name():
    with pytest.raises(PassError, match="unknown pass 'fold_b'") as info:
        get_pass("fold_b")
    assert "fold_bn" in info.value.hint


def test_pass_without_options_rejects_options(resnet18):
    captured = fxforge.capture(resnet18, X)
    with pytest.raises(PassError, match="takes no options"):
        apply_pass(captured.graph_module, "fold_bn", {"x": 1})


def test_pipeline_verifies_each_pass_and_logs(resnet18):
    captured = fxforge.capture(resnet18, X)
    result = Pipeline(["fold_bn"], verify_each=True).run(captured)
    assert result.ok
    step = result.steps[0]
    assert step.result.removed == 20 and step.verification.ok
    assert len(step.result.log) == 20 and step.result.log[0].startswith("folded bn1 into conv1")
    data = result.to_dict()
    assert data["passes"][0]["name"] == "fold_bn" and data["passes"][0]["changed"] is True


def test_pipeline_rejects_unknown_pass_before_doing_work():
    with pytest.raises(PassError):
        Pipeline(["fold_bn", "no_such_pass"])


@pytest.mark.parametrize(
    "suffix,text",
    [
        (".yaml", "passes:\n  - fold_bn\nverify: true\n"),
        (".toml", 'verify = true\npasses = ["fold_bn"]\n'),
    ],
)
def test_pipeline_files(tmp_path, suffix, text, resnet18):
    path = tmp_path / f"pipe{suffix}"
    path.write_text(text)
    pipeline = Pipeline.from_file(path)
    assert [s.name for s in pipeline.steps] == ["fold_bn"] and pipeline.verify_each
    result = pipeline.run(fxforge.capture(resnet18, X))
    assert result.ok and result.verification is not None


def test_exact_names_the_exact_passes_and_is_optimizes_default(tmp_path, resnet18, capsys):
    """``-p exact`` (or no -p at all) runs FIX_ORDER, also inside a longer list or a pipeline file; on resnet18 it
    folds every BatchNorm, verified; the table shows three skipped candidates per pass, --json all of them."""
    from fxforge.cli import main
    from fxforge.passes import FIX_ORDER
    from fxforge.pipeline import build_pipeline

    assert [s.name for s in build_pipeline().steps] == list(FIX_ORDER)
    assert [s.name for s in build_pipeline(["exact,insert_after"]).steps] == [*FIX_ORDER, "insert_after"]
    path = tmp_path / "pipe.yaml"
    path.write_text("passes: [fold_bn, exact]\n")
    assert [s.name for s in Pipeline.from_file(path).steps] == ["fold_bn", *FIX_ORDER]
    result = Pipeline(["exact"], verify_each=True).run(fxforge.capture(resnet18, X))
    assert result.ok and _bn_count(result.graph_module) == 0 and result.verification.ok
    assert main(["report", "demo", "-p", "exact", "-o", str(tmp_path / "report.html")]) == 0  # report takes it too
    assert "merge_convs" in (tmp_path / "report.html").read_text()  # only as a pass that ran
    capsys.readouterr()
    pytest.importorskip("timm")
    assert main(["optimize", "timm:efficientnet_b0", "--input", "1x3x64x64"]) == 0
    out = capsys.readouterr().out
    # cse's many skips here were traced reads of x.ndim, which capture drops now; merge_convs still skips several
    assert "fold_bn" in out and "dead_code" in out and "merge_convs skipped" in out
    shown = [line for line in out.splitlines() if line.strip().startswith("merge_convs skipped:")]
    assert len(shown) == 3 and "more (--json lists all)" in out


def test_bad_pipeline_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("passes: [fold_bn\n")
    with pytest.raises(FxforgeError, match="not valid"):
        Pipeline.from_file(path)
    path.write_text("steps: []\n")
    with pytest.raises(FxforgeError, match="'passes' list"):
        Pipeline.from_file(path)
    toml = tmp_path / "quoted.toml"
    toml.write_text('verify = "no"\npasses = ["fold_bn"]\n')  # bool("no") is True: refused, not switched on
    with pytest.raises(FxforgeError, match="verify must be true or false, not 'no'"):
        Pipeline.from_file(toml)
    toml.write_text('verify = true\npasses = ["fold_bn"]\n')
    assert Pipeline.from_file(toml).verify_each is True


def test_optimize_writes_reloadable_output_with_torch_alone(resnet18, tmp_path):
    captured = fxforge.capture(resnet18, X)
    out = tmp_path / "out"
    result = optimize(captured, ["fold_bn"], output_dir=out, verify=True)
    assert result.pipeline.ok
    assert {"model.pt", "report.json", "inputs.txt", "provenance.json"} <= {p.name for p in out.iterdir()}
    report = json.loads((out / "report.json").read_text())
    assert report["passes"][0]["name"] == "fold_bn" and report["passes"][0]["verify"]["ok"]
    # A fresh interpreter with torch only: no fxforge import needed to load and run the model.
    torch.save(X[0], tmp_path / "x.pt")
    script = (
        "import sys, torch\n"
        f"m = torch.load({str(out / 'model.pt')!r}, weights_only=False)\n"
        f"x = torch.load({str(tmp_path / 'x.pt')!r})\n"
        f"torch.save(m(x), {str(tmp_path / 'y.pt')!r})\n"
        "assert not [k for k in sys.modules if k.startswith('fxforge')], 'fxforge was imported'\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)
    with torch.no_grad():
        expected = resnet18(X[0])
    assert fxforge.compare_outputs(expected, torch.load(tmp_path / "y.pt")).ok
    # The optimized_model/ package imports as plain Python from wherever the directory ends up.
    moved = tmp_path / "elsewhere"
    out.rename(moved)
    script = (
        "import sys, torch\n"
        f"sys.path.insert(0, {str(moved)!r})\n"
        "from optimized_model import OptimizedModel\n"
        f"x = torch.load({str(tmp_path / 'x.pt')!r})\n"
        f"torch.save(OptimizedModel().eval()(x), {str(tmp_path / 'z.pt')!r})\n"
        "assert not [k for k in sys.modules if k.startswith('fxforge')], 'fxforge was imported'\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)
    assert fxforge.compare_outputs(expected, torch.load(tmp_path / "z.pt")).ok


USER_MODEL = """
import collections
import torch
from torch import nn

Out = collections.namedtuple("Out", "logits features")


class Gate(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent: kept as a leaf, so the graph does not export and model.pt is the model
            return x * 2
        return x - 1


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.gate = Gate()

    def forward(self, x):
        y = self.gate(self.bn(self.conv(x)))
        return Out(y.mean((2, 3)), y)
"""


def test_an_output_holding_the_users_classes_loads_in_a_new_process(tmp_path):
    """A model from file.py with a leaf module and a namedtuple output: model.pt names fxforge_user_net.Gate, a
    module only the writing process had. It loaded nowhere else -- neither with plain torch, nor the package,
    nor fxforge.load_model (QA finding). The file is copied into source/ and each loader finds it there."""
    from fxforge.cli import main

    (tmp_path / "net.py").write_text(USER_MODEL)
    out = tmp_path / "out"
    assert main(["optimize", f"{tmp_path / 'net.py'}:Net", "-i", "1x3x8x8", "-p", "fold_bn", "-o", str(out)]) == 0
    assert not (out / "model.pt2").exists() and (out / "source" / "fxforge_user_net.py").is_file()
    moved = tmp_path / "elsewhere"
    out.rename(moved)
    (tmp_path / "net.py").unlink()  # the original file is gone too: the copy is all there is
    script = (
        "import sys, torch\n"
        "x = torch.randn(1, 3, 8, 8)\n"
        f"sys.path.insert(0, {str(moved / 'source')!r})\n"
        f"plain = torch.load({str(moved / 'model.pt')!r}, weights_only=False)(x)\n"
        f"sys.path.insert(0, {str(moved)!r})\n"
        "from optimized_model import OptimizedModel\n"
        "package = OptimizedModel()(x)\n"
        "assert type(plain).__name__ == type(package).__name__ == 'Out'\n"
        "assert torch.equal(plain.features, package.features)\n"
        "assert not [k for k in sys.modules if k.startswith('fxforge.')], 'fxforge was imported'\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)
    script = (
        "import fxforge, torch\n"
        f"loaded = fxforge.load_model({str(moved)!r}, trust_pickle=True).module\n"
        "assert type(loaded(torch.randn(1, 3, 8, 8))).__name__ == 'Out'\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)


NO_LEAF_MODEL = """
import collections
import torch
from torch import nn

Out = collections.namedtuple("Out", "logits features")


def gate(x):
    if x.sum() > 0:  # data-dependent: wrapped as one call, named only in the graph's code
        return x * 2
    return x - 1


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        y = gate(self.bn(self.conv(x)))
        return Out(y.mean((2, 3)), y)
"""


def test_a_namedtuple_output_and_a_wrapped_function_alone_load_in_a_new_process(tmp_path):
    """QA: with no leaf module of the user's file, the pickle named fxforge_user_net only inside the GraphModule's
    code, so no source/ was written and the directory loaded nowhere else. And the package built its batch norm (not
    folded by -p cse) in training mode: it normalised by the batch and was 0.14 off model.pt."""
    from fxforge.cli import main

    (tmp_path / "net.py").write_text(NO_LEAF_MODEL)
    out = tmp_path / "out"
    assert main(["optimize", f"{tmp_path / 'net.py'}:Net", "-i", "1x3x8x8", "-p", "cse", "-o", str(out)]) == 0
    assert (out / "source" / "fxforge_user_net.py").is_file()
    (tmp_path / "net.py").unlink()
    script = (
        "import sys, torch\n"
        "x = torch.randn(2, 3, 8, 8)\n"
        f"sys.path.insert(0, {str(out / 'source')!r})\n"
        f"plain = torch.load({str(out / 'model.pt')!r}, weights_only=False)\n"
        f"sys.path.insert(0, {str(out)!r})\n"
        "from optimized_model import OptimizedModel\n"
        "package = OptimizedModel()\n"
        "assert not package.training and not package.bn.training\n"
        "expected = plain(x)\n"
        "for _ in range(2):  # a second call: nothing was updated by the first\n"
        "    got = package(x)\n"
        "    assert type(got).__name__ == 'Out' and torch.equal(got.features, expected.features)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)


def test_optimize_aten_dialect_writes_pt2(resnet18, tmp_path):
    captured = fxforge.capture(resnet18, X, method="export")
    result = optimize(captured, ["fold_bn"], output_dir=tmp_path / "o", verify=True)
    assert result.pipeline.ok and (tmp_path / "o" / "model.pt2").exists()
    loaded = fxforge.load_model(str(tmp_path / "o"))
    with torch.no_grad():
        assert fxforge.compare_outputs(resnet18(X[0]), loaded.module(X[0])).ok


def test_atomic_directory_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(RuntimeError), atomic_directory(target) as staging:
        (staging / "half.txt").write_text("partial")
        raise RuntimeError("boom")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_atomic_directory_refuses_non_empty_without_force(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("user data")
    named = r"not empty: it holds files \(keep.txt\) but no"  # named: a hidden .DS_Store alone was not (QA)
    with pytest.raises(FxforgeError, match=named) as refused, atomic_directory(target):
        pass
    assert "--force" not in str(refused.value.hint)  # it would be refused as well (QA: a hint that cannot work)
    assert (target / "keep.txt").read_text() == "user data"
    # --force replaces an earlier fxforge output, never a folder of the user's (optimize -o myproject --force)
    with pytest.raises(FxforgeError, match="not an fxforge output"), atomic_directory(target, force=True):
        pass
    assert (target / "keep.txt").read_text() == "user data"
    # a report.json of someone else's is no proof (split -o project --force deleted a project that had one)
    for foreign in ("{}", '{"written_by": "some tool"}', "not json", '["fxforge"]'):
        (target / "report.json").write_text(foreign)
        with pytest.raises(FxforgeError, match="not an fxforge output"), atomic_directory(target, force=True):
            pass
        assert (target / "keep.txt").read_text() == "user data"
    (target / "report.json").write_text('{"written_by": "fxforge 0.1.0"}')
    with pytest.raises(FxforgeError, match=r"out is not empty \(hint") as refused, atomic_directory(target):
        pass
    assert refused.value.hint == "pass force=True to replace it"  # an earlier output: --force would replace it
    with atomic_directory(target, force=True) as staging:
        (staging / "new.txt").write_text("new")
    assert [p.name for p in target.iterdir()] == ["new.txt"]


def test_optimize_with_failing_verification_writes_nothing(resnet18, tmp_path):
    from fxforge.passes import PASSES, PassResult, mark, register_pass

    @register_pass("test_bias_shift", summary="test only", guarantees="none")
    def shift(gm, options):
        result = PassResult("test_bias_shift", gm)
        out = next(n for n in gm.graph.nodes if n.op == "output")
        value = out.args[0]
        with gm.graph.inserting_before(out):
            shifted = gm.graph.call_function(torch.add, (value, 1.0))
        out.args = (shifted,)
        mark(shifted, "test_bias_shift", origin_of=value)
        result.note("shifted output", inserted=1)
        return result

    try:
        captured = fxforge.capture(resnet18, X)
        result = optimize(captured, ["fold_bn", "test_bias_shift"], output_dir=tmp_path / "o", verify=True)
    finally:
        PASSES.pop("test_bias_shift")
    assert not result.pipeline.ok and result.pipeline.failed_pass == "test_bias_shift"
    assert result.pipeline.verification.divergence.pass_name == "test_bias_shift"
    assert not (tmp_path / "o").exists()


def test_atomic_directory_gets_ordinary_permissions(tmp_path):
    import os
    import stat

    umask = os.umask(0o022)
    try:
        with atomic_directory(tmp_path / "out") as staging:
            (staging / "f").write_text("x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o755


def test_the_api_takes_one_name_or_a_comma_list_where_it_takes_several():
    """Iterating a string made each character a name: optimize(c, "fold_bn") said "unknown pass 'f'", and the same
    for bench's backends, lint's select, quantize's float_layers and capture's leaf_modules."""
    captured = fxforge.prepare("demo")
    steps = fxforge.optimize(captured, "fold_bn,dead_code").pipeline.steps
    assert [step.result.name for step in steps] == ["fold_bn", "dead_code"]
    assert {f.code for f in fxforge.lint(captured, select="FX008", ignore="FX004").findings} == {"FX008"}
    report = fxforge.bench(captured, "eager,fx", passes="fold_bn", repeats=1, warmup=1, peak=False)
    assert [row.backend for row in report.rows] == ["eager", "fx"]
    leafed = fxforge.prepare("demo", leaf_modules="bn1")
    assert any(n.op == "call_module" and n.target == "bn1" for n in leafed.graph_module.graph.nodes)


def test_a_staging_directory_abandoned_by_a_killed_process_is_removed_by_the_next_write(tmp_path):
    """split on a full disk died in a C++ abort inside torch's zip writer, leaving .s.partial-XXXX/ with stage files."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    abandoned = tmp_path / f".out.partial-{int(dead.stdout)}-x1"
    abandoned.mkdir()
    (abandoned / "stage_0.pt2").write_bytes(b"half")
    running = tmp_path / f".out.partial-{os.getppid()}-x2"  # another process still writing: left alone
    running.mkdir()
    with atomic_directory(tmp_path / "out") as staging:
        (staging / "report.json").write_text("{}")
    assert not abandoned.exists() and running.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [running.name, "out"]


def test_an_aten_result_that_cannot_be_saved_gets_a_hint_about_its_own_failure(tmp_path, monkeypatch):
    """An ATen graph is saved as model.pt2 only; when that failed (torch 2.11's torch.export refusing a
    torch.Generator), the hint blamed a TorchScript submodule, which an ATen graph cannot hold."""
    import fxforge.artifacts

    def refuses(*args, **kwargs):
        raise RuntimeError("argument of type: <class 'torch._C.Generator'>")

    captured = fxforge.capture(torch.nn.Sequential(torch.nn.Linear(4, 4)).eval(), (torch.randn(2, 4),), method="export")
    monkeypatch.setattr(fxforge.artifacts, "export_program_any_batch", refuses)
    with pytest.raises(FxforgeError) as info:
        fxforge.optimize(captured, ["dead_code"], output_dir=tmp_path / "out")
    assert "model.pt2: argument of type" in info.value.message
    assert "TorchScript" not in info.value.hint and "in memory" in info.value.hint


def test_force_replaces_what_fxforge_wrote_there_before(tmp_path):
    """Every output directory's report.json (optimize, quantize, --auto) or plan.json (split) says it is fxforge's."""
    out = tmp_path / "out"
    fxforge.optimize(fxforge.prepare("demo"), ["fold_bn"], output_dir=out)
    assert json.loads((out / "report.json").read_text())["written_by"].startswith("fxforge")
    fxforge.optimize(fxforge.prepare("demo"), ["fold_bn"], output_dir=out, force=True)
    split_dir = tmp_path / "split"
    fxforge.split(fxforge.prepare("demo"), stages=2, output_dir=split_dir)
    fxforge.split(fxforge.prepare("demo"), stages=2, output_dir=split_dir, force=True)


class _Transposed(torch.nn.Module):
    def forward(self, x):
        return x.transpose(1, 2).contiguous() * 2


def test_a_pass_run_twice_reports_its_skips_once_and_the_result_says_ok():
    """QA (BERT, -p exact): remove_identity's skip lines were printed twice, once per run of the pass; and the API's
    result had no ``ok`` where --json has one."""
    from rich.console import Console

    from fxforge.cli.render import render_optimize

    captured = fxforge.capture(_Transposed(), (torch.randn(2, 3, 4),), method="export")
    result = fxforge.optimize(captured, ["remove_identity", "remove_identity"])
    assert [len(step.result.skipped) for step in result.pipeline.steps] == [1, 1]  # the same node, both times
    console = Console(record=True, width=200)
    render_optimize(console, "model", result)
    assert console.export_text().count("remove_identity skipped:") == 1
    assert result.ok is result.pipeline.ok is True and result.to_dict()["ok"] is True


def test_the_model_pt2_of_a_batch_1_vit_runs_other_batches(tmp_path):
    """model.pt2 is exported with a dynamic batch; from a batch-1 example torch.export fixed ViT's batch at 1 (the
    class token is expanded to the batch), and the file refused batch 2. (An ATen-dialect capture holds the
    example's batch in its ops already: its model.pt2 checks for that batch.)"""
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(image_size=32, patch_size=16, num_layers=1, num_heads=2, hidden_dim=32, mlp_dim=32).eval()
    torch.nn.init.normal_(vit.heads.head.weight)  # zeros in torchvision: outputs would not vary
    captured = fxforge.capture(vit, (torch.randn(1, 3, 32, 32),), method="symbolic_trace")
    optimize(captured, ["remove_dropout"], output_dir=tmp_path / "o", verify=True)
    program = torch.export.load(str(tmp_path / "o" / "model.pt2")).module()
    for batch in (1, 3):
        x = torch.randn(batch, 3, 32, 32)
        with torch.no_grad():
            assert fxforge.compare_outputs(vit(x), program(x)).ok


class _Tokens(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)

    def forward(self, input_ids, attention_mask):
        hidden = self.embed(input_ids) * attention_mask.unsqueeze(-1)
        return {"hidden": hidden, "pooled": hidden.mean(1)}


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_a_loaded_model_pt2_takes_inputs_by_name_and_returns_a_plain_dict(tmp_path, method):
    """model.pt2 loads took the exported positional inputs only (model(**tokenizer(text)) raised "kwarg keyword
    mismatch") and returned fx's immutable_dict, whose pop raised."""
    torch.manual_seed(0)
    model = _Tokens().eval()
    ids, mask = torch.randint(0, 50, (2, 6)), torch.ones(2, 6, dtype=torch.int64)
    captured = fxforge.capture(model, (ids, mask), method=method)
    optimize(captured, ["dead_code"], output_dir=tmp_path / "o")
    for spec in (tmp_path / "o", tmp_path / "o" / "model.pt2"):
        loaded = fxforge.load_model(str(spec)).module
        with torch.no_grad():
            out = loaded(input_ids=ids, attention_mask=mask)
            assert type(out) is dict and fxforge.compare_outputs(model(ids, mask), out).ok
            assert torch.equal(out.pop("pooled"), loaded(ids, attention_mask=mask)["pooled"])
        with pytest.raises(TypeError, match="no input named 'token_type_ids'"):
            loaded(ids, mask, token_type_ids=mask)
        with pytest.raises(TypeError, match=r"takes 2 inputs \(input_ids, attention_mask\), got 1"):
            loaded(ids)  # torch's own message spanned ten lines


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_a_model_pt2_fixed_to_the_examples_batch_says_so(tmp_path, method):
    """QA: a transformers model's model.pt2 ran its example's batch only (its ATen graph holds it), and nothing said
    so; optimize.md promised a dynamic batch where the graph allows one."""
    model = _Tokens().eval()
    ids, mask = torch.randint(0, 50, (2, 6)), torch.ones(2, 6, dtype=torch.int64)
    result = optimize(fxforge.capture(model, (ids, mask), method=method), ["dead_code"], output_dir=tmp_path / "o")
    fixed = [note for note in result.notes if "runs batch 2 only" in note]
    program = torch.export.load(str(tmp_path / "o" / "model.pt2")).module()
    try:
        runs_other_batches = program(ids[:1], mask[:1]) is not None
    except Exception:
        runs_other_batches = False
    assert bool(fixed) == (not runs_other_batches)


def test_verify_of_an_edited_file_against_its_old_output_compares_the_old_code(tmp_path):
    """QA: after the user edited the file, ``verify file.py:Net out`` said OK: the pickle in model.pt names the file's
    module (fxforge_user_net), which verify had just imported from the edited file, so the directory ran the new
    code too. Loading the directory now uses its own copy (source/) while it unpickles."""
    from fxforge.api import verify_specs
    from fxforge.cli import main

    (tmp_path / "net.py").write_text(USER_MODEL)
    out = tmp_path / "out"
    assert main(["optimize", f"{tmp_path / 'net.py'}:Net", "-i", "1x3x8x8", "-p", "fold_bn", "-o", str(out)]) == 0
    spec = f"{tmp_path / 'net.py'}:Net"
    assert verify_specs(spec, str(out), ["1x3x8x8"], trust_pickle=True).ok  # written by this process: the same code
    (tmp_path / "net.py").write_text(USER_MODEL.replace("return x * 2", "return x * 3"))
    script = (
        "import sys\n"
        "from fxforge.api import verify_specs\n"
        f"result = verify_specs({spec!r}, {str(out)!r}, ['1x3x8x8'], trust_pickle=True)\n"
        "sys.exit(0 if not result.ok and sys.modules['fxforge_user_net'].__file__.endswith('/net.py') else 1)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-1500:]


def test_a_damaged_inputs_txt_is_an_error_only_where_its_shapes_are_needed(tmp_path, capsys):
    """QA: the error said "pass --input instead", and with --input the command failed the same way."""
    from fxforge.cli import main

    out = tmp_path / "out"
    assert main(["optimize", "demo", "-p", "dead_code", "-o", str(out)]) == 0
    (out / "inputs.txt").write_text("garbage\n")
    capsys.readouterr()
    assert main(["inspect", str(out), "--trust-pickle"]) == 2  # model.pt: no shapes but the file's
    assert "inputs.txt is corrupt" in capsys.readouterr().err
    assert main(["inspect", str(out), "--trust-pickle", "--input", "2x3x32x32"]) == 0
    capsys.readouterr()  # model.pt2 records an example of its own; a damaged inputs.txt beside it is not passed over
    assert main(["inspect", str(out)]) == 2 and "inputs.txt is corrupt" in capsys.readouterr().err
    # a directory holds several forms: the verdict names the one it compared (QA: OK while model.pt was damaged)
    capsys.readouterr()
    assert main(["verify", "demo", str(out), "--input", "2x3x32x32"]) == 0
    assert f"OK: {out} (model.pt2) matches demo" in capsys.readouterr().out.replace("\n", " ")
    assert main(["verify", "demo", str(out), "--input", "2x3x32x32", "--trust-pickle", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["files"] == {"candidate": "model.pt"}


class _BranchOnBatch(torch.nn.Module):
    def forward(self, x):
        return x * 2 if x.shape[0] == 1 else x * 3


class _Branchy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.b = _BranchOnBatch()

    def forward(self, x):
        return self.b(self.fc(x))


def test_a_model_pt2_traced_at_batch_2_is_kept_only_when_it_computes_the_example(tmp_path):
    """QA regression: model.pt2 exported at batch 2 ran the example (batch 1) through the batch-2 branch, silently
    wrong; it must give the model's result on the example, else the example's batch is exported."""
    torch.manual_seed(0)
    model = _Branchy().eval()
    x = torch.randn(1, 8)
    captured = fxforge.capture(model, (x,), leaf_modules=["b"], method="symbolic_trace")
    optimize(captured, ["dead_code"], output_dir=tmp_path / "o")
    program = torch.export.load(str(tmp_path / "o" / "model.pt2")).module()
    with torch.no_grad():
        assert fxforge.compare_outputs(model(x), program(x)).ok


def test_optimize_without_passes_is_one_clear_error():
    """QA: fxforge.optimize(captured, None) raised a bare TypeError ('NoneType' object is not iterable)."""
    captured = fxforge.prepare("demo")
    with pytest.raises(FxforgeError, match="passes must be pass names or a Pipeline"):
        fxforge.optimize(captured, None)


def test_the_api_names_a_wrong_argument_type_in_one_line():
    """QA: optimize(model), optimize(graph_module), apply_pass(captured) raised bare AttributeErrors; graph_html of a
    module said 'lint takes a captured graph'."""
    from fxforge.passes import PassError

    captured = fxforge.prepare("demo")
    for wrong in (captured.original, captured.graph_module):
        with pytest.raises(FxforgeError, match="optimize takes a captured model"):
            fxforge.optimize(wrong, ["fold_bn"])
    with pytest.raises(PassError, match="apply_pass takes a GraphModule, not a Captured") as raised:
        fxforge.apply_pass(captured, "fold_bn")
    assert "captured.graph_module" in str(raised.value.hint)
    with pytest.raises(FxforgeError, match="a graph page takes a captured graph"):
        fxforge.graph_html(captured.original)


def test_verifying_passes_without_example_inputs_is_refused_not_claimed():
    """QA: a graph captured with no inputs, optimize(..., verify=True) said ok with nothing verified."""
    from fxforge.errors import InputSpecError

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)).eval()
    captured = fxforge.capture(model, ())
    assert "no output check: no example inputs were given" in captured.record.notes
    with pytest.raises(InputSpecError, match="needs example inputs"):
        fxforge.optimize(captured, ["fold_bn"], verify=True)


def test_checking_a_model_in_training_mode_leaves_the_callers_random_stream():
    """QA: running a train-mode model (dropout) drew from the global generator: verify, optimize, inspect... each
    moved the caller's torch.get_rng_state()."""
    from fxforge.inspect import inspect_graph

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).train()
    captured = fxforge.capture(model, (torch.randn(2, 4),))
    state = torch.get_rng_state()
    fxforge.verify(captured, captured.graph_module)
    fxforge.optimize(captured, ["dead_code"])
    inspect_graph(captured)
    assert torch.equal(torch.get_rng_state(), state)


class _RunningState(torch.nn.Module):
    """Buffers updated in place in forward, and arithmetic on them alone."""

    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(()))
        self.register_buffer("ema", torch.zeros(4))

    def forward(self, x):
        self.calls.add_(1)
        self.ema.mul_(0.9).add_(0.1 * x.mean(0))
        return self.l(x) + self.ema * self.calls


def test_a_model_pt_torch_would_load_wrong_is_not_written(tmp_path):
    """torch.load rebuilds a pickled GraphModule by tracing its code with buffers as plain tensors: calls.add_(1) ran
    once at load and ema * calls became a constant, so the written model.pt was wrong from its first call (QA)."""
    torch.manual_seed(0)
    model, x = _RunningState().eval(), torch.ones(2, 4)
    captured = fxforge.capture(model, (x,))
    result = optimize(captured, ["dead_code"], output_dir=tmp_path / "out")
    assert not (tmp_path / "out" / "model.pt").exists()
    assert any("model.pt: torch.load rebuilds" in note for note in result.notes)
    twin, loaded = _RunningState().eval(), fxforge.load_model(tmp_path / "out").module  # model.pt2
    twin.load_state_dict(model.state_dict())
    for _ in range(3):
        assert torch.allclose(loaded(x), twin(x))


def _bump(state):  # a user's helper: fxforge captures it as one call and cannot see its write
    state.add_(1)
    return state


class _HiddenWrites(torch.nn.Module):
    """Buffers written in forward by calls whose names do not end in an underscore."""

    def __init__(self, how: str):
        super().__init__()
        self.how, self.l = how, torch.nn.Linear(4, 4)
        self.register_buffer("state", torch.zeros(4))

    def forward(self, x):
        if self.how == "out":
            torch.add(self.state, 1, out=self.state)
        elif self.how == "setitem":
            self.state[0] = self.state[0] + 1
        elif self.how == "inplace_flag":
            torch.nn.functional.hardtanh(self.state.sub(2), 0.0, 9.0, True)  # in place on a temporary: harmless
            torch.nn.functional.threshold(self.state, 0.5, 3.0, True)  # state <= 0.5 -> 3, in place
        else:
            _bump(self.state)
        return self.l(x) + self.state


torch.fx.wrap("_bump")


@pytest.mark.parametrize("how", ["out", "setitem", "inplace_flag", "helper"])
def test_a_model_pt_is_not_written_where_a_hidden_write_would_run_once_at_load(tmp_path, how):
    """QA: ``torch.add(self.state, 1, out=self.state)`` (and setitem, ``inplace=True``, a helper captured as one
    call) ran once when torch.load rebuilt the model.pt, which then returned that first state forever. The check
    of which calls write now shares the passes' (fxforge.effects.written_args)."""
    torch.manual_seed(0)
    model, x = _HiddenWrites(how).eval(), torch.ones(2, 4)
    captured = fxforge.capture(model, (x,))
    optimize(captured, ["dead_code"], output_dir=tmp_path / "out")
    twin = _HiddenWrites(how).eval()
    twin.load_state_dict(model.state_dict())
    if (tmp_path / "out" / "model.pt").exists():  # written: it must keep the state as the model does
        loaded = fxforge.load_model(tmp_path / "out", trust_pickle=True).module
        for _ in range(3):
            torch.testing.assert_close(loaded(x), twin(x))
    else:
        assert (tmp_path / "out" / "model.pt2").exists()


def test_a_model_pt_with_an_argument_traced_as_none_leaves_later_loads_working(tmp_path):
    """Loading a model.pt whose graph guards an argument traced as None registers a name with torch.fx that made
    every later model.pt load in the process fail with KeyError, reported as a corrupt file (QA; torch's bug: plain
    torch.load still has it, fxforge's loader forgets the name after each load)."""

    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(4, 4)

        def forward(self, x, mask=None):
            y = self.l(x)
            return y if mask is None else y + mask

    x = torch.randn(2, 4)
    optimize(fxforge.capture(Masked().eval(), (x,)), ["dead_code"], output_dir=tmp_path / "masked")
    optimize(fxforge.capture(torch.nn.Linear(4, 4).eval(), (x,)), ["dead_code"], output_dir=tmp_path / "plain")
    for name in ("masked", "plain"):
        assert fxforge.load_model(tmp_path / name, trust_pickle=True).module(x).shape == (2, 4)


class _BigBatchesNegated(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return -y if x.shape[0] > 2 else y


def test_a_model_pt2_whose_batch_the_code_narrows_says_so_from_the_file(tmp_path):
    """QA: captured with --check-batch 1 (torch.export, batch dynamic up to 2: the code branches above it), the graph
    was verified at batches 2 and 1 and the note said nothing, while the written model.pt2, loaded, ran batch 2 only
    (torch.export specialised the batch when the program was saved). The note is read from the file now."""
    captured = fxforge.prepare(_BigBatchesNegated().eval(), ["2x8"], check_batch=1)
    result = optimize(captured, ["dead_code"], output_dir=tmp_path / "o")
    loaded = fxforge.load_model(str(tmp_path / "o" / "model.pt2")).module
    runs = []
    for batch in (1, 2, 3):
        try:
            loaded(torch.randn(batch, 8))
            runs.append(batch)
        except Exception:
            pass
    noted = [note for note in result.notes if note.startswith("model.pt2 runs batch")]
    assert runs != [1, 2, 3] and noted, (runs, result.notes)
    assert f"runs batch {runs[0]} only" in noted[0] if len(runs) == 1 else "batch sizes" in noted[0]


_GATED_MODEL = """
import torch
from torch import nn


def gate(x):  # branches on values: capture keeps it as one call
    if x.sum() > 0:
        return x * 2
    return x - 1


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return gate(self.lin(x))


def build():
    return M()


example_inputs = ["2x8"]
"""


def test_a_model_pt_whose_graph_calls_a_kept_helper_loads_again(tmp_path):
    """QA: capture wrapped ``gate`` (data-dependent), optimize said "wrote model.pt", and torch.load failed on it:
    unpickling traces the graph's code again, into ``gate``. Such a model.pt names fxforge's rebuild tracer now."""
    (tmp_path / "gated.py").write_text(_GATED_MODEL)
    spec, out = f"{tmp_path / 'gated.py'}:build", tmp_path / "out"
    result = optimize(fxforge.prepare(spec), ["fold_bn"], output_dir=out)
    assert (out / "model.pt").exists() and "model.pt" in result.files
    script = (
        "import sys, torch, fxforge\n"
        f"model = fxforge.load_model({spec!r}).module\n"
        f"loaded = fxforge.load_model({str(out)!r}, trust_pickle=True)\n"
        "assert loaded.file == 'model.pt', loaded.file\n"
        "for sign in (1, -1):\n"
        "    x = sign * torch.ones(3, 8) * 5\n"
        "    torch.testing.assert_close(loaded.module(x), model(x))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-1500:]


def test_a_torch_only_pass_on_a_model_symbolic_trace_cannot_capture_says_so():
    """QA: "capture with --method symbolic_trace" sent the user of a transformers model to a capture that fails;
    where capture already tried it, the hint says where it stopped, before any pass runs."""
    from pathlib import Path

    tricky = Path(__file__).parent / "tricky_models.py"
    captured = fxforge.prepare(f"{tricky}:LenOfTensor", ["2x8"])
    assert captured.dialect == "aten"
    with pytest.raises(PassError) as info:
        optimize(captured, ["remove_dropout", "replace_modules"])
    assert "works on torch graphs" in info.value.message
    assert "symbolic_trace cannot capture this model" in info.value.hint and "len(x)" in info.value.hint
    plain = fxforge.prepare("demo", method="export")  # symbolic_trace was never tried: it would work
    with pytest.raises(PassError) as info:
        optimize(plain, ["replace_modules"])
    assert info.value.hint == "capture with method='symbolic_trace'"


def test_a_torch_only_pass_where_symbolic_trace_failed_without_a_location_names_the_error():
    """QA: GPT-2's trace fails with no line of the user's to name, and the hint read "it stopped), so
    replace_modules cannot run on it"; the error says why instead."""
    from pathlib import Path

    tricky = Path(__file__).parent / "tricky_models.py"
    captured = fxforge.prepare(f"{tricky}:LenOfTensor", ["2x8"])
    failed = captured.record.trace_failure
    failed.location = None
    with pytest.raises(PassError) as info:
        optimize(captured, ["replace_modules"])
    assert f"(it stopped with {failed.error}), so replace_modules" in info.value.hint


def test_a_torch_only_pass_on_a_loaded_aten_graph_does_not_advise_a_capture_method():
    """QA: on an optimize output's model.pt2 the hint said "capture with --method symbolic_trace", which a saved
    graph ignores (it is not captured again): the same refusal came back."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    x = torch.randn(2, 4)
    captured = fxforge.capture(torch.export.export(model, (x,)).module(), (x,))
    assert captured.dialect == "aten" and captured.record.method == "loaded"
    with pytest.raises(PassError) as info:
        optimize(captured, ["replace_modules"])
    assert "capture with" not in info.value.hint and "already an aten graph" in info.value.hint


def test_a_pass_that_crashes_is_an_internal_error_in_one_line(capsys):
    """QA: fold_bn crashing (on a pruned conv) exited 2, the code of bad input, although the input was fine."""
    from fxforge.cli import main
    from fxforge.errors import EXIT_INTERNAL
    from fxforge.passes import PASSES, register_pass

    @register_pass("test_crashes", summary="test only", guarantees="none")
    def crashes(gm, options):
        raise RuntimeError("the pass's own bug")

    try:
        code = main(["optimize", "demo", "-p", "test_crashes"])
    finally:
        PASSES.pop("test_crashes")
    err = capsys.readouterr().err
    assert code == EXIT_INTERNAL, err
    assert "error: pass 'test_crashes' (from" in err and "crashed: RuntimeError: the pass's own bug" in err, err
    assert "Traceback" not in err and "internal error" not in err


def test_a_model_whose_file_imports_a_module_beside_it_loads_elsewhere_too(tmp_path):
    """QA: --auto choosing eager copied the factory's file into source/ but not models.py beside it, from which it
    imports the model's class: the printed load line failed, "No module named 'models'"."""
    from fxforge.cli import main

    project = tmp_path / "project"
    project.mkdir()
    (project / "models.py").write_text(
        "import torch\nfrom torch import nn\n\n\nclass Tiny(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.lin = nn.Linear(4, 2)\n\n    def forward(self, x):\n"
        "        return self.lin(x)\n"
    )
    (project / "factory.py").write_text("from models import Tiny\n\n\ndef build():\n    return Tiny().eval()\n")
    out = tmp_path / "out"
    args = ["optimize", f"{project / 'factory.py'}:build", "-i", "2x4", "--auto", "-b", "eager", "--repeats", "3"]
    assert main([*args, "-o", str(out)]) == 0
    assert {p.name for p in (out / "source").iterdir()} == {"models.py"}  # the class is models.Tiny
    shutil.rmtree(project)  # the copies are all there is
    script = (
        "import sys, torch\n"
        "sys.path.insert(0, 'source')\n"
        "model = torch.load('model.pt', weights_only=False)\n"
        "assert model(torch.randn(2, 4)).shape == (2, 2)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=out)
    script = (
        "import fxforge, torch\n"
        f"loaded = fxforge.load_model({str(out)!r}, trust_pickle=True).module\n"
        "assert loaded(torch.randn(2, 4)).shape == (2, 2)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)


def test_an_output_that_appears_while_the_work_runs_is_not_replaced(tmp_path):
    """QA: a folder the user made at the target while optimize ran (or another run's output) was replaced and
    deleted without --force, and two runs at one target both said "wrote"; export's file likewise."""
    from fxforge.artifacts import StagedOutput, atomic_directory

    target = tmp_path / "out"
    appeared = pytest.raises(FxforgeError, match="it appeared while this run worked")
    with appeared, atomic_directory(target) as staging:
        (staging / "model.pt2").write_text("new")
        target.mkdir()
        (target / "precious.txt").write_text("mine")
    assert [p.name for p in target.iterdir()] == ["precious.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging left behind

    exported = tmp_path / "model.onnx"
    appeared = pytest.raises(FxforgeError, match="it appeared while this run worked")
    with appeared, StagedOutput(exported) as staged:
        staged.path.write_text("new")
        exported.write_text("user data")
        staged.commit()
    assert exported.read_text() == "user data"


def test_the_package_imports_names_from_the_users_sibling_modules(tmp_path, monkeypatch):
    """QA: a factory file importing its namedtuple and wrapped helper from a sibling module (nets.py): the
    optimized_model/ package raised NameError for them (only the factory file's own names were imported)."""
    from fxforge.cli import main

    (tmp_path / "nets.py").write_text(
        "import collections\nfrom torch import nn\n\nPair = collections.namedtuple('Pair', 'a b')\n\n\n"
        "def helper(x):\n    if x.sum() > 0:\n        return x * 2\n    return x\n\n\n"
        "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.lin = nn.Linear(8, 8)\n\n"
        "    def forward(self, x):\n        y = helper(self.lin(x))\n        return Pair(y, x)\n"
    )
    (tmp_path / "fac.py").write_text("from nets import Net\n\n\ndef make():\n    return Net().eval()\n")
    monkeypatch.chdir(tmp_path)
    assert main(["optimize", "fac.py:make", "-i", "2x8", "--wrap", "nets.py:helper", "-p", "cse", "-o", "out"]) == 0
    script = (
        "import sys, torch\nsys.path.insert(0, 'out')\nfrom optimized_model import OptimizedModel\n"
        "out = OptimizedModel()(torch.randn(2, 8))\nassert type(out).__name__ == 'Pair'\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").rename(elsewhere / "out")
    subprocess.run([sys.executable, "-c", script], check=True, cwd=elsewhere)


def test_a_loaded_graph_no_pass_changed_is_not_called_verified(tmp_path, capsys):
    """QA: ``optimize out/model.pt2 --verify`` with passes that changed nothing printed "verified: outputs match the
    model on 16 cases": the loaded graph against a copy of itself, a check that could not fail."""
    from fxforge.cli import main

    captured = fxforge.prepare("demo")
    bare = captured.graph_module
    unchanged = Pipeline(["remove_identity"], verify_each=True).run(bare, inputs=captured.example_inputs)
    assert unchanged.ok and unchanged.compared_with_itself and unchanged.to_dict()["compared_with_itself"]
    changed = Pipeline(["fold_bn"], verify_each=True).run(bare, inputs=captured.example_inputs)
    assert changed.ok and not changed.compared_with_itself  # a rewritten graph: the check could have failed
    # a model captured from its code: the graph is checked against the model itself, changed or not
    assert not Pipeline(["remove_identity"], verify_each=True).run(captured).compared_with_itself

    assert main(["optimize", "demo", "-p", "fold_bn", "-o", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    assert main(["optimize", str(tmp_path / "a"), "-p", "remove_identity", "--verify", "-o", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "nothing to verify: no pass changed the graph" in out and "verified" not in out
    html = (tmp_path / "b" / "report.html").read_text()
    assert "Nothing to verify: no pass changed the graph" in html
