"""``fxforge report``: one self-contained HTML page to attach to a pull request."""

from __future__ import annotations

import click

from fxforge.cli.options import CaptureOptions, capture_options, emit_json, split, status, stdout, typed_parameters
from fxforge.errors import EXIT_FINDINGS, FxforgeError


@click.command(
    "report",
    epilog="""\b
Examples:
  fxforge report torchvision:resnet18 -o report.html
  fxforge report torchvision:resnet18 -p fold_bn,remove_dropout --bench -o report.html
  fxforge report torchvision:resnet18 --quantize static -o report.html
  fxforge report torchvision:resnet18 --profile -o report.html   # nodes coloured by their time
The page holds the environment, capture, inspect table, lint findings (click one: the graph shows its node),
the change log, verification and diff (with -p), bench latencies (--bench), quantize accuracy (--quantize) and
each node's share of the time (--profile: the captured model's nodes timed one by one, as fxforge profile does).
Exit code: 1 when the verification of -p fails (the page is written and says so).
""",
)
@capture_options
@click.option("--output", "-o", required=True, type=click.Path(path_type=str), help="report.html")
@click.option(
    "--passes", "-p", "pass_names", multiple=True, metavar="NAMES", help="Run these passes (verified); 'exact': all."
)
@click.option("--bench", "do_bench", is_flag=True, help="Time backends and chart their latencies.")
@click.option(
    "--backends",
    "-b",
    default="",
    metavar="NAMES",
    help="--bench: backends (default eager,fx,torchscript,onnxruntime).",
)
@click.option("--repeats", default=None, type=click.IntRange(min=1), help="--bench: timed rounds.  [default: 20]")
@click.option(
    "--quantize",
    "quantize_mode",
    type=click.Choice(["static", "dynamic"]),
    default=None,
    help="Quantize and report accuracy.",
)
@click.option(
    "--profile", "do_profile", is_flag=True, help="Time every node (fxforge profile) and colour the graph by time."
)
@click.option(
    "--profile-file",
    default=None,
    metavar="FILE",
    help="Colour by a saved profile instead (fxforge profile --json output).",
)
@click.option("--depth", type=click.IntRange(min=0), default=None, help="Open the graph's modules to this depth.")
@click.option("--force", is_flag=True, help="Replace an existing file.")
def command(
    opts: CaptureOptions,
    output: str,
    pass_names: tuple[str, ...],
    do_bench: bool,
    backends: str,
    repeats: int | None,
    quantize_mode: str | None,
    do_profile: bool,
    profile_file: str | None,
    depth: int | None,
    force: bool,
) -> None:
    """Write an HTML report: environment, capture, inspect, lint, optimize diff, bench and quantize charts."""
    from fxforge.cli.render import page_node_counts, render_page
    from fxforge.passes import expand_groups
    from fxforge.pipeline import pass_name
    from fxforge.profile import profile_model
    from fxforge.report import check_report_passes, check_report_path, report
    from fxforge.visual.graph import read_profile

    check_report_path(output, force=force)  # before the work: a refusal after it would waste it
    given = typed_parameters()
    bench_only = [f"--{name}" for name in ("backends", "repeats") if name in given]
    if bench_only and not do_bench:  # they would be ignored, and the page would have no bench section
        verb = "applies" if len(bench_only) == 1 else "apply"
        raise FxforgeError(f"{', '.join(bench_only)} {verb} to --bench", hint="add --bench")
    if do_profile and profile_file:
        raise FxforgeError("--profile and --profile-file both say where the times come from", hint="pass one")
    # file.py:function registers the plug-in pass and gives its name, as optimize -p does (QA: report refused it)
    names = expand_groups([pass_name(name) for group in pass_names for name in split(group)])
    check_report_passes(names)  # an unknown pass, or one that needs options, fails now, before any work
    profile = read_profile(profile_file) if profile_file else None
    captured = opts.prepare()
    if do_profile:
        with status("timing every node", opts.as_json):
            profile = profile_model(captured)
    with status("building the report", opts.as_json):
        view = report(
            captured,
            output,
            passes=names,
            bench=(split(backends) or True) if do_bench else False,
            bench_repeats=repeats,
            quantize=quantize_mode,
            profile=profile,
            spec=opts.model,
            depth=depth,
            force=force,
        )
    if opts.as_json:
        emit_json(
            {
                "path": str(view.path),
                **page_node_counts(view.model),
                "counts": view.model.get("counts"),
                "profile": view.model.get("profile"),
                **view.findings,  # lint, and optimize (its verification), bench, quantize where asked
            }
        )
    else:
        render_page(stdout, view)
    if view.failures:  # the page is written and says so; a CI job reads the exit code, as of optimize --verify
        raise SystemExit(EXIT_FINDINGS)
