"""``fxforge bench``: latency, throughput, peak memory and error vs eager, per backend, side by side."""

from __future__ import annotations

import click

from fxforge.cli.options import (
    CaptureOptions,
    capture_options,
    emit_json,
    parameter_label,
    split,
    stderr,
    stdout,
    typed_parameters,
)
from fxforge.errors import FxforgeError


@click.command(
    "bench",
    epilog="""\b
Examples:
  fxforge bench torchvision:resnet18 --input 1x3x224x224
  fxforge bench torchvision:mobilenet_v2 --backends eager,onnxruntime,int8 --batch 1,8 --threads 2
  fxforge bench out/resnet18 --backends eager,torchscript --repeats 50 --json
  fxforge bench torchvision:resnet18 -i 1x3x224x224 --artifact out/auto --artifact resnet18.onnx
  fxforge bench --list-backends
Backends: fxforge bench --list-backends (default: every one this machine runs fast; plug-ins add their own).
""",
)
@capture_options(model_required=False)
@click.option("--backends", "-b", default=None, metavar="NAMES", help="Comma-separated backends (default: all).")
@click.option("--batch", "batch_sizes", multiple=True, metavar="N[,N]", help="Batch sizes (default: the input's).")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="Intra-op threads for torch and ORT.")
@click.option("--warmup", default=3, show_default=True, type=click.IntRange(min=1), help="Untimed calls first.")
@click.option("--repeats", default=20, show_default=True, type=click.IntRange(min=1), help="Timed calls per backend.")
@click.option("--passes", "-p", "pass_names", default=None, metavar="NAMES", help="Passes for the fx backend.")
@click.option("--option", "pass_options", multiple=True, metavar="PASS.KEY=VALUE", help="Option for one of --passes.")
@click.option(
    "--artifact",
    "artifacts",
    multiple=True,
    metavar="PATH",
    help="Also time a written file or output directory (ONNX, TorchScript, .pt2, AOTInductor, an --auto output), "
    "loaded as fxforge.load_model loads it, next to the model (with no --backends: next to eager). Repeatable.",
)
@click.option("--list-backends", is_flag=True, help="List the backends (with where each comes from) and exit.")
def command(
    opts: CaptureOptions,
    backends: str | None,
    batch_sizes: tuple[str, ...],
    threads: int | None,
    warmup: int,
    repeats: int,
    pass_names: str | None,
    pass_options: tuple[str, ...],
    artifacts: tuple[str, ...],
    list_backends: bool,
) -> None:
    """Median/p90 latency, throughput, peak memory and max error vs eager, per backend, side by side."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from fxforge.bench import (
        all_backends,
        bench,
        check_artifacts,
        get_backend,
        pass_steps,
        refuse_no_backends,
        refuse_passes_without_fx,
    )
    from fxforge.cli.render import render_backends, render_bench, render_plugin_failures
    from fxforge.plugins import BACKENDS_GROUP, failures

    if list_backends:
        _refuse_with_list_backends()
        listed = [backend.to_dict() for backend in all_backends()]
        if opts.as_json:
            emit_json({"backends": listed, "plugin_failures": [f.describe() for f in failures(BACKENDS_GROUP)]})
        else:
            render_plugin_failures(stderr, failures(BACKENDS_GROUP))
            render_backends(stdout, listed)
        return
    if not opts.model:
        raise FxforgeError("bench needs a MODEL", hint="e.g. fxforge bench torchvision:resnet18")
    names = None if backends is None else split(backends)
    refuse_no_backends(names)
    chosen = [get_backend(name) for name in names or ()]  # an unknown name fails before the model is loaded
    # an unknown pass or option: named before anything else
    pass_steps(None if pass_names is None else split(pass_names), pass_options)
    if pass_names is not None and chosen:
        refuse_passes_without_fx(chosen)  # before the model loads; bench() checks it again for Python callers
    try:
        batches = [int(b) for group in batch_sizes for b in split(group)]
    except ValueError:
        raise FxforgeError(f"--batch takes integers, got {' '.join(batch_sizes)!r}", hint="e.g. --batch 1,8") from None
    if any(b < 1 for b in batches):
        raise FxforgeError("--batch sizes must be at least 1")
    check_artifacts(artifacts)  # before the model is loaded and captured
    captured = opts.prepare()
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"))
    # Off when stderr is not a terminal, like the other commands' spinner: there rich draws no bar, but stopping
    # it still writes an empty line, which landed before an error message or in a redirected log.
    quiet = opts.as_json or not stderr.is_terminal
    with Progress(*columns, TimeElapsedColumn(), console=stderr, transient=True, disable=quiet) as progress:
        task = progress.add_task("benchmarking", total=None)

        def advance(done: int, total: int, description: str) -> None:
            progress.update(task, completed=done, total=total, description=description or "benchmarking")

        report = bench(
            captured,
            names,
            batches=batches or None,
            threads=threads,
            warmup=warmup,
            repeats=repeats,
            seed=opts.seed,
            passes=None if pass_names is None else split(pass_names),
            progress=advance,
            pass_options=pass_options,
            artifacts=list(artifacts),
            # the artifacts are loaded like the model: a pickled model.pt needs the same opt-in
            trust_pickle=opts.trust_pickle or None,
        )
    if opts.as_json:
        emit_json({"model": opts.model, **report.to_dict()})
    else:
        render_bench(stdout, opts.model, report)


def _refuse_with_list_backends() -> None:
    """--list-backends lists and exits: a MODEL or another option given with it would be silently ignored."""
    given = [
        parameter_label(param) for name, param in typed_parameters().items() if name not in ("list_backends", "as_json")
    ]
    if given:
        raise FxforgeError(
            f"--list-backends takes no model or other options (got {', '.join(given)})",
            hint="fxforge bench --list-backends [--json]",
        )
