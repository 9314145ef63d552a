"""ONNX Runtime in streams (the ``onnxruntime+streams`` candidate): the batch split over one-thread streams, in
micro-batches whose size is timed, recorded in recipe.json and applied by fxforge's loader."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading

import pytest
import torch
from torch import nn

import fxforge
from fxforge import Budget, auto_optimize, capture
from fxforge.errors import FxforgeError
from fxforge.runtime import torch_threads

pytest.importorskip("onnxruntime")

# fp32 round-off of the same kernels on fewer samples per call (ONNX Runtime's conv kernels gave equal bits)
RTOL, ATOL = 1e-5, 1e-6


class SmallConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU6(), nn.Conv2d(8, 8, 3, padding=1, groups=8)
        )
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


class MixesSamples(nn.Module):
    """Per-sample in shape, not in value: each sample minus the batch's mean."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) - torch.relu(x).mean(0, keepdim=True)


class SumsTheBatch(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x).sum(0)


def _exported(model: nn.Module, example: torch.Tensor, path) -> str:
    file = path / "model.onnx"
    fxforge.export_model(model.eval(), "onnx", file, example_inputs=(example,), dynamic_batch=True)
    return str(file)


def test_streams_compute_what_one_call_computes_at_every_batch_size(tmp_path):
    """Even and uneven splits, a micro-batch larger than a stream's share, and one sample (which does not split and
    runs on every thread, as without streams)."""
    from fxforge.artifacts import OnnxRuntimeModule

    torch.manual_seed(0)
    model = SmallConvNet().eval()
    path = _exported(model, torch.randn(2, 3, 16, 16), tmp_path)
    whole = OnnxRuntimeModule(path, threads=2)
    for micro_batch in (1, 2, 3, 8):
        streamed = whole.in_streams(2, micro_batch, whole.input_names)
        assert (streamed.streams, streamed.micro_batch) == (2, micro_batch)
        for batch in (1, 2, 5, 8):
            x = torch.randn(batch, 3, 16, 16)
            out = streamed(x)
            assert out.shape == (batch, 5)
            torch.testing.assert_close(out, whole(x), rtol=RTOL, atol=ATOL)
            torch.testing.assert_close(out, model(x).detach(), rtol=1e-4, atol=1e-5)
    assert streamed._whole_session is not None  # the one-sample call ran on a session of all the threads


def test_an_output_that_is_not_per_sample_runs_as_one_call(tmp_path):
    """A batch reduced to one value cannot be joined from pieces: the streamed module computes it in one call, and
    ort_streams (what --auto builds the candidate with) refuses, saying why."""
    from fxforge.artifacts import OnnxRuntimeModule
    from fxforge.bench import ort_streams

    model = SumsTheBatch()
    example = torch.randn(4, 6)
    path = _exported(model, example, tmp_path)
    whole = OnnxRuntimeModule(path, threads=2)
    streamed = whole.in_streams(2, 1, whole.input_names)
    torch.testing.assert_close(streamed(example), model(example))
    with pytest.raises(FxforgeError, match="not per-sample"):
        ort_streams(tmp_path / "model.onnx", capture(model, (example,)), 2)


def test_ort_streams_needs_two_threads_and_two_samples(tmp_path):
    from fxforge.bench import ort_streams

    model = SmallConvNet().eval()
    path = _exported(model, torch.randn(2, 3, 8, 8), tmp_path)
    with pytest.raises(FxforgeError, match="two threads"):
        ort_streams(tmp_path / "model.onnx", capture(model, (torch.randn(4, 3, 8, 8),)), 1)
    with pytest.raises(FxforgeError, match="one sample"):
        ort_streams(tmp_path / "model.onnx", capture(model, (torch.randn(1, 3, 8, 8),)), 2)
    module, recipe, notes = ort_streams(tmp_path / "model.onnx", capture(model, (torch.randn(8, 3, 8, 8),)), 2)
    assert recipe["run"] == "onnxruntime" and recipe["streams"] == 2 and recipe["batched"] == module.input_names
    assert recipe["micro_batch"] in (1, 2, 4) and module.micro_batch == recipe["micro_batch"]
    assert "micro-batches of 1:" in notes[0] and "4:" in notes[0]  # every size timed is reported
    assert str(path) == module.path


def test_the_candidate_needs_a_batch_and_two_threads():
    from fxforge.auto import candidate_backends

    def names(batch: int, threads: int, quick: bool = True) -> list[str]:
        captured = capture(SmallConvNet().eval(), (torch.randn(batch, 3, 8, 8),))
        return [b.name for b in candidate_backends(captured, None, Budget(), quick=quick, threads=threads)]

    assert "onnxruntime+streams" in names(8, 2) and "onnxruntime+streams" in names(2, 2, quick=False)
    assert "onnxruntime+streams" not in names(1, 2)
    assert "onnxruntime+streams" not in names(8, 1)
    budget = Budget(min_agreement=0.9)
    captured = capture(SmallConvNet().eval(), (torch.randn(8, 3, 8, 8),))
    for quick in (True, False):
        with_budget = [b.name for b in candidate_backends(captured, None, budget, quick=quick, threads=2)]
        assert "ort_int8" in with_budget and "ort_int8+streams" in with_budget
        assert "ort_int8+streams" not in [b.name for b in candidate_backends(captured, None, budget, quick, threads=1)]


def test_onnx_runtime_int8_in_streams_is_written_with_its_recipe(tmp_path):
    """ort_int8+streams: ONNX Runtime's int8 file (dynamic batch already) and a streams recipe; loaded back it
    computes what the one-call int8 file computes, at every batch size."""
    from fxforge.bench import BuildSettings, get_backend
    from fxforge.deploy import write_artifact

    torch.manual_seed(0)
    model = SmallConvNet().eval()
    captured = capture(model, (torch.randn(4, 3, 16, 16),))
    expected = model(*captured.example_inputs)
    artifacts = {}
    for name in ("ort_int8", "ort_int8+streams"):
        settings = BuildSettings(2, tmp_path / name, expected)
        settings.variants = get_backend(name).selected
        artifacts[name] = write_artifact(get_backend(name), captured, tmp_path / name, settings)
    assert json.loads((tmp_path / "ort_int8+streams" / "recipe.json").read_text())["streams"] == 2
    assert "int8 QDQ" in artifacts["ort_int8+streams"].load and "streams" in artifacts["ort_int8+streams"].load
    assert not (tmp_path / "ort_int8" / "recipe.json").exists()
    streamed, whole = artifacts["ort_int8+streams"].runner, artifacts["ort_int8"].runner
    assert streamed.streams == 2 and whole.streams == 1
    for batch in (1, 4, 7):
        x = torch.randn(batch, 3, 16, 16)
        # the same int8 kernels per sample; the calibration differs only if the two quantizations did (they are seeded)
        torch.testing.assert_close(streamed(x), whole(x), rtol=RTOL, atol=ATOL)


def test_auto_writes_a_recipe_the_loader_runs_in_streams(tmp_path):
    """The written directory: a dynamic-batch model.onnx and recipe.json; fxforge.load_model runs it in streams at
    any batch size and computes what the model computes. The recipe is not a pickle: no opt-in."""
    from fxforge.artifacts import OnnxRuntimeModule

    torch.manual_seed(0)
    model = SmallConvNet().eval()
    captured = capture(model, (torch.randn(4, 3, 16, 16),))
    out = tmp_path / "out"
    # the choice is timed: on a busy machine (a full CI run beside other work) eager won one run of three rounds
    # and wrote no recipe; three tries, each with a verified, accepted streams candidate
    for _ in range(3):
        result = auto_optimize(captured, out, backends=["onnxruntime+streams"], repeats=3, threads=2, force=True)
        row = next(c for c in result.candidates if c.name == "onnxruntime+streams")
        assert row.status in ("chosen", "accepted"), row.reason
        assert any("streams of one thread" in note for note in row.notes)
        if row.status == "chosen":
            break
    assert row.status == "chosen", [(c.name, c.status, c.median_ms) for c in result.candidates]
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["run"] == "onnxruntime" and recipe["streams"] == 2
    with torch_threads(2):  # the suite gives torch one thread, and the loader runs no more streams than that
        loaded = fxforge.load_model(str(out))
    assert loaded.file == "model.onnx + recipe.json"
    assert isinstance(loaded.module, OnnxRuntimeModule) and loaded.module.streams == 2
    for batch in (1, 3, 8):
        x = torch.randn(batch, 3, 16, 16)
        torch.testing.assert_close(loaded.module(x), model(x).detach(), rtol=1e-4, atol=1e-5)


def test_a_model_that_mixes_samples_is_refused_when_built(tmp_path):
    """Splitting the batch changes what a model that mixes samples computes, while every output keeps its shape:
    the build compares the pieces' outputs with one call's and refuses, saying why (and --auto's verification
    against the model would reject it after that)."""
    captured = capture(MixesSamples(), (torch.randn(8, 16),))
    result = auto_optimize(captured, backends=["onnxruntime+streams"], repeats=3, threads=2)
    row = next(c for c in result.candidates if c.name == "onnxruntime+streams")
    assert row.status == "failed" and "the model mixes samples" in row.reason, row.reason
    assert result.chosen == "eager"


@pytest.mark.parametrize(
    ("recipe", "message"),
    [
        ({"streams": 0, "micro_batch": 2, "batched": ["x"]}, "whole numbers"),
        ({"streams": 2, "micro_batch": "2", "batched": ["x"]}, "whole numbers"),
        ({}, "whole numbers"),
        ({"streams": 2, "micro_batch": 2}, "list of input names"),
        ({"streams": 2, "micro_batch": 2, "batched": "x"}, "list of input names"),
        ({"streams": 2, "micro_batch": 2, "batched": ["y"]}, "no input named 'y'"),
        ({"streams": 2, "micro_batch": 2, "batched": []}, "list of batched inputs is empty"),
    ],
)
def test_a_damaged_streams_recipe_is_one_clear_error(tmp_path, recipe, message):
    from fxforge.artifacts import OnnxRuntimeModule, apply_recipe

    path = _exported(SmallConvNet(), torch.randn(2, 3, 8, 8), tmp_path)
    for threads in (2, 1):  # one thread runs no streams, and the same directory is still refused (QA)
        with pytest.raises(FxforgeError, match=message):
            apply_recipe(OnnxRuntimeModule(path, threads=threads), {"run": "onnxruntime", **recipe})
    with pytest.raises(FxforgeError, match="not one"):
        apply_recipe(nn.Identity(), {"run": "onnxruntime", "streams": 2, "micro_batch": 1, "batched": ["x"]})
    for not_an_object in ([1, 2], None, "onnxruntime"):  # an AttributeError, an internal error (QA)
        with pytest.raises(FxforgeError, match="not a JSON object"):
            apply_recipe(OnnxRuntimeModule(path), not_an_object)


def test_a_torchvision_net_in_streams_through_bench(tmp_path):
    """A real depthwise net (torchvision mobilenet_v3_small, random weights): bench's streams row computes what eager
    computes, and says which micro-batch it chose."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small(num_classes=10).eval()
    captured = capture(model, (torch.randn(4, 3, 64, 64),))
    report = fxforge.bench(captured, ["eager", "onnxruntime+streams"], warmup=1, repeats=3, threads=2)
    row = next(r for r in report.rows if r.backend == "onnxruntime+streams")
    assert row.error is None, row.error
    assert row.max_abs_err is not None and row.max_abs_err < 1e-4
    assert any("micro-batches of" in note for note in row.notes)


def test_the_loader_runs_no_more_streams_than_torch_has_threads(tmp_path):
    """A process that gives torch one thread (a server running one model per core) gets one call on one thread
    from a streams directory, not a second core taken behind its back."""
    from fxforge.artifacts import OnnxRuntimeModule, apply_recipe

    path = _exported(SmallConvNet(), torch.randn(2, 3, 8, 8), tmp_path)
    recipe = {"run": "onnxruntime", "streams": 2, "micro_batch": 2, "batched": ["x"]}
    assert apply_recipe(OnnxRuntimeModule(path, threads=2), recipe).streams == 2
    assert apply_recipe(OnnxRuntimeModule(path, threads=4), recipe).streams == 2
    assert apply_recipe(OnnxRuntimeModule(path, threads=1), recipe).streams == 1


class PositionBias(nn.Module):
    """A bias every sample shares, passed as an input: its first dimension is not the batch."""

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + bias)


def test_an_input_every_sample_shares_is_never_split(tmp_path):
    """The dynamic-batch export names every input's first dimension "batch", so a shared bias of 8 was cut in
    pieces at batch 8: wrong values, or ONNX Runtime's broadcast error (QA). Only the inputs recorded as batched at
    build are split; one that has the batch's size at the example is caught there."""
    from fxforge.bench import ort_streams

    bias = torch.arange(8.0)
    model = PositionBias()
    file = tmp_path / "model.onnx"
    fxforge.export_model(model, "onnx", file, example_inputs=(torch.randn(4, 8), bias), dynamic_batch=True)
    module, recipe, _ = ort_streams(file, capture(model, (torch.randn(4, 8), bias)), 2)
    assert recipe["batched"] == [module.input_names[0]] and recipe["micro_batch"] in (1, 2)
    for batch in (2, 7, 8, 9):
        x = torch.randn(batch, 8)
        torch.testing.assert_close(module(x, bias), model(x, bias))
    with pytest.raises(FxforgeError, match="shared by every sample"):
        ort_streams(file, capture(model, (torch.randn(8, 8), bias)), 2)


class _Spy:
    """Stands in for an ONNX Runtime session: records which thread ran how many samples."""

    def __init__(self, session) -> None:
        self.session, self.calls = session, []

    def run(self, names, feeds):
        self.calls.append((threading.current_thread().name, next(iter(feeds.values())).shape[0]))
        return self.session.run(names, feeds)


@pytest.mark.parametrize(("batch", "micro_batch", "expected"), [(2, 4, [1, 1]), (4, 4, [2, 2]), (9, 4, [4, 5])])
def test_the_batch_is_shared_evenly_between_streams(tmp_path, batch, micro_batch, expected):
    """Batches up to micro_batch ran on one thread, and 9 as 8 and 1 (QA): each stream gets an even share."""
    from fxforge.artifacts import OnnxRuntimeModule

    path = _exported(SmallConvNet(), torch.randn(2, 3, 8, 8), tmp_path)
    whole = OnnxRuntimeModule(path, threads=2)
    streamed = whole.in_streams(2, micro_batch, whole.input_names)
    streamed.session = spy = _Spy(streamed.session)
    streamed(torch.randn(batch, 3, 8, 8))
    per_thread: dict[str, int] = {}
    for thread, samples in spy.calls:
        assert samples <= micro_batch
        per_thread[thread] = per_thread.get(thread, 0) + samples
    assert sorted(per_thread.values()) == sorted(expected)


def _call_in_child(module, x, expected, queue) -> None:
    queue.put(bool(torch.allclose(module(x), expected, rtol=1e-4, atol=1e-5)))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_runs_the_streams(tmp_path):
    """A pool made before a fork has no threads in the child, which waited forever (QA; gunicorn --preload after a
    warm-up call): the child makes its own."""
    from fxforge.artifacts import OnnxRuntimeModule

    path = _exported(SmallConvNet(), torch.randn(2, 3, 8, 8), tmp_path)
    whole = OnnxRuntimeModule(path, threads=2)
    streamed = whole.in_streams(2, 1, whole.input_names)
    x = torch.randn(4, 3, 8, 8)
    expected = streamed(x)  # the parent's pool exists now
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_call_in_child, args=(streamed, x, expected, queue))
    child.start()
    child.join(120)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive and child.exitcode == 0 and queue.get(timeout=5)


class SharedWeight(nn.Module):
    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x @ w


class SharedMaskMean(nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return x * mask.mean()


@pytest.mark.parametrize(
    ("model", "example"),
    [
        (SharedWeight(), (torch.randn(8, 8), torch.randn(8, 4))),  # cut, w no longer fits x: ONNX Runtime failed
        (SharedMaskMean(), (torch.randn(8, 4), torch.ones(8))),  # all ones at the example: the cut did not show
    ],
    ids=["weight", "uniform-mask"],
)
def test_a_shared_input_of_the_batch_size_is_refused_in_one_line(tmp_path, model, example, capfd):
    """An input every sample shares that has the batch's size at the example cannot be told from a batched one
    by its shape: the pieces are checked on the example and on random values, at every micro-batch size timed, and
    a refusal is one line, with no ONNX Runtime log on stderr (QA)."""
    from fxforge.bench import ort_streams

    file = tmp_path / "model.onnx"
    fxforge.export_model(model, "onnx", file, example_inputs=example, dynamic_batch=True)
    capfd.readouterr()
    with pytest.raises(FxforgeError, match="shared by every sample") as refused:
        ort_streams(file, capture(model, example), 2)
    assert "\n" not in str(refused.value)
    assert "onnxruntime" not in capfd.readouterr().err


@pytest.mark.parametrize(
    ("recipe", "message"),
    [
        ({"run": "autocast", "dtype": "nope"}, "dtype must name"),
        ({"run": "autocast", "dtype": 5}, "dtype must name"),
        ({"run": "autocast", "dtype": "int8"}, "dtype must name"),
        ({"run": "compile", "inductor": 5}, "inductor must be"),
        ({"run": "compile", "mode": ["max"]}, "inductor must be"),
    ],
)
def test_a_damaged_torch_recipe_is_one_clear_error(recipe, message):
    from fxforge.artifacts import apply_recipe

    with pytest.raises(FxforgeError, match=message):  # internal errors (AttributeError, TypeError) before (QA)
        apply_recipe(nn.Identity(), recipe)


def test_a_torch_recipe_beside_an_onnx_file_is_refused(tmp_path):
    from fxforge.artifacts import OnnxRuntimeModule, apply_recipe

    path = _exported(SmallConvNet(), torch.randn(2, 3, 8, 8), tmp_path)
    for recipe in ({"run": "autocast"}, {"run": "compile"}):
        with pytest.raises(FxforgeError, match="is an ONNX file"):
            apply_recipe(OnnxRuntimeModule(path), recipe)


def test_a_transformers_bert_runs_in_streams_with_both_its_inputs_split(tmp_path):
    """A real transformer from a small config (transformers BertModel, random weights): token ids and attention
    mask both carry the batch, are both recorded as batched, and the pieces compute what one call computes at
    batch sizes other than the example's."""
    transformers = pytest.importorskip("transformers")
    from fxforge.bench import ort_streams

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    model = transformers.BertModel(config).eval()
    ids, mask = torch.randint(0, 99, (4, 12)), torch.ones(4, 12, dtype=torch.int64)
    captured = fxforge.prepare(model, (ids, mask))
    file = tmp_path / "model.onnx"
    fxforge.export_model(captured, "onnx", file, example_inputs=(ids, mask), dynamic_batch=True)
    module, recipe, _ = ort_streams(file, captured, 2)
    assert recipe["batched"] == module.input_names and len(recipe["batched"]) == 2
    for batch in (3, 8):
        ids, mask = torch.randint(0, 99, (batch, 12)), torch.ones(batch, 12, dtype=torch.int64)
        mask[0, 6:] = 0  # one padded sample: the mask must travel with its own sample
        expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
        got = module(ids, mask)
        got = got["last_hidden_state"] if isinstance(got, dict) else getattr(got, "last_hidden_state", got[0])
        torch.testing.assert_close(got, expected.detach(), rtol=1e-4, atol=1e-4)
