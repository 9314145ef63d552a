"""``fxforge graph``: the captured graph (or a before/after diff) as an interactive HTML page or an SVG picture."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from fxforge.cli.options import CaptureOptions, capture_options, emit_json, status, stdout


@click.command(
    "graph",
    epilog="""\b
Examples:
  fxforge graph torchvision:resnet18 -o resnet18.html
  fxforge graph torchvision:resnet18 -o resnet18.svg --depth 1
  fxforge graph torchvision:resnet18 --diff out/resnet18 --trust-pickle -o diff.html
  fxforge graph my_model.py:Net --input 1x3x32x32 --profile profile.json -o hot.html
  fxforge graph transformers:LlamaForCausalLM --device meta -o llama.html   # opens collapsed
The page works offline (no network request): open it in any browser.
""",
)
@capture_options
@click.option("--output", "-o", required=True, type=click.Path(path_type=str), help="graph.html or graph.svg.")
@click.option("--depth", type=click.IntRange(min=0), default=None, help="Open modules to this depth (default: auto).")
@click.option(
    "--diff", "diff_dir", default=None, metavar="OUTDIR", help="Overlay an fxforge optimize output directory."
)
@click.option(
    "--profile", "profile_file", default=None, metavar="FILE", help="fxforge profile --json output: colour by time."
)
@click.option("--force", is_flag=True, help="Replace an existing file.")
def command(
    opts: CaptureOptions, output: str, depth: int | None, diff_dir: str | None, profile_file: str | None, force: bool
) -> None:
    """Draw a model's graph: modules you can open and close, shapes, FLOPs, source lines, lint findings."""
    from fxforge.cli.render import page_node_counts, render_page
    from fxforge.graphs import ATEN, dialect_of
    from fxforge.visual.graph import read_profile
    from fxforge.visual.page import GraphView, check_page_path, write_text
    from fxforge.visual.render import diff_html, graph_html, graph_svg, load_output_dir

    check_page_path(output, force=force)  # before the work: a refusal after it would waste it
    suffix = Path(output).suffix.lower()
    profile = read_profile(profile_file) if profile_file else None
    if diff_dir is not None:
        rewritten, passes = load_output_dir(
            diff_dir, trust_pickle=opts.trust_pickle or None, model=opts.model, model_kwargs=opts.model_kwargs()
        )
        if opts.method == "auto":  # capture the model in the dialect of the output's graph: a diff needs one
            opts = dataclasses.replace(opts, method="export" if dialect_of(rewritten) == ATEN else "symbolic_trace")
    captured = opts.prepare()
    with status("drawing the graph", opts.as_json):
        title = opts.model or "model"
        if diff_dir is not None:
            view = diff_html(  # captured in the output's dialect above, unless --method said otherwise
                captured,
                rewritten,
                passes=passes,
                depth=depth,
                profile=profile,
                title=f"{title} vs {diff_dir}",
                match_dialect=False,
            )
        else:
            view = graph_html(captured, depth=depth, profile=profile, title=title)
        if suffix == ".svg":
            svg = graph_svg(view.model, depth=depth)
            write_text(output, svg, force=force)
            view = GraphView(svg, view.model, Path(output), title)
        else:
            view.save(output, force=force)
    if opts.as_json:
        emit_json(
            {
                "path": str(view.path),
                "depth": view.model["depth"],
                **page_node_counts(view.model),
                "modules": sum(1 for m in view.model["modules"] if not m.get("g")),  # not boxes of nodes
                "counts": view.model.get("counts"),
                "divergence": view.model.get("divergence"),
            }
        )
        return
    render_page(stdout, view)
