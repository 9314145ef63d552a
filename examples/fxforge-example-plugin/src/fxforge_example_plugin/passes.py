"""Pass ``fold_scale_into_linear``: ``linear(x) * c`` (or ``/ c``) for a constant number ``c`` becomes one linear
whose weight and bias are scaled by ``c`` -- one multiplication over the activations fewer per call.

Attention heads and residual branches often scale a projection's output by a constant (``q * d ** -0.5``);
folding it into the projection is exact up to float rounding.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch import fx, nn

from fxforge.passes import PassResult, mark, register_pass

NAME = "fold_scale_into_linear"

_MULTIPLY = (operator.mul, torch.mul)
_DIVIDE = (operator.truediv, torch.div)


@dataclass(frozen=True)
class ScaledLinear:
    linear: fx.Node  # a call_module of an nn.Linear, used only by ``scale``
    scale: fx.Node  # the multiplication (or division) by a constant number
    factor: float


def find_scaled_linears(gm: fx.GraphModule) -> list[ScaledLinear]:
    """Every linear whose only use is a multiplication or division by a constant number (the pass and lint rule
    FXP001 share this, so the rule reports exactly what the pass folds)."""
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_module" or not isinstance(gm.get_submodule(str(node.target)), nn.Linear):
            continue
        if len(node.users) != 1:
            continue  # another user needs the unscaled output
        (user,) = node.users
        factor = _constant_factor(user, node)
        if factor is not None:
            found.append(ScaledLinear(node, user, factor))
    return found


def _constant_factor(user: fx.Node, linear: fx.Node) -> float | None:
    if user.op != "call_function" or user.kwargs or len(user.args) != 2:
        return None
    first, second = user.args
    if user.target in _MULTIPLY:
        other = second if first is linear else first if second is linear else None
        return float(other) if isinstance(other, (int, float)) and not isinstance(other, bool) else None
    if user.target in _DIVIDE and first is linear and isinstance(second, (int, float)) and not isinstance(second, bool):
        return 1.0 / float(second) if second != 0 else None
    return None


def _no_folds_left(gm: fx.GraphModule, result: PassResult) -> str | None:
    left = find_scaled_linears(gm)
    return f"{left[0].linear.name} is still followed by a constant scale" if left else None


@register_pass(
    NAME,
    summary="Fold a constant multiplication (or division) of a Linear's output into its weight and bias.",
    guarantees=(
        "Equal up to float rounding: (x W^T + b) c = x (cW)^T + cb. Only a linear whose single user is the "
        "scaling folds (another user needs the unscaled output); new weights are stored, the model's are never "
        "written. Torch dialect (call_module nn.Linear)."
    ),
    dialects=("torch",),
    ensures=_no_folds_left,
)
def fold_scale_into_linear(gm: fx.GraphModule, options: None) -> PassResult:
    result = PassResult(NAME, gm)
    replaced: set[str] = set()
    for fold in find_scaled_linears(gm):
        original = gm.get_submodule(str(fold.linear.target))
        scaled = nn.Linear(original.in_features, original.out_features, bias=original.bias is not None)
        scaled = scaled.to(device=original.weight.device, dtype=original.weight.dtype)
        with torch.no_grad():
            scaled.weight.copy_(original.weight * fold.factor)
            if original.bias is not None:
                scaled.bias.copy_(original.bias * fold.factor)
        # a new module, not the user's (the model may share it); the name says where it came from
        new_name = f"{str(fold.linear.target).replace('.', '_')}_scaled"
        while hasattr(gm, new_name):
            new_name += "_"
        gm.add_submodule(new_name, scaled)
        replaced.add(str(fold.linear.target))
        fold.linear.target = new_name
        mark(fold.linear, NAME, origin_of=fold.scale)
        fold.scale.replace_all_uses_with(fold.linear)
        gm.graph.erase_node(fold.scale)
        result.note(f"folded {fold.scale.name} (x {fold.factor:g}) into {new_name}", replaced=1, removed=1)
    still_called = {str(node.target) for node in gm.graph.nodes if node.op == "call_module"}
    for target in replaced - still_called:  # only the linears it replaced: other unused modules are not its business
        gm.delete_submodule(target)
    return result
