"""``fxforge verify A B``: prove two models compute the same thing, or name the first node where they part."""

from __future__ import annotations

import click

from fxforge.cli.options import (
    emit_json,
    parse_assignments,
    parse_model_args,
    status,
    stdout,
    trust_pickle_option,
)
from fxforge.errors import EXIT_FINDINGS


@click.command(
    "verify",
    epilog="""\b
Examples:
  fxforge verify torchvision:resnet18 out/resnet18
  fxforge verify my_model.py:Net out/net --input 4x3x32x32 --cases 64 --json
Exit code: 1 when the outputs differ beyond the tolerance, the candidate does not run on the inputs
(a program exported for other shapes), or the reference cannot be checked (not deterministic, or the
same output for every input).
See docs/verified.md for what is tried and what a pass cannot prove.
""",
)
@click.argument("reference")
@click.argument("candidate")
@click.option("--input", "-i", "inputs", multiple=True, metavar="SPEC", help="Input shape (default: the model's).")
@click.option(
    "--seed",
    default=0,
    show_default=True,
    type=click.IntRange(0, 2**63 - 1),
    help="Seed for random weights and the first case.",
)
@click.option(
    "--cases",
    default=16,
    show_default=True,
    type=click.IntRange(min=1),
    help="Input cases to compare on (at least every distribution at every batch size).",
)
@click.option("--seeds", type=click.IntRange(min=1), default=None, hidden=True, help="Older name: at least N cases.")
@click.option("--rtol", type=click.FloatRange(min=0), default=None, help="Relative tolerance (default: per dtype).")
@click.option("--atol", type=click.FloatRange(min=0), default=None, help="Absolute tolerance (default: per dtype).")
@click.option("--allow-dtype-change", is_flag=True, help="Compare values even where the output dtype differs.")
@click.option("--model-arg", "model_args", multiple=True, metavar="KEY=VALUE", help="Constructor/config argument.")
@click.option("--leaf", "leaves", multiple=True, metavar="NAME", help="Capturing REFERENCE: keep this submodule whole.")
@click.option(
    "--wrap", "wraps", multiple=True, metavar="FUNCTION", help="Capturing REFERENCE: keep this function as one call."
)
@click.option(
    "--concrete",
    "concrete",
    multiple=True,
    metavar="NAME=VALUE",
    help="Call REFERENCE (and a CANDIDATE model that takes NAME) with this forward argument fixed, as "
    "--concrete fixed it when CANDIDATE was written, e.g. --concrete return_dict=false.",
)
@trust_pickle_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
def command(
    reference: str,
    candidate: str,
    inputs: tuple[str, ...],
    seed: int,
    cases: int,
    seeds: int | None,
    rtol: float | None,
    atol: float | None,
    allow_dtype_change: bool,
    model_args: tuple[str, ...],
    leaves: tuple[str, ...],
    wraps: tuple[str, ...],
    concrete: tuple[str, ...],
    trust_pickle: bool,
    as_json: bool,
) -> None:
    """Check that CANDIDATE computes what REFERENCE computes; on a mismatch, name the first diverging node."""
    from fxforge.api import verify_specs
    from fxforge.cli.render import render_verify

    with status("verifying", as_json):
        result = verify_specs(
            reference,
            candidate,
            list(inputs),
            seed=seed,
            cases=cases,
            seeds=seeds,
            rtol=rtol,
            atol=atol,
            model_kwargs=parse_model_args(model_args),
            trust_pickle=trust_pickle or None,
            concrete_args=parse_assignments(concrete, "--concrete"),
            allow_dtype_change=allow_dtype_change,
            leaf_modules=list(leaves),
            wrap=list(wraps),
        )
    if as_json:
        emit_json(result.to_dict())
    else:
        render_verify(stdout, reference, candidate, result)
    if not result.ok:
        raise SystemExit(EXIT_FINDINGS)
