"""``fxforge passes``: the registered passes, their options, dialects and guarantees."""

from __future__ import annotations

import click

from fxforge.cli.options import emit_json, json_option, stderr, stdout


@click.command("passes")
@json_option
def command(as_json: bool) -> None:
    """List the available passes, their options, dialects and guarantees."""
    from fxforge.cli.render import render_passes, render_plugin_failures
    from fxforge.passes import all_passes
    from fxforge.plugins import PASSES_GROUP, failures

    specs = all_passes()
    if as_json:
        emit_json([spec.to_dict() for spec in specs])
    else:
        render_passes(stdout, specs)
    render_plugin_failures(stderr, failures(PASSES_GROUP))
