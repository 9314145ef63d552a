"""remove_dropout: drop inactive dropout from inference graphs.

An inactive dropout (a module in eval mode, a functional call with ``training=False``, an ATen
dropout with ``train=False``) returns its input tensor itself, so its users can read the input
directly and nothing changes, not even aliasing. An *active* dropout is random and is left alone:
a functional call traced with ``training=True`` (``F.dropout``'s default) has that flag frozen into
the graph, and it stays active after ``model.eval()`` -- that is reported, since it is usually a
bug in the model (``F.dropout(x, p)`` instead of ``F.dropout(x, p, self.training)``).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from fxforge.effects import AliasClasses, copy_layout_problem
from fxforge.graphs import aten_packet, node_arg, node_kind, submodule
from fxforge.passes import PassResult, mark, register_pass

NAME = "remove_dropout"

# Where the training flag sits, and its default, for each functional form.
_FUNCTIONAL_FLAG: dict[Any, tuple[int, str, bool | None]] = {
    F.dropout: (2, "training", True),
    F.dropout1d: (2, "training", True),
    F.dropout2d: (2, "training", True),
    F.dropout3d: (2, "training", True),
    F.alpha_dropout: (2, "training", False),
    F.feature_alpha_dropout: (2, "training", False),
    torch.dropout: (2, "train", None),
}


def _flag(node: fx.Node, position: int, keyword: str, default: bool | None) -> Any:
    if len(node.args) > position:
        return node.args[position]
    return node.kwargs.get(keyword, default)


def _training_flag(gm: fx.GraphModule, node: fx.Node) -> tuple[Any, str]:
    """(flag, form) of a dropout node: flag is True/False, or something that is not a literal."""
    if node.op == "call_module":
        return submodule(gm, node).training, "module"
    packet = aten_packet(node)
    if packet is not None:
        return _flag(node, 2, "train", None), "aten"
    position, keyword, default = _FUNCTIONAL_FLAG.get(node.target, (2, "training", None))
    return _flag(node, position, keyword, default), "functional"


def _drops_nothing(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether the dropout's probability is a literal 0: it returns its input (a copy scaled by 1 where a fused
    kernel runs it), whatever its training flag."""
    if node.op == "call_module":
        p = getattr(submodule(gm, node), "p", None)
    else:
        p = node_arg(node, 1, "p", 0.5 if aten_packet(node) is None else None)
    return isinstance(p, (int, float)) and not isinstance(p, bool) and p == 0


@register_pass(
    NAME,
    summary="Remove inactive dropout (eval-mode modules, training=False calls, ATen dropout with train=False).",
    guarantees=(
        "Exact: an inactive dropout returns its input tensor itself, so outputs are bit-identical (ATen "
        "native_dropout returns a copy: removed only where no in-place op or caller could tell the copy from its "
        "input and the copy has the input's strides). Never removes "
        "an active dropout: a module in training mode, or a call whose training flag is True (a flag frozen at "
        "capture: reported with the reason) or computed in the graph, unless its probability is a literal 0. "
        "Torch and ATen dialects."
    ),
)
def remove_dropout(gm: fx.GraphModule, options: None) -> PassResult:
    result = PassResult(NAME, gm)
    aliases: AliasClasses | None = None
    removed_modules = False
    for node in list(gm.graph.nodes):
        if node_kind(gm, node) != "dropout":
            continue
        source = node.args[0] if node.args else node.kwargs.get("input")
        if not isinstance(source, fx.Node):
            result.skip(f"{node.name}: its input is not a node of the graph")
            continue
        training, form = _training_flag(gm, node)
        if _drops_nothing(gm, node):
            # p=0 drops nothing in training mode too; FX004 called it a no-op, and lint --fix could never clear it (QA)
            training = False
        if training is True:
            owner = _dropout_module_path(node) if form == "aten" else None
            if form == "module":
                result.skip(f"{node.name}: module {node.target} is in training mode; call model.eval() first")
            elif owner is not None:
                result.skip(f"{node.name}: module {owner} was in training mode at capture; call model.eval() first")
            else:
                result.skip(
                    f"{node.name}: traced with training=True frozen into the graph, so it drops values even in "
                    "eval mode (pass training=self.training in the model to make it removable)"
                )
            continue
        if training is not False:
            result.skip(f"{node.name}: its training flag ({training!r}) is not a literal False")
            continue
        if aten_packet(node) == "native_dropout":
            if aliases is None:
                aliases = AliasClasses(gm)
            if not _remove_native_dropout(gm, node, source, aliases, result):
                continue
        else:
            _carry_origin(source, node)
            node.replace_all_uses_with(source)
            gm.graph.erase_node(node)
            removed_modules |= node.op == "call_module"
        result.note(f"removed {node.name} ({form} dropout)", removed=1)
    if removed_modules:
        gm.delete_all_unused_submodules()
    return result


def _dropout_module_path(node: fx.Node) -> str | None:
    """The path of the nn.Dropout module an ATen dropout came from (torch.export records it), else None.

    A module captured in training mode needs model.eval(), not the functional call's training=self.training fix.
    """
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path, type_name = list(stack.values())[-1]
    return str(path) if str(type_name).startswith("torch.nn.modules.dropout.") else None


def _remove_native_dropout(
    gm: fx.GraphModule, node: fx.Node, source: fx.Node, aliases: AliasClasses, result: PassResult
) -> bool:
    # native_dropout(train=False) returns (a copy of the input, a mask of ones): only the copy can go,
    # and only where nothing writes into either tensor or hands the input back to the caller.
    users = list(node.users)
    # torch.export also unpacks the mask, usually into a getitem nothing reads: that is no use of the mask
    if any(u.target is not operator.getitem or (u.args[1] != 0 and u.users) for u in users):
        result.skip(f"{node.name}: its dropout mask is used")
        return False
    if aliases.written(node) or aliases.written(source) or (aliases.escapes(node) and aliases.external(source)):
        result.skip(f"{node.name}: its output is a copy that in-place ops or the caller could tell apart")
        return False
    output = next((u for u in users if u.args[1] == 0), None)
    layout = copy_layout_problem(output, source, gm) if output is not None else None
    if layout is not None:
        result.skip(f"{node.name}: {layout}")
        return False
    for user in users:
        if user.args[1] == 0:
            _carry_origin(source, user)
            user.replace_all_uses_with(source)
        gm.graph.erase_node(user)
    gm.graph.erase_node(node)
    return True


def _carry_origin(source: fx.Node, removed: fx.Node) -> None:
    # The input now stands for the dropout's value too; blame this pass if the two ever differ.
    # Inputs and stored tensors keep their own names: verify maps them by position, not origin.
    if source.op.startswith("call"):
        mark(source, NAME, origin_of=removed)
