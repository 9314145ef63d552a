"""FX008 foldable-batchnorm: an inference BatchNorm right after a conv/linear folds into its weights for free."""

from __future__ import annotations

from fxforge.lint import LintContext, rule
from fxforge.passes.fold_bn import FoldPlan, plan_fold
from fxforge.passes.merge_convs import count_uses


@rule(
    "FX008",
    "foldable-batchnorm",
    "info",
    "inference BatchNorm that can be folded into the preceding conv/linear",
    fix="fold_bn",
)
def check(ctx: LintContext):
    """A BatchNorm (module, ``F.batch_norm`` or ATen ``batch_norm``) in inference mode whose input is a
    conv, conv-transpose or linear output used by nothing else, with weights that belong to that one call:
    a conv module called once whose parameters the graph does not also read directly, or a functional/ATen
    conv whose stored weights nothing else reads. The detection is ``fold_bn``'s own (``plan_fold``), so
    ``lint --fix`` clears what this rule reports. A linear followed by BatchNorm1d is reported only when
    its output is known to be 2-D (the ATen dialect records shapes; a plain symbolic trace does not),
    because BatchNorm1d on 3-D input normalises another dimension.
    """
    uses = count_uses(ctx.graph)
    for node in ctx.graph.nodes:
        plan = plan_fold(ctx.gm, node, uses)
        if isinstance(plan, FoldPlan):
            yield (
                node,
                f"{node.name} (batch norm) can be folded into {plan.producer.name} ({plan.kind}): "
                "inference statistics, sole user",
            )
