"""Quantization: int8 static and dynamic post-training quantization and QAT preparation of a captured
model, with the int8 model's accuracy measured against the float model and a per-layer sensitivity
ranking.

The package, one module per concern: :mod:`.data` (calibration and evaluation data formats),
:mod:`.accuracy` (int8 against float, targets), :mod:`.result` (:class:`QuantizeResult`), :mod:`.flow`
(:func:`quantize`, sensitivity, "keep the most sensitive units in float until a target is met", and the
:func:`int8_backend` hook of ``fxforge.bench``), :mod:`.units` (the fallback units: every layer and op static
quantization quantizes, and how each is kept in float), :mod:`.ort` (ONNX Runtime's own static int8 of an
exported ONNX file, used by the ``ort_int8`` backend of ``fxforge.bench``), :mod:`.saving` (the output directory and the
work-arounds that let torch 2.14.1 pickle and reload FX-quantized and QAT models), :mod:`.scripted` (the int8
model as frozen TorchScript, which ``optimize --auto`` writes and ``bench`` times), :mod:`.fx_safety` (the
rewrites without which FX quantization would change what a model computes) and :mod:`.engine`
(the int8 kernel engine). What a node of a quantized graph is (``quant_kind``, ``int8_weights``,
``int8_flops``), which inspect and lint read without quantizing anything, is :mod:`fxforge.vocabulary`.

Machinery: PyTorch's **FX graph-mode quantization**, ``torch.ao.quantization.quantize_fx``
(``prepare_fx`` / ``prepare_qat_fx`` -> calibrate -> ``convert_fx``), run on the torch-dialect
GraphModule fxforge captured (so capture's leaves carry over as float black boxes). Chosen over
torchao's PT2E flow (``prepare_pt2e``/``convert_pt2e`` with ``X86InductorQuantizer``) because,
measured with torch 2.14.1 and torchao 0.18.0 on this project's CPU machine:

* PT2E fails on torchvision resnet18 captured with ``torch.export``: ``ValueError: Input partition
  has more than one output node``. ResNet's ``BasicBlock`` calls its one ``self.relu`` twice; the
  exported graph attributes both ``aten.relu`` nodes to that module, so the quantizer's source
  partition for it has two outputs, and the conv-add-relu annotation gives up. (mobilenet_v2, whose
  ReLU6 modules are called once each, goes through.)
* A PT2E model is a float graph with quantize/dequantize ops around float kernels: run eagerly it
  was 3x *slower* than float (mobilenet_v2, 64x64: 36.6 ms vs 12.0 ms). It is fast only after
  ``torch.compile`` lowers it with Inductor (6.5 ms vs 9.4 ms float, after a 69 s compile that needs
  a C++ compiler). ``convert_fx`` instead swaps in real int8 modules (fbgemm/oneDNN or QNNPACK
  kernels) that are fast eagerly, pickle with ``torch.save`` and need no compiler.
* torchao is one more dependency (and transformers imports it when present, with warnings).

FX graph mode is deprecated in torch (every call warns "torch.ao.quantization is deprecated and will
be removed in 2.10", yet it is still there in 2.14.1). We chose it deliberately, so our calls
suppress exactly that warning (and the observers' ``reduce_range`` notice); docs/commands/quantize.md
records the decision and the migration path (PT2E once the x86 quantizer handles shared modules).

Static and QAT quantization need a torch-dialect graph (``symbolic_trace``): FX's patterns match
``nn.Conv2d`` modules and ``torch``-level calls, not ATen ops. Dynamic quantization only swaps
``nn.Linear``/``nn.LSTM``-like modules, so for models that only ``torch.export`` can capture
(transformers) it falls back to eager ``torch.ao.quantization.quantize_dynamic`` on the original
module; the result says which machinery ran.
"""

from __future__ import annotations

from fxforge.quantize.accuracy import AccuracyReport, Target, compare_batches, parse_target, run_batches
from fxforge.quantize.data import (
    DEFAULT_RANDOM_BATCHES,
    RANDOM_EVAL_WARNING,
    RANDOM_WARNING,
    CalibrationData,
    RandomCalibrationWarning,
    load_calibration,
)
from fxforge.quantize.engine import quantized_engine
from fxforge.quantize.flow import (
    BACKENDS,
    DYNAMIC_LAYER_TYPES,
    MODES,
    STATIC_LAYER_TYPES,
    convert,
    fallback_units,
    int8_backend,
    quantizable_layers,
    quantize,
)
from fxforge.quantize.result import LayerSensitivity, QuantizeResult
from fxforge.quantize.saving import picklable_quantized_modules, write_output
from fxforge.quantize.scripted import frozen_torchscript, write_frozen
from fxforge.quantize.units import Unit

__all__ = [
    "BACKENDS",
    "DEFAULT_RANDOM_BATCHES",
    "DYNAMIC_LAYER_TYPES",
    "MODES",
    "RANDOM_EVAL_WARNING",
    "RANDOM_WARNING",
    "STATIC_LAYER_TYPES",
    "AccuracyReport",
    "CalibrationData",
    "LayerSensitivity",
    "QuantizeResult",
    "RandomCalibrationWarning",
    "Target",
    "Unit",
    "compare_batches",
    "convert",
    "fallback_units",
    "frozen_torchscript",
    "int8_backend",
    "load_calibration",
    "parse_target",
    "picklable_quantized_modules",
    "quantizable_layers",
    "quantize",
    "quantized_engine",
    "run_batches",
    "write_frozen",
    "write_output",
]
