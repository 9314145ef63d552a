"""onednn_linear: compute float32 ``Linear`` layers with oneDNN's matmul instead of torch's default (MKL's).

torch's x86 builds compute an fp32 ``nn.Linear``, ``F.linear`` or ``aten.linear`` with MKL's sgemm. On CPUs
where MKL does not use the widest vectors (measured on an AMD EPYC with AVX-512: MKL's sgemm 210 GFLOP/s,
oneDNN's matmul 455, ``fxforge doctor`` says so), the same product through oneDNN
(``torch.ops.mkldnn._linear_pointwise``, which Inductor emits for packed linear layers only where it cannot use
MKL's) ran BERT-base 1.9x faster in eager mode. On a CPU where MKL is at home the two kernels are about as fast, so
this pass is not in the ``exact`` group: ``optimize --auto`` tries it as the ``fx+onednn_linear`` candidate and keeps
it only where it measures faster.

The product is the same; only the order of the sums inside the matmul differs, so results move by float32 round-off
(as between any two BLAS libraries), which verification checks. Rewritten: float32 CPU tensors of at least two
dimensions, a float32 weight and bias (or none), and a module that runs no hooks and is not in training mode.
**Inference only**: oneDNN's linear has no backward, so no gradient flows through a rewritten layer (torch warns);
an ATen graph records no mode, so this holds for it whatever mode its model was in. The call stays an op of torch's,
so the graph still exports to ``model.pt2`` and loads with plain torch built with oneDNN (every x86 and aarch64
wheel); ONNX and TorchScript cannot express it (export says so).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn

from fxforge.effects import tensor_facts
from fxforge.graphs import node_kind, runs_hooks
from fxforge.passes import PassResult, mark, register_pass
from fxforge.runtime import onednn_linear_op

NAME = "onednn_linear"


def available() -> bool:
    """Whether this torch has oneDNN's linear kernel (every x86 and aarch64 wheel does)."""
    return torch.backends.mkldnn.is_available() and onednn_linear_op() is not None


def _float32_cpu(facts: dict[str, Any] | None, min_rank: int) -> bool:
    if facts is None or facts["dtype"] != torch.float32 or facts["shape"] is None:
        return False
    return len(facts["shape"]) >= min_rank and (facts["device"] is None or facts["device"].type == "cpu")


def why_not(gm: fx.GraphModule, node: fx.Node) -> str | None:
    """Why this pass leaves ``node`` as it is (None: it rewrites it); "" for a node that is no linear layer."""
    module = gm.get_submodule(str(node.target)) if node.op == "call_module" else None
    if type(module) is nn.Linear and runs_hooks(module):  # node_kind says nothing of it: said here
        return f"module {node.target} runs hooks, which see the layer as it is"
    if node_kind(gm, node) != "linear":
        return ""
    source = node.args[0] if node.args else node.kwargs.get("input")
    facts = tensor_facts(source, gm)
    if facts is None:
        return "its input's dtype and shape are not recorded (capture with fxforge.capture, or run ShapeProp first)"
    if not _float32_cpu(facts, 2):
        return "its input is not a float32 CPU tensor of 2 or more dimensions"
    if module is not None:
        if module.training:  # oneDNN's linear has no backward: a model being trained would get no gradient
            return f"module {node.target} is in training mode (oneDNN's linear has no backward)"
        tensors = [t for t in (module.weight, module.bias) if t is not None]
        if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in tensors):
            return "its weight is not a float32 CPU tensor"
        return None if len(node.args) == 1 and not node.kwargs else "called with arguments this pass does not read"
    arguments = dict(zip(("input", "weight", "bias"), node.args))
    arguments.update(node.kwargs)
    if set(arguments) - {"input", "weight", "bias"} or "weight" not in arguments:
        return "called with arguments this pass does not read"
    bias = arguments.get("bias")
    if not _float32_cpu(tensor_facts(arguments["weight"], gm), 2) or (
        bias is not None and not _float32_cpu(tensor_facts(bias, gm), 1)
    ):
        return "its weight or bias is not known to be a float32 CPU tensor"
    return None


def _operands(gm: fx.GraphModule, node: fx.Node) -> tuple[Any, Any, Any]:
    """(input, weight, bias) of a linear call :func:`why_not` accepts, as graph values (``get_attr`` nodes made for
    a module's)."""
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        with gm.graph.inserting_before(node):
            weight = gm.graph.get_attr(f"{node.target}.weight")
            bias = gm.graph.get_attr(f"{node.target}.bias") if module.bias is not None else None
        return node.args[0], weight, bias
    arguments = dict(zip(("input", "weight", "bias"), node.args))
    arguments.update(node.kwargs)
    return arguments["input"], arguments["weight"], arguments.get("bias")


@register_pass(
    NAME,
    summary="Compute float32 Linear layers with oneDNN's matmul (torch.ops.mkldnn._linear_pointwise) instead of MKL's.",
    guarantees=(
        "The same product with the sums in another order: float32 round-off, as between two BLAS libraries "
        "(verified). Only float32 CPU inputs of 2 or more dimensions with float32 weights; modules that run hooks "
        "are kept. Inference only (no backward: modules in training mode are kept; an ATen graph records no mode). "
        "Faster only where MKL does not use the CPU's widest vectors (an AMD EPYC with AVX-512: 1.9x on "
        "BERT-base): not in the exact group; --auto keeps it (fx+onednn_linear) only where it measures faster. "
        "Needs torch built with oneDNN (x86 and aarch64 wheels). Torch and ATen dialects."
    ),
)
def onednn_linear(gm: fx.GraphModule, options: None) -> PassResult:
    result = PassResult(NAME, gm)
    if not available():
        result.skip("this torch has no oneDNN linear kernel (torch.ops.mkldnn._linear_pointwise)")
        return result
    for node in list(gm.graph.nodes):
        reason = why_not(gm, node)
        if reason:
            result.skip(f"{node.name}: {reason}")
        if reason is not None:
            continue
        source, weight, bias = _operands(gm, node)
        with gm.graph.inserting_before(node):
            # scalars [None], not []: torch.export's serialiser cannot write an empty list of scalars
            onednn = gm.graph.call_function(onednn_linear_op().default, (source, weight, bias, "none", [None], ""))
        onednn.meta = dict(node.meta)
        mark(onednn, NAME, origin_of=node)
        for attr in (weight, bias):
            if isinstance(attr, fx.Node) and attr.op == "get_attr" and not attr.meta:  # made for a module's weight
                mark(attr, NAME, origin_of=node)
        node.replace_all_uses_with(onednn)
        gm.graph.erase_node(node)  # a module's Linear stays: its weight and bias are read from it
        result.note(f"{node.name}: linear -> oneDNN's matmul", replaced=1)
    return result
