"""FX010 baked-shape-constant: a literal batch size in a shape argument breaks the graph for other batch sizes."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from fxforge.errors import said
from fxforge.graphs import ATEN, aten_packet, target_name
from fxforge.lint import LintContext, NotApplicable, rule

# op name -> which positional arguments hold sizes: an index, or (index, None) for "this one and all after"
_ALL_AFTER_SELF = (1, None)
_ALL = (0, None)
_METHODS: dict[str, Any] = {
    "view": _ALL_AFTER_SELF,
    "reshape": _ALL_AFTER_SELF,
    "expand": _ALL_AFTER_SELF,
    "repeat": _ALL_AFTER_SELF,
    "new_zeros": _ALL_AFTER_SELF,
    "new_ones": _ALL_AFTER_SELF,
    "new_empty": _ALL_AFTER_SELF,
    "new_full": 1,
}
_FUNCTIONS: dict[Any, Any] = {
    torch.reshape: 1,
    torch.zeros: _ALL,
    torch.ones: _ALL,
    torch.empty: _ALL,
    torch.full: 0,
    torch.arange: _ALL,
    torch.randn: _ALL,
    torch.rand: _ALL,
}
_ATEN: dict[str, Any] = {
    "view": 1,
    "_unsafe_view": 1,
    "reshape": 1,
    "expand": 1,
    "repeat": 1,
    "new_zeros": 1,
    "new_ones": 1,
    "new_empty": 1,
    "new_full": 1,
    "zeros": 0,
    "ones": 0,
    "empty": 0,
    "full": 0,
    "randn": 0,
    "rand": 0,
    "arange": _ALL,
}
_KWARGS = ("size", "shape", "end")


def _positions(node: fx.Node) -> Any:
    if node.op == "call_method":
        return _METHODS.get(str(node.target))
    if node.op == "call_function":
        packet = aten_packet(node)
        if packet is not None:
            return _ATEN.get(packet)
        return _FUNCTIONS.get(node.target)
    return None


def _size_args(node: fx.Node, spec: Any) -> list[Any]:
    if isinstance(spec, tuple):
        values = list(node.args[spec[0] :])
    else:
        values = [node.args[spec]] if len(node.args) > spec else []
    values += [node.kwargs[k] for k in _KWARGS if k in node.kwargs]
    flat: list[Any] = []
    for value in values:
        if isinstance(value, (list, tuple, torch.Size)):
            flat.extend(value)
        else:
            flat.append(value)
    return flat


def _batch_size(inputs: tuple[Any, ...]) -> int | None:
    """Dimension 0 of the first tensor among the example inputs (nested ones too)."""
    for value in torch.utils._pytree.tree_leaves(inputs):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return None


def _batch_is_symbolic(graph: fx.Graph) -> bool:
    """Whether the first tensor input of an exported graph has a symbolic dimension 0 (``--check-batch``)."""
    for node in graph.nodes:
        value = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return isinstance(value.shape[0], torch.SymInt)
    return False


@rule("FX010", "baked-shape-constant", "warning", "literal batch size in a shape argument")
def check(ctx: LintContext):
    """Shape-taking calls (``view``, ``reshape``, ``expand``, ``repeat``, ``new_zeros``/``new_ones``/...,
    ``zeros``/``ones``/``empty``/``full``/``arange``) whose size arguments hold a literal int equal to the
    batch size (dimension 0 of the first tensor example input), when that is more than 1. A symbolic
    trace keeps ``x.size(0)`` as a node, so the torch dialect is flagged only for sizes the model's own
    code wrote as numbers. torch.export specialises ``x.view(x.size(0), -1)`` to ``view(x, [4, -1])``
    for a static batch, so an aten graph is judged only where its batch is symbolic (``--check-batch``);
    otherwise the rule is listed as skipped. Skipped without example inputs. A size that only
    happens to equal the batch size is flagged too (the message says which value matched), except where the first
    size is computed or inferred (``x.reshape(x.shape[0], 2, 2, 2)``, ``x.view(-1, 2, 4)`` at batch 2: the batch is
    that one).
    """
    batch = _batch_size(ctx.example_inputs)
    if batch is None or batch <= 1:
        return
    if ctx.dialect == ATEN and not _batch_is_symbolic(ctx.graph):
        # every shape torch.export recorded holds the example's batch, whether the code wrote x.size(0) or 4: seven
        # warnings on a correct BertModel, with advice to do what the code already did (QA)
        raise NotApplicable(
            f"cannot tell a batch size the code wrote from the one torch.export fixed (batch {batch}): capture with "
            f"{said('--check-batch N', 'check_batch=N')} for a graph whose batch stays symbolic"
        )
    for node in ctx.graph.nodes:
        spec = _positions(node)
        if spec is None:
            continue
        sizes = _size_args(node, spec)
        if sizes and (isinstance(sizes[0], fx.Node) or sizes[0] == -1):
            continue  # the batch dimension comes from the input (x.reshape(x.shape[0], 2, 2, 2)): the rest is not it
        if not any(isinstance(v, int) and not isinstance(v, bool) and v == batch for v in sizes):
            continue
        shown = ", ".join(str(v) if isinstance(v, (int, float)) else getattr(v, "name", "?") for v in sizes)
        yield (
            node,
            f"{node.name} ({target_name(node)}) takes the literal size {batch}, the example batch size, in ({shown}): "
            "the graph only works for that batch size; derive it from the input (x.size(0)) or use -1",
        )
