"""Plug-ins and the user's own code: the example plug-in package (installed by scripts/install.sh) reaches every
command with its origin shown, a broken plug-in is reported by name while the others work, passes and rules from
files (``-p file.py:fn``, ``--rule file.py:fn``, pipeline files), and ``--wrap``/``--concrete`` on the commands."""

from __future__ import annotations

import importlib.metadata
import json
import sys
import textwrap

import pytest
import torch
from torch import fx, nn

import fxforge.plugins as plugins
from fxforge.api import prepare
from fxforge.bench import all_backends
from fxforge.cli import main
from fxforge.errors import EXIT_CAPTURE, EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, FxforgeError
from fxforge.lint import all_rules, lint
from fxforge.optimize import fix, optimize
from fxforge.passes import PassError, all_passes, apply_pass, get_pass
from fxforge.pipeline import Pipeline, build_pipeline

EXAMPLE = "plugin fxforge-example-plugin (example)"

pytest.importorskip("fxforge_example_plugin", reason="scripts/install.sh installs examples/fxforge-example-plugin")


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


class ScaledHeads(nn.Module):
    """Two projections scaled by constants (what fold_scale_into_linear folds) and one that is also used unscaled."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(16, 16)
        self.k = nn.Linear(16, 16)
        self.v = nn.Linear(16, 16)

    def forward(self, x):
        q = self.q(x) * 0.125
        k = self.k(x) / 3.0
        v = self.v(x)
        return q + k + v * 0.5 + v


@pytest.fixture
def scaled_heads():
    torch.manual_seed(0)
    return ScaledHeads().eval()


def flat(text: str) -> str:
    """Output with the console's line wrapping undone."""
    return " ".join(text.split())


@pytest.fixture(autouse=True)
def registries_restored():
    """Passes, rules and backends a test registers (from its own temporary files) are gone after it: the next
    test's file of the same name is another function, which the registry would refuse as a clash."""
    from fxforge.bench import BACKENDS
    from fxforge.lint import RULES
    from fxforge.passes import PASSES

    all_passes(), all_rules(), all_backends()  # fxforge's own and the installed plug-ins' first
    saved = [(registry, dict(registry), dict(registry.origins)) for registry in (PASSES, RULES, BACKENDS)]
    yield
    for registry, items, origins in saved:
        registry.clear()
        registry.update(items)
        registry.origins.clear()
        registry.origins.update(origins)


@pytest.fixture
def fresh_plugins():
    """Plug-in groups load again in the test, and again after it (so a fake entry point does not leak)."""
    plugins.forget()
    yield
    plugins.forget()


# --------------------------------------------------------------------------------------------------------------
# the installed example plug-in


def test_example_plugin_is_listed_with_its_origin(capsys):
    code, out, _ = run(capsys, "passes", "--json")
    passes = {p["name"]: p for p in json.loads(out)}
    assert code == EXIT_OK
    assert passes["fold_scale_into_linear"]["origin"] == EXAMPLE
    assert passes["fold_bn"]["origin"] == "fxforge"
    code, out, _ = run(capsys, "lint", "--rules", "--json")
    rules = {r["code"]: r for r in json.loads(out)}
    assert rules["FXP001"]["origin"] == EXAMPLE and rules["FXP001"]["fix"] == "fold_scale_into_linear"
    code, out, _ = run(capsys, "bench", "--list-backends", "--json")
    backends = {b["name"]: b for b in json.loads(out)["backends"]}
    assert backends["channels_last"]["origin"] == EXAMPLE and backends["eager"]["origin"] == "fxforge"
    code, out, _ = run(capsys, "passes")
    assert "fold_scale_into_linear" in out and "fxforge-example-plugin" in out


def test_example_pass_folds_scales_and_verifies(scaled_heads):
    captured = prepare(scaled_heads, inputs="2x16")
    result = optimize(captured, ["fold_scale_into_linear"], verify=True)
    step = result.pipeline.steps[0]
    assert step.result.changed and step.result.replaced == 2  # q and k; v has an unscaled user too
    assert step.verification is not None and step.verification.ok
    gm = result.pipeline.graph_module
    scalings = [n for n in gm.graph.nodes if (n.op == "call_function" and "mul" in n.name) or "truediv" in n.name]
    assert len(scalings) == 1  # only v * 0.5 is left
    x = torch.randn(4, 16)
    torch.testing.assert_close(gm(x), scaled_heads(x), rtol=1e-5, atol=1e-6)  # float32: one rounding moved
    assert scaled_heads.q.weight.data_ptr() != gm.get_submodule("q_scaled").weight.data_ptr()


def test_example_rule_reports_what_the_pass_folds_and_fix_clears_it(scaled_heads, tmp_path):
    captured = prepare(scaled_heads, inputs="2x16")
    findings = [f for f in lint(captured).findings if f.code == "FXP001"]
    assert sorted(f.node for f in findings) == ["mul", "truediv"]
    fixed = fix(captured, tmp_path / "fixed")
    # q, k and v read the same input, so FX014 asks for merge_parallel_linears too; fixes outside the exact passes'
    # order run by name, so the scales are folded into q and k before the three merge
    assert fixed.passes == ["fold_scale_into_linear", "merge_parallel_linears"]
    assert not [f for f in fixed.after.findings if f.code == "FXP001"]
    assert (tmp_path / "fixed" / "model.pt2").is_file()


def test_example_pass_changes_nothing_on_resnet18_and_refuses_export_graphs(resnet18):
    captured = prepare(resnet18, inputs="1x3x64x64")
    assert not apply_pass(captured.graph_module, "fold_scale_into_linear").changed  # no scaled linear there
    exported = prepare(nn.Sequential(nn.Linear(4, 4)).eval(), inputs="1x4", method="export")
    with pytest.raises(PassError, match="works on torch graphs"):
        apply_pass(exported.graph_module, "fold_scale_into_linear")


def test_example_backend_runs_in_bench(capsys):
    code, out, _ = run(
        capsys, "bench", "demo", "--backends", "eager,channels_last", "--repeats", "2", "--warmup", "1", "--json"
    )
    rows = {row["backend"]: row for row in json.loads(out)["rows"]}
    assert code == EXIT_OK
    assert rows["channels_last"]["ok"] and rows["channels_last"]["max_abs_err"] < 1e-4


# --------------------------------------------------------------------------------------------------------------
# broken plug-ins


def _fake_entry_points(monkeypatch, extra: dict[str, list[importlib.metadata.EntryPoint]]) -> None:
    real = plugins.entry_points

    def entry_points(group: str) -> list[importlib.metadata.EntryPoint]:
        return real(group) + extra.get(group, [])

    monkeypatch.setattr(plugins, "entry_points", entry_points)


def test_a_plugin_that_fails_to_import_is_named_and_the_others_still_load(monkeypatch, capsys, fresh_plugins):
    broken = importlib.metadata.EntryPoint("broken", "fxforge_no_such_plugin.passes", plugins.PASSES_GROUP)
    _fake_entry_points(monkeypatch, {plugins.PASSES_GROUP: [broken]})
    names = {spec.name for spec in all_passes()}
    assert {"fold_bn", "fold_scale_into_linear"} <= names
    (failure,) = plugins.failures(plugins.PASSES_GROUP)
    assert failure.name == "broken" and "fxforge_no_such_plugin" in failure.error
    code, out, err = run(capsys, "passes")
    assert code == EXIT_OK and "fold_scale_into_linear" in out
    assert "plug-in unknown package (broken, fxforge.passes) failed to load" in flat(err)
    assert "No module named 'fxforge_no_such_plugin'" in flat(err)
    # asked for by name, its pass is unknown: the failed plug-in is named with it (QA: a bare "unknown pass")
    code, _, err = run(capsys, "optimize", "demo", "-p", "broken_pass")
    assert code == EXIT_USAGE and "unknown pass 'broken_pass'" in flat(err)
    assert "plug-in unknown package (broken, fxforge.passes) failed to load" in flat(err)


def test_a_pass_is_registered_only_under_a_name_and_dialects_that_can_work():
    """QA: "", "has,comma" (-p then asked for 'has') and "exact" (hidden behind the group) were accepted as names, and
    dialects=("Torch",) failed later with "works on Torch graphs, but this graph is torch"."""
    from fxforge.passes import register_pass

    for name in ("", "has,comma", "exact", "1st"):
        with pytest.raises(PassError, match="cannot register a pass named"):
            register_pass(name, summary="x", guarantees="x")
    with pytest.raises(PassError, match="dialects are 'torch' and 'aten'"):
        register_pass("test_dialect", summary="x", guarantees="x", dialects=("Torch",))


def test_a_plugin_reusing_a_builtin_name_is_refused_not_swapped_in(monkeypatch, tmp_path, fresh_plugins):
    (tmp_path / "clashing_plugin.py").write_text(
        textwrap.dedent(
            """
            from fxforge.passes import PassResult, register_pass

            @register_pass("fold_bn", summary="not fxforge's", guarantees="none")
            def fold_bn(gm, options):
                return PassResult("fold_bn", gm)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    clash = importlib.metadata.EntryPoint("clash", "clashing_plugin", plugins.PASSES_GROUP)
    _fake_entry_points(monkeypatch, {plugins.PASSES_GROUP: [clash]})
    assert get_pass("fold_bn").origin == "fxforge"
    (failure,) = plugins.failures(plugins.PASSES_GROUP)
    assert "fold_bn" in failure.error and "already" in failure.error


def test_a_plugin_that_fails_to_load_leaves_nothing_it_registered(monkeypatch, tmp_path, fresh_plugins):
    """QA: a plug-in that registered a pass and then raised was "failed to load", yet its pass stayed registered
    and ran with no warning."""
    from fxforge.passes import PASSES

    (tmp_path / "half_plugin.py").write_text(
        textwrap.dedent(
            """
            from fxforge.passes import PassResult, register_pass

            @register_pass("half_registered", summary="x", guarantees="x")
            def half(gm, options):
                return PassResult("half_registered", gm)

            raise RuntimeError("the rest of the plug-in is broken")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    half = importlib.metadata.EntryPoint("half", "half_plugin", plugins.PASSES_GROUP)
    _fake_entry_points(monkeypatch, {plugins.PASSES_GROUP: [half]})
    try:
        assert "half_registered" not in {spec.name for spec in all_passes()}
        (failure,) = plugins.failures(plugins.PASSES_GROUP)
        assert "the rest of the plug-in is broken" in failure.error
    finally:
        PASSES.pop("half_registered", None)
        sys.modules.pop("half_plugin", None)


def test_broken_rule_and_backend_plugins_are_reported_too(monkeypatch, capsys, fresh_plugins):
    rule = importlib.metadata.EntryPoint("rules", "fxforge_no_such_rules", plugins.RULES_GROUP)
    not_a_rule = importlib.metadata.EntryPoint("loose", "os.path:join", plugins.RULES_GROUP)
    backend = importlib.metadata.EntryPoint("fast", "fxforge_no_such_backend:build", plugins.BACKENDS_GROUP)
    _fake_entry_points(monkeypatch, {plugins.RULES_GROUP: [rule, not_a_rule], plugins.BACKENDS_GROUP: [backend]})
    assert "FXP001" in {r.code for r in all_rules()} and "FX001" in {r.code for r in all_rules()}
    errors = {f.name: f.error for f in plugins.failures(plugins.RULES_GROUP)}
    assert set(errors) == {"rules", "loose"} and "not a lint rule" in errors["loose"]
    assert "channels_last" in {b.name for b in all_backends()}
    code, out, err = run(capsys, "bench", "--list-backends")
    assert code == EXIT_OK and "channels_last" in out and "(fast, fxforge.backends) failed to load" in flat(err)


# --------------------------------------------------------------------------------------------------------------
# passes and rules from the user's files


PASSES_FILE = '''
import operator
from torch import fx
from fxforge.passes import PassResult, register_pass


@register_pass("double_to_add", summary="x * 2 becomes x + x", guarantees="exact in binary floating point")
def double_to_add(gm: fx.GraphModule, options) -> PassResult:
    result = PassResult("double_to_add", gm)
    for node in list(gm.graph.nodes):
        if node.target is operator.mul and node.args[1] == 2:
            with gm.graph.inserting_after(node):
                added = gm.graph.call_function(operator.add, (node.args[0], node.args[0]))
            node.replace_all_uses_with(added)
            gm.graph.erase_node(node)
            result.note(f"{node.name}: x * 2 -> x + x", replaced=1)
    return result


def negate_output(gm):
    """A plain function: flips the sign of the output (verification must catch it)."""
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    with gm.graph.inserting_before(output):
        flipped = gm.graph.call_function(operator.neg, (output.args[0],))
    output.args = (flipped,)
    return gm


def returns_nonsense(gm):
    return 42
'''

RULES_FILE = """
import operator
from fxforge.lint import rule


@rule("USR001", "doubling", "warning", "x * 2 could be x + x", fix="double_to_add")
def check(ctx):
    for node in ctx.graph.nodes:
        if node.target is operator.mul and node.args[1] == 2:
            yield node, "multiplication by 2"
"""


class Doubler(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * 2


@pytest.fixture
def user_files(tmp_path):
    (tmp_path / "my_passes.py").write_text(PASSES_FILE)
    (tmp_path / "my_rules.py").write_text(RULES_FILE)
    (tmp_path / "model.py").write_text(
        textwrap.dedent(
            """
            from torch import nn

            class Doubler(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.lin = nn.Linear(4, 4)

                def forward(self, x):
                    return self.lin(x) * 2
            """
        )
    )
    return tmp_path


def test_decorated_pass_from_a_file(user_files):
    captured = prepare(Doubler().eval(), inputs="2x4")
    result = optimize(captured, [f"{user_files}/my_passes.py:double_to_add"], verify=True)
    (step,) = result.pipeline.steps
    assert step.result.name == "double_to_add" and step.result.changed and step.verification.ok
    assert get_pass("double_to_add").origin.endswith("my_passes.py")


def test_plain_function_pass_is_adopted_and_verification_catches_it(user_files):
    captured = prepare(Doubler().eval(), inputs="2x4")
    result = optimize(captured, [f"{user_files}/my_passes.py:negate_output"], verify=True, keep_going=True)
    (step,) = result.pipeline.steps
    assert step.result.changed  # the wrapper saw the code change
    assert step.verification is not None and not step.verification.ok
    assert step.rolled_back and "max abs error" in step.rolled_back  # keep_going: rolled back, not kept
    assert "neg" not in result.pipeline.graph_module.code
    with pytest.raises(PassError, match="returned '42' \\(a int\\)"):
        Pipeline([f"{user_files}/my_passes.py:returns_nonsense"]).run(captured)


def test_pass_reference_errors_are_one_line(capsys, user_files):
    code, _, err = run(capsys, "optimize", "demo", "-p", f"{user_files}/my_passes.py:missing", "-o", "x")
    assert code == EXIT_USAGE and "has no attribute 'missing'" in err and "Traceback" not in err
    code, _, err = run(capsys, "optimize", "demo", "-p", f"{user_files}/nowhere.py:fn", "-o", "x")
    assert code == EXIT_USAGE and "file not found" in err


def test_pipeline_file_names_a_pass_file_beside_it(user_files):
    (user_files / "pipeline.yaml").write_text("passes:\n  - remove_dropout\n  - my_passes.py:double_to_add\n")
    pipeline = build_pipeline(pipeline_file=user_files / "pipeline.yaml")
    assert [s.name for s in pipeline.steps] == ["remove_dropout", "double_to_add"]


def test_cli_pass_and_rule_from_files(capsys, user_files, monkeypatch):
    monkeypatch.chdir(user_files)
    code, out, err = run(
        capsys, "optimize", "model.py:Doubler", "--input", "2x4", "-p", "my_passes.py:double_to_add", "-o", "out"
    )
    assert code == EXIT_OK, err
    assert "double_to_add" in out and (user_files / "out" / "model.pt2").is_file()
    code, out, _ = run(capsys, "lint", "model.py:Doubler", "--input", "2x4", "--rule", "my_rules.py:check", "--json")
    assert code == 1 and "USR001" in [f["code"] for f in json.loads(out)["findings"]]
    code, out, _ = run(capsys, "lint", "--rules", "--rule", "my_rules.py:check", "--json")
    assert {r["code"]: r["origin"] for r in json.loads(out)}["USR001"] == "file my_rules.py"
    code, _, err = run(capsys, "lint", "model.py:Doubler", "--input", "2x4", "--rule", "my_passes.py:double_to_add")
    assert code == EXIT_USAGE and "is not a lint rule" in err


def test_a_rule_reference_adds_the_rule_it_names_not_the_whole_file(capsys, user_files, monkeypatch):
    """QA: --rule my_rules.py:check ran every @rule in the file. Only the named one is added; naming the other
    one too (the file is imported once) adds it as well."""
    monkeypatch.chdir(user_files)
    (user_files / "two_rules.py").write_text(
        RULES_FILE
        + """

@rule("USR002", "any_linear", "info", "a linear layer")
def linears(ctx):
    for node in ctx.graph.nodes:
        if node.op == "call_module":
            yield node, "a module call"
"""
    )
    lint_doubler = ("lint", "model.py:Doubler", "--input", "2x4", "--json")
    code, out, err = run(capsys, *lint_doubler, "--rule", "two_rules.py:check")
    assert code == 1, err
    assert {f["code"] for f in json.loads(out)["findings"]} & {"USR001", "USR002"} == {"USR001"}
    code, out, err = run(capsys, *lint_doubler, "--rule", "two_rules.py:linears", "--rule", "two_rules.py:check")
    assert {f["code"] for f in json.loads(out)["findings"]} & {"USR001", "USR002"} == {"USR001", "USR002"}, err


# --------------------------------------------------------------------------------------------------------------
# --wrap and --concrete


MODEL_WITH_HELPER = """
import torch
from torch import nn
from helpers import signed_norm, scale_rows


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x, double: bool = False):
        y = self.lin(scale_rows(signed_norm(x)))
        if double:
            y = y * 2
        return y
"""

HELPERS = """
import torch


def signed_norm(x):
    if x.sum() > 0:  # data-dependent
        return x / x.norm()
    return -x / x.norm()


def scale_rows(x):
    return x * torch.arange(1, x.shape[1] + 1, dtype=x.dtype)
"""


@pytest.fixture
def helper_model(tmp_path, monkeypatch):
    (tmp_path / "helpers.py").write_text(HELPERS)
    (tmp_path / "net.py").write_text(MODEL_WITH_HELPER)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    # net.py does ``from helpers import ...``: another test's helpers.py must not answer that import
    monkeypatch.delitem(sys.modules, "helpers", raising=False)
    yield tmp_path
    sys.modules.pop("helpers", None)


def test_wrap_keeps_a_traceable_function_as_one_call(capsys, helper_model):
    args = ("inspect", "net.py:Net", "--input", "2x8", "--method", "symbolic_trace", "--code")
    code, plain, _ = run(capsys, *args)
    assert code == EXIT_OK and "arange" in plain  # traced through
    code, wrapped, err = run(capsys, *args, "--wrap", "helpers.py:scale_rows", "--wrap", "helpers.signed_norm")
    assert code == EXIT_OK, err
    assert "arange" not in wrapped and "helpers_scale_rows(" in wrapped and "helpers_signed_norm(" in wrapped


def test_wrap_that_does_nothing_says_so(capsys, helper_model):
    code, _, err = run(capsys, "inspect", "net.py:Net", "--input", "2x8", "--wrap", "helpers.py:nothing")
    assert code == EXIT_USAGE and "has no attribute 'nothing'" in err
    (helper_model / "other.py").write_text("def unrelated(x):\n    return x\n")
    code, out, _ = run(capsys, "inspect", "net.py:Net", "--input", "2x8", "--wrap", "other.py:unrelated", "--json")
    record = json.loads(out)["capture"]
    assert code == EXIT_OK and "other.py:unrelated" not in record["wrapped"]
    assert "--wrap other.py:unrelated: the traced code never called it, so wrapping changed nothing" in record["notes"]
    code, out, _ = run(
        capsys, "inspect", "net.py:Net", "--input", "2x8", "--wrap", "helpers.py:scale_rows", "--method", "export"
    )
    assert code == EXIT_CAPTURE  # export cannot follow signed_norm's branch, and a wrap cannot help it


def test_concrete_fixes_a_branch_on_every_command(capsys, helper_model, tmp_path):
    base = ("net.py:Net", "--input", "2x8", "--concrete", "double=true")
    code, out, _ = run(capsys, "inspect", *base, "--code")
    assert code == EXIT_OK and "* 2" in out
    code, out, err = run(capsys, "lint", *base, "--json")
    assert code == EXIT_OK, err
    code, out, err = run(capsys, "bench", *base, "--backends", "eager,fx", "--repeats", "1", "--warmup", "1", "--json")
    rows = {row["backend"]: row for row in json.loads(out)["rows"]}
    assert code == EXIT_OK and rows["eager"]["ok"] and rows["fx"]["ok"], err
    assert rows["fx"]["max_abs_err"] == 0  # eager called with double=True, the graph has it built in
    code, _, err = run(capsys, "optimize", *base, "-p", "dead_code", "-o", str(tmp_path / "out"), "--verify")
    assert code == EXIT_OK, err
    # a misspelt name, not "the model rejected the example inputs"
    for args in (("verify", "net.py:Net", "net.py:Net"), ("inspect", "net.py:Net")):
        code, _, err = run(capsys, *args, "--concrete", "triple=true")
        assert code == EXIT_USAGE and "net.py:Net's forward has no argument 'triple'" in err
    code, _, err = run(capsys, "inspect", "net.py:Net", "--input", "2x8", "--concrete", "double")
    assert code == EXIT_USAGE and "--concrete 'double' is not KEY=VALUE" in err


FLAG_MODEL = """
import torch
from torch import nn


class Flag(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, double: bool = False):
        y = self.fc(x)
        if double:
            y = y * 2
        return y
"""


def test_files_written_with_concrete_args_take_the_inputs_alone_and_verify_with_them(capsys, tmp_path):
    """--concrete double=true fixes the value in what is written: model.pt2 (of optimize and export) and the ONNX
    file run as model(x) -- model.pt2 demanded double= and guarded its value -- and verify --concrete calls the
    reference the same way."""
    (tmp_path / "flag_model.py").write_text(FLAG_MODEL)
    spec, out = f"{tmp_path / 'flag_model.py'}:Flag", tmp_path / "out"
    base = (spec, "--input", "2x8", "--concrete", "double=true")
    code, _, err = run(capsys, "optimize", *base, "-p", "dead_code", "-o", str(out), "--verify")
    assert code == EXIT_OK, err
    program = torch.export.load(str(out / "model.pt2")).module()
    model = prepare(spec, inputs="2x8").original
    x = torch.randn(3, 8)
    torch.testing.assert_close(program(x), model(x, double=True))
    code, result, err = run(capsys, "verify", spec, str(out), "--concrete", "double=true", "--json")
    assert code == EXIT_OK and json.loads(result)["trials"] >= 16, err
    code, _, _ = run(capsys, "verify", spec, str(out))  # the reference called with double=False: it differs
    assert code == EXIT_FINDINGS
    for name in ("flag.pt2", "flag.onnx"):  # export fixes the value the same way (it refused --concrete before)
        code, _, err = run(capsys, "export", *base, "-o", str(tmp_path / name))
        assert code == EXIT_OK, err
    code, _, err = run(capsys, "verify", spec, str(tmp_path / "flag.onnx"), "--concrete", "double=true")
    assert code == EXIT_OK, err


def test_api_wrap_and_concrete_match_the_model(helper_model):
    captured = prepare("net.py:Net", inputs="2x8", wrap=["helpers.py:scale_rows"], concrete_args={"double": True})
    assert captured.record.wrapped == ["helpers.scale_rows", "helpers.signed_norm"]
    gm: fx.GraphModule = captured.graph_module
    assert any("scale_rows" in str(n.target) for n in gm.graph.nodes)
    x = captured.example_inputs[0]
    torch.testing.assert_close(gm(x), captured.original(x, double=True))


def test_verify_takes_leaf_and_wrap_for_its_reference(capsys, helper_model):
    args = ("verify", "net.py:Net", "net.py:Net", "--input", "2x8", "--json")
    code, out, err = run(capsys, *args, "--wrap", "helpers.py:scale_rows", "--leaf", "lin")
    assert code == EXIT_OK and json.loads(out)["ok"], err
    code, _, err = run(capsys, *args, "--wrap", "helpers.py:nothing")
    assert code == EXIT_USAGE and "has no attribute 'nothing'" in err


BROKEN_RULES_FILE = """
import operator
from fxforge.lint import rule


@rule("USR051", "raises", "warning", "raises at lint time")
def raises(ctx):
    raise KeyError("oops in rule")
    yield


@rule("USR052", "says-a-string", "warning", "yields a bare string")
def says(ctx):
    yield "not a finding"


@rule("USR054", "misspelt-fix", "info", "names a fix no pass has", fix="fold_bnn")
def misspelt(ctx):
    yield None, "a finding whose fix is misspelt"


@rule("USR053", "edits", "warning", "edits the graph it reads")
def edits(ctx):
    for node in list(ctx.graph.nodes):
        if node.target is operator.mul:
            node.args = (node.args[0], 3)
            yield node, "edited"
"""


def test_a_broken_rule_is_named_and_the_other_rules_still_run(capsys, user_files, monkeypatch):
    """QA: a plug-in rule that raised (or yielded a bare string) stopped lint, and optimize with it, for every model,
    as an internal error that named neither the rule nor its file; a rule that edited the graph corrupted
    optimize's output and the next pass was blamed."""
    from fxforge.errors import EXIT_INTERNAL
    from fxforge.lint import RULES

    monkeypatch.chdir(user_files)
    (user_files / "broken_rules.py").write_text(BROKEN_RULES_FILE)
    try:
        code, out, err = run(
            capsys, "lint", "model.py:Doubler", "--input", "2x4", "--rule", "broken_rules.py:raises",
            "--rule", "broken_rules.py:says", "--rule", "broken_rules.py:misspelt", "--rule", "broken_rules.py:edits",
            "--rule", "my_rules.py:check", "--ignore", "USR053",
        )  # fmt: skip
        assert code == EXIT_FINDINGS and "USR001" in out, out  # the other rule's finding stands
        said = " ".join(err.split())
        assert "warning: rule USR051 raises (from file broken_rules.py) crashed: KeyError: 'oops in rule'" in said
        assert "rule USR052 says-a-string (from file broken_rules.py) crashed: TypeError: yielded 'not a" in said
        assert (
            "warning: rule USR054 (from file broken_rules.py): its fix 'fold_bnn' is not a registered pass: lint --fix "
            "cannot apply it" in said
        )
        captured = prepare(Doubler().eval(), inputs="2x4")
        with pytest.raises(FxforgeError) as raised:
            lint(captured, select=["USR053"])
        assert raised.value.exit_code == EXIT_INTERNAL
        assert "rule USR053 edits (from file broken_rules.py) changed the graph" in str(raised.value)
    finally:
        for code_ in ("USR051", "USR052", "USR053", "USR054", "USR001"):
            RULES.pop(code_, None)


def test_a_crashed_rule_fails_lint_unless_fail_on_never(capsys, user_files, monkeypatch):
    """QA: a plug-in rule that crashed, with no other finding, let lint exit 0 under "All checks passed!" on stdout:
    CI passed a check that did not run. It exits 4 (a plug-in's bug), as a crashed pass does, after the report."""
    from fxforge.errors import EXIT_INTERNAL
    from fxforge.lint import RULES

    monkeypatch.chdir(user_files)
    (user_files / "broken_rules.py").write_text(BROKEN_RULES_FILE)
    try:
        args = ["lint", "model.py:Doubler", "--input", "2x4", "--rule", "broken_rules.py:raises", "--json"]
        code, out, _ = run(capsys, *args)
        assert code == EXIT_INTERNAL
        assert json.loads(out)["rules_crashed"] == ["USR051"]
        code, _, err = run(capsys, *args[:-1], "--fail-on", "never")
        assert code == EXIT_OK and "USR051 raises (from file broken_rules.py) crashed" in " ".join(err.split())
    finally:
        RULES.pop("USR051", None)


def test_a_plugin_pass_writing_through_data_is_caught_and_named():
    """QA: a pass doubling a weight through .data (no write counter moves) changed the user's model undetected, and
    verify put the difference down to rounding."""
    from fxforge.passes import PASSES, PassResult, register_pass

    @register_pass("test_data_write", summary="test only", guarantees="none")
    def data_write(gm, options):
        gm.get_submodule("lin").weight.data.mul_(2.0)
        result = PassResult("test_data_write", gm)
        result.note("doubled a weight behind fxforge's back")
        return result

    try:
        captured = prepare(Doubler().eval(), inputs="2x4")
        with pytest.raises(PassError, match=r"pass 'test_data_write' wrote into stored tensors in place \(lin.weight"):
            apply_pass(captured.graph_module, "test_data_write")
    finally:
        PASSES.pop("test_data_write")


def test_passes_named_after_a_file_of_passes_keep_their_own_origin(user_files):
    """QA: after -p my_passes.py:double_to_add, every built-in pass was credited to my_passes.py."""
    import subprocess

    code = (
        "from fxforge.passes import resolve_pass_reference, get_pass; "
        f"resolve_pass_reference({str(user_files / 'my_passes.py') + ':double_to_add'!r}); "
        "print(get_pass('fold_bn').origin, '|', get_pass('double_to_add').origin)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-500:]
    builtin, theirs = done.stdout.strip().split(" | ")
    assert builtin == "fxforge" and theirs.endswith("my_passes.py"), done.stdout


def test_options_are_checked_by_type_and_when_the_pipeline_is_built(tmp_path):
    """QA: count=2.5 reached an int option, factor=true read as 1.0, an empty factor= as None; a misspelt option
    was parsed only when its step ran, so under keep_going it was rolled back and the run said "verified", exit 0;
    a YAML list of options was an internal error."""
    import dataclasses

    from fxforge.passes import PASSES, PassResult, parse_options, register_pass

    @dataclasses.dataclass
    class Opts:
        factor: float = 1.0
        count: int = 1
        label: str = ""
        limit: int | None = None

    @register_pass("test_typed", summary="test only", guarantees="none", options=Opts)
    def typed(gm, options):
        return PassResult("test_typed", gm)

    try:
        spec = get_pass("test_typed")
        good = parse_options(spec, {"factor": "2", "count": "3", "label": 5, "limit": None})
        assert (good.factor, good.count, good.label, good.limit) == (2.0, 3, "5", None)
        for bad in ({"count": 2.5}, {"count": [1, 2]}, {"count": True}, {"factor": True}, {"factor": None},
                    {"label": [1]}, {"limit": "many"}):  # fmt: skip
            with pytest.raises(PassError, match=r"option test_typed\.\w+ must be"):
                parse_options(spec, bad)
        with pytest.raises(PassError, match="has no option 'factr'"):
            Pipeline([("test_typed", {"factr": 2}), "fold_bn"], keep_going=True)
        with pytest.raises(PassError, match="options of pipeline step 'test_typed' are a list"):
            Pipeline([{"name": "test_typed", "options": ["factor", 2]}])
        assert Pipeline([("test_typed", Opts(factor=3.0))]).steps[0].options.factor == 3.0
        pipeline_file = tmp_path / "p.yaml"
        pipeline_file.write_text("passes:\n  - name: fold_constants\n    options: {max_byts: 10}\nkeep_going: true\n")
        with pytest.raises(PassError, match="has no option 'max_byts'"):
            build_pipeline(pipeline_file=pipeline_file)
    finally:
        PASSES.pop("test_typed")


def test_a_registered_pass_must_return_a_result_and_report_what_it_changed():
    """QA: a decorated pass returning None or the graph module crashed with AttributeError or RecursionError; one
    that changed the graph without a note read "changed: no", and verification could blame no pass."""
    import operator

    from fxforge.passes import PASSES, PassResult, register_pass

    @register_pass("test_returns_gm", summary="test only", guarantees="none")
    def returns_gm(gm, options):
        return gm

    @register_pass("test_returns_str", summary="test only", guarantees="none")
    def returns_str(gm, options):
        return "done"

    @register_pass("test_silent_change", summary="test only", guarantees="none")
    def silent_change(gm, options):
        output = next(n for n in gm.graph.nodes if n.op == "output")
        with gm.graph.inserting_before(output):
            scaled = gm.graph.call_function(operator.mul, (output.args[0], 1.5))
        output.args = (scaled,)
        return PassResult("someone_else", gm)

    try:
        captured = prepare(Doubler().eval(), inputs="2x4")
        assert not apply_pass(captured.graph_module, "test_returns_gm").changed
        with pytest.raises(PassError, match=r"pass 'test_returns_str' returned 'done' \(a str\), not a PassResult"):
            apply_pass(captured.graph_module, "test_returns_str")
        result = apply_pass(captured.graph_module, "test_silent_change")
        assert result.changed and result.name == "test_silent_change"
        assert result.log == ["changed the graph without reporting it (no note)"]
        verified = optimize(captured, ["test_silent_change"], verify=True)
        assert not verified.pipeline.ok and verified.pipeline.failed_pass == "test_silent_change"
    finally:
        for name in ("test_returns_gm", "test_returns_str", "test_silent_change"):
            PASSES.pop(name)


def test_a_plugin_pass_that_only_swaps_a_weight_is_changed_and_blamed_itself():
    """QA: a plug-in's pass that replaced conv1's weight with a scaled copy left the code as it was: it read
    "changed: no", was not checked as it ran, and under --keep-going the exact fold_bn after it was blamed for its
    difference and rolled back, while the changed weight was verified and written."""
    from fxforge.passes import PASSES, register_pass

    @register_pass("test_swaps_a_weight", summary="test only", guarantees="none")
    def swaps_a_weight(gm, options):
        gm.conv1.weight = nn.Parameter(gm.conv1.weight.detach() * 1.001, requires_grad=False)
        return gm

    try:
        captured = prepare("demo")
        result = apply_pass(captured.graph_module, "test_swaps_a_weight")
        assert result.changed and "replaced stored tensors without reporting it" in result.log[0]
        ran = optimize(captured, ["test_swaps_a_weight", "fold_bn"], verify=True, keep_going=True)
        assert [step.result.name for step in ran.pipeline.rolled_back] == ["test_swaps_a_weight"]
        assert "last rewritten by pass 'test_swaps_a_weight'" in ran.pipeline.rolled_back[0].rolled_back
        assert ran.pipeline.ok
    finally:
        PASSES.pop("test_swaps_a_weight")


def test_a_plugin_raising_a_base_exception_is_one_internal_error_line(capsys, user_files, monkeypatch):
    """QA: a plug-in pass raising a BaseException subclass (GeneratorExit, a class of its own) gave a traceback."""
    from fxforge.errors import EXIT_INTERNAL

    monkeypatch.chdir(user_files)
    (user_files / "halting.py").write_text(
        "class Halt(BaseException):\n    pass\n\n\ndef halt(gm):\n    raise Halt('the plug-in stops here')\n"
    )
    code, _, err = run(capsys, "optimize", "model.py:Doubler", "--input", "2x4", "--passes", "halting.py:halt")
    assert code == EXIT_INTERNAL and "Traceback" not in err
    # the plug-in is named, not fxforge asked to be reported (QA: "internal error: Halt")
    first = err.strip().splitlines()[0]
    assert first == "error: pass 'halt' (from file halting.py) crashed: Halt: the plug-in stops here", err
    # and a plug-in's options dataclass that crashes names the plug-in too, before any pass runs
    (user_files / "badopts.py").write_text(
        "import dataclasses\nfrom fxforge.passes import PassResult, register_pass\n\n\n@dataclasses.dataclass\n"
        "class Opts:\n    level: int = 1\n\n    def __post_init__(self):\n        raise RuntimeError('no level')\n\n\n"
        "@register_pass('badopts', summary='x', guarantees='x', options=Opts)\ndef badopts(gm, options):\n"
        "    return PassResult('badopts', gm)\n"
    )
    code, _, err = run(capsys, "optimize", "model.py:Doubler", "--input", "2x4", "--passes", "badopts.py:badopts")
    assert code == EXIT_INTERNAL
    assert "pass 'badopts' (from file badopts.py) crashed building its options: RuntimeError: no level" in err


def test_report_takes_a_pass_from_a_file_as_optimize_does(user_files):
    """QA: optimize -p my_passes.py:double_to_add worked; report -p refused it as an unknown pass."""
    page = user_files / "page.html"
    spec, plugin = f"{user_files}/model.py:Doubler", f"{user_files}/my_passes.py:double_to_add"
    assert main(["report", spec, "-i", "2x4", "-p", plugin, "-o", str(page)]) == EXIT_OK
    assert "double_to_add" in page.read_text()
