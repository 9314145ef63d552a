"""``fxforge profile``: time per node and per module, against the machine's measured peak."""

from __future__ import annotations

import click

from fxforge.cli.options import (
    CAPTURE_ONLY,
    CaptureOptions,
    capture_options,
    emit_json,
    status,
    stdout,
    typed_parameters,
)
from fxforge.errors import FxforgeError, options_need


@click.command(
    "profile",
    epilog="""\b
Examples:
  fxforge profile torchvision:resnet18
  fxforge profile torchvision:resnet18 --batch 8 --top 10 --trace out/resnet18-trace.json
  fxforge profile transformers:BertModel --model-arg num_hidden_layers=2 --json > profile.json
  fxforge profile my_model.py:Net --input 1x3x32x32 --backend eager     # leaf modules, no graph needed
The trace opens in chrome://tracing or https://ui.perfetto.dev; the JSON feeds `fxforge graph --profile`.
""",
)
@capture_options
@click.option(
    "--backend",
    type=click.Choice(["fx", "eager"]),
    default="fx",
    show_default=True,
    help="fx: the captured graph, node by node; eager: the model, leaf module by leaf module.",
)
@click.option("--batch", type=click.IntRange(min=1), default=None, help="Batch size (default: the input's).")
@click.option("--repeats", default=10, show_default=True, type=click.IntRange(min=1), help="Profiled runs.")
@click.option("--warmup", default=2, show_default=True, type=click.IntRange(min=0), help="Unprofiled runs first.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="Intra-op threads.")
@click.option("--top", default=15, show_default=True, type=click.IntRange(min=1), help="Rows in the node table.")
@click.option("--depth", default=1, show_default=True, type=click.IntRange(min=1), help="Module roll-up depth.")
@click.option("--trace", type=click.Path(path_type=str), default=None, help="Write a Chrome/Perfetto trace here.")
@click.option("--force", is_flag=True, help="Replace an existing trace file.")
def command(
    opts: CaptureOptions,
    backend: str,
    batch: int | None,
    repeats: int,
    warmup: int,
    threads: int | None,
    top: int,
    depth: int,
    trace: str | None,
    force: bool,
) -> None:
    """Time every node (or leaf module) under torch.profiler; say which are compute- or memory-bound."""
    from fxforge.cli.render import render_profile
    from fxforge.profile import check_trace_path, profile_model

    given = typed_parameters()
    shaping = [f"--{name}" for name in ("top", "depth") if name in given]
    if opts.as_json and shaping:
        # the JSON is every node and module, whole: graph --profile colours each node from it, and a script picks
        # its own top rows (jq '.nodes | sort_by(-.time_ms)[:5]'); cutting it silently would mislead both
        raise FxforgeError(
            f"{' and '.join(shaping)} {'shapes' if len(shaping) == 1 else 'shape'} the tables; --json always holds "
            "every node and module",
            hint="drop them, or select from the JSON, e.g. jq '.nodes | sort_by(-.time_ms) | .[:5]'",
        )
    if backend == "eager" and opts.capture_only():
        given = opts.capture_only()
        raise FxforgeError(
            f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to --backend fx: --backend eager times "
            "the model itself, uncaptured",
            hint=f"drop {', '.join(given)}, or profile with --backend fx",
        )
    if trace is not None:
        check_trace_path(trace, force=force)  # before the model loads: a refusal after it would waste the wait
    example = None
    if backend == "eager":  # leaf modules of the model itself: no graph, so no capture to fail
        options_need(CAPTURE_ONLY, "--backend fx")  # refused above: a hint offers them with the mode that takes them
        target, example = opts.load()
    else:
        target = opts.prepare()
    with status("profiling", opts.as_json):
        report = profile_model(
            target,
            backend=backend,
            example_inputs=example,
            batch=batch,
            repeats=repeats,
            warmup=warmup,
            threads=threads,
            trace=trace,
            seed=opts.seed,
            force=force,
        )
    if opts.as_json:
        emit_json({"model": opts.model, **report.to_dict()})
    else:
        render_profile(stdout, opts.model, report, top, depth)
