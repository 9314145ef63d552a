"""``fxforge export``: TorchScript, ONNX or a torch.export program, reloaded and verified before it is written."""

from __future__ import annotations

import time
from typing import Any

import click

from fxforge.cli.options import CaptureOptions, capture_options, emit_json, status, stdout
from fxforge.errors import EXIT_FINDINGS


@click.command(
    "export",
    epilog="""\b
Examples:
  fxforge export torchvision:resnet18 --to onnx --dynamic-batch -o out/resnet18.onnx
  fxforge export torchvision:resnet18 --to torchscript -o out/resnet18.pt
  fxforge export out/resnet18 --to pt2 -o out/resnet18.pt2 --json
  fxforge export my_model.py:Net --input 1x3x32x32 --to torchscript --script -o net.pt
Exit code: 1 when the reloaded export differs from the model (nothing is written then);
3 when the exporter fails, or a trace fixed a value computed from the input (the message names the line).
""",
)
@capture_options
@click.option(
    "--to",
    "to_format",
    type=click.Choice(["torchscript", "onnx", "pt2"]),
    default=None,
    help="Format (default: from the -o suffix: .pt, .onnx, .pt2).",
)
@click.option("--output", "-o", type=click.Path(path_type=str), required=True, help="File to write.")
@click.option("--script", is_flag=True, help="TorchScript by torch.jit.script instead of tracing.")
@click.option("--no-freeze", is_flag=True, help="TorchScript: skip torch.jit.freeze (and optimize_for_inference).")
@click.option("--no-optimize", is_flag=True, help="TorchScript: skip torch.jit.optimize_for_inference.")
@click.option(
    "--exporter",
    type=click.Choice(["auto", "dynamo", "legacy"]),
    default="auto",
    show_default=True,
    help="ONNX exporter; auto tries dynamo, then the legacy exporter.",
)
@click.option("--opset", type=click.IntRange(min=1), default=None, help="ONNX opset version (default: the exporter's).")
@click.option("--dynamic-batch", is_flag=True, help="ONNX/pt2: keep the batch dimension dynamic (verified).")
@click.option(
    "--allow-trace-warnings",
    is_flag=True,
    help="Accept a trace during which torch warned that it fixed a value computed from the input.",
)
@click.option("--no-verify", is_flag=True, help="Do not reload and verify the export.")
@click.option("--cases", default=None, type=click.IntRange(min=1), help="Input cases to verify on.  [default: 16]")
@click.option("--seeds", type=click.IntRange(min=1), default=None, hidden=True, help="Older name: at least N cases.")
@click.option("--rtol", type=click.FloatRange(min=0), default=None, help="Relative tolerance (default: per dtype).")
@click.option("--atol", type=click.FloatRange(min=0), default=None, help="Absolute tolerance (default: per dtype).")
@click.option("--force", is_flag=True, help="Replace an existing file.")
def command(
    opts: CaptureOptions,
    to_format: str | None,
    output: str,
    script: bool,
    no_freeze: bool,
    no_optimize: bool,
    exporter: str,
    opset: int | None,
    dynamic_batch: bool,
    allow_trace_warnings: bool,
    no_verify: bool,
    cases: int | None,
    seeds: int | None,
    rtol: float | None,
    atol: float | None,
    force: bool,
) -> None:
    """Export to TorchScript, ONNX or a torch.export program; reload it and verify it against the model."""
    from fxforge.artifacts import check_output_file
    from fxforge.cli.render import render_export
    from fxforge.export import check_export_options, export_model

    # the hidden older --seeds N: at least N cases from --seed, which is what the API's seeds list says
    seed_list = None if seeds is None else list(range(opts.seed, opts.seed + seeds))
    # before the model loads: a typo or a misplaced option costs nothing
    written = check_export_options(
        output,
        to_format,
        exporter=exporter,
        opset=opset,
        script=script,
        dynamic_batch=dynamic_batch,
        freeze=not no_freeze,
        optimize=not no_optimize,
        verify_export=not no_verify,
        cases=cases,
        seeds=seed_list,
        rtol=rtol,
        atol=atol,
    )
    check_output_file(output, force=force, reading=opts.model)
    started = time.perf_counter()
    target, example, scripted_model = _target(opts, script and written == "torchscript")
    capture_s = time.perf_counter() - started
    with status(f"exporting to {written}", opts.as_json):
        result = export_model(
            target,
            to_format,
            output,
            example_inputs=example,
            script=script,
            freeze=not no_freeze,
            optimize=not (no_optimize or no_freeze),
            exporter=exporter,
            opset=opset,
            dynamic_batch=dynamic_batch,
            verify_export=not no_verify,
            cases=cases,
            seed=opts.seed,
            seeds=seed_list,
            rtol=rtol,
            atol=atol,
            allow_trace_warnings=allow_trace_warnings,
            force=force,
        )
    if scripted_model is not None:
        result.notes.insert(0, scripted_model)
    seconds = {"capture_s": round(capture_s, 3), "total_s": round(time.perf_counter() - started, 3)}
    if opts.as_json:
        emit_json({**result.to_dict(), **seconds})
    else:
        render_export(stdout, opts.model, result, **seconds)
    if not result.ok:
        raise SystemExit(EXIT_FINDINGS)


def _target(opts: CaptureOptions, scripting: bool) -> tuple[Any, Any, str | None]:
    """(what to export, its example inputs when it is a module, a note): the captured graph; with --script, the
    model itself where no graph can be captured -- torch.jit.script compiles Python control flow that neither
    symbolic_trace nor torch.export can capture, which is what --script is for (as export_model does)."""
    from fxforge.errors import CaptureError

    try:
        return opts.prepare(), None, None
    except CaptureError as exc:
        if not scripting:
            raise
        reason = exc.message
    module, example = opts.load()
    return module, example, f"no graph could be captured ({reason}): the model itself was scripted"
