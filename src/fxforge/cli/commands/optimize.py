"""``fxforge optimize``: run passes (or ``--auto``: every backend, verified and timed) and write the result."""

from __future__ import annotations

import time
import warnings
from typing import TYPE_CHECKING

import click

from fxforge.cli.options import CaptureOptions, capture_options, emit_json, split, status, stderr, stdout, warn
from fxforge.errors import EXIT_FINDINGS, FxforgeError

if TYPE_CHECKING:
    from fxforge.auto import Budget


@click.command(
    "optimize",
    epilog="""\b
Examples:
  fxforge optimize torchvision:resnet18 -p fold_bn,remove_dropout --verify -o out/resnet18
  fxforge optimize demo -p fold_bn -p replace_modules --option replace_modules.mapping='{ReLU: ReLU6}' -o out/demo
  fxforge optimize my_model.py:Net --input 1x3x32x32 --pipeline pipeline.yaml -o out/net
  fxforge optimize torchvision:resnet18 --auto -o out/fastest
  fxforge optimize torchvision:resnet18 --auto --quick -o out/fastest
  fxforge optimize torchvision:resnet18 --auto --min-agreement 0.99 --data val.pt -o out/fastest
  fxforge optimize torchvision:resnet18 --auto -b onnxruntime,compile+channels_last -o out/fastest
Exit code: 1 when verification finds a mismatch (nothing is written then; with --keep-going the failing
pass is rolled back and reported instead).
""",
)
@capture_options
@click.option(
    "--passes",
    "-p",
    "pass_names",
    multiple=True,
    metavar="NAMES",
    help="Comma-separated pass names; 'exact' is every exact pass (the default without --pipeline).",
)
@click.option("--pipeline", type=click.Path(exists=True, dir_okay=False), default=None, help="YAML/TOML pipeline.")
@click.option("--option", "pass_options", multiple=True, metavar="PASS.KEY=VALUE", help="Option for one pass.")
@click.option(
    "--verify/--no-verify",
    "do_verify",
    default=None,
    help="Verify every pass that changes the graph (default: off, or the pipeline file's 'verify').",
)
@click.option("--keep-going", is_flag=True, default=None, help="Roll back a pass that fails and run the rest.")
@click.option("--timings", is_flag=True, help="Say where the time went: capture, reference, each pass, writing.")
@click.option("--output", "-o", type=click.Path(path_type=str), default=None, help="Directory to write.")
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
@click.option("--auto", is_flag=True, help="Try every backend, verify, time the survivors, write the fastest.")
@click.option(
    "--tolerance",
    type=float,
    default=None,
    help="--auto: normwise relative tolerance for every dtype.  [default: each output dtype's round-off, as verify]",
)
@click.option("--min-agreement", type=float, default=None, help="--auto: allow bf16/int8 at this top-1 agreement.")
@click.option(
    "--max-drop",
    type=float,
    default=None,
    help="--auto: allow bf16/int8 that lose at most this much top-1 accuracy (0.01: one point) on --data's labels.",
)
@click.option("--data", default=None, metavar="FILE|file.py:fn", help="--auto: inputs to judge bf16/int8 on.")
@click.option(
    "--calibration-data",
    default=None,
    metavar="FILE|file.py:fn",
    help="--auto: other samples to calibrate int8 on (default: --data, an in-sample judgement).",
)
@click.option(
    "--backends",
    "-b",
    "auto_backends",
    default=None,
    metavar="NAMES",
    help="--auto: candidates (compile+channels_last).",
)
@click.option("--quick", is_flag=True, help="--auto: only the candidates that usually win here, fewer rounds.")
@click.option(
    "--repeats", default=None, type=click.IntRange(min=1), help="--auto: timed rounds (default 30; --quick 10)."
)
@click.option("--threads", type=click.IntRange(min=1), default=None, help="--auto: intra-op threads while timing.")
def command(
    opts: CaptureOptions,
    pass_names: tuple[str, ...],
    pipeline: str | None,
    pass_options: tuple[str, ...],
    do_verify: bool | None,
    keep_going: bool | None,
    timings: bool,
    output: str | None,
    force: bool,
    auto: bool,
    tolerance: float | None,
    min_agreement: float | None,
    max_drop: float | None,
    data: str | None,
    calibration_data: str | None,
    auto_backends: str | None,
    quick: bool,
    repeats: int | None,
    threads: int | None,
) -> None:
    """Rewrite a model with passes, verify it, and write the result (loadable with torch alone)."""
    from fxforge.artifacts import check_output_directory
    from fxforge.cli.render import render_capture_warnings, render_optimize, render_timings
    from fxforge.optimize import optimize
    from fxforge.pipeline import build_pipeline

    # an option of the other mode would be ignored, silently: refused instead
    auto_only = {
        "--tolerance": tolerance is not None,
        "--min-agreement": min_agreement is not None,
        "--max-drop": max_drop is not None,
        "--data": data is not None,
        "--calibration-data": calibration_data is not None,
        "--backends": auto_backends is not None,
        "--quick": quick,
        "--repeats": repeats is not None,
        "--threads": threads is not None,
    }
    given = [name for name, is_given in auto_only.items() if is_given]
    if given and not auto:
        verb = "applies" if len(given) == 1 else "apply"
        raise FxforgeError(f"{', '.join(given)} {verb} to --auto", hint="add --auto")
    if auto:
        if pass_names or pipeline or pass_options:
            raise FxforgeError("--auto picks the passes itself", hint="drop --passes/--pipeline/--option")
        pipeline_only = {"--keep-going": bool(keep_going), "--timings": timings, "--no-verify": do_verify is False}
        given = [name for name, is_given in pipeline_only.items() if is_given]
        if given:
            raise FxforgeError(
                f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to passes, not to --auto",
                hint="--auto verifies every candidate, rejects those that fail and reports where its time went: "
                f"drop {', '.join(given)}",
            )
        from fxforge.auto import FP32_TOLERANCE, Budget

        budget = Budget(FP32_TOLERANCE if tolerance is None else tolerance, min_agreement, max_drop)
        _auto(opts, output, force, budget, data, calibration_data, auto_backends, quick, repeats, threads)
        return
    plan = build_pipeline(
        pass_names, pass_options, pipeline_file=pipeline, verify=do_verify, keep_going=keep_going or None
    )
    if output is not None:
        check_output_directory(output, force=force, reading=opts.model)  # before the capture and the passes
    started = time.perf_counter()
    captured = opts.prepare()
    capture_s = time.perf_counter() - started
    with status("running passes", opts.as_json):
        result = optimize(captured, plan, output_dir=output, force=force, spec=opts.model)
    if opts.as_json:
        emit_json({**result.to_dict(), "capture_s": round(capture_s, 3)})
    else:
        render_optimize(stdout, opts.model, result)
        render_capture_warnings(stdout, captured.record)
        if timings:
            render_timings(stdout, capture_s, result)
        if output is None:  # a run that wrote nothing said nothing of it (QA)
            stderr.print("nothing written: pass -o OUTDIR to write the rewritten model", highlight=False)
    if not result.pipeline.ok:
        raise SystemExit(EXIT_FINDINGS)


def _auto(
    opts: CaptureOptions,
    output: str | None,
    force: bool,
    budget: Budget,
    data: str | None,
    calibration_data: str | None,
    backends: str | None,
    quick: bool,
    repeats: int | None,
    threads: int | None,
) -> None:
    from fxforge.artifacts import check_output_directory
    from fxforge.auto import AutoWarning, auto_optimize
    from fxforge.cli.render import render_auto

    if output is not None:
        check_output_directory(output, force=force, reading=opts.model)  # before the capture and candidates
    captured = opts.prepare()
    with status("writing, verifying and timing every candidate", opts.as_json), warnings.catch_warnings():
        warnings.simplefilter("ignore", AutoWarning)  # printed below as one line, from result.warnings
        result = auto_optimize(
            captured,
            output,
            budget=budget,
            backends=_backend_names(backends),
            data=data,
            calibration_data=calibration_data,
            repeats=repeats,
            threads=threads,
            force=force,
            spec=opts.model,
            quick=quick,
        )
    for message in result.warnings:
        warn(message)
    if opts.as_json:  # what report.json holds, and the seconds of writing it
        emit_json({"model": opts.model, "capture": captured.record.to_dict(), **result.to_dict()})
    else:
        render_auto(stdout, opts.model, result)


def _backend_names(text: str | None) -> list[str] | None:
    """``--backends``' names; None where it was not given. An empty list is refused: it ran the whole default list
    (QA: ``-b ""``), where a list that replaces the default would leave eager alone."""
    if text is None:
        return None
    names = split(text)
    if not names:
        raise FxforgeError("--backends names no backend", hint="e.g. --backends onnxruntime,compile (or leave it out)")
    return names
