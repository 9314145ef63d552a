"""``fxforge passes``: the registered passes, their options, dialects and guarantees."""

from __future__ import annotations

import click

from fxforge.cli.options import emit_json, json_option, stdout


@click.command("passes")
@json_option
def command(as_json: bool) -> None:
    """List the available passes, their options, dialects and guarantees."""
    from fxforge.cli.render import render_passes
    from fxforge.passes import all_passes

    specs = all_passes()
    if as_json:
        emit_json([spec.to_dict() for spec in specs])
    else:
        render_passes(stdout, specs)
