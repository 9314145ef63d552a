"""``fxforge debug``: forward hooks on the model itself: the first module to produce NaN/Inf, activation stats."""

from __future__ import annotations

import click

from fxforge.cli.options import emit_json, json_option, parse_model_args, status, stdout, trust_pickle_option


@click.command(
    "debug",
    epilog="""\b
Examples:
  fxforge debug my_model.py:Net --input 8x3x32x32 --nan
  fxforge debug my_model.py:Net --input 8x3x32x32 --nan --cases 16      # try varied inputs until one triggers it
  fxforge debug torchvision:resnet18 --stats --json
Works on models fxforge cannot capture: nothing is traced, the model runs as it is.
Exit code: 1 when --nan finds a NaN/Inf, else 0.
""",
)
@click.argument("model")
@click.option("--input", "-i", "inputs", multiple=True, metavar="SPEC", help="Input shape (default: the model's).")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, 2**63 - 1), help="Seed.")
@click.option("--model-arg", "model_args", multiple=True, metavar="KEY=VALUE", help="Constructor/config argument.")
@click.option("--nan", is_flag=True, help="Name the first module whose output holds NaN or Inf.")
@click.option("--stats", is_flag=True, help="Activation statistics per module.")
@click.option("--cases", default=1, show_default=True, type=click.IntRange(min=1), help="Input cases to try.")
@trust_pickle_option
@json_option
def command(
    model: str,
    inputs: tuple[str, ...],
    seed: int,
    model_args: tuple[str, ...],
    nan: bool,
    stats: bool,
    cases: int,
    trust_pickle: bool,
    as_json: bool,
) -> None:
    """Run the model with forward hooks: find where NaN/Inf first appears, or record activation statistics."""
    from fxforge.api import example_inputs_for
    from fxforge.cli.render import render_debug
    from fxforge.debug import debug_model
    from fxforge.errors import EXIT_FINDINGS, FxforgeError
    from fxforge.models import load_model

    if not nan and not stats:  # before building the model: a usage error should not wait for it
        raise FxforgeError("debug needs something to look for", hint="pass --nan and/or --stats")
    loaded = load_model(model, seed=seed, model_kwargs=parse_model_args(model_args), trust_pickle=trust_pickle or None)
    example = example_inputs_for(loaded, list(inputs), seed=seed)
    with status("running with hooks", as_json):
        report = debug_model(loaded.module, example, nan=nan, stats=stats, cases=cases, seed=seed)
    if as_json:
        emit_json({"model": model, **report.to_dict()})
    else:
        render_debug(stdout, model, report)
    if report.nan is not None:
        raise SystemExit(EXIT_FINDINGS)
