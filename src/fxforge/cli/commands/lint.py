"""``fxforge lint``: rule-based findings, and ``--fix`` to apply the passes that clear them (verified)."""

from __future__ import annotations

import click
from rich.markup import escape

from fxforge.cli.options import (
    CaptureOptions,
    capture_options,
    emit_json,
    parameter_label,
    split,
    stderr,
    stdout,
    typed_parameters,
    warn_failed_checks,
)
from fxforge.errors import EXIT_FINDINGS, EXIT_INTERNAL, FxforgeError


@click.command(
    "lint",
    epilog="""\b
Examples:
  fxforge lint torchvision:mobilenet_v2
  fxforge lint my_model.py:Net --input 1x3x32x32 --select FX001,FX004
  fxforge lint demo --fail-on info --json
  fxforge lint torchvision:resnet18 --fix -o out/resnet18-fixed
  fxforge lint --rules
  fxforge lint my_model.py:Net --rule my_rules.py:no_big_linears
Exit code: 1 when a finding at or above --fail-on (default: warning) exists; 4 when a rule crashed (its findings are
missing), unless --fail-on never; else 0.
""",
)
@capture_options(model_required=False)
@click.option("--select", default="", help="Comma-separated rule codes or names to run (default: all).")
@click.option("--ignore", default="", help="Comma-separated rule codes or names to skip.")
@click.option(
    "--fail-on",
    type=click.Choice(["info", "warning", "error", "never"]),
    default="warning",
    show_default=True,
    help="Lowest severity that makes the exit code 1.",
)
@click.option("--rules", "list_rules", is_flag=True, help="List the rules and exit.")
@click.option(
    "--rule",
    "rule_references",
    multiple=True,
    metavar="FILE.py:FUNCTION",
    help="Also run the function it names, from a file or module (decorated with @fxforge.register_rule); repeat "
    "it for each rule.",
)
@click.option("--fix", is_flag=True, help="Apply the passes that fix the findings (verified); needs -o.")
@click.option("--output", "-o", type=click.Path(path_type=str), default=None, help="Output directory for --fix.")
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
def command(
    opts: CaptureOptions,
    select: str,
    ignore: str,
    fail_on: str,
    list_rules: bool,
    rule_references: tuple[str, ...],
    fix: bool,
    output: str | None,
    force: bool,
) -> None:
    """Find dead code, redundant ops, leftover training ops and optimisation opportunities."""
    from fxforge.cli.render import render_findings, render_optimize, render_plugin_failures, render_rules
    from fxforge.lint import all_rules, load_rule_reference
    from fxforge.lint import lint as run_lint
    from fxforge.optimize import fix as run_fix
    from fxforge.plugins import RULES_GROUP, failures

    if list_rules:
        _refuse_with_rules()
    for reference in rule_references:
        load_rule_reference(reference)
    if list_rules:
        rules = all_rules()
        if opts.as_json:
            emit_json([rule.to_dict() for rule in rules])
        else:
            render_rules(stdout, rules)
        render_plugin_failures(stderr, failures(RULES_GROUP))
        return
    if not opts.model:
        raise FxforgeError("lint needs a MODEL", hint="e.g. fxforge lint torchvision:resnet18")
    if fix and not output:
        raise FxforgeError("lint --fix writes the fixed model to a directory", hint="add -o OUTDIR")
    if not fix and (output or force):  # ignored, silently (QA): lint alone writes nothing
        given = "-o" if output else "--force"
        raise FxforgeError(f"{given} applies to lint --fix, which writes the fixed model", hint="add --fix")
    captured = opts.prepare()
    if fix:
        fixed = run_fix(captured, output, select=split(select), ignore=split(ignore), force=force, spec=opts.model)
        report = fixed.after
        if opts.as_json:
            emit_json({**report.to_dict(), "capture": captured.record.to_dict(), "fixed": fixed.to_dict()})
        else:
            if not fixed.passes:  # else an empty pass table would be all there is to read
                stdout.print("No finding names a fix pass: the model is written unchanged.")
            render_optimize(stdout, opts.model, fixed.optimized)
            if fixed.optimized.pipeline.ok:
                stdout.print(f"Remaining findings after {', '.join(fixed.landed) or 'no passes'}:")
                render_findings(stdout, opts.model, report.findings)
            else:  # nothing was written: the findings are still the model's
                stdout.print("Findings of the model (nothing was written):")
                render_findings(stdout, opts.model, fixed.before.findings)
        if not fixed.optimized.pipeline.ok:
            raise SystemExit(EXIT_FINDINGS)
    else:
        report = run_lint(captured, select=split(select), ignore=split(ignore), rules=rule_references)
        if opts.as_json:
            emit_json({**report.to_dict(), "capture": captured.record.to_dict()})
        else:
            warn_failed_checks(captured)
            # what capture kept as one call is not looked into: "All checks passed!" alone hid it (QA)
            record = captured.record
            for kept, what in ((record.leaves, "submodule"), (record.wrapped, "function or method")):
                if kept:
                    stdout.print(
                        f"note: kept as one call by capture (its code cannot be traced), so not linted inside: "
                        f"{what} {', '.join(kept)}",
                        highlight=False,
                    )
            if report.graphs_not_linted:  # lint read the graph around them only (QA: their findings went unsaid)
                stdout.print(
                    "note: not linted inside: the graphs that torch.cond (or another higher-order op) runs: "
                    f"{', '.join(report.graphs_not_linted)}",
                    highlight=False,
                )
            for skipped in report.rules_skipped:
                stdout.print(f"note: not run: {escape(skipped)}", highlight=False)
            render_findings(stdout, opts.model, report.findings)
    if not opts.as_json:
        # a rule that crashed, or a plug-in of rules that did not load: its findings are missing, which "All checks
        # passed!" alone hid (QA: lint.md promises the plug-in is named on stderr)
        for failure in report.rule_failures:
            stderr.print(f"warning: {escape(failure)}", highlight=False)
        render_plugin_failures(stderr, failures(RULES_GROUP))
    if fail_on != "never" and report.at_least(fail_on):
        raise SystemExit(EXIT_FINDINGS)
    if fail_on != "never" and report.rules_crashed:
        # its findings are missing: "0, all checks passed" would let CI pass a check that did not run (QA)
        raise SystemExit(EXIT_INTERNAL)


def _refuse_with_rules() -> None:
    """--rules lists and exits: a MODEL given with it was silently not linted (QA), as other options were ignored.
    --rule is kept (its rule is listed too), and --json."""
    given = [
        parameter_label(param)
        for name, param in typed_parameters().items()
        if name not in ("list_rules", "rule_references", "as_json")
    ]
    if given:
        raise FxforgeError(
            f"--rules lists the rules and lints no model: it takes no MODEL or other options (got {', '.join(given)})",
            hint="fxforge lint --rules [--rule FILE.py:FUNCTION] [--json], or fxforge lint MODEL to lint it",
        )
