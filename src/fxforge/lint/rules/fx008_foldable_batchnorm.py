"""FX008 foldable-batchnorm: an inference BatchNorm right after a conv/linear folds into its weights for free."""

from __future__ import annotations

from fxforge.lint import LintContext, rule
from fxforge.passes.fold_bn import FoldPlan, find_folds


@rule(
    "FX008",
    "foldable-batchnorm",
    "info",
    "inference BatchNorm that can be folded into the preceding conv/linear",
    fix="fold_bn",
)
def check(ctx: LintContext):
    """A batch norm in inference mode whose input is a conv, conv-transpose or linear output used by nothing
    else (reads of its shape or rank aside), with weights that belong to that one call. The detection is
    ``fold_bn``'s own (``find_folds``), so the rule reports exactly what the pass folds and ``lint --fix``
    clears it: ``nn.BatchNorm*`` modules, ``F.batch_norm`` and ATen batch norms; frozen batch norms
    (``x * scale + shift`` with per-channel scale and shift computed from stored tensors, e.g.
    ``FrozenBatchNorm2d``); batch norms inside a module the graph calls as one node (timm ``BatchNormAct2d``,
    ``ConvNormAct``), reported on that call. A linear followed by BatchNorm1d is reported only when its output
    is known to be 2-D (the ATen dialect records shapes; a plain symbolic trace does not), because
    BatchNorm1d on 3-D input normalises another dimension.

    A batch norm after a conv/linear that is in training mode cannot be folded; it is reported too, with
    the fix (call ``model.eval()`` before capture), since ``fold_bn`` cannot clear it.
    """
    for node, plan in find_folds(ctx.gm):
        if isinstance(plan, FoldPlan):
            what = "frozen batch norm" if plan.norm.frozen else "batch norm"
            yield (
                node,
                f"{node.name} ({what}) can be folded into {plan.producer.name} ({plan.kind}): "
                "inference statistics, sole user",
            )
        elif plan.training:
            yield node, f"{node.name} (batch norm) cannot be folded: {plan}"
