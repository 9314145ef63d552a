"""Capture on models that are hard to capture (tests/tricky_models.py), on transformers' BERT, a timm
model and a meta-device model. Each case either captures correctly (same outputs, and the record says
how) or fails with a CaptureError that names the user's source line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torchvision
from torchvision.utils import make_grid

from fxforge.api import prepare
from fxforge.capture import EXPORT, LOADED, SYMBOLIC_TRACE, Captured, capture
from fxforge.errors import CaptureError, FxforgeError, InputSpecError, format_location
from fxforge.graphs import ATEN, TORCH
from fxforge.inputs import InputSpec, make_inputs
from fxforge.models import load_model
from fxforge.verify import compare_outputs

TRICKY = Path(__file__).parent / "tricky_models.py"
USER_MODULE = "fxforge_user_tricky_models"  # the module name load_model gives tricky_models.py


@pytest.fixture(autouse=True)
def _fixed_seed() -> None:
    torch.manual_seed(0)  # every test draws the same random tensors, run alone or in any order


def load(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return load_model(f"{TRICKY}:{name}").module


def line_of(mark: str) -> int:
    """The line number in tricky_models.py of the line carrying ``# MARK:<mark>``."""
    for number, line in enumerate(TRICKY.read_text().splitlines(), start=1):
        if f"# MARK:{mark}" in line:
            return number
    raise AssertionError(f"no MARK:{mark} in {TRICKY}")


def x(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 8, generator=torch.Generator().manual_seed(batch))


def assert_same_outputs(model: torch.nn.Module, captured: Captured, *args: Any, **kwargs: Any) -> None:
    """The model and the captured graph give the same outputs (the test's own check, not capture's)."""
    copy = torch.utils._pytree.tree_map_only(torch.Tensor, torch.clone, (args, kwargs))
    with torch.no_grad():
        expected = model(*args, **kwargs)
        actual = captured.graph_module(*copy[0], **copy[1])
    comparison = compare_outputs(expected, actual)
    assert comparison.ok, comparison.problems


def call_nodes(captured: Captured, op: str) -> list[str]:
    return [str(n.target) for n in captured.graph_module.graph.nodes if n.op == op]


# --------------------------------------------------------------------------------------------------
# data-dependent control flow


def test_branch_in_submodule_becomes_leaf():
    model = load("SubmoduleBranch")
    captured = capture(model, x())
    record = captured.record
    assert record.method == SYMBOLIC_TRACE and record.dialect == TORCH
    assert record.leaves == ["gate"] and record.wrapped == []
    assert record.ok and len(record.checks) == 1
    assert "gate" in call_nodes(captured, "call_module")
    [attempt] = record.attempts
    assert attempt.action == "made gate a leaf module"
    assert attempt.location is not None and f"tricky_models.py:{line_of('gate-branch')}" in attempt.location
    # both branches of the leaf still work: the leaf runs the module's own Python code
    assert_same_outputs(model, captured, x())
    assert_same_outputs(model, captured, -100 * torch.ones(2, 8))


def test_a_leaf_name_that_names_no_submodule_is_an_error_with_close_names():
    """The tracer ignores a leaf name it never meets: capturing as if --leaf had not been given hid the typo."""
    model = load("SubmoduleBranch")
    assert capture(model, x(), leaf_modules=["gate"]).record.ok  # a real name: fine
    with pytest.raises(FxforgeError, match="'gat' names no submodule") as info:
        capture(model, x(), leaf_modules=["gat"])
    assert info.value.hint == "did you mean gate?" and not isinstance(info.value, CaptureError)
    torchvision = pytest.importorskip("torchvision")
    resnet = torchvision.models.resnet18().eval()
    with pytest.raises(FxforgeError, match=r"'layer1\.O' names no submodule") as info:  # a letter O for a zero
        capture(resnet, (torch.randn(1, 3, 32, 32),), leaf_modules=["layer1.O"])
    assert "layer1.0" in info.value.hint
    assert capture(resnet, (torch.randn(1, 3, 32, 32),), leaf_modules=["layer1.0"]).record.ok


def test_branch_in_root_forward_is_a_clear_capture_error():
    model = load("RootBranch")
    with pytest.raises(CaptureError) as info:
        capture(model, x())
    error = info.value
    assert error.location is not None
    assert f"tricky_models.py:{line_of('root-branch')}" in error.location
    assert "if y.sum() > 0" in error.location  # the source line itself
    assert "data-dependent control flow" in error.message
    assert error.location in error.message
    assert "torch.where" in error.hint or "torch.cond" in error.hint
    assert {a.strategy for a in error.attempts} == {SYMBOLIC_TRACE, EXPORT}
    assert "\n" not in str(error)  # one line for the CLI


def test_capture_error_names_the_line_that_blocked_capture():
    """The submodule's branch was worked around with a leaf; the root's branch is what stopped capture."""
    with pytest.raises(CaptureError) as info:
        capture(load("GateThenRootBranch"), x())
    assert f"tricky_models.py:{line_of('late-root-branch')}" in info.value.location
    assert info.value.attempts[0].action == "made gate a leaf module"


def test_branch_in_root_with_symbolic_trace_only():
    with pytest.raises(CaptureError) as info:
        capture(load("RootBranch"), x(), method="symbolic_trace")
    assert [a.strategy for a in info.value.attempts] == [SYMBOLIC_TRACE]
    assert f"tricky_models.py:{line_of('root-branch')}" in info.value.location


def test_export_alone_cannot_keep_a_data_dependent_branch_in_a_submodule():
    with pytest.raises(CaptureError) as info:
        capture(load("SubmoduleBranch"), x(), method="export")
    assert f"tricky_models.py:{line_of('gate-branch')}" in info.value.location
    assert "data-dependent control flow" in info.value.message


def test_loop_over_batch_falls_back_to_export():
    model = load("BatchLoop")
    captured = capture(model, x())
    record = captured.record
    assert record.method == EXPORT and record.dialect == ATEN
    assert record.attempts[0].strategy == SYMBOLIC_TRACE
    assert "range(x.size(0))" in record.attempts[0].location
    assert record.ok
    assert_same_outputs(model, captured, x())


@pytest.mark.parametrize("batch", [1, 2])
def test_loop_over_batch_with_check_batch_reports_the_baked_batch(batch: int):
    captured = capture(load("BatchLoop"), x(batch), check_batch=3)
    first, other = captured.record.checks
    assert first.ok and first.batch is None
    assert other.batch == 3 and not other.ok and other.message  # the unrolled loop only fits `batch` rows
    assert not captured.record.ok
    # the guard says which batch the graph holds for; the line of the loop says why
    assert "torch.export fixed the batch size at" in other.message and "range(x.size(0))" in other.message


class _SqueezedLength(torch.nn.Module):
    def forward(self, x):
        y = x.squeeze()
        return y * len(y)


def test_a_batch_one_example_the_model_squeezes_is_captured_for_batch_one():
    """QA: traced for any batch, torch.export takes the batch to be other than 1, so ``x.squeeze()`` kept the batch
    dimension the model drops at batch 1 and the graph differed on the example itself: nothing was captured, and
    the error blamed "Python values". The program for the example's batch computes it; the other batch says why
    it does not run there."""
    model, example = _SqueezedLength(), torch.randn(1, 3, 4)
    captured = capture(model, (example,), check_batch=4)
    assert captured.record.method == EXPORT
    example_check, at_four = captured.record.checks[:2]
    assert example_check.ok and at_four.batch == 4 and not at_four.ok and "Guard failed" in at_four.message
    assert any(note.startswith("captured for batch 1 only") for note in captured.record.notes)
    assert_same_outputs(model, captured, example)


def test_shape_arithmetic_traces_and_stays_batch_agnostic():
    model = load("ShapeArithmetic")
    captured = capture(model, x(), check_batch=5)
    assert captured.record.method == SYMBOLIC_TRACE and captured.record.attempts == []
    assert captured.record.ok and [c.batch for c in captured.record.checks] == [None, 5, 1]
    assert_same_outputs(model, captured, x(7))


def test_len_of_a_tensor():
    model = load("LenOfTensor")
    captured = capture(model, x())
    assert captured.record.method == EXPORT
    assert "'len' is not supported" in captured.record.attempts[0].error
    assert "len(x)" in captured.record.attempts[0].location
    assert captured.record.ok
    assert_same_outputs(model, captured, x())


@pytest.mark.parametrize("batch", [1, 2])
def test_export_keeps_the_batch_dynamic(batch: int):
    """A batch-agnostic model captured by torch.export on batch 1 must not be specialised to batch 1."""
    model = load("TupleOut")
    captured = capture(model, x(batch), method="export", check_batch=3)
    assert captured.record.method == EXPORT
    assert captured.record.ok, captured.record.checks
    assert_same_outputs(model, captured, x(4))


# --------------------------------------------------------------------------------------------------
# helper functions


@pytest.mark.parametrize(
    "name,helper", [("HelperBranch", "rescale"), ("PrivateHelperBranch", "_private_shift")], ids=["public", "private"]
)
def test_branching_helper_function_is_wrapped(name: str, helper: str):
    model = load(name)
    captured = capture(model, x())
    record = captured.record
    assert record.method == SYMBOLIC_TRACE
    # a function of a file fxforge imported is named as the user knows it: file:function
    assert record.wrapped == [f"tricky_models.py:{helper}"] and record.leaves == []
    assert record.attempts[0].action == f"wrapped tricky_models.py:{helper} as one call"
    assert record.ok
    wrapped = [n for n in captured.graph_module.graph.nodes if n.op == "call_function" and n.target.__name__ == helper]
    assert len(wrapped) == 1
    assert_same_outputs(model, captured, x())
    assert_same_outputs(model, captured, 0.001 * x())  # the other branch
    # the helper is restored in the user's module after capture
    module_globals = type(model).forward.__globals__
    assert module_globals[helper].__module__ == USER_MODULE and not hasattr(module_globals[helper], "__wrapped__")


def test_user_given_autowrap_function():
    model = load("HelperBranch")
    helper = type(model).forward.__globals__["rescale"]
    captured = capture(model, x(), autowrap_functions=[helper])
    assert captured.record.attempts == []  # nothing failed: the helper was wrapped from the start
    assert captured.record.wrapped == ["tricky_models.py:rescale"]
    assert captured.record.ok


# --------------------------------------------------------------------------------------------------
# structured inputs and outputs


def test_dict_input_and_dict_tuple_output():
    model = load("DictIO")
    inputs = {"a": torch.randn(2, 8), "b": torch.randn(2, 6)}
    captured = capture(model, (inputs,))
    assert captured.record.method == SYMBOLIC_TRACE and captured.record.ok
    with torch.no_grad():
        out = captured.graph_module(inputs)
    assert set(out) == {"sum", "parts"} and isinstance(out["parts"], tuple) and len(out["parts"]) == 2
    assert_same_outputs(model, captured, inputs)


def test_dict_input_with_export():
    model = load("DictIO")
    inputs = {"a": torch.randn(1, 8), "b": torch.randn(1, 6)}
    captured = capture(model, (inputs,), method="export", check_batch=2)
    assert captured.record.method == EXPORT and captured.record.ok, captured.record.checks
    assert_same_outputs(model, captured, inputs)


def test_tuple_output():
    model = load("TupleOut")
    captured = capture(model, x())
    assert captured.record.method == SYMBOLIC_TRACE and captured.record.ok
    assert_same_outputs(model, captured, x())


@pytest.mark.parametrize("method", ["auto", "export"])
def test_keyword_inputs(method: str):
    model = load("KwargsModel")
    mask = torch.rand(2, 8, generator=torch.Generator().manual_seed(0)) > 0.5
    kwargs = {"mask": mask}
    captured = capture(model, x(), example_kwargs=kwargs, method=method, check_batch=3)
    assert captured.record.method == (SYMBOLIC_TRACE if method == "auto" else EXPORT)
    assert captured.record.ok, captured.record.checks  # the mask is resized to batch 3 with x
    assert [c.batch for c in captured.record.checks] == [None, 3, 1]  # and batch 1
    assert captured.example_kwargs.keys() == kwargs.keys() and torch.equal(captured.example_kwargs["mask"], mask)
    assert captured.example_kwargs["mask"] is not mask  # a copy: nothing fxforge runs can write into the caller's
    assert_same_outputs(model, captured, x(), mask=mask)
    with torch.no_grad():
        out = captured.graph_module(x(), mask=mask)
    assert (out[mask] == 0).all()


def test_keyword_inputs_map_onto_placeholders():
    model = load("KwargsModel")
    mask = torch.zeros(2, 8, dtype=torch.bool)
    captured = capture(model, x(), example_kwargs={"mask": mask})
    values = captured.flat_inputs()
    assert values[0] is captured.example_inputs[0] and values[1] is captured.example_kwargs["mask"]
    assert values[2] == 1.0  # `scale` takes its default
    with pytest.raises(InputSpecError):
        captured.flat_inputs(args=(), kwargs={})  # no value for x


# --------------------------------------------------------------------------------------------------
# reuse, in-place ops and state


@pytest.mark.parametrize("method", ["auto", "export"])
def test_submodule_used_twice(method: str):
    from fxforge.inspect import inspect_graph

    model = load("SharedBlock")
    captured = capture(model, x(), method=method)
    assert captured.record.ok
    if method == "auto":
        assert call_nodes(captured, "call_module").count("block.lin") == 2
    report = inspect_graph(captured)
    assert report.totals["params"] == sum(p.numel() for p in model.parameters()) == 8 * 8 + 8 + 8 * 2 + 2
    block = next(m for m in report.modules if m.path == "block")
    assert block.params == 72 and block.flops == 2 * 2 * (2 * 8 * 8)  # two calls of an 8x8 linear on 2 rows
    assert_same_outputs(model, captured, x())


def test_in_place_ops():
    model = load("InPlace")
    captured = capture(model, x())
    assert captured.record.method == SYMBOLIC_TRACE and captured.record.ok
    assert {"relu_", "mul_", "clamp_"} <= set(call_nodes(captured, "call_method"))
    assert_same_outputs(model, captured, x())


def test_model_writing_into_its_input():
    """Each run (eager reference, captured graph) gets its own copy of the inputs, so the check compares
    like with like, and the caller's inputs are left alone."""
    model = load("InputMutation")
    inputs = torch.ones(2, 8)
    captured = capture(model, inputs, check_batch=3)
    assert captured.record.method == SYMBOLIC_TRACE
    assert captured.record.ok, captured.record.checks
    assert torch.equal(inputs, torch.ones(2, 8))
    assert_same_outputs(model, captured, torch.ones(2, 8))


@pytest.mark.parametrize("method", ["auto", "export"])
def test_buffer_mutated_in_forward(method: str):
    model = load("CallCounter")
    captured = capture(model, x(), method=method, check_batch=3)
    assert captured.record.ok, captured.record.checks
    # neither tracing nor checking changed the model's state
    assert model.calls.item() == 0
    # the graph keeps the write: each call increments the counter, as the model does
    with torch.no_grad():
        first = captured.graph_module(x())
        second = captured.graph_module(x())
    assert torch.allclose(second, 2 * first)
    with torch.no_grad():
        model.calls.zero_()
        expected = model(x())
    assert torch.allclose(first, expected)


def test_nan_in_a_buffer_is_not_a_write():
    model = load("NaNBuffer")
    captured = capture(model, x())
    assert captured.record.method == SYMBOLIC_TRACE and captured.record.attempts == []
    assert captured.record.ok
    assert_same_outputs(model, captured, x())


def test_custom_autograd_function():
    model = load("CustomFunction")
    captured = capture(model, x())
    assert captured.record.method == SYMBOLIC_TRACE and captured.record.ok
    assert_same_outputs(model, captured, x())


def test_user_leaf_module_by_name():
    model = load("TwoBlocks")
    captured = capture(model, x(), leaf_modules=["first"])
    modules = call_nodes(captured, "call_module")
    assert "first" in modules and "second" not in modules and "second.lin" in modules
    assert captured.record.leaves == []  # only automatic leaves are recorded
    assert captured.record.ok
    assert_same_outputs(model, captured, x())


def test_user_leaf_module_by_type():
    model = load("TwoBlocks")
    captured = capture(model, x(), leaf_modules=[type(model.first)])
    modules = call_nodes(captured, "call_module")
    assert {"first", "second", "head"} == set(modules)
    assert captured.record.ok
    assert_same_outputs(model, captured, x())


def test_user_leaf_skips_the_automatic_search():
    model = load("SubmoduleBranch")
    captured = capture(model, x(), leaf_modules=["gate"])
    assert captured.record.attempts == [] and captured.record.leaves == []
    assert "gate" in call_nodes(captured, "call_module")


def test_unknown_method_is_refused():
    with pytest.raises(CaptureError, match="unknown capture method"):
        capture(load("TupleOut"), x(), method="jit")


def test_inputs_the_model_rejects_are_an_input_error():
    with pytest.raises(InputSpecError, match="rejected the example inputs"):
        capture(load("TupleOut"), torch.randn(2, 5))


def test_capture_leaves_parameters_shared_and_unchanged():
    model = load("SubmoduleBranch")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    captured = capture(model, x())
    assert captured.graph_module.lin.weight is model.lin.weight
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert captured.record.to_dict()["leaves"] == ["gate"]


def test_loaded_graph_module_is_not_captured_again():
    model = load("TupleOut")
    captured = capture(model, x())
    again = capture(captured.graph_module, x())
    assert again.record.method == LOADED and again.record.dialect == TORCH and again.record.ok


# --------------------------------------------------------------------------------------------------
# real models: transformers, timm, meta device

BERT_CONFIG = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128, vocab_size=100)


@pytest.fixture(scope="module")
def bert():
    pytest.importorskip("transformers")
    return load_model("transformers:BertModel", model_kwargs=BERT_CONFIG)


@pytest.mark.slow  # importing transformers alone takes ~9 s
def test_bert_falls_back_to_export(bert):
    assert bert.default_inputs == [InputSpec((1, 16), torch.int64)]
    inputs = make_inputs(bert.default_inputs)
    with pytest.raises(Exception):  # noqa: B017 - plain symbolic tracing cannot trace BERT
        torch.fx.symbolic_trace(bert.module)
    captured = capture(bert, inputs, check_batch=3)
    record = captured.record
    assert record.method == EXPORT and record.dialect == ATEN
    assert record.attempts and record.attempts[0].strategy == SYMBOLIC_TRACE
    assert record.ok, record.checks  # batch 3 too: torch.export must not specialise the batch of 1
    assert_same_outputs(bert.module, captured, *inputs)
    assert_same_outputs(bert.module, captured, *make_inputs(bert.default_inputs, seed=1, batch=2))


class _AssertsItsRank(torch.nn.Module):
    """timm's BatchNormAct2d: the rank is read for the check and again for its message."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        torch._assert(x.ndim == 4, f"expected 4D input (got {x.ndim}D input)")
        unused_size = x.size()  # noqa: F841 - as unused as the message's read, and as harmless
        return self.norm(x)


def test_metadata_reads_left_by_a_traced_message_are_not_dead_code():
    """QA: timm's mobilenetv3 linted with 34 dead-node warnings (exit 1) in the torch dialect and none in the ATen
    one: formatting ``x.ndim`` into an assert's message records a read nothing uses."""
    from fxforge.lint import lint

    captured = capture(_AssertsItsRank().eval(), (torch.randn(1, 4, 5, 5),), method="symbolic_trace")
    reads = [n for n in captured.graph_module.graph.nodes if n.target is getattr or n.target in ("size", "dim")]
    assert len(reads) == 1 and len(reads[0].users) == 1  # the rank the check compares, kept
    assert not [f for f in lint(captured).findings if f.code == "FX001"]
    # nor is an element of a shape the model unpacks and leaves unused (timm's ViTs: B, N, C = x.shape)
    captured = capture(_UnpacksItsShape(), (torch.randn(2, 3, 4),), method="symbolic_trace")
    assert not [f for f in lint(captured).findings if f.code == "FX001"]
    torch.testing.assert_close(captured.graph_module(torch.ones(2, 3, 4)), torch.full((2, 12), 1.0))


class _UnpacksItsShape(torch.nn.Module):
    def forward(self, x):
        batch, tokens, channels = x.shape  # noqa: RUF059 - channels unused, as in timm's ViTs
        return x.reshape(batch, tokens * 4)


def test_a_transformers_model_traced_symbolically_is_told_to_use_export(bert):
    """QA: the hint pointed to --leaf and torch.fx.wrap, neither of which helps where a transformers decorator stops
    tracing."""
    with pytest.raises(CaptureError) as info:
        capture(bert, make_inputs(bert.default_inputs), method="symbolic_trace")
    assert info.value.hint == "transformers models are captured with torch.export: pass method='export' (or auto)"


@pytest.mark.parametrize(
    "name,size,needs_leaves",
    [("resnet18", 64, False), ("vit_tiny_patch16_224", 224, False), ("mobilevit_xxs", 256, True)],
)
def test_timm_model(name: str, size: int, needs_leaves: bool):
    pytest.importorskip("timm")
    loaded = load_model(f"timm:{name}")
    inputs = make_inputs([InputSpec((1, 3, size, size))])
    captured = capture(loaded, inputs, check_batch=2)
    assert captured.record.method == SYMBOLIC_TRACE and captured.record.ok, captured.record.checks
    # MobileViT's blocks compute patch counts with Python arithmetic on shapes: fxforge makes them leaves
    assert bool(captured.record.leaves) == needs_leaves
    assert_same_outputs(loaded.module, captured, *inputs)


def test_meta_device_model_captures_without_check():
    pytest.importorskip("torchvision")
    loaded = load_model("torchvision:resnet18", device="meta")
    inputs = make_inputs(loaded.default_inputs, device="meta")
    captured = capture(loaded, inputs, check_batch=2)
    assert captured.record.method == SYMBOLIC_TRACE
    assert captured.record.checks == []
    assert any("meta device" in note for note in captured.record.notes)
    assert all(p.device.type == "meta" for p in captured.graph_module.parameters())


def test_quiet_torch_logs_silences_torch_loggers_and_restores_their_levels():
    import logging

    from fxforge.runtime import quiet_torch_logs

    dynamo = logging.getLogger("torch._dynamo")
    user = logging.getLogger("my_app")
    before = dynamo.getEffectiveLevel(), user.getEffectiveLevel()
    with quiet_torch_logs():
        assert dynamo.getEffectiveLevel() == logging.ERROR
        assert user.getEffectiveLevel() == before[1]  # only torch's loggers are touched
    assert (dynamo.getEffectiveLevel(), user.getEffectiveLevel()) == before


def test_torchscript_module_is_refused_with_a_plain_reason():
    scripted = torch.jit.trace(torch.nn.Linear(4, 2).eval(), torch.randn(1, 4))
    with pytest.raises(CaptureError, match="cannot capture a TorchScript module") as caught:
        capture(scripted, (torch.randn(1, 4),))
    assert "verify" in caught.value.hint


def test_a_torchscript_file_without_input_shapes_is_refused_for_what_it_is(tmp_path):
    """QA: `fxforge inspect model.ts.pt` asked for --input; given one, it was refused as TorchScript: the refusal
    comes first."""
    torch.jit.trace(torch.nn.Linear(4, 2).eval(), torch.randn(1, 4)).save(str(tmp_path / "linear.pt"))
    with pytest.raises(CaptureError, match="cannot capture a TorchScript module"):
        prepare(str(tmp_path / "linear.pt"))


def test_user_files_are_told_apart_from_torch_by_folder_not_prefix():
    import json

    import torchvision

    from fxforge.errors import is_user_file

    # torchvision's folder starts with torch's name: it is the model's library, not torch
    assert is_user_file(torchvision.__file__) and not is_user_file(torch.__file__)
    assert not is_user_file(json.__file__) and not is_user_file("<string>")
    assert is_user_file(__file__)


class StringAnnotated(torch.nn.Module):
    """``from __future__ import annotations`` (this file has it) makes forward's annotations strings."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.relu() + 1


def test_string_annotations_do_not_reach_the_graph(tmp_path):
    # fx kept "torch.Tensor" as the placeholder's type; torch 2.11 then could not pickle the GraphModule
    # ("'str' object has no attribute '__name__'"): model.pt of optimize, quantize and split failed there
    captured = capture(StringAnnotated(), (torch.randn(2, 3),), method="symbolic_trace")
    assert StringAnnotated.forward.__annotations__["x"] == "torch.Tensor"  # the premise
    assert all(not isinstance(node.type, str) for node in captured.graph_module.graph.nodes)
    torch.save(captured.graph_module, tmp_path / "model.pt")
    reloaded = torch.load(tmp_path / "model.pt", weights_only=False)
    x = torch.randn(2, 3)
    assert torch.equal(reloaded(x), x.relu() + 1)


def test_capture_of_something_not_a_module_is_one_line():
    with pytest.raises(CaptureError, match=r"capture takes an nn\.Module, not a function"):
        capture(lambda x: x + 1, (torch.randn(2),))


def test_a_transformers_cache_in_the_output_names_use_cache():
    """T5 returns its EncoderDecoderCache, which torch.export cannot flatten; the fix is use_cache=False, not the
    generic --leaf hint."""
    transformers = pytest.importorskip("transformers")
    config = transformers.T5Config(num_layers=1, d_model=32, d_ff=32, num_heads=2, d_kv=16, vocab_size=100)
    ids = torch.randint(0, 100, (1, 8))
    with pytest.raises(CaptureError) as info:
        capture(transformers.T5Model(config).eval(), (), example_kwargs={"input_ids": ids, "decoder_input_ids": ids})
    assert "model_kwargs={'use_cache': False}" in info.value.hint  # the Python API's words: capture() was called
    assert "config.use_cache = False in a factory of your own" in info.value.hint  # a --model-arg it may refuse
    config.use_cache = False
    kwargs = {"input_ids": ids, "decoder_input_ids": ids}
    assert capture(transformers.T5Model(config).eval(), (), example_kwargs=kwargs).record.ok


def test_a_loop_over_an_input_tensor_suggests_the_list_it_may_want():
    """torchvision's detection models loop `for img in images:` over a list of images; given a batched tensor,
    capture stops there, and the hint says what the loop means instead of suggesting torch.where."""

    class LoopsOverImages(torch.nn.Module):
        def forward(self, images: torch.Tensor) -> torch.Tensor:
            sizes = []
            for img in images:
                if img.sum() > 0:  # data-dependent per image
                    sizes.append(img.mean())
            return torch.stack(sizes) if sizes else images.mean()

    with pytest.raises(CaptureError) as info:
        capture(LoopsOverImages(), (torch.randn(2, 3, 4, 4),))
    assert "for img in images:" in info.value.message
    assert "takes a list of tensors" in info.value.hint


def test_a_graph_captured_again_claims_no_output_check_it_could_not_fail():
    """``inspect model.pt2`` printed "check (example batch): outputs match (max abs err 0)": a graph against itself."""
    graph = capture(torch.nn.Sequential(torch.nn.Linear(8, 4)), (torch.randn(2, 8),)).graph_module
    again = capture(graph, (torch.randn(2, 8),), check_batch=3)
    assert again.record.checks == []
    assert "no output check: the model is already a graph (it ran on the inputs and at batch 3)" in again.record.notes
    with pytest.raises(InputSpecError):  # inputs it does not take are still an error
        capture(graph, (torch.randn(2, 9),))


class _ReadsANumber(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = float(x.abs().max())
        return self.fc(x) / max(scale, 1.0)


def test_a_number_read_from_a_tensor_is_not_called_a_branch():
    """No branch on the line that stopped capture: it was 'data-dependent control flow', hinting torch.where."""
    with pytest.raises(CaptureError) as info:
        capture(_ReadsANumber(), (torch.randn(2, 4),))
    message, hint = info.value.message, info.value.hint
    assert "read as a Python number" in message and "control flow" not in message
    assert "float(x.abs().max())" in message and "torch.where" not in hint


def test_torchs_debug_logging_advice_is_left_out_of_the_line_we_quote():
    from fxforge.errors import first_line

    message = 'Constraints violated (batch)! For more information, run with TORCH_LOGS="+dynamic".\nmore detail'
    assert first_line(RuntimeError(message)) == "Constraints violated (batch)!"
    assert first_line(RuntimeError("Guard failed: x.size()[0] == 2")) == "Guard failed: x.size()[0] == 2"


def test_leaves_with_method_export_are_refused_not_ignored():
    """torch.export traces through every submodule: --leaf was silently ignored, and the capture error then advised
    --leaf NAME (QA finding)."""
    model = load("SubmoduleBranch")
    with pytest.raises(FxforgeError, match=r"^leaf_modules applies to symbolic tracing") as info:
        capture(model, x(), method="export", leaf_modules=["gate"])
    assert not isinstance(info.value, CaptureError) and "method='export'" in info.value.hint
    assert capture(model, x(), leaf_modules=["gate"]).record.ok  # auto: traced with the leaf


def test_a_forward_reading_its_keyword_arguments_runs_node_by_node(tmp_path):
    """``forward(self, x, **kwargs)`` reading ``kwargs.get``: torch's Interpreter gives the placeholder a list, so
    inspect said 'the graph failed ... check --input' (exit 2), profile too, and optimize wrote no model.pt2."""
    import fxforge
    from fxforge.profile import profile_model

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x, **kwargs):
            return self.lin(x) * kwargs.get("scale", 2.0)

    captured = capture(Scaled().eval(), (torch.randn(2, 8),), method="symbolic_trace")
    assert fxforge.inspect_graph(captured).totals["flops"] > 0
    assert profile_model(captured, repeats=1, warmup=0, peak=False).nodes
    result = fxforge.optimize(captured, ["fold_bn"], verify=True, output_dir=tmp_path / "out")
    assert result.pipeline.ok and (tmp_path / "out" / "model.pt2").is_file()


@pytest.mark.parametrize("batch", [0, -1])
def test_capture_refuses_a_check_batch_below_one(batch):
    """QA: check_batch=0 or -1 made empty tensors, and the recorded check on them passed."""
    from fxforge.errors import InputSpecError

    with pytest.raises(InputSpecError, match="must be at least 1"):
        capture(torch.nn.Linear(4, 4).eval(), (torch.randn(2, 4),), check_batch=batch)


def test_a_loaded_model_captured_without_inputs_uses_its_default_inputs():
    """QA: capture(load_model('transformers:BertModel')) ignored the token ids the loaded model says it takes and
    failed with an error about BERT's arguments."""
    from fxforge.models import load_model

    loaded = load_model(
        "transformers:BertModel",
        model_kwargs={"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64},
    )
    captured = capture(loaded)
    assert [t.dtype for t in captured.example_inputs] == [torch.int64]
    assert captured.record.checks and captured.record.checks[0].ok


class _TracesAnotherBranch(torch.nn.Module):
    """Under symbolic tracing ``x`` is a Proxy, not a Tensor: the graph records ``x + None``, which fails when run."""

    def forward(self, x):
        if isinstance(x, torch.Tensor):
            return x * 2
        return x + None


def test_a_traced_graph_that_fails_its_check_prints_no_traceback(capsys):
    """QA (transformers SqueezeBert): torch.fx printed its own traceback and an excerpt of the generated forward to
    stderr when capture's check ran the traced graph, before capture fell back to torch.export and succeeded."""
    captured = capture(_TracesAnotherBranch(), (torch.randn(2, 3),))
    assert captured.record.method == EXPORT
    err = capsys.readouterr().err
    assert "Traceback" not in err and "FX-traced Module" not in err, err


class _BatchOneBranch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        if y.shape[0] == 1:
            return y * 100
        return y


def test_check_batch_also_checks_batch_one_where_the_graph_runs_it():
    """QA: torch.export assumes a dynamic batch is at least 2, so ``if y.shape[0] == 1`` was traced as False with no
    guard; checked at batches 2 and 3 only, the graph ran batch 1 without the branch, silently wrong. The check at
    batch 1 now shows it."""
    torch.manual_seed(0)
    captured = capture(_BatchOneBranch().eval(), (torch.randn(2, 8),), check_batch=3)
    checks = {check.batch: check.ok for check in captured.record.checks}
    assert checks == {None: True, 3: True, 1: False}
    plain = capture(torch.nn.Sequential(torch.nn.Linear(8, 8)).eval(), (torch.randn(2, 8),), check_batch=3)
    assert [check.batch for check in plain.record.checks] == [None, 3, 1] and plain.record.ok


def test_a_branch_in_a_helper_called_through_its_module_names_the_wrap_that_works(tmp_path, monkeypatch):
    """QA: ``helpers.gate(x)`` (or ``from helpers import gate as g``) is not wrapped automatically, and the hint
    said torch.where or a submodule, never --wrap helpers.py:gate, which captures it."""
    from fxforge.api import prepare

    (tmp_path / "helpers.py").write_text("def gate(x):\n    if x.sum() > 0:\n        return x * 2\n    return x - 1\n")
    (tmp_path / "net.py").write_text(
        "import helpers\nfrom torch import nn\n"
        "class Net(nn.Module):\n    def forward(self, x):\n        return helpers.gate(x) + 1\n"
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CaptureError) as info:
        prepare("net.py:Net", ["2x4"])
    assert "autowrap_functions=[gate] (fxforge.prepare: wrap='helpers.py:gate')" in info.value.hint
    captured = prepare("net.py:Net", ["2x4"], wrap=["helpers.py:gate"])
    assert captured.record.wrapped == ["helpers.py:gate"]


def test_wrapping_a_decorated_function_is_reported_as_wrapped(tmp_path, monkeypatch):
    """QA: --wrap of a function decorated with functools.wraps captured it as one call, yet the record listed no
    wrap and the note said "the traced code never called it, so wrapping changed nothing"."""
    from fxforge.api import prepare

    (tmp_path / "net.py").write_text(
        "import functools\nfrom torch import nn\n"
        "def deco(f):\n    @functools.wraps(f)\n    def w(*a, **k):\n        return f(*a, **k)\n    return w\n"
        "@deco\ndef gate(x):\n    if x.sum() > 0:\n        return x * 2\n    return x - 1\n"
        "class Net(nn.Module):\n    def forward(self, x):\n        return gate(x) + 1\n"
    )
    monkeypatch.chdir(tmp_path)
    captured = prepare("net.py:Net", ["2x4"], wrap=["net.py:gate"], method="symbolic_trace")
    assert captured.record.wrapped == ["net.py:gate"]
    assert not [note for note in captured.record.notes if "changed nothing" in note]


_GATED_BLOCKS = (
    "from torch import nn\n"
    "class Block(nn.Module):\n"
    "    def __init__(self):\n        super().__init__()\n        self.lin = nn.Linear(4, 4)\n"
    "    def gate(self, x):\n        if x.sum() > 0:\n            return x * 2\n        return x - 1\n"
    "    def forward(self, x):\n        return self.gate(self.lin(x))\n"
    "class Other(nn.Module):\n    def gate(self, x):\n        return x\n"
    "class Net(nn.Module):\n"
    "    def __init__(self):\n        super().__init__()\n        self.a, self.b = Block(), Block()\n"
    "    def forward(self, x):\n        return self.b(self.a(x))\n"
)


def test_wrapping_a_method_of_the_models_modules_keeps_it_as_one_call_on_each(tmp_path, monkeypatch):
    """--wrap net.py:Block.gate was looked up as a global and refused ("the model's code never calls it by name"),
    although capture keeps such a method as one call by itself when it stops the trace: now the user may ask."""
    (tmp_path / "net.py").write_text(_GATED_BLOCKS)
    monkeypatch.chdir(tmp_path)
    captured = prepare("net.py:Net", ["2x4"], wrap=["net.py:Block.gate"], method="symbolic_trace")
    assert captured.record.wrapped == ["a.gate", "b.gate"] and captured.record.attempts == []
    called = [str(n.target) for n in captured.graph_module.graph.nodes if n.op == "call_module"]
    assert called == ["a.lin", "a_gate_method", "b.lin", "b_gate_method"]
    for sign in (1.0, -1.0):  # both branches of the method run as the model's
        x = sign * torch.ones(2, 4)
        assert torch.equal(captured.graph_module(x), captured.original(x))


@pytest.mark.parametrize(
    ("wrapped", "said"),
    [
        ("net.py:Block.forward", "it is the forward of Block: keep a module as one call with --leaf"),
        ("net.py:Other.gate", "it is a method of Other, and no module of this model is one"),
    ],
)
def test_wrapping_a_method_no_module_of_the_model_can_keep_says_why(wrapped, said, tmp_path, monkeypatch):
    (tmp_path / "net.py").write_text(_GATED_BLOCKS)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CaptureError) as info:
        prepare("net.py:Net", ["2x4"], wrap=[wrapped], method="symbolic_trace")
    assert said in info.value.message and "--leaf" in info.value.hint


class _ComputeBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def compute(self, x):
        if x.mean() > 0:
            return self.lin(x)
        return x * 3


class _CallsAMethod(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = _ComputeBlock()

    def forward(self, x):
        return self.block.compute(x) + 1


def test_a_branch_in_a_submodules_other_method_is_kept_as_one_call():
    """A leaf is called through its forward, so block.compute(x), called from the root, stayed traced code and
    capture failed (the hint said to move the code into a submodule's forward): the method is now one call."""
    model = _CallsAMethod().eval()
    captured = capture(model, (torch.randn(2, 8),))
    assert captured.record.method == SYMBOLIC_TRACE and captured.record.ok
    assert captured.record.wrapped == ["block.compute"]
    assert "kept the method block.compute as one call" in captured.record.attempts[0].action
    method_calls = [n for n in captured.graph_module.graph.nodes if n.op == "call_module" and "method" in str(n.target)]
    assert [type(captured.graph_module.get_submodule(n.target)).__name__ for n in method_calls] == ["MethodCall"]
    for sign in (1.0, -1.0):  # both sides of the branch: the method runs, not a traced copy of one side
        x = sign * (torch.rand(2, 8) + 0.1)
        torch.testing.assert_close(captured.graph_module(x), model(x), rtol=0, atol=0)
    assert "compute" not in vars(model.block)  # the stand-in used while tracing is gone from the user's module


class _GatesInAMethod(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.scale = torch.nn.Parameter(torch.full((8,), 2.0))

    def gate(self, x):
        if x.mean() > 0:
            return x * self.scale
        return -x

    def forward(self, x):
        return self.gate(self.lin(x)) + 1


def test_a_branch_in_a_method_of_the_model_itself_is_kept_as_one_call(tmp_path):
    """The model's own methods could be neither leaves nor --wrap functions, and capture failed. The method is one
    MethodCall node; the graph keeps the rest (lin, the add), saves, reloads and computes both branches."""
    model = _GatesInAMethod().eval()
    captured = capture(model, (torch.randn(2, 8),))
    assert captured.record.method == SYMBOLIC_TRACE and captured.record.wrapped == ["_GatesInAMethod.gate"]
    targets = [str(n.target) for n in captured.graph_module.graph.nodes if n.op == "call_module"]
    assert targets == ["lin", "gate_method"]
    # the parameter only the method reads is the graph's too (moved, saved and counted with it), once
    assert sum(p.numel() for p in captured.graph_module.parameters()) == sum(p.numel() for p in model.parameters())
    path = tmp_path / "model.pt"
    torch.save(captured.graph_module, path)
    reloaded = torch.load(path, weights_only=False)
    for sign in (1.0, -1.0):
        x = sign * (torch.rand(2, 8) + 0.1)
        expected = model(x)
        torch.testing.assert_close(captured.graph_module(x), expected, rtol=0, atol=0)
        torch.testing.assert_close(reloaded(x), expected, rtol=0, atol=0)
    assert "gate" not in vars(model)


class _SelfNamedOtherwise(torch.nn.Module):
    """``self`` is a convention: this model calls it ``this``."""

    def __init__(this):
        super().__init__()
        this.lin = torch.nn.Linear(8, 8)

    def gate(this, x):
        if x.mean() > 0:
            return torch.relu(x)
        return -x

    def forward(this, x):
        return this.gate(this.lin(x))


def _helper_taking_a_module(block, x):
    if x.mean() > 0:  # a helper's branch: the helper is wrapped, its module argument is not taken for its self
        return block(x)
    return -x


class _HelperCaller(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return _helper_taking_a_module(self.lin, x)


def test_a_method_is_kept_as_one_call_whatever_its_first_argument_is_named():
    """QA: with ``def gate(this, x)`` the method was never kept as one call and capture failed on its branch."""
    model = _SelfNamedOtherwise().eval()
    captured = capture(model, (torch.randn(2, 8),))
    assert captured.record.method == SYMBOLIC_TRACE and captured.record.wrapped == ["_SelfNamedOtherwise.gate"]
    for sign in (1.0, -1.0):
        x = sign * (torch.rand(2, 8) + 0.1)
        torch.testing.assert_close(captured.graph_module(x), model(x), rtol=0, atol=0)
    helper = capture(_HelperCaller().eval(), (torch.randn(2, 8),))
    assert helper.record.method == SYMBOLIC_TRACE and helper.record.wrapped == [
        f"{__name__}._helper_taking_a_module"
    ], helper.record


class _StaticGate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    @staticmethod
    def gate(x):
        if x.mean() > 0:
            return x * 2
        return -x

    def forward(self, x):
        return self.gate(self.lin(x)) + 1


class _ClassGate(_StaticGate):
    scale = 3.0

    @classmethod
    def gate(cls, x):
        if x.mean() > 0:
            return x * cls.scale
        return -x


class _DecoratedStaticGate(_StaticGate):
    @staticmethod
    @torch.no_grad()
    def gate(x):
        if x.mean() > 0:
            return x * 2
        return -x


class _StaticGateByClassName(_StaticGate):
    def forward(self, x):
        return _StaticGate.gate(self.lin(x)) + 1


class _ClassGateByClassName(_ClassGate):
    def forward(self, x):
        return _ClassGateByClassName.gate(self.lin(x)) + 1


class _HoldsAStaticGate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block, self.head = _StaticGate(), torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.block(x))


@pytest.mark.parametrize(
    "model_type, kept",
    [
        (_StaticGate, "wrapped"),
        (_ClassGate, "wrapped"),
        (_DecoratedStaticGate, "wrapped"),
        (_StaticGateByClassName, "wrapped"),
        (_ClassGateByClassName, "wrapped"),
        (_HoldsAStaticGate, "leaves"),
    ],
)
def test_a_branch_in_a_static_or_class_method_is_kept_as_a_method_is(tmp_path, model_type, kept):
    """QA: the same branch in a @staticmethod failed the capture ("stopped at ...: data-dependent control flow"),
    where as a method it was kept as one call; in a submodule, the submodule becomes a leaf, as for a method."""
    model = model_type().eval()
    captured = capture(model, (torch.randn(2, 8),))
    assert captured.record.method == SYMBOLIC_TRACE
    expected_kept = {"wrapped": [f"{model_type.__name__}.gate"], "leaves": ["block"]}[kept]
    assert getattr(captured.record, kept) == expected_kept
    torch.save(captured.graph_module, tmp_path / "model.pt")
    reloaded = torch.load(tmp_path / "model.pt", weights_only=False)
    for sign in (1.0, -1.0):
        x = sign * (torch.rand(2, 8) + 0.1)
        torch.testing.assert_close(captured.graph_module(x), model(x), rtol=0, atol=0)
        torch.testing.assert_close(reloaded(x), model(x), rtol=0, atol=0)
    assert "gate" not in vars(model)
    # the classes are as they were: the class-name call (``Model.gate(x)``) was recorded through a patch of the class
    assert isinstance(vars(_StaticGate)["gate"], staticmethod) and isinstance(vars(_ClassGate)["gate"], classmethod)
    assert vars(_StaticGate)["gate"].__func__.__code__.co_name == "gate"


class _AllInAMethod(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def _impl(self, x):
        y = self.lin(x)
        if y.sum() > 0:
            return y
        return -y

    def forward(self, x):
        return self._impl(x)


def test_a_method_doing_all_the_work_is_not_kept_as_the_only_call():
    """A graph of one opaque call would show and change nothing: capture fails as before, naming the line and
    saying why keeping the method as one call does not help."""
    with pytest.raises(CaptureError) as info:
        capture(_AllInAMethod().eval(), (torch.randn(2, 8),))
    assert "`if y.sum() > 0:`" in str(info.value)
    assert "_AllInAMethod._impl, which does all of the model's work" in info.value.hint


class _AllNaN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.log(self.lin(x).abs() + 1) / 0.0 * 0.0  # inf * 0: every value NaN


def test_a_model_whose_output_is_all_nan_is_captured_and_the_check_says_what_it_saw():
    """QA: capture (method auto) refused it: "the graphs differ from the model (by 0 and 0) ... its forward computes
    Python values from tensors". NaN matches NaN in capture's check, which says so."""
    captured = capture(_AllNaN().eval(), (torch.randn(2, 4),))
    assert captured.record.method == SYMBOLIC_TRACE and captured.record.ok
    assert "8 of 8 reference values are NaN or Inf" in captured.record.checks[0].message


@pytest.mark.parametrize("name", ['bn"<x>', "back\\slash", "two\nlines"])
def test_a_name_torch_fx_cannot_write_into_code_is_refused_by_name(name):
    """QA: a submodule named 'bn"<x>' made torch's generated code a SyntaxError that escaped capture bare (with
    torch.export) or was blamed on untraceable code (with symbolic_trace)."""
    model = torch.nn.Sequential()
    model.add_module("fc", torch.nn.Linear(2, 2))
    model.add_module(name, torch.nn.ReLU())
    for method in ("auto", "export", "symbolic_trace"):
        with pytest.raises(CaptureError) as raised:
            capture(model, (torch.randn(1, 2),), method=method)
        assert repr(name) in str(raised.value) and "rename" in raised.value.hint
    model = torch.nn.Sequential()
    model.add_module("<it's & fine>", torch.nn.Linear(2, 2))  # quoted the other way, escaped: captured
    assert capture(model, (torch.randn(1, 2),)).record.method == SYMBOLIC_TRACE


class _CallsNms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x):
        boxes = self.lin(x).abs().cumsum(-1)
        keep = torchvision.ops.nms(boxes, boxes.sum(-1), 0.5)  # MARK:nms-call
        return boxes[keep]


def test_a_failure_inside_an_installed_package_names_the_users_call_too():
    """QA: the attempt named torchvision's line (ops/boxes.py) only, not the user's call of nms."""
    captured = capture(_CallsNms().eval(), (torch.randn(6, 8),))
    location = captured.record.attempts[0].location
    assert "torchvision" in location and "(called from " in location and "MARK:nms-call" in location


class _FeaturesBranchOnShape(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.big, self.big2, self.head = torch.nn.Linear(8, 64), torch.nn.Linear(64, 8), torch.nn.Linear(8, 2)

    def features(self, x):
        if x.shape[0] > 1:  # a shape: torch.export records the branch
            x = x * 2
        return self.big2(self.big(x).relu())

    def forward(self, x):
        return self.head(self.features(x))


class _FeaturesBranchOnValue(_FeaturesBranchOnShape):
    def features(self, x):
        if x.sum() > 0:  # a value: torch.export cannot
            x = x * 2
        return self.big2(self.big(x).relu())


def test_a_method_hiding_most_weights_lets_torch_export_try_first():
    """Kept as one call, a method holding most of the weights hides most of the model: torch.export, which records a
    branch on a shape, captures all of it; where it cannot (a branch on a value), the trace with the method kept
    as one call stands."""
    on_shape = capture(_FeaturesBranchOnShape().eval(), (torch.randn(2, 8),))
    assert on_shape.record.method == EXPORT and on_shape.record.ok
    assert "hides most of the weights: torch.export first" in on_shape.record.attempts[1].error
    on_value = capture(_FeaturesBranchOnValue().eval(), (torch.randn(2, 8),))
    assert on_value.record.method == SYMBOLIC_TRACE and on_value.record.ok
    assert on_value.record.wrapped == ["_FeaturesBranchOnValue.features"]
    assert [a.strategy for a in on_value.record.attempts] == [SYMBOLIC_TRACE, SYMBOLIC_TRACE, EXPORT]


class _GateBase(torch.nn.Module):
    def gate(self, x):
        if x.mean() > 0:
            return x * 2
        return -x


class _GateOverridden(_GateBase):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(2, 2, 1)
        self.bn = torch.nn.BatchNorm1d(2)
        self.only_the_method_reads = torch.nn.Parameter(torch.ones(4))

    @torch.no_grad()
    def gate(self, x):  # decorated, and calling the base class's: the branch is in _GateBase.gate
        return super().gate(x) * self.only_the_method_reads

    def forward(self, x):
        return self.gate(self.bn(self.conv(x)))


def test_a_kept_method_runs_on_a_shell_of_the_model_not_the_model_itself():
    """QA: the MethodCall held the user's model itself, so gm.train() set the model's mode, and after fold_bn the
    old conv and bn counted (and saved) again through it. It holds a shell: the graph's modules by plain reference,
    only what the method alone can read registered. A decorated method whose branch is in super()'s is kept too."""
    from fxforge.inspect import inspect_graph
    from fxforge.passes import apply_pass

    model = _GateOverridden().eval()
    captured = capture(model, (torch.randn(3, 2, 4),))
    assert captured.record.wrapped == ["_GateOverridden.gate"]
    gm = captured.graph_module
    gm.train()
    assert not model.training  # the model's own flag; its submodules are the graph's, shared as after any capture
    gm.eval()
    own = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for p in gm.parameters()) == own  # each weight once; the method's own one included
    folded = apply_pass(gm, "fold_bn").graph_module
    assert inspect_graph(capture(folded, (torch.randn(3, 2, 4),))).totals["params"] == own - 4  # bn's 2+2 gone
    for sign in (1.0, -1.0):
        x = sign * (torch.rand(3, 2, 4) + 0.1)
        torch.testing.assert_close(folded(x), model(x))


class _ComputeThroughAnInnerMethod(_ComputeBlock):
    def inner(self, x):
        if x.sum() > 0:
            return x * 2
        return x

    def compute(self, x):
        return self.lin(self.inner(x))


class _CallsTheChain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = _ComputeThroughAnInnerMethod()

    def forward(self, x):
        return self.block.compute(x) + 1


def test_a_leaf_made_on_the_way_that_the_graph_never_calls_is_not_listed():
    """QA: the inner method's failure first made block a leaf (called from block's own code, which a leaf does not
    cover: block's forward is never called), then a method was kept as one call; the record still said "leaves:
    block", a module the graph does not call."""
    captured = capture(_CallsTheChain().eval(), (torch.randn(2, 8),))
    assert captured.record.attempts[0].action == "made block a leaf module"
    assert captured.record.wrapped == ["block.inner"] and captured.record.leaves == []


class _MakesAGrid(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c = torch.nn.Conv2d(3, 3, 1)

    def forward(self, x):
        return make_grid(self.c(x), nrow=2, normalize=True)  # by name, as `from torchvision.utils import make_grid`


class _MakesAGridThroughItsModule(_MakesAGrid):
    def forward(self, x):
        return torchvision.utils.make_grid(self.c(x), nrow=2, normalize=True)


def test_a_decorated_package_function_is_wrapped_and_named_from_the_users_call():
    """QA: torchvision's make_grid (under torch.no_grad()) was neither wrapped (its name holds the decorator's
    wrapper) nor named from the user's call (the decorator's frame, torch's, ended the search); capture failed.
    Called through its module, it is not found by name: the hint names it by module, not by a path into
    site-packages."""
    captured = capture(_MakesAGrid().eval(), (torch.randn(4, 3, 8, 8),))
    assert captured.record.method == SYMBOLIC_TRACE and captured.record.ok
    assert captured.record.wrapped == ["torchvision.utils.make_grid"]
    assert "(called from " in captured.record.attempts[0].location
    with pytest.raises(CaptureError) as info:
        capture(_MakesAGridThroughItsModule().eval(), (torch.randn(4, 3, 8, 8),))
    assert "wrap='torchvision.utils:make_grid'" in info.value.hint


_MULTI_LINE_BRANCH = """
import torch


class MultiLine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        if (
            y.mean()
            > 0
        ):
            y = y + 1
        return y
"""


def test_a_branch_written_over_several_lines_is_named_as_a_branch(tmp_path):
    """QA: the condition's inner line was named alone (`y.mean()`), and read as "a tensor's value read as a Python
    number" with the .item() hint; the statement is named from its first line, header joined into one."""
    (tmp_path / "multi.py").write_text(_MULTI_LINE_BRANCH)
    with pytest.raises(CaptureError) as info:
        prepare(f"{tmp_path / 'multi.py'}:MultiLine", ["2x8"])
    assert "multi.py:12 `if ( y.mean() > 0 ):`: data-dependent control flow" in info.value.message
    assert "torch.where or torch.cond" in info.value.hint


_LAYOUTS = """def f(x, mode, flag):
    match mode:
        case "a":
            y = x + 1
            if y.sum() > 0:
                y = y.relu()
        case _:
            y = x
    assert y.sum() > 0, (
        "message"
    )
    if flag:
        @staticmethod
        def g(v):
            return v
    return y
"""


def test_a_location_names_the_statement_not_its_block(tmp_path):
    """Regression QA: a `match` block was taken for one statement (a line inside it named the whole block), an
    assert's message line was named alone, and a decorator was pulled into the `if` header above it."""
    path = tmp_path / "layouts.py"
    path.write_text(_LAYOUTS)
    assert format_location(str(path), 5).endswith(":5 `if y.sum() > 0:`")
    assert format_location(str(path), 10).endswith(':9 `assert y.sum() > 0, ( "message" )`')
    assert format_location(str(path), 12).endswith(":12 `if flag:`")
    assert format_location(str(path), 13).endswith(":13 `@staticmethod`")


class _ScaledGate(_ClassGate):
    scale = 5.0

    def forward(self, x):
        return _ClassGate.gate(self.lin(x)) + 1  # binds cls to _ClassGate (scale 3), not to the instance's class


def test_a_class_method_called_through_a_base_class_is_never_kept_with_the_wrong_class():
    """Regression QA: kept as one call, ``Base.gate(x)`` ran as the instance's method, with ``cls`` the subclass (its
    ``scale`` 5, not 3): a silently wrong graph, which the example input (taking the other branch) did not show.
    Such a call is not kept: the capture fails as before, loudly."""
    model = _ScaledGate().eval()
    with pytest.raises(CaptureError):
        capture(model, (-(torch.rand(2, 8) + 1),))
