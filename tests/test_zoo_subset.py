"""A fast subset of the zoo benchmark (``benchmarks/zoo.py``, results in docs/zoo.md): ten timm families and five
transformers families through capture -> ``lint --fix``'s exact passes (verified, keep going) -> ONNX export
(verified), with the benchmark's own per-model function.

Per model: the capture check passes; every pass that changed the graph verified, or was rolled back with a
reason; no BatchNorm is left directly after a conv/linear; the ONNX file reloads and verifies. timm models run
at 64x64 (every family here accepts it), transformers models are built from two-layer configs.

The transformers models are built with ``return_dict=False`` (tuple outputs): the ONNX export of a model that
returns a transformers ``ModelOutput`` does not verify yet, which the strict xfail at the end records.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("timm")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

ROOT = Path(__file__).resolve().parent.parent


def _load_zoo() -> Any:
    name = "fxforge_benchmarks_zoo"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "zoo.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the file runs
        spec.loader.exec_module(module)
    return sys.modules[name]


zoo = _load_zoo()

SMALL_IMAGE = ["1x3x64x64"]

# name -> timm family (the module it is registered in); each the smallest or a small model of its family.
TIMM = {
    "resnet10t": "resnet",
    "mobilenetv3_small_050": "mobilenetv3",
    "mobilenetv2_035": "efficientnet",
    "regnetx_002": "regnet",
    "dla46x_c": "dla",
    "ghostnet_050": "ghostnet",
    "ese_vovnet19b_slim_dw": "vovnet",
    "cs3darknet_focus_s": "cspnet",
    "repghostnet_050": "repghost",
    "convnext_zepto_rms": "convnext",
}
# families whose graph has BatchNorms right after a conv when captured: fold_bn must remove every one
TIMM_WITHOUT_BN = {"convnext_zepto_rms"}


def _tuples(config: dict[str, Any]) -> dict[str, Any]:
    return {**config, "return_dict": False}


def _transformers() -> dict[str, Any]:
    resnet_class, resnet_inputs, resnet_config = zoo.KWARGS_VISION["resnet"]
    return {
        "bert": zoo.ZooModel("transformers", "bert", "transformers:BertModel", [zoo.IDS], _tuples(zoo.TEXT)),
        "gpt2": zoo.ZooModel(
            "transformers",
            "gpt2",
            "transformers:GPT2Model",
            [zoo.IDS],
            _tuples(
                {"n_embd": 32, "n_layer": 2, "n_head": 2, "vocab_size": zoo.VOCAB, "bos_token_id": 1, "eos_token_id": 2}
            ),
        ),
        "t5": zoo.ZooModel(
            "transformers",
            "t5",
            inputs=[zoo.IDS, zoo.IDS],
            factory=zoo.seq2seq("T5Model", _tuples(zoo.T5), "input_ids"),
        ),
        "vit": zoo.ZooModel("transformers", "vit", "transformers:ViTModel", [zoo.IMAGE], _tuples(zoo.VISION)),
        # ResNetModel's forward takes **kwargs: called through the benchmark's one-input wrapper
        "resnet": zoo.ZooModel(
            "transformers", "resnet", inputs=resnet_inputs, factory=zoo.one_input(resnet_class, _tuples(resnet_config))
        ),
    }


TRANSFORMERS = _transformers()


def _model(name: str) -> Any:
    if name in TIMM:
        return zoo.ZooModel("timm", name, f"timm:{name}", SMALL_IMAGE, family=TIMM[name])
    return TRANSFORMERS[name]


def _assert_zoo_targets(record: dict[str, Any]) -> None:
    name = record["name"]
    assert record["capture"]["ok"], f"{name}: capture: {record['capture'].get('error')}"
    passes = record["passes"]
    assert "error" not in passes, f"{name}: passes: {passes['error']}"
    assert not passes["unverified"], f"{name}: passes kept without verification: {passes['unverified']}"
    for item in passes["rolled_back"]:
        assert item["reason"].strip(), f"{name}: {item['pass']} rolled back without a reason"
    left = record["bn_after"]["after_conv"]
    assert not left, f"{name}: BatchNorms left right after a conv/linear: {left}"
    export = record["export"]
    assert export["ok"], f"{name}: ONNX export: {export.get('error')}"


@pytest.mark.slow
@pytest.mark.parametrize("name", [*TIMM, *TRANSFORMERS])
def test_zoo_model_meets_the_targets(name):
    record = zoo.run_model(_model(name))
    _assert_zoo_targets(record)
    if name in TIMM and name not in TIMM_WITHOUT_BN:
        # the subset exercises fold_bn: BatchNorms followed a conv in the captured graph, and none is left
        assert record["bn_before"]["after_conv"], f"{name}: no BatchNorm after a conv was captured"
        assert "fold_bn" in record["passes"]["changed"]
    assert record["status"] == "ok", zoo.errors_of(record)


def test_batch_norm_census_in_both_dialects():
    # the census the targets rest on: a module BN after a conv module (torch dialect), an ATen batch norm after an
    # ATen convolution (torch.export), and a BN fed by something else, which is not a fold target
    import torch
    from torch import nn

    import fxforge

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.BatchNorm2d(4)).eval()
    for method in ("symbolic_trace", "export"):
        captured = fxforge.capture(model, (torch.randn(1, 3, 8, 8),), method=method)
        census = zoo.batch_norms(captured.graph_module)
        assert census["count"] == 2, (method, census)
        assert len(census["after_conv"]) == 1 and "conv" in census["after_conv"][0], (method, census)


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="fxforge bug: verifying an ONNX export of a model that returns a transformers ModelOutput fails with "
    "'You cannot use ``update`` on a ... instance' (runtime._restore_module_state clears and refills every dict "
    "attribute of the OnnxRuntimeModule, its output_like ModelOutput included); see docs/zoo.md",
)
def test_onnx_export_of_a_model_output_verifies():
    record = zoo.run_model(zoo.ZooModel("transformers", "bert", "transformers:BertModel", [zoo.IDS], zoo.TEXT))
    _assert_zoo_targets(record)
