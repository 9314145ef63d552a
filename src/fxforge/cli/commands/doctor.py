"""``fxforge doctor``: versions, CPU features, kernel backends, GPUs, feature availability and measured peak."""

from __future__ import annotations

import click

from fxforge.cli.options import emit_json, json_option, status, stdout


@click.command(
    "doctor",
    epilog="""\b
Examples:
  fxforge doctor
  fxforge doctor --json > machine.json      # for a bug report or next to a benchmark table
  fxforge doctor --no-peak                   # skip the 2-second peak measurement
""",
)
@click.option("--no-peak", is_flag=True, help="Skip measuring the peak matmul throughput and memory bandwidth.")
@click.option(
    "--seconds",
    type=click.FloatRange(min=0.2, max=60),
    default=None,
    help="About how long the peak measurement takes (at least what its memory copy needs, about 1 s).  [default: 2.0]",
)
@json_option
def command(no_peak: bool, seconds: float | None, as_json: bool) -> None:
    """Say what this installation and this machine can do, and why a feature is not available."""
    from fxforge.cli.render import render_doctor
    from fxforge.doctor import doctor

    with status("measuring the machine", as_json):
        report = doctor(peak=not no_peak, seconds=seconds)
    if as_json:
        emit_json(report.to_dict())
    else:
        render_doctor(stdout, report)
