"""FX009 mergeable-convs: back-to-back convs (or linears) that one no larger layer computes exactly: wasted work."""

from __future__ import annotations

from fxforge.lint import LintContext, rule
from fxforge.passes.merge_convs import MergeConvsOptions, MergePlan, count_uses, plan_merge


@rule(
    "FX009",
    "mergeable-convs",
    "info",
    "two consecutive linear layers that one layer, no larger than the two, computes exactly",
    fix="merge_convs",
)
def check(ctx: LintContext):
    """Conv then conv (same dimensionality) or linear then linear, where the first one's output goes only
    to the second and one layer computes both exactly (the detection is ``merge_convs``'s own, so the two
    agree):

    * linear -> linear, always;
    * any conv -> a conv that does not pad: one conv of the input with the first conv's padding, the strides
      multiplied and the two kernels composed (kxk then 1x1, kxk then strided 1x1, 1x1 then kxk, kxk then kxk);
    * a 1x1 conv with stride 1 and no padding -> a padded conv, with reflect/replicate/circular padding, or
      with zero padding when the first conv has no bias (otherwise the bias would show up where the second
      conv pads with zeros);
    * any groups: the merged conv has gcd(groups) groups.

    A conv that pads another conv's output is never reported: that padding is no conv of the input.
    Modules, ``F.conv*``/``F.linear`` with stored weights, and ATen ``conv1d/2d/3d``, ``convolution`` and
    ``linear`` (arguments read from the call, weights from the ``get_attr`` nodes). Layers whose
    module or weights are used elsewhere are skipped: merging would change the other use.

    The merged layer is not always cheaper (a bottleneck pair has fewer weights than its product, two 3x3 convs
    become a 5x5). ``merge_convs`` merges such a pair only with ``allow_larger``, which ``lint --fix`` does not
    set, so such pairs are not reported: a finding the fix cannot clear would stay after every ``lint --fix``.
    The message gives both weight counts.
    """
    # lint --fix runs merge_convs with its default options: report only the pairs those options merge.
    options = MergeConvsOptions()
    uses = count_uses(ctx.graph, gm=ctx.gm)
    for node in ctx.graph.nodes:
        plan = plan_merge(ctx.gm, node, uses)
        if not isinstance(plan, MergePlan):
            continue
        if plan.refused(options) is not None:
            continue  # merge_convs leaves it alone with these options
        yield (
            node,
            f"{plan.first.node.name} and {node.name} can be merged into one layer: {plan.reason} "
            f"({plan.separate_weights:,} weights now, {plan.merged_weights:,} merged)",
        )
