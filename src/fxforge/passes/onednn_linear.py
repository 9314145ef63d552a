"""onednn_linear: compute float32 ``Linear`` layers with oneDNN's matmul instead of torch's default (MKL's).

torch's x86 builds compute an fp32 ``nn.Linear``, ``F.linear`` or ``aten.linear`` with MKL's sgemm. On CPUs
where MKL does not use the widest vectors (measured on an AMD EPYC with AVX-512: MKL's sgemm 210 GFLOP/s,
oneDNN's matmul 455, ``fxforge doctor`` says so), the same product through oneDNN
(``torch.ops.mkldnn._linear_pointwise``, the kernel Inductor itself emits for packed linear layers) ran BERT-base
1.9x faster in eager mode. On a CPU where MKL is at home the two kernels are about as fast, so this pass is not in
the ``exact`` group: ``optimize --auto`` tries it as the ``fx+onednn_linear`` candidate and keeps it only where it
measures faster.

The product is the same; only the order of the sums inside the matmul differs, so results move by float32 round-off
(as between any two BLAS libraries), which verification checks. Rewritten: float32 CPU tensors of at least two
dimensions, a float32 weight and bias (or none), and a module that runs no hooks. The call stays an ATen-level op,
so the graph still exports to ``model.pt2`` and loads with plain torch built with oneDNN (every x86 and aarch64
wheel).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from fxforge.effects import tensor_facts
from fxforge.graphs import node_kind
from fxforge.passes import PassResult, mark, register_pass

NAME = "onednn_linear"


def _available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _float32_cpu(facts: dict[str, Any] | None, min_rank: int) -> bool:
    if facts is None or facts["dtype"] != torch.float32 or facts["shape"] is None:
        return False
    return len(facts["shape"]) >= min_rank and (facts["device"] is None or facts["device"].type == "cpu")


def _operands(gm: fx.GraphModule, node: fx.Node) -> tuple[Any, Any, Any] | None:
    """(input, weight, bias) of a linear call as graph values (``get_attr`` nodes made for a module's), or None."""
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        if len(node.args) != 1 or node.kwargs:
            return None
        with gm.graph.inserting_before(node):
            weight = gm.graph.get_attr(f"{node.target}.weight")
            bias = gm.graph.get_attr(f"{node.target}.bias") if module.bias is not None else None
        return node.args[0], weight, bias
    arguments = dict(zip(("input", "weight", "bias"), node.args))
    arguments.update(node.kwargs)
    if set(arguments) - {"input", "weight", "bias"} or "input" not in arguments or "weight" not in arguments:
        return None
    return arguments["input"], arguments["weight"], arguments.get("bias")


@register_pass(
    NAME,
    summary="Compute float32 Linear layers with oneDNN's matmul (torch.ops.mkldnn._linear_pointwise) instead of MKL's.",
    guarantees=(
        "The same product with the sums in another order: float32 round-off, as between two BLAS libraries "
        "(verified). Only float32 CPU inputs of 2 or more dimensions with float32 weights; modules that run hooks "
        "are kept. Faster only where MKL does not use the CPU's widest vectors (an AMD EPYC with AVX-512: 1.9x on "
        "BERT-base): not in the exact group; --auto keeps it (fx+onednn_linear) only where it measures faster. "
        "Needs torch built with oneDNN (x86 and aarch64 wheels). Torch and ATen dialects."
    ),
)
def onednn_linear(gm: fx.GraphModule, options: None) -> PassResult:
    result = PassResult(NAME, gm)
    if not _available():
        result.skip("this torch has no oneDNN linear kernel (torch.ops.mkldnn._linear_pointwise)")
        return result
    for node in list(gm.graph.nodes):
        if node_kind(gm, node) != "linear":
            continue
        facts = tensor_facts(node.args[0] if node.args else node.kwargs.get("input"), gm)
        if not _float32_cpu(facts, 2):
            result.skip(f"{node.name}: its input is not known to be a float32 CPU tensor of 2 or more dimensions")
            continue
        if node.op == "call_module":
            module = gm.get_submodule(str(node.target))
            tensors = [module.weight, module.bias]
            if any(t is not None and (t.dtype != torch.float32 or t.device.type != "cpu") for t in tensors):
                result.skip(f"{node.name}: its weight is not a float32 CPU tensor")
                continue
        else:
            weight = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
            bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
            if not _float32_cpu(tensor_facts(weight, gm), 2) or (bias is not None and not _float32_cpu(
                tensor_facts(bias, gm), 1
            )):
                result.skip(f"{node.name}: its weight or bias is not known to be a float32 CPU tensor")
                continue
        operands = _operands(gm, node)
        if operands is None:
            result.skip(f"{node.name}: called with arguments this pass does not read")
            continue
        source, weight, bias = operands
        with gm.graph.inserting_before(node):
            # scalars [None], not []: torch.export's serialiser cannot write an empty list of scalars
            onednn = gm.graph.call_function(
                torch.ops.mkldnn._linear_pointwise.default, (source, weight, bias, "none", [None], "")
            )
        onednn.meta = dict(node.meta)
        mark(onednn, NAME, origin_of=node)
        for attr in (weight, bias):
            if isinstance(attr, fx.Node) and attr.op == "get_attr" and not attr.meta:  # made for a module's weight
                mark(attr, NAME, origin_of=node)
        node.replace_all_uses_with(onednn)
        gm.graph.erase_node(node)  # a module's Linear stays: its weight and bias are read from it
        result.note(f"{node.name}: linear -> oneDNN's matmul", replaced=1)
    return result
