"""``fxforge split``: plan pipeline stages that balance a cost, build and verify them, write one module per stage."""

from __future__ import annotations

import click

from fxforge.cli.options import (
    CaptureOptions,
    capture_options,
    emit_json,
    status,
    stdout,
    warn_failed_checks,
)
from fxforge.errors import EXIT_FINDINGS


@click.command(
    "split",
    epilog="""\b
Examples:
  fxforge split torchvision:resnet18 --stages 4 -o out/resnet18-4
  fxforge split torchvision:resnet50 --stages 4 --balance memory --json
  fxforge split transformers:LlamaForCausalLM --device meta --stages 8 --balance params   # plan only
  fxforge split my_model.py:Net --input 2x3x32x32 --stages 2 --balance time --profile profile.json -o out/net
Then run the stages: fxforge run-pipeline out/resnet18-4 --microbatches 8
Exit code: 1 when the stages chained together do not match the model (nothing is written);
2 for bad input (--stages below 1 or above the graph's node count, --balance time without --profile, --profile
without --balance time, --cases with --no-verify, a non-empty -o without --force, or with --force a directory
fxforge did not write).
""",
)
@capture_options
@click.option("--stages", "-n", type=click.IntRange(min=1), required=True, help="Number of pipeline stages.")
@click.option(
    "--balance",
    type=click.Choice(["flops", "params", "memory", "time"]),
    default="flops",
    show_default=True,
    help="Cost to balance: FLOPs, parameter bytes, parameter + activation bytes, or profiled time (--profile).",
)
@click.option(
    "--profile",
    "profile_path",
    type=click.Path(dir_okay=False, path_type=str),
    default=None,
    help="Profile JSON with node times (fxforge profile MODEL --json), for --balance time.",
)
@click.option(
    "--slack",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Accept a largest stage up to this fraction above the best when that cuts fewer bytes.",
)
@click.option("--output", "-o", type=click.Path(path_type=str), default=None, help="Directory to write the stages to.")
@click.option(
    "--force",
    is_flag=True,
    help="Replace a directory fxforge wrote (a split's, with plan.json, or another command's, with report.json) "
    "or an empty one.",
)
@click.option("--no-verify", is_flag=True, help="Do not verify the chained stages against the model.")
@click.option("--cases", default=None, type=click.IntRange(min=1), help="Input cases to verify on.  [default: 16]")
def command(
    opts: CaptureOptions,
    stages: int,
    balance: str,
    profile_path: str | None,
    slack: float,
    output: str | None,
    force: bool,
    no_verify: bool,
    cases: int | None,
) -> None:
    """Split a model into pipeline stages: optimal cuts balancing a cost, one loadable module per stage."""
    from fxforge.artifacts import check_output_directory
    from fxforge.cli.render import render_split
    from fxforge.split import check_split_request, split

    # before the model loads: the mistake costs nothing
    check_split_request(stages, balance, profile_path, slack, verify_stages=not no_verify, cases=cases)
    if output is not None:
        # before the capture (25 s for a 70B model on meta)
        check_output_directory(output, force=force, reading=opts.model)
    captured = opts.prepare()
    with status("planning the split", opts.as_json):
        result = split(
            captured,
            stages,
            balance,
            profile=profile_path,
            slack=slack,
            output_dir=output,
            force=force,
            verify_stages=not no_verify,
            cases=cases,
            seed=opts.seed,
            model_name=opts.model or "",
        )
    if opts.as_json:
        emit_json(result.to_dict())
    else:
        warn_failed_checks(captured)
        render_split(stdout, opts.model or "", captured.record.to_dict(), result)
    if not result.ok:  # without -o a mismatch is reported, not raised (with -o nothing is written and it raises)
        raise SystemExit(EXIT_FINDINGS)
