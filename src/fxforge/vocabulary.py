"""Graph vocabulary: the names fxforge writes into ``node.meta`` and reads back, shared by every layer.

Provenance keys: before a pass runs, every node without one gets ``node.meta[ORIGIN]`` (the name of the
node in the captured graph whose value it computes); nodes a pass creates or rewrites get
``node.meta[PASS]``. ``verify`` reads both to name the first diverging node and the pass that made it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx, nn

from fxforge.runtime import quiet_quantization_notices

ORIGIN = "fxforge_origin"
PASS = "fxforge_pass"
# In a GraphModule's own ``meta`` (not a node's): the file beside the program it was loaded from that holds the same
# model as a torch-dialect graph (an optimize output's model.pt beside its model.pt2). verify's bisection points
# there only when it is set: a plain exported program has no such file to be bisected from.
PICKLED_GRAPH_BESIDE = "fxforge_pickled_graph_beside"


# --------------------------------------------------------------------------------------------------
# quantized graphs: what a node of one is (inspect and the lint rules read these)

# What a node of a quantized graph does, for inspect's "quant" column and the lint rules:
#   observer    an observer module collecting value ranges (a prepared, not yet converted, model)
#   fake_quant  a fake-quantize module or op (QAT: rounds to int8 steps, computes in float)
#   qat         a QAT layer (float weights fake-quantized on every forward)
#   quantize    float -> int8 (torch.quantize_per_tensor, aten/quantized_decomposed quantize ops)
#   dequantize  int8 -> float (Tensor.dequantize, torch.dequantize, the dequantize ops)
#   int8        a layer or op computing on int8 data (torch.ao.nn.quantized modules, quantized:: ops)
QUANT_KINDS = ("observer", "fake_quant", "qat", "quantize", "dequantize", "int8")

_INT8_MODULE_PREFIXES = ("torch.ao.nn.quantized.", "torch.ao.nn.intrinsic.quantized.", "torch.ao.nn.sparse.quantized.")
_QAT_MODULE_PREFIXES = ("torch.ao.nn.qat.", "torch.ao.nn.intrinsic.qat.")


def module_quant_kind(module: nn.Module) -> str | None:
    """The :data:`QUANT_KINDS` entry for a module, or None for a plain float module."""
    from torch.ao.quantization import FakeQuantizeBase, ObserverBase

    if isinstance(module, FakeQuantizeBase):
        return "fake_quant"
    if isinstance(module, ObserverBase):
        return "observer"
    name = type(module).__module__ + "."
    if name.startswith(_QAT_MODULE_PREFIXES):
        return "qat"
    # reference modules are float modules carrying weight qparams, not int8 kernels; FloatFunctional (and FX's
    # copy) is the float stand-in for QFunctional that eager-mode models hold before conversion
    float_stand_in = type(module).__name__ in ("FloatFunctional", "FXFloatFunctional")
    if name.startswith(_INT8_MODULE_PREFIXES) and ".reference." not in name and not float_stand_in:
        kind = type(module).__name__
        return {"Quantize": "quantize", "DeQuantize": "dequantize"}.get(kind, "int8")
    return None


def op_quant_kind(qualified_name: str) -> str | None:
    """The :data:`QUANT_KINDS` entry for an operator's schema name (``namespace::name``), or None."""
    namespace, _, name = qualified_name.partition("::")
    if namespace == "quantized":
        return "int8"
    if namespace not in ("aten", "quantized_decomposed"):
        return None
    if name.startswith("quantize_per_"):
        return "quantize"
    if name.startswith("dequantize"):
        return "dequantize"
    if name.startswith(("fake_quantize_", "fused_moving_avg_obs_fake_quant", "_fake_quantize")):
        return "fake_quant"
    return None


def quant_kind(gm: nn.Module, node: fx.Node) -> str | None:
    """The :data:`QUANT_KINDS` entry for ``node`` of ``gm`` (either dialect), or None."""
    if node.op == "call_module":
        return module_quant_kind(gm.get_submodule(str(node.target)))
    if node.op == "call_method":
        return "dequantize" if node.target == "dequantize" else None
    if node.op != "call_function":
        return None
    target = node.target
    if target in (torch.quantize_per_tensor, torch.quantize_per_channel, torch.quantize_per_tensor_dynamic):
        return "quantize"
    if target is torch.dequantize:
        return "dequantize"
    schema = getattr(target, "_schema", None)
    return op_quant_kind(schema.name) if schema is not None else None


def int8_weights(module: nn.Module) -> list[torch.Tensor]:
    """The weight and bias an int8 layer keeps packed for its kernel (they are not ``parameters()``)."""
    if module_quant_kind(module) != "int8":
        return []
    tensors = []
    for name in ("weight", "bias"):
        getter = getattr(type(module), name, None)
        if callable(getter):  # a method on the quantized classes; an attribute on float modules
            with quiet_quantization_notices():
                value = getter(module)
            if isinstance(value, torch.Tensor):
                tensors.append(value)
    return tensors


def int8_flops(module: nn.Module, inputs: Sequence[Any], output: Any) -> int:
    """FLOPs (2 per multiply-add, as ``torch.utils.flop_counter`` counts float layers) of an int8
    conv or linear layer, whose ops torch's FLOP counter has no formula for; 0 for anything else."""
    if module_quant_kind(module) != "int8" or not isinstance(output, torch.Tensor):
        return 0
    if hasattr(module, "in_channels") and hasattr(module, "kernel_size"):
        kernel = math.prod(module.kernel_size)
        if getattr(module, "transposed", False):
            source = inputs[0] if inputs and isinstance(inputs[0], torch.Tensor) else None
            return 2 * source.numel() * (module.out_channels // module.groups) * kernel if source is not None else 0
        return 2 * output.numel() * (module.in_channels // module.groups) * kernel
    if hasattr(module, "in_features"):
        return 2 * output.numel() * module.in_features
    return 0
