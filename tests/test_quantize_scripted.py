"""The int8 model as frozen TorchScript (fxforge.quantize.scripted): what optimize --auto writes for its int8
candidate and bench times. Kept only where the trace computes the GraphModule's bits; never where a trace could
have fixed a branch of the user's code."""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn

from fxforge.auto import Budget, auto_optimize
from fxforge.capture import capture
from fxforge.errors import EXIT_USAGE
from fxforge.models import load_model
from fxforge.quantize import frozen_torchscript, int8_backend

torchvision = pytest.importorskip("torchvision")


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_large"])
def test_a_torchvision_int8_model_traces_to_the_same_bits(name):
    """resnet18 (quantized add_relu, whose scales convert_fx keeps as tensor attributes) and mobilenet_v3_large
    (quantized Hardswish, whose module reads its scale tensor as a number): both trace, at batch 1 and 2."""
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, num_classes=10).eval()
    example = (torch.randn(1, 3, 64, 64),)
    int8 = int8_backend(capture(model, example), 1)
    code_before = int8.code
    scripted, how = frozen_torchscript(int8, example)
    assert scripted is not None, how
    assert isinstance(scripted, torch.jit.ScriptModule) and "at batch 1 and 2" in how
    other = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(scripted(other), int8(other))
    assert int8.code == code_before  # the scales were written into a copy of the graph, not the caller's
    assert any(isinstance(getattr(int8, name), torch.Tensor) for name in dir(int8) if name.endswith("_scale_0"))
    quantized_with_scales = [m for m in int8.modules() if isinstance(m._buffers.get("scale"), torch.Tensor)]
    assert (name == "mobilenet_v3_large") == bool(quantized_with_scales)  # its Hardswish modules: still tensors


class _SignGate(nn.Module):
    """Branches on a value computed from its input: a trace would keep the branch of the example."""

    def forward(self, x):
        return x * 2 if x.mean().item() > 0 else x - 1


def test_a_leaf_of_the_users_code_is_not_traced():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), _SignGate(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)).eval()
    example = (torch.randn(1, 3, 8, 8),)
    int8 = int8_backend(capture(model, example, leaf_modules=[_SignGate]), 1)
    scripted, how = frozen_torchscript(int8, example)
    assert scripted is None
    assert how == "it calls 1 (_SignGate), whose Python a trace cannot see into"  # the leaf, as the graph names it


def test_a_branch_on_a_tensor_value_is_not_kept():
    """Straight-line code of torch's own that reads a tensor as a bool: the trace warns, and is not kept."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    positive = graph.call_function(bool, (graph.call_function(torch.gt, (graph.call_method("sum", (x,)), 0)),))
    graph.output(graph.call_function(torch.mul, (x, positive)))
    module = fx.GraphModule(nn.Module(), graph)
    scripted, how = frozen_torchscript(module, (torch.ones(2, 3),))
    assert scripted is None and how.startswith("its trace fixed a value read from a tensor"), how


class _Halves(nn.Module):
    """Splits its sequence in halves: the split size is a number computed from the input's shape."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        first, second = self.fc(x).split(x.shape[1] // 2, dim=1)
        return first.mean(1) - second.mean(1)


def test_a_number_read_from_the_input_is_not_fixed_in_a_trace():
    """QA: the trace fixed the split size of the example's sequence length (6 -> 3), checked only at other batch
    sizes: silently wrong at length 4, failing at 8. A tensor read as a number (not a constant of the int8 graph,
    which is written in first) is refused."""
    torch.manual_seed(0)
    example = (torch.randn(1, 6, 16),)
    int8 = int8_backend(capture(_Halves().eval(), example), 1)
    with torch.no_grad():
        int8(torch.randn(2, 4, 16))  # the GraphModule itself runs at another length
    scripted, how = frozen_torchscript(int8, example)
    assert scripted is None and how.startswith("its trace fixed a value read from a tensor (TracerWarning: Convert")


def test_a_trace_that_computes_other_values_is_not_kept(monkeypatch):
    """The bit-for-bit comparison can fail: a trace made to compute something else is refused, naming the batch."""
    from fxforge.quantize import scripted as scripted_module

    real_trace = torch.jit.trace
    monkeypatch.setattr(torch.jit, "trace", lambda module, inputs, **kw: real_trace(nn.ReLU(), inputs, **kw))
    module = fx.symbolic_trace(nn.Sequential(nn.Identity()))
    result, how = scripted_module.frozen_torchscript(module, (torch.randn(2, 3),))
    assert result is None and how == "its trace computes other values at batch 2"


def test_auto_writes_its_int8_candidate_as_torchscript_that_loads_without_unpickling(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 14 * 14, 10)).eval()
    captured = capture(model, (torch.randn(2, 3, 16, 16),))
    result = auto_optimize(
        captured, tmp_path / "o", backends=["eager", "int8"], budget=Budget(tolerance=10.0), repeats=2
    )
    int8 = next(c for c in result.candidates if c.name == "int8")
    assert int8.status in ("accepted", "chosen"), int8.reason
    assert "model.torchscript.pt" in int8.artifact and int8.load == "torch.jit.load('model.torchscript.pt')"
    assert any("equal bit for bit to the fx GraphModule" in note for note in int8.notes), int8.notes
    if result.chosen == "int8":
        assert sorted(p.name for p in (tmp_path / "o").iterdir() if p.name.startswith("model")) == [
            "model.torchscript.pt"
        ]
        loaded = load_model(str(tmp_path / "o"), trust_pickle=False)  # no pickle: no opt-in needed
        x = torch.randn(5, 3, 16, 16)
        scripted = torch.jit.load(str(tmp_path / "o" / "model.torchscript.pt"))
        with torch.no_grad():
            assert torch.equal(loaded.module(x), scripted(x))


def test_quantize_writes_the_torchscript_beside_the_pickle_and_loads_it_without_trust(tmp_path, capsys):
    from fxforge.cli import main

    out = tmp_path / "q"
    assert main(["quantize", "demo", "--calib", "random:2", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "deprecated" not in err  # torch.jit.save/load warn on every call: not a stray line of ours
    assert (out / "model.pt").is_file() and (out / "model.torchscript.pt").is_file()
    untrusted, trusted = load_model(str(out)), load_model(str(out), trust_pickle=True)
    assert untrusted.file == "model.torchscript.pt" and trusted.file == "model.pt"  # the GraphModule, to inspect
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(untrusted.module(x), trusted.module(x))


def test_quantize_of_a_graph_calling_user_code_writes_no_torchscript_and_says_why(tmp_path):
    import fxforge

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), _SignGate(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)).eval()
    captured = capture(model, (torch.randn(1, 3, 8, 8),), leaf_modules=[_SignGate])
    result = fxforge.quantize(captured, "static", calibration="random:2", output_dir=tmp_path / "q")
    assert not (tmp_path / "q" / "model.torchscript.pt").exists() and (tmp_path / "q" / "model.pt").is_file()
    assert "no model.torchscript.pt: it calls 1 (_SignGate), whose Python a trace cannot see into" in " ".join(
        result.notes
    )


def test_loading_an_int8_torchscript_prints_no_stray_warning(tmp_path):
    """QA: every command loading an int8 model.torchscript.pt printed torch's raw "[W... Quantizer.cpp:111] Warning:
    torch.quantize_per_tensor ... deprecated" line: TorchScript's loader makes the first quantized tensor, where no
    Python filter sees the warning. A fresh process, as a user's command is."""
    import subprocess
    import sys

    from fxforge.cli import main

    assert main(["quantize", "demo", "--calib", "random:2", "-o", str(tmp_path / "q")]) == 0
    script = (
        "import torch, fxforge\n"
        f"model = fxforge.load_model({str(tmp_path / 'q')!r}).module\n"
        "print(tuple(model(torch.randn(2, 3, 32, 32)).shape))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "(2, 10)", done.stderr
    assert "Warning" not in done.stderr and "deprecated" not in done.stderr, done.stderr


def _branchy(x):
    if x.mean() > 0:  # a branch on a value: capture keeps this function as one call (--wrap)
        return x * 2
    return x - 1


class _WrapNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 4, 3), nn.Linear(4, 5)

    def forward(self, x):
        return self.fc(_branchy(self.conv(x)).mean((2, 3)))


def test_int8_of_a_graph_calling_a_wrapped_function_is_written_as_a_pickle_that_reloads(tmp_path):
    """QA: the int8 candidate of a model captured with --wrap never built ("the written int8 artifact does not load
    and run: symbolically traced variables cannot be used as inputs to control flow"): torch.load rebuilt the
    GraphModule by tracing into the wrapped function. It is not traced (a trace would fix the branch), and its
    pickle names fxforge's rebuild tracer, as quantize's does."""
    torch.manual_seed(0)
    captured = capture(_WrapNet().eval(), (torch.randn(1, 3, 8, 8),), autowrap_functions=[_branchy])
    result = auto_optimize(captured, tmp_path / "o", backends=["int8"], budget=Budget(tolerance=10.0), repeats=2)
    int8 = next(c for c in result.candidates if c.name == "int8")
    assert int8.status in ("accepted", "chosen"), int8.reason
    assert "model.pt" in int8.artifact and "model.torchscript.pt" not in int8.artifact
    assert any(note.startswith("the int8 GraphModule is saved as it is: it calls _branchy()") for note in int8.notes)


class _ScaledBySequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.second(self.first(x) * (x.size(1) ** -0.5))


def test_a_size_of_the_input_used_as_a_number_is_not_traced():
    """QA: ``x.size(1) ** -0.5`` traced as a float32 pow of a tensor, where the GraphModule computes a Python double:
    the file was one ulp off at sequence lengths 6, 7 and 24 only, so no check at a few shapes could be trusted to
    see it. A trace computing with a size other than to make another size is refused; sizes that only shape
    (reshape) are not."""
    torch.manual_seed(0)
    example = (torch.randn(2, 8, 16),)
    int8 = int8_backend(capture(_ScaledBySequence().eval(), example), mode="dynamic")
    scripted, how = frozen_torchscript(int8, example)
    assert scripted is None
    assert how == "its trace computes with a size of the input as a tensor (aten::pow), not as Python does"

    class Reshaped(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.Linear(16, 16)

        def forward(self, x):
            return self.first(x).reshape(x.shape[0], -1)

    int8 = int8_backend(capture(Reshaped().eval(), example), mode="dynamic")
    scripted, how = frozen_torchscript(int8, example)
    assert scripted is not None, how
    other = torch.randn(3, 5, 16)
    with torch.no_grad():
        assert torch.equal(scripted(other), int8(other))


def test_a_quantize_output_without_the_opt_in_names_its_pickled_graph(tmp_path, capsys):
    """QA: inspect/lint of a quantize output without --trust-pickle now loaded the TorchScript and said it cannot be
    captured, no longer that the directory's model.pt is the graph, with the opt-in."""
    from fxforge.cli import main

    assert main(["quantize", "demo", "--calib", "random:2", "-o", str(tmp_path / "q")]) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "q")]) == EXIT_USAGE  # as for a QAT output, whose only model is model.pt
    err = " ".join(capsys.readouterr().err.split())
    assert "hint: if you trust it, pass --trust-pickle" in err
    assert "error: the directory's fx graph is model.pt, a pickled module, loaded only with --trust-pickle" in err
    assert main(["quantize", "demo", "--mode", "qat-prepare", "-o", str(tmp_path / "qat")]) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "qat")]) == EXIT_USAGE
    assert "--trust-pickle" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "q"), "--trust-pickle"]) == 0


def test_debug_refuses_a_torchscript_model_it_cannot_watch(tmp_path, capsys):
    """QA: debug --nan of a quantize output without the opt-in (its TorchScript) said "no NaN or Inf in any
    module's output (0 modules, 1 case)": it had watched nothing."""
    from fxforge.cli import main

    assert main(["quantize", "demo", "--calib", "random:2", "-o", str(tmp_path / "q")]) == 0
    capsys.readouterr()
    assert main(["debug", str(tmp_path / "q"), "--nan"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: debug cannot watch a RecursiveScriptModule: none of its modules takes forward hooks")
    assert main(["debug", str(tmp_path / "q"), "--nan", "--trust-pickle"]) == 0


def test_a_timm_int8_model_traces_and_a_transformers_one_is_refused_by_name():
    """Beyond torchvision: timm's resnet18 (random weights) traces to the same bits at another batch size; a BERT
    captured with torch.export gets dynamic int8 on the model's own module, which is not traced, and the note says
    why instead of naming the model as code of the user's."""
    from fxforge.models import load_model as load_spec

    pytest.importorskip("timm")
    torch.manual_seed(0)
    example = (torch.randn(1, 3, 64, 64),)
    int8 = int8_backend(capture(load_spec("timm:resnet18").module.eval(), example), 1)
    scripted, how = frozen_torchscript(int8, example)
    assert scripted is not None, how
    other = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(scripted(other), int8(other))

    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37, vocab_size=99
    )
    ids = (torch.randint(0, 99, (1, 8)),)
    bert = int8_backend(capture(transformers.BertModel(config).eval(), ids, method="export"))
    scripted, how = frozen_torchscript(bert, ids)
    assert scripted is None
    assert how == "it is not an fx graph but the BertModel module's own code, which a trace would fix"
