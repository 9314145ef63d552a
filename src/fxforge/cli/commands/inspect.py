"""``fxforge inspect``: shapes, parameters, FLOPs and activations per node and per module."""

from __future__ import annotations

import click

from fxforge.cli.options import CaptureOptions, capture_options, emit_json, stdout, warn_failed_checks


@click.command(
    "inspect",
    epilog="""\b
Examples:
  fxforge inspect torchvision:resnet18
  fxforge inspect torchvision:resnet18 --nodes --depth 2
  fxforge inspect my_model.py:build --input 1x3x32x32 --json
  fxforge inspect transformers:BertModel --model-arg num_hidden_layers=2
  fxforge inspect transformers:LlamaForCausalLM --device meta   # no weights allocated
""",
)
@capture_options
@click.option("--depth", default=2, show_default=True, type=click.IntRange(min=0), help="Module summary depth.")
@click.option("--nodes", "show_nodes", is_flag=True, help="Also print the per-node table.")
@click.option("--code", "show_code", is_flag=True, help="Also print the generated Python code.")
def command(opts: CaptureOptions, depth: int, show_nodes: bool, show_code: bool) -> None:
    """Show a model's graph: shapes, parameters, FLOPs and activations per node and per module."""
    from fxforge.cli.render import render_inspect
    from fxforge.inspect import inspect_graph

    captured = opts.prepare()
    report = inspect_graph(captured, depth=depth, include_code=opts.as_json or show_code)
    if opts.as_json:
        emit_json(report.to_dict())
        return
    warn_failed_checks(captured)
    render_inspect(stdout, opts.model, report, show_nodes, show_code)
