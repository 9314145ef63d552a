"""Lint rule FXP001 scalable-linear: a Linear's output scaled by a constant, which ``fold_scale_into_linear`` folds.

The rule and the pass share one detection (:func:`find_scaled_linears`), so ``fxforge lint --fix`` clears every
finding and the rule never reports what the pass would refuse.
"""

from __future__ import annotations

from fxforge.lint import LintContext, rule
from fxforge_example_plugin.passes import NAME, find_scaled_linears


@rule(
    "FXP001",
    "scalable-linear",
    "info",
    "a Linear's output is scaled by a constant that its weights could carry",
    fix=NAME,
    dialects=("torch",),
)
def check(ctx: LintContext):
    for fold in find_scaled_linears(ctx.gm):
        yield fold.scale, f"{fold.linear.target}'s output is scaled by {fold.factor:g}: fold it into the weights"
