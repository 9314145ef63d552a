"""The ``fxforge`` command line: a thin layer over the Python API.

Each command parses options, calls one API function, and renders the result as rich tables or, with
``--json``, as JSON on stdout (and nothing else on stdout). Errors print one ``error:`` line (plus a
``hint:`` line) on stderr and exit with the code documented in docs/commands/index.md:

0 success · 1 findings (lint) or mismatch (verify) · 2 bad input · 3 capture failed · 4 internal error
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import click
import yaml
from rich.console import Console

from fxforge import __version__
from fxforge.errors import EXIT_FINDINGS, EXIT_INTERNAL, EXIT_OK, FxforgeError

# Piped output gets a fixed, roomy width instead of rich's 80-column fallback.
stdout = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
stderr = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 120)


def _parse_model_args(values: tuple[str, ...]) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise FxforgeError(f"--model-arg {item!r} is not KEY=VALUE", hint="e.g. --model-arg num_classes=10")
        # YAML scalars: 10 -> int, 0.5 -> float, true -> bool, [1, 2] -> list, anything else a string
        parsed[key.strip()] = yaml.safe_load(raw)
    return parsed


def model_options(command: Callable[..., Any] | None = None, *, model_required: bool = True):
    """Options shared by every command that loads and captures one model."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        options = [
            click.argument("model", required=model_required),
            click.option(
                "--input",
                "-i",
                "inputs",
                multiple=True,
                metavar="SPEC",
                help="Example input shape, e.g. 1x3x224x224 or 1x16:int64; repeat for several inputs.",
            ),
            click.option("--seed", default=0, show_default=True, help="Seed for random weights and inputs."),
            click.option(
                "--device",
                type=click.Choice(["cpu", "meta"]),
                default=None,
                help="Build the model on this device; 'meta' allocates no weights (shapes and FLOPs only).",
            ),
            click.option(
                "--model-arg", "model_args", multiple=True, metavar="KEY=VALUE", help="Constructor/config argument."
            ),
            click.option("--leaf", "leaves", multiple=True, metavar="NAME", help="Keep this submodule as one node."),
            click.option(
                "--method",
                type=click.Choice(["auto", "symbolic_trace", "export"]),
                default="auto",
                show_default=True,
                help="Capture method; auto tries symbolic_trace (with leaves), then torch.export.",
            ),
            click.option("--check-batch", type=int, default=None, help="Also check the capture on this batch size."),
            click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout instead of tables."),
        ]
        for option in reversed(options):
            command = option(command)
        return command

    return decorate(command) if command is not None else decorate


def _prepare(model: str, inputs, seed, device, model_args, leaves, method, check_batch, as_json: bool):
    from fxforge.api import prepare

    with _status("capturing model", as_json):
        return prepare(
            model,
            list(inputs),
            seed=seed,
            device=device,
            model_kwargs=_parse_model_args(model_args),
            leaf_modules=list(leaves),
            method=method,
            check_batch=check_batch,
        )


def _status(message: str, quiet: bool):
    import contextlib

    if quiet or not stderr.is_terminal:
        return contextlib.nullcontext()
    return stderr.status(message)


def _emit_json(payload: Any) -> None:
    click.echo(json.dumps(payload, indent=2, default=str))


def _warn_failed_checks(captured) -> None:
    for check in captured.record.checks:
        if not check.ok:
            batch = "the example inputs" if check.batch is None else f"batch {check.batch}"
            stderr.print(f"[yellow]warning:[/] captured graph differs from the model on {batch}: {check.message}")


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)  # keep declaration order: the natural workflow order


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="fxforge")
@click.option("--debug", is_flag=True, help="Show full tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Capture, inspect, lint, rewrite, verify, export and benchmark PyTorch models as torch.fx graphs.

    MODEL is a spec: demo, torchvision:resnet18, timm:NAME, transformers:CLASS, path/to/file.py:factory,
    package.module:attr, model.pt, model.pt2, or a directory written by fxforge optimize.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug or bool(os.environ.get("FXFORGE_DEBUG"))


@cli.command(
    epilog="""\b
Examples:
  fxforge inspect torchvision:resnet18
  fxforge inspect torchvision:resnet18 --nodes --depth 2
  fxforge inspect my_model.py:build --input 1x3x32x32 --json
  fxforge inspect transformers:BertModel --model-arg num_hidden_layers=2
  fxforge inspect transformers:LlamaForCausalLM --device meta   # no weights allocated
"""
)
@model_options
@click.option("--depth", default=2, show_default=True, help="Module summary depth.")
@click.option("--nodes", "show_nodes", is_flag=True, help="Also print the per-node table.")
@click.option("--code", "show_code", is_flag=True, help="Also print the generated Python code.")
def inspect(
    model, inputs, seed, device, model_args, leaves, method, check_batch, as_json, depth, show_nodes, show_code
):
    """Show a model's graph: shapes, parameters, FLOPs and activations per node and per module."""
    from fxforge.inspect import inspect_graph
    from fxforge.render import render_inspect

    captured = _prepare(model, inputs, seed, device, model_args, leaves, method, check_batch, as_json)
    report = inspect_graph(captured, depth=depth, include_code=as_json or show_code)
    if as_json:
        _emit_json(report.to_dict())
        return
    _warn_failed_checks(captured)
    render_inspect(stdout, model, report, show_nodes, show_code)


@cli.command(
    epilog="""\b
Examples:
  fxforge lint torchvision:mobilenet_v2
  fxforge lint my_model.py:Net --input 1x3x32x32 --select FX001,FX004
  fxforge lint demo --fail-on info --json
  fxforge lint --rules
Exit code: 1 when a finding at or above --fail-on (default: warning) exists, else 0.
"""
)
@model_options(model_required=False)
@click.option("--select", default="", help="Comma-separated rule codes or names to run (default: all).")
@click.option("--ignore", default="", help="Comma-separated rule codes or names to skip.")
@click.option(
    "--fail-on",
    type=click.Choice(["info", "warning", "error", "never"]),
    default="warning",
    show_default=True,
    help="Lowest severity that makes the exit code 1.",
)
@click.option("--rules", "list_rules", is_flag=True, help="List the rules and exit.")
@click.option("--fix", is_flag=True, help="Apply the passes that fix the findings (verified); needs -o.")
@click.option("--output", "-o", type=click.Path(path_type=str), default=None, help="Output directory for --fix.")
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
def lint(
    model,
    inputs,
    seed,
    device,
    model_args,
    leaves,
    method,
    check_batch,
    as_json,
    select,
    ignore,
    fail_on,
    list_rules,
    fix,
    output,
    force,
):
    """Find dead code, redundant ops, leftover training ops and optimisation opportunities."""
    from fxforge.lint import all_rules
    from fxforge.lint import lint as run_lint
    from fxforge.render import render_findings, render_rules

    if list_rules:
        rules = all_rules()
        if as_json:
            _emit_json([{k: v for k, v in r.__dict__.items() if k != "check"} for r in rules])
        else:
            render_rules(stdout, rules)
        return
    if not model:
        raise FxforgeError("lint needs a MODEL", hint="e.g. fxforge lint torchvision:resnet18")
    if fix and not output:
        raise FxforgeError("lint --fix writes the fixed model to a directory", hint="add -o OUTDIR")
    captured = _prepare(model, inputs, seed, device, model_args, leaves, method, check_batch, as_json)
    if fix:
        from fxforge.lint import fix as run_fix

        fixed = run_fix(captured, output, select=_split(select), ignore=_split(ignore), force=force, spec=model)
        report = fixed.after
        if as_json:
            _emit_json({**report.to_dict(), "fixed": fixed.to_dict()})
        else:
            _render_optimize(fixed.optimized, model)
            stdout.print(f"Remaining findings after {', '.join(fixed.passes) or 'no passes'}:")
            render_findings(stdout, model, report.findings)
        if not fixed.optimized.pipeline.ok:
            raise SystemExit(EXIT_FINDINGS)
    else:
        report = run_lint(captured, select=_split(select), ignore=_split(ignore))
        if as_json:
            _emit_json(report.to_dict())
        else:
            _warn_failed_checks(captured)
            render_findings(stdout, model, report.findings)
    if fail_on != "never" and report.at_least(fail_on):
        raise SystemExit(EXIT_FINDINGS)


@cli.command(
    epilog="""\b
Examples:
  fxforge optimize torchvision:resnet18 -p fold_bn,remove_dropout --verify -o out/resnet18
  fxforge optimize demo -p fold_bn -p replace_modules --option replace_modules.mapping='{ReLU: ReLU6}' -o out/demo
  fxforge optimize my_model.py:Net --input 1x3x32x32 --pipeline pipeline.yaml --verify -o out/net
  fxforge optimize torchvision:resnet18 --auto -o out/fastest
  fxforge optimize torchvision:resnet18 --auto --min-agreement 0.99 --data val.pt -o out/fastest
Exit code: 1 when --verify finds a mismatch (nothing is written then).
"""
)
@model_options
@click.option("--passes", "-p", "pass_names", multiple=True, metavar="NAMES", help="Comma-separated pass names.")
@click.option("--pipeline", type=click.Path(exists=True, dir_okay=False), default=None, help="YAML/TOML pipeline.")
@click.option("--option", "pass_options", multiple=True, metavar="PASS.KEY=VALUE", help="Option for one pass.")
@click.option("--verify", "do_verify", is_flag=True, help="Verify after every pass; stop at the first mismatch.")
@click.option("--output", "-o", type=click.Path(path_type=str), default=None, help="Directory to write.")
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
@click.option("--auto", is_flag=True, help="Try every backend, verify, time the survivors, write the fastest.")
@click.option("--tolerance", type=float, default=1e-4, show_default=True, help="--auto: normwise relative tolerance.")
@click.option("--min-agreement", type=float, default=None, help="--auto: allow bf16/int8 at this top-1 agreement.")
@click.option("--data", default=None, metavar="FILE|file.py:fn", help="--auto: inputs to judge bf16/int8 on.")
@click.option("--backends", "-b", "auto_backends", default="", metavar="NAMES", help="--auto: candidates to try.")
@click.option("--repeats", default=20, show_default=True, help="--auto: timed calls per candidate.")
@click.option("--threads", type=int, default=None, help="--auto: intra-op threads while timing.")
def optimize(
    model,
    inputs,
    seed,
    device,
    model_args,
    leaves,
    method,
    check_batch,
    as_json,
    pass_names,
    pipeline,
    pass_options,
    do_verify,
    output,
    force,
    auto,
    tolerance,
    min_agreement,
    data,
    auto_backends,
    repeats,
    threads,
):
    """Rewrite a model with passes, verify it, and write the result (loadable with torch alone)."""
    from fxforge.optimize import optimize as run_optimize
    from fxforge.passes.pipeline import Pipeline

    if auto:
        from fxforge.auto import Budget

        if pass_names or pipeline or pass_options:
            raise FxforgeError("--auto picks the passes itself", hint="drop --passes/--pipeline/--option")
        if device == "meta":
            raise FxforgeError("optimize needs real weights", hint="drop --device meta")
        budget = Budget(tolerance, min_agreement)
        captured = _prepare(model, inputs, seed, device, model_args, leaves, method, check_batch, as_json)
        _optimize_auto(captured, model, output, force, budget, data, auto_backends, repeats, threads, as_json)
        return

    names = [n for group in pass_names for n in _split(group)]
    options = _parse_pass_options(pass_options)
    if pipeline and names:
        raise FxforgeError("give either --passes or --pipeline, not both")
    if pipeline:
        plan = Pipeline.from_file(pipeline, verify_each=do_verify)
    elif names:
        plan = Pipeline([(n, options.pop(n, {})) for n in names], verify_each=do_verify)
    else:
        raise FxforgeError("no passes given", hint="e.g. -p fold_bn,remove_dropout (list them with: fxforge passes)")
    if options:
        raise FxforgeError(f"--option names pass {next(iter(options))!r}, which is not in the pipeline")
    if device == "meta":
        raise FxforgeError("optimize needs real weights", hint="drop --device meta")
    captured = _prepare(model, inputs, seed, device, model_args, leaves, method, check_batch, as_json)
    with _status("running passes", as_json):
        result = run_optimize(captured, plan, output_dir=output, verify=do_verify, force=force, spec=model)
    if as_json:
        _emit_json(result.to_dict())
    else:
        _render_optimize(result, model)
    if not result.pipeline.ok:
        raise SystemExit(EXIT_FINDINGS)


def _parse_pass_options(values: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    options: dict[str, dict[str, Any]] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        pass_name, dot, option = key.partition(".")
        if not sep or not dot or not pass_name or not option:
            raise FxforgeError(
                f"--option {item!r} is not PASS.KEY=VALUE", hint="e.g. --option insert_after.insert=stats"
            )
        options.setdefault(pass_name.strip(), {})[option.strip()] = yaml.safe_load(raw)
    return options


def _render_optimize(result, spec: str) -> None:
    from fxforge.render import render_optimize

    render_optimize(stdout, spec, result)


@cli.command(
    epilog="""\b
Examples:
  fxforge verify torchvision:resnet18 out/resnet18
  fxforge verify my_model.py:Net out/net --input 4x3x32x32 --seeds 5 --json
Exit code: 1 when the outputs differ beyond the tolerance.
"""
)
@click.argument("reference")
@click.argument("candidate")
@click.option("--input", "-i", "inputs", multiple=True, metavar="SPEC", help="Input shape (default: the model's).")
@click.option("--seed", default=0, show_default=True, help="Seed for random weights of model specs.")
@click.option("--seeds", default=3, show_default=True, help="Number of random input batches to compare on.")
@click.option("--rtol", type=float, default=None, help="Relative tolerance (default: per dtype).")
@click.option("--atol", type=float, default=None, help="Absolute tolerance (default: per dtype).")
@click.option("--model-arg", "model_args", multiple=True, metavar="KEY=VALUE", help="Constructor/config argument.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
def verify(reference, candidate, inputs, seed, seeds, rtol, atol, model_args, as_json):
    """Check that CANDIDATE computes what REFERENCE computes; on a mismatch, name the first diverging node."""
    from fxforge.api import verify_specs
    from fxforge.render import render_verify

    with _status("verifying", as_json):
        result = verify_specs(
            reference,
            candidate,
            list(inputs),
            seed=seed,
            seeds=seeds,
            rtol=rtol,
            atol=atol,
            model_kwargs=_parse_model_args(model_args),
        )
    if as_json:
        _emit_json(result.to_dict())
    else:
        render_verify(stdout, reference, candidate, result)
    if not result.ok:
        raise SystemExit(EXIT_FINDINGS)


@cli.command(
    epilog="""\b
Examples:
  fxforge quantize demo -o out/demo-int8                      # random calibration: a quick look
  fxforge quantize torchvision:resnet18 --calib calib.pt --sensitivity -o out/r18-int8
  fxforge quantize my_model.py:Net --calib data.py:batches --eval test.pt --keep-float-until drop=0.01 -o out/net
  fxforge quantize transformers:BertModel --mode dynamic --model-arg num_hidden_layers=2 -o out/bert
  fxforge quantize my_model.py:Net --mode qat-prepare -o out/qat   # train it, then fxforge.quantize.convert
Data (--calib, --eval): a file saved with torch.save (a tensor with samples along dim 0, a tuple
(inputs, labels) of such tensors, or a list of batches), file.py:function returning batches, or random[:N].
Exit code: 1 when --keep-float-until's target is not met (the model is written all the same).
"""
)
@model_options
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
@click.option("--sensitivity", is_flag=True, help="Quantize one layer at a time and rank layers by their error.")
@click.option(
    "--keep-float-until",
    "keep_float_until",
    default=None,
    metavar="TARGET",
    help="Keep the most sensitive layers in float until TARGET: 0.99 / agreement=0.99, drop=0.01, rel-err=0.05.",
)
@click.option("--float-layer", "float_layers", multiple=True, metavar="NAME", help="Keep this layer in float.")
@click.option("--random-batches", default=8, show_default=True, help="Batches of random data when there is none.")
@click.option("--output", "-o", type=click.Path(path_type=str), default=None, help="Directory to write.")
@click.option("--force", is_flag=True, help="Replace a non-empty output directory.")
def quantize(
    model,
    inputs,
    seed,
    device,
    model_args,
    leaves,
    method,
    check_batch,
    as_json,
    mode,
    backend,
    calib,
    eval_data,
    sensitivity,
    keep_float_until,
    float_layers,
    random_batches,
    output,
    force,
):
    """Quantize a model to int8 (static or dynamic) or prepare it for QAT, and report its accuracy."""
    import warnings

    from fxforge.quantize import RandomCalibrationWarning
    from fxforge.quantize import quantize as run_quantize
    from fxforge.render import render_quantize

    if device == "meta":
        raise FxforgeError("quantize needs real weights", hint="drop --device meta")
    captured = _prepare(model, inputs, seed, device, model_args, leaves, method, check_batch, as_json)
    with _status("quantizing", as_json), warnings.catch_warnings():
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
            seed=seed,
            output_dir=output,
            force=force,
            spec=model,
        )
    if as_json:
        _emit_json(result.to_dict())
    else:
        _warn_failed_checks(captured)
        for warning in result.warnings:
            stderr.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
        render_quantize(stdout, model, result)
    if result.target_met is False:
        raise SystemExit(EXIT_FINDINGS)


@cli.command(name="passes")
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
def list_passes(as_json):
    """List the available passes, their options, dialects and guarantees."""
    from fxforge.passes import all_passes
    from fxforge.render import render_passes

    specs = all_passes()
    if as_json:
        _emit_json(
            [
                {
                    "name": p.name,
                    "summary": p.summary,
                    "guarantees": p.guarantees,
                    "dialects": list(p.dialects),
                    "options": [{"name": f.name, "type": str(f.type)} for f in p.option_fields()],
                }
                for p in specs
            ]
        )
    else:
        render_passes(stdout, specs)


@cli.command(
    epilog="""\b
Examples:
  fxforge export torchvision:resnet18 --to onnx --dynamic-batch -o out/resnet18.onnx
  fxforge export torchvision:resnet18 --to torchscript -o out/resnet18.pt
  fxforge export out/resnet18 --to pt2 -o out/resnet18.pt2 --json
  fxforge export my_model.py:Net --input 1x3x32x32 --to torchscript --script -o net.pt
Exit code: 1 when the reloaded export differs from the model (nothing is written then);
3 when the exporter fails (the message names the operator or construct).
"""
)
@model_options
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
@click.option("--opset", type=int, default=None, help="ONNX opset version (default: the exporter's).")
@click.option("--dynamic-batch", is_flag=True, help="ONNX/pt2: keep the batch dimension dynamic (verified).")
@click.option("--no-verify", is_flag=True, help="Do not reload and verify the export.")
@click.option("--seeds", default=3, show_default=True, help="Random input batches to verify on.")
@click.option("--rtol", type=float, default=None, help="Relative tolerance (default: per dtype).")
@click.option("--atol", type=float, default=None, help="Absolute tolerance (default: per dtype).")
@click.option("--force", is_flag=True, help="Replace an existing file.")
def export(
    model,
    inputs,
    seed,
    device,
    model_args,
    leaves,
    method,
    check_batch,
    as_json,
    to_format,
    output,
    script,
    no_freeze,
    no_optimize,
    exporter,
    opset,
    dynamic_batch,
    no_verify,
    seeds,
    rtol,
    atol,
    force,
):
    """Export to TorchScript, ONNX or a torch.export program; reload it and verify it against the model."""
    from fxforge.export import SUFFIXES, export_model, render_export

    to_format = to_format or next((f for f, suffix in SUFFIXES.items() if output.endswith(suffix)), None)
    if to_format is None:
        raise FxforgeError(f"cannot tell the format from {output!r}", hint="pass --to torchscript, onnx or pt2")
    captured = _prepare(model, inputs, seed, device, model_args, leaves, method, check_batch, as_json)
    with _status(f"exporting to {to_format}", as_json):
        result = export_model(
            captured,
            to_format,
            output,
            script=script,
            freeze=not no_freeze,
            optimize=not (no_optimize or no_freeze),
            exporter=exporter,
            opset=opset,
            dynamic_batch=dynamic_batch,
            verify_export=not no_verify,
            seeds=range(seed, seed + seeds),
            rtol=rtol,
            atol=atol,
            force=force,
        )
    if as_json:
        _emit_json(result.to_dict())
    else:
        render_export(stdout, model, result)
    if not result.ok:
        raise SystemExit(EXIT_FINDINGS)


@cli.command(
    epilog="""\b
Examples:
  fxforge bench torchvision:resnet18 --input 1x3x224x224
  fxforge bench torchvision:mobilenet_v2 --backends eager,onnxruntime,int8 --batch 1,8 --threads 2
  fxforge bench out/resnet18 --backends eager,torchscript --repeats 50 --json
Backends: eager, fx, torchscript, onnxruntime, compile, int8, bf16 (default: all).
"""
)
@model_options
@click.option("--backends", "-b", default="", metavar="NAMES", help="Comma-separated backends (default: all).")
@click.option("--batch", "batch_sizes", multiple=True, metavar="N[,N]", help="Batch sizes (default: the input's).")
@click.option("--threads", type=int, default=None, help="Intra-op threads for torch and ONNX Runtime.")
@click.option("--warmup", default=3, show_default=True, help="Untimed calls per backend before timing.")
@click.option("--repeats", default=20, show_default=True, help="Timed calls per backend (interleaved rounds).")
@click.option("--passes", "-p", "pass_names", default=None, metavar="NAMES", help="Passes for the fx backend.")
def bench(
    model,
    inputs,
    seed,
    device,
    model_args,
    leaves,
    method,
    check_batch,
    as_json,
    backends,
    batch_sizes,
    threads,
    warmup,
    repeats,
    pass_names,
):
    """Median/p90 latency, throughput, peak memory and max error vs eager, per backend, side by side."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from fxforge.bench import bench as run_bench
    from fxforge.bench import get_backend, render_bench

    if device == "meta":
        raise FxforgeError("bench needs real weights", hint="drop --device meta")
    for name in _split(backends):
        get_backend(name)  # an unknown name fails before the model is loaded
    try:
        batches = [int(b) for group in batch_sizes for b in _split(group)]
    except ValueError:
        raise FxforgeError(f"--batch takes integers, got {' '.join(batch_sizes)!r}", hint="e.g. --batch 1,8") from None
    if any(b < 1 for b in batches):
        raise FxforgeError("--batch sizes must be at least 1")
    if threads is not None and threads < 1:
        raise FxforgeError("--threads must be at least 1")
    captured = _prepare(model, inputs, seed, device, model_args, leaves, method, check_batch, as_json)
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"))
    with Progress(*columns, TimeElapsedColumn(), console=stderr, transient=True, disable=as_json) as progress:
        task = progress.add_task("benchmarking", total=None)

        def advance(done: int, total: int, description: str) -> None:
            progress.update(task, completed=done, total=total, description=description or "benchmarking")

        report = run_bench(
            captured,
            _split(backends) or None,
            batches=batches or None,
            threads=threads,
            warmup=warmup,
            repeats=repeats,
            seed=seed,
            passes=None if pass_names is None else _split(pass_names),
            progress=advance,
        )
    if as_json:
        _emit_json({"model": model, **report.to_dict()})
    else:
        render_bench(stdout, model, report)


def _optimize_auto(captured, spec, output, force, budget, data, backends, repeats, threads, as_json):
    import warnings

    from fxforge.auto import AutoWarning, auto_optimize, render_auto

    with _status("trying every backend", as_json), warnings.catch_warnings():
        warnings.simplefilter("ignore", AutoWarning)  # printed below as one line, from result.warnings
        result = auto_optimize(
            captured,
            output,
            budget=budget,
            backends=_split(backends) or None,
            data=data,
            repeats=repeats,
            threads=threads,
            force=force,
            spec=spec,
        )
    for warning in result.warnings:
        stderr.print(f"[yellow]warning:[/] {warning}")
    if as_json:
        _emit_json(result.to_dict())
    else:
        render_auto(stdout, spec, result)


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the CLI and turns every error into one line and an exit code."""
    debug = "--debug" in (argv if argv is not None else sys.argv[1:]) or bool(os.environ.get("FXFORGE_DEBUG"))
    try:
        cli.main(args=argv, prog_name="fxforge", standalone_mode=False)
    except FxforgeError as exc:
        if debug:
            raise
        stderr.print(f"[bold red]error:[/] {exc.message}", highlight=False, soft_wrap=True)
        if exc.hint:
            stderr.print(f"[dim]hint:[/] {exc.hint}", highlight=False, soft_wrap=True)
        return exc.exit_code
    except click.exceptions.Abort:
        stderr.print("aborted")
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except KeyboardInterrupt:
        stderr.print("interrupted")
        return 130
    except Exception as exc:
        if debug:
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        stderr.print(f"[bold red]internal error:[/] {type(exc).__name__}: {first}", highlight=False, soft_wrap=True)
        stderr.print("[dim]hint:[/] rerun with --debug for the traceback, and please report it", highlight=False)
        return EXIT_INTERNAL
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())


def run() -> None:
    """Console-script entry point (``fxforge``)."""
    sys.exit(main())
