"""``fxforge quantize``: int8 (static, dynamic) or QAT preparation, with accuracy and sensitivity reports."""

from __future__ import annotations

import warnings

import click

from fxforge.cli.options import (
    CaptureOptions,
    capture_options,
    emit_json,
    status,
    stdout,
    warn,
    warn_failed_checks,
)
from fxforge.errors import EXIT_FINDINGS


@click.command(
    "quantize",
    epilog="""\b
Examples:
  fxforge quantize demo -o out/demo-int8                      # random calibration: a quick look
  fxforge quantize torchvision:resnet18 --calib calib.pt --sensitivity -o out/r18-int8
  fxforge quantize my_model.py:Net --calib data.py:batches --eval test.pt --keep-float-until drop=0.01 -o out/net
  fxforge quantize transformers:BertModel --mode dynamic --model-arg num_hidden_layers=2 -o out/bert
  fxforge quantize my_model.py:Net --mode qat-prepare -o out/qat   # train it, then convert()
Data (--calib, --eval): a file saved with torch.save (a tensor with samples along dim 0, a tuple
(inputs, labels) of such tensors, or a list of batches), file.py:function returning batches, or random[:N].
Exit code: 1 when --keep-float-until's target is not met (the model is written all the same).
""",
)
@capture_options
@click.option(
    "--mode",
    type=click.Choice(["static", "dynamic", "qat-prepare"]),
    default="static",
    show_default=True,
    help="static: int8 weights and activations; dynamic: int8 Linear/LSTM weights; qat-prepare: fake-quant model.",
)
@click.option(
    "--backend", type=click.Choice(["x86", "qnnpack"]), default="x86", show_default=True, help="Kernel backend."
)
@click.option("--calib", default=None, metavar="SPEC", help="Calibration data (default: random inputs; warns).")
@click.option("--eval", "eval_data", default=None, metavar="SPEC", help="Data to compare float and int8 on.")
@click.option(
    "--sensitivity",
    is_flag=True,
    help="Quantize one unit (a layer or op int8 quantizes) at a time and rank the units by their error.",
)
@click.option(
    "--keep-float-until",
    "keep_float_until",
    default=None,
    metavar="TARGET",
    help="Keep the most sensitive units in float until TARGET: 0.99 / agreement=0.99, drop=0.01, rel-err=0.05.",
)
@click.option(
    "--float-layer",
    "float_layers",
    multiple=True,
    metavar="NAME",
    help="Keep this layer or unit (a name from the sensitivity ranking) in float.",
)
@click.option(
    "--random-batches",
    default=None,
    type=click.IntRange(min=1),
    help="Batches of random data when there is none.  [default: 8]",
)
@click.option("--output", "-o", type=click.Path(path_type=str), default=None, help="Directory to write.")
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
def command(
    opts: CaptureOptions,
    mode: str,
    backend: str,
    calib: str | None,
    eval_data: str | None,
    sensitivity: bool,
    keep_float_until: str | None,
    float_layers: tuple[str, ...],
    random_batches: int | None,
    output: str | None,
    force: bool,
) -> None:
    """Quantize a model to int8 (static or dynamic) or prepare it for QAT, and report its accuracy."""
    from fxforge.artifacts import refuse_output_over_input
    from fxforge.cli.render import render_quantize
    from fxforge.quantize import RandomCalibrationWarning
    from fxforge.quantize import quantize as run_quantize
    from fxforge.quantize.flow import check_arguments

    # before capturing: a refused option or output directory must not cost a capture (minutes for big models)
    if output is not None:
        refuse_output_over_input(output, opts.model)
    check_arguments(
        mode,
        backend,
        calibration=calib,
        eval_data=eval_data,
        sensitivity=sensitivity,
        keep_float_until=keep_float_until,
        random_batches=random_batches,
        output_dir=output,
        force=force,
    )
    captured = opts.prepare()
    with status("quantizing", opts.as_json), warnings.catch_warnings():
        warnings.simplefilter("ignore", RandomCalibrationWarning)  # printed below from result.warnings
        result = run_quantize(
            captured,
            mode,
            backend,
            calib,
            eval_data=eval_data,
            sensitivity=sensitivity,
            keep_float_until=keep_float_until,
            float_layers=list(float_layers),
            random_batches=random_batches,
            seed=opts.seed,
            output_dir=output,
            force=force,
            spec=opts.model,
        )
    if opts.as_json:
        emit_json(result.to_dict())
    else:
        warn_failed_checks(captured)
        for message in result.warnings:
            warn(message)
        render_quantize(stdout, opts.model, result)
    if result.target_met is False:
        raise SystemExit(EXIT_FINDINGS)
