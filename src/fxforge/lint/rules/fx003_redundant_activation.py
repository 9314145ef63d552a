"""FX003 redundant-activation: an activation applied to a value that is already in its range does nothing.

Detection is remove_redundant_activation's own (:func:`~fxforge.passes.remove_redundant_activation.plan_removals`),
so the rule reports exactly what ``lint --fix`` removes."""

from __future__ import annotations

from fxforge.lint import LintContext, rule
from fxforge.passes.remove_redundant_activation import plan_removals


@rule(
    "FX003",
    "redundant-activation",
    "warning",
    "activation applied to a value already in its output range",
    fix="remove_redundant_activation",
)
def check(ctx: LintContext):
    """Clamp-like activations (relu, relu6, hardtanh, clamp/clip with literal bounds) that change nothing:

    * outer redundant: ``clamp(lo, hi)`` applied to a value already within ``[lo, hi]`` (relu of relu,
      relu of sigmoid/softmax/relu6/hardsigmoid, relu6 of sigmoid, hardtanh(-1, 1) of tanh...) returns its input;
    * inner redundant: ``clamp(lo2, hi2)(clamp(lo1, hi1)(x))`` with ``[lo2, hi2]`` inside ``[lo1, hi1]``
      (relu6 of relu) equals the outer clamp alone; reported only when the outer is the inner's
      single user, since other users still need the inner value.

    Works on both dialects (modules, functions, methods, in-place and ATen forms; ATen ``hardtanh``, what relu6
    becomes, is read with its bounds). A redundant activation that the pass must keep -- an in-place op could
    tell its removal apart, or a clamp could change an integer dtype -- is not reported: the pass's result lists
    it with the reason.
    """
    removals, _ = plan_removals(ctx.gm)
    for removal in removals:
        yield removal.node, removal.message
