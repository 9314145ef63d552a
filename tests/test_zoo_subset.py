"""A fast subset of the zoo benchmark (``benchmarks/zoo.py``, results in docs/zoo.md): ten timm families and five
transformers families through capture -> ``lint --fix``'s exact passes (verified, keep going) -> ONNX export
(verified), with the benchmark's own per-model function.

Per model: the capture check passes; every pass that changed the graph verified, or was rolled back with a
reason; no BatchNorm is left directly after a conv/linear whose output it alone reads (the fold target: a BN on a
conv output that other nodes read too cannot be folded without a second copy of the conv, and is allowed); the
ONNX file reloads and verifies. timm models run at 64x64 (every family here accepts it), transformers models are
built from two-layer configs with their default ``return_dict=True``, so verification and the ONNX export compare
transformers ``ModelOutput``s.
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
    "starnet_s050": "starnet",
    "convnext_zepto_rms": "convnext",
}
# families whose graph has BatchNorms right after a conv when captured: fold_bn must remove every one
TIMM_WITHOUT_BN = {"convnext_zepto_rms"}
# models whose graph keeps BatchNorms on a conv output that other nodes read too, and how many: repghost's ghost
# module computes x1 = bn(conv(x)), then cheap_operation(x1) + fusion_bn(x1). fold_bn folds bn into conv (its sole
# user), which leaves fusion_bn directly after a conv whose output cheap_operation reads too: folding it as well
# would take a second copy of the conv. Exactly these must be left, every sole-user BN folded
TIMM_SHARED_BN = {"repghostnet_050": 16}


def _transformers() -> dict[str, Any]:
    resnet_class, resnet_inputs, resnet_config = zoo.KWARGS_VISION["resnet"]
    return {
        "bert": zoo.ZooModel("transformers", "bert", "transformers:BertModel", [zoo.IDS], zoo.TEXT),
        "gpt2": zoo.ZooModel(
            "transformers",
            "gpt2",
            "transformers:GPT2Model",
            [zoo.IDS],
            {"n_embd": 32, "n_layer": 2, "n_head": 2, "vocab_size": zoo.VOCAB, "bos_token_id": 1, "eos_token_id": 2},
        ),
        # T5Model(input_ids, decoder_input_ids=...) through the benchmark's two-input wrapper
        "t5": zoo.ZooModel(
            "transformers", "t5", inputs=[zoo.IDS, zoo.IDS], factory=zoo.seq2seq("T5Model", zoo.T5, "input_ids")
        ),
        "vit": zoo.ZooModel("transformers", "vit", "transformers:ViTModel", [zoo.IMAGE], zoo.VISION),
        # ResNetModel.forward(pixel_values, output_hidden_states=None, return_dict=None, **kwargs), called as it is
        "resnet": zoo.ZooModel("transformers", "resnet", f"transformers:{resnet_class}", resnet_inputs, resnet_config),
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
    left, shared = zoo.bn_left(record["bn_after"])  # shared: the conv's output has other readers (not foldable)
    assert not left, f"{name}: BatchNorms left right after a conv/linear: {left}"
    assert len(shared) == TIMM_SHARED_BN.get(name, 0), f"{name}: BatchNorms left after a shared conv: {shared}"
    export = record["export"]
    assert export["ok"], f"{name}: ONNX export: {export.get('error')}"


@pytest.mark.slow
@pytest.mark.parametrize("name", [*TIMM, *TRANSFORMERS])
def test_zoo_model_meets_the_targets(name):
    record = zoo.run_model(_model(name))
    _assert_zoo_targets(record)
    if name in TIMM and name not in TIMM_WITHOUT_BN:
        # the subset exercises fold_bn: BatchNorms followed a conv in the captured graph, and none is left
        assert zoo.bn_left(record["bn_before"])[0], f"{name}: no BatchNorm after a conv was captured"
        assert "fold_bn" in record["passes"]["changed"]
    assert record["status"] == "ok", zoo.errors_of(record)


def test_a_forward_with_var_keywords_captures_and_verifies():
    # transformers' vision models take **kwargs (ResNetModel, RegNetModel, MobileNetV2Model, ...): symbolic tracing
    # makes it a placeholder "**kwargs", which once asked for an input of its own ("the model needs an input for
    # 'kwargs'; pass one more --input") and so failed every capture of such a model as it is
    import torch
    from torch import nn

    import fxforge

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

        def forward(self, x: torch.Tensor, scale: float | None = None, **kwargs: Any) -> torch.Tensor:
            return torch.relu(self.bn(self.conv(x)))

    captured = fxforge.prepare(Net().eval(), ["1x3x8x8"])
    assert captured.record.method == "symbolic_trace"
    assert all(check.ok for check in captured.record.checks)
    result = fxforge.optimize(captured, ["fold_bn"], verify=True)
    assert result.pipeline.ok and result.pipeline.steps[0].result.changed


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


def test_onnx_export_of_a_model_output_verifies(tmp_path):
    # A model that returns a transformers ModelOutput: its ONNX Runtime runner keeps one to restore the outputs'
    # structure. runtime.preserved_state once cleared and refilled every dict attribute of the runner, that
    # ModelOutput included ("You cannot use ``update`` on a ... instance"), so no such export verified; it restores
    # only nn.Module's plain dicts now. (The subset's transformers models return ModelOutputs too.)
    import torch
    from torch import nn
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    import fxforge

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> BaseModelOutputWithPooling:
            hidden = torch.tanh(self.linear(x))
            return BaseModelOutputWithPooling(last_hidden_state=hidden, pooler_output=hidden.mean(1))

    torch.manual_seed(0)
    captured = fxforge.prepare(Tiny().eval(), ["2x4x8"])
    result = fxforge.export_model(captured, "onnx", tmp_path / "model.onnx")
    assert result.ok and result.verification is not None and result.verification.ok, result.verification
