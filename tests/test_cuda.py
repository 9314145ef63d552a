"""fxforge with the model and its inputs on a CUDA device, through the Python API.

Skipped where torch sees no GPU (CI has none); run on a GPU machine with ``pytest tests/test_cuda.py``. Each test
is one thing a user does with a model already on the GPU: capture it in both dialects, inspect and lint it, run
the exact passes with verification, catch a wrong rewrite, export and reload, time it.
"""

from __future__ import annotations

import copy
import os
import time

import pytest
import torch
from torch import fx, nn

import fxforge
from fxforge.capture import Captured
from fxforge.profile import profile_model
from fxforge.runtime import ieee_float32

# FXFORGE_TEST_DEVICE=cpu runs the same checks on the CPU (to debug this file where there is no GPU)
GPU = torch.device(os.environ.get("FXFORGE_TEST_DEVICE", "cuda"))
pytestmark = pytest.mark.skipif(GPU.type == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def resnet() -> tuple[nn.Module, torch.Tensor]:
    model = fxforge.load_model("torchvision:resnet18").module.to(GPU).eval()
    return model, torch.randn(2, 3, 64, 64, device=GPU)


@pytest.fixture(scope="module")
def resnet_captured(resnet) -> Captured:
    model, x = resnet
    return fxforge.capture(model, [x])


def _synchronize() -> None:
    if GPU.type == "cuda":
        torch.cuda.synchronize()


def _on_gpu(module: nn.Module) -> bool:
    tensors = [*module.parameters(), *module.buffers()]
    return bool(tensors) and all(t.device.type == GPU.type for t in tensors)


def test_capture_leaves_the_graph_and_the_model_on_the_gpu(resnet, resnet_captured):
    model, _ = resnet
    assert resnet_captured.dialect == "torch"
    assert _on_gpu(resnet_captured.graph_module)
    assert _on_gpu(model)


def test_export_dialect_capture_on_the_gpu(resnet):
    model, x = resnet
    captured = fxforge.capture(model, [x], method="export")
    assert captured.dialect == "aten"
    assert _on_gpu(captured.graph_module)
    with torch.no_grad(), ieee_float32():
        torch.testing.assert_close(captured.graph_module(x), model(x))


def test_inspect_counts_flops_on_the_gpu(resnet_captured):
    report = fxforge.inspect_graph(resnet_captured)
    assert report.totals["flops"] > 0


def test_lint_runs_on_the_gpu(resnet_captured):
    findings = fxforge.lint(resnet_captured).findings
    assert any(f.code == "FX008" for f in findings)  # BatchNorm after conv: foldable


def test_exact_passes_verified_on_the_gpu(resnet, resnet_captured):
    model, x = resnet
    result = fxforge.optimize(resnet_captured, "exact", verify=True)
    assert result.pipeline.ok, result.pipeline.verification
    rewritten = result.pipeline.graph_module
    assert not any(isinstance(m, nn.BatchNorm2d) for m in rewritten.modules())
    assert _on_gpu(rewritten)
    with torch.no_grad(), ieee_float32():  # TF32 convolutions alone move resnet18's outputs by ~4e-3
        torch.testing.assert_close(rewritten(x), model(x), rtol=1e-4, atol=1e-4)


def test_verify_on_the_gpu_catches_a_dropped_batchnorm(resnet_captured):
    gm = copy.deepcopy(resnet_captured.graph_module)
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target == "layer1.0.bn2":
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    gm.recompile()
    check = fxforge.verify(resnet_captured, gm)
    assert not check.ok
    assert check.divergence is not None


def test_verify_on_the_gpu_accepts_an_exact_rewrite(resnet_captured):
    folded = fxforge.apply_pass(resnet_captured.graph_module, "fold_bn").graph_module
    check = fxforge.verify(resnet_captured, folded)
    assert check.ok, check.problems
    assert check.trials >= 3


@pytest.mark.parametrize("to", ["torchscript", "pt2", "onnx"])
def test_export_and_reload_from_the_gpu(resnet_captured, tmp_path, to):
    if to == "onnx":
        pytest.importorskip("onnxruntime")
    suffix = {"torchscript": ".pt", "pt2": ".pt2", "onnx": ".onnx"}[to]
    result = fxforge.export_model(resnet_captured, to=to, path=tmp_path / f"m{suffix}")
    assert result.verification is not None and result.verification.ok, result.verification


def test_bench_on_the_gpu_waits_for_the_kernels(resnet_captured):
    report = fxforge.bench(resnet_captured, ["eager"], repeats=5, warmup=2, peak=False)
    (row,) = report.rows
    assert row.error is None, row.error
    model, x = resnet_captured.original, resnet_captured.example_inputs[0]
    with torch.no_grad():
        model(x)
        _synchronize()
        start = time.perf_counter()
        for _ in range(10):
            model(x)
        _synchronize()
    gpu_ms = (time.perf_counter() - start) * 100
    # a timer that does not wait for the GPU reports the launch time only
    assert row.median_ms >= 0.5 * gpu_ms, (row.median_ms, gpu_ms)


def test_a_transformer_on_the_gpu_in_the_aten_dialect():
    loaded = fxforge.load_model("transformers:BertModel", model_kwargs={"num_hidden_layers": 2})
    model = loaded.module.to(GPU).eval()
    ids = torch.randint(0, 100, (1, 16), device=GPU)
    captured = fxforge.capture(model, [ids])
    assert captured.dialect == "aten"
    result = fxforge.optimize(captured, "exact", verify=True)
    assert result.pipeline.ok, result.pipeline.verification


@pytest.mark.skipif(GPU.type == "cpu", reason="a refusal for models off the CPU")
def test_quantize_and_profile_refuse_a_gpu_model_in_one_line(resnet_captured):
    with pytest.raises(fxforge.FxforgeError, match=r"int8 models run on the CPU, and this model is on cuda"):
        fxforge.quantize(resnet_captured, "static")
    with pytest.raises(fxforge.FxforgeError, match=r"profile times models on the CPU, and this model is on cuda"):
        profile_model(resnet_captured)


@pytest.mark.skipif(GPU.type == "cpu", reason="CPU-only backends are left out for models off the CPU")
def test_bench_leaves_cpu_runtimes_out_for_a_gpu_model_and_says_why_when_named(resnet_captured):
    default = fxforge.bench(resnet_captured, repeats=2, warmup=1)
    names = {row.backend for row in default.rows}
    assert "onnxruntime" not in names and "int8" not in names and "compile" in names
    assert all(row.error is None for row in default.rows), [(r.backend, r.error) for r in default.rows]
    assert "cuda" in default.machine and all(row.peak_fraction is None for row in default.rows)
    named = fxforge.bench(resnet_captured, ["eager", "onnxruntime"], repeats=2, warmup=1, peak=False)
    (ort,) = [row for row in named.rows if row.backend == "onnxruntime"]
    assert "runs on the CPU only; the model is on cuda" in ort.error


def test_auto_on_the_gpu_writes_an_artifact_that_runs_there(resnet, resnet_captured, tmp_path):
    model, x = resnet
    result = fxforge.auto_optimize(resnet_captured, tmp_path / "auto", quick=True, repeats=3)
    chosen = next(c for c in result.candidates if c.name == result.chosen)
    assert chosen.status == "chosen" and chosen.verified_on, chosen
    if GPU.type == "cuda":
        assert not any(c.name in ("onnxruntime", "ort_int8", "int8") for c in result.candidates)
    # trust_pickle: on a GPU the choice is often compile, written as an AOTInductor package (native code this test
    # has just compiled), which fxforge loads only when told the file is trusted
    loaded = fxforge.load_model(str(tmp_path / "auto"), trust_pickle=True).module
    with torch.no_grad(), ieee_float32():  # the artifact may be Inductor's code: its own sums, so 1e-3
        torch.testing.assert_close(loaded(x), model(x), rtol=1e-3, atol=1e-3)


def test_split_on_the_gpu_is_verified(resnet_captured, tmp_path):
    result = fxforge.split(resnet_captured, stages=2, output_dir=tmp_path / "split")
    assert result.verification is not None and result.verification.ok, result.verification
    assert all(_on_gpu(stage) for stage in result.stages)


def test_graph_module_fx_nodes_keep_device_metadata(resnet_captured):
    metas = [n.meta.get("tensor_meta") for n in resnet_captured.graph_module.graph.nodes if n.op == "call_module"]
    assert any(m is not None for m in metas)
    assert isinstance(resnet_captured.graph_module, fx.GraphModule)


def _random_state() -> torch.Tensor:
    return torch.cuda.get_rng_state(GPU) if GPU.type == "cuda" else torch.get_rng_state()


def test_the_callers_gpu_random_state_is_given_back():
    """A train-mode model's dropout draws from the GPU's generator: the API's entry points run it, and must give the
    caller's random stream back as it was (they gave back the CPU's only)."""
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).to(GPU).train()
    x = torch.randn(4, 8, device=GPU)
    state = _random_state()
    captured = fxforge.capture(model, [x])
    fxforge.verify(model, captured.graph_module, [x])
    fxforge.inspect_graph(captured)
    fxforge.optimize(captured, ["fold_bn", "dead_code"])
    assert torch.equal(_random_state(), state)
    model(x)  # the check can fail: a call of the model itself moves it
    assert not torch.equal(_random_state(), state)
