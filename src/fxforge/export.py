"""Export: write a model as TorchScript, ONNX or a ``torch.export`` program, reload it and prove it.

Owns the three static formats, their reload (:func:`load_exported`), the verification of every
export against the original model, and the atomic write of the result:

* ``torchscript`` -- ``torch.jit.trace`` (or ``torch.jit.script`` with ``script=True``), then
  ``torch.jit.freeze`` and ``torch.jit.optimize_for_inference`` unless told not to. The optimised
  module embeds MKLDNN weight tensors for convolutions, which ``torch.jit.save`` writes but
  ``torch.jit.load`` cannot read back (torch 2.14: "required keyword attribute 'value' is
  undefined"). fxforge therefore tries the optimised module first and, when it does not reload,
  saves the frozen module with a flag in the archive (``fxforge.json``) telling
  :func:`load_exported` to re-apply ``optimize_for_inference`` after loading.
* ``onnx`` -- ``torch.onnx.export`` with the dynamo exporter, falling back to the legacy
  (TorchScript-based) exporter when it fails; checked with ``onnx.checker`` and run with ONNX
  Runtime. ONNX's attention translation takes 4-D tensors only, so during the dynamo export a
  ``scaled_dot_product_attention`` call on tensors of another rank (timm's NesT, Twins, SAM-ViT) runs
  as the same attention on 4-D views: the leading dimensions broadcast and merged into one. Attention
  is independent across those dimensions, so this is the same computation; verification checks it.
* ``pt2`` -- ``torch.export`` (non-strict), saved with ``torch.export.save``.

What is exported: for a :class:`~fxforge.capture.Captured` in the torch dialect, its GraphModule
(equal to the model, checked at capture; straight-line code, so ``script`` succeeds where the
model's own Python might not); in the ATen dialect, the model itself (torch.export's unlifted module
is an export *result*, not a good export source). The reference for verification is always the
original model.

Every export is written into a staging directory beside the target, reloaded from there, verified
on random inputs (and, with a dynamic batch, on a second batch size), and only then moved into
place. A failed export or verification leaves nothing behind; a failed export raises
:class:`ExportError` naming the operator or construct that failed and where.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import io
import json
import os
import re
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from fxforge import display
from fxforge.artifacts import (
    BOUNDS_KEY,
    FORMATS,
    METADATA_FILE,
    OUTPUT_STRUCTURE_KEY,
    SUFFIXES,
    StagedOutput,
    argument_names,
    check_free_space,
    describe_structure,
    format_for,
    load_exported,
    positional_names,
    save_program,
    scripted_output_structure,
    unwrapped,
)
from fxforge.capture import Captured
from fxforge.compare import compare_outputs, is_dataclass_instance
from fxforge.errors import (
    EXIT_CAPTURE,
    SYSTEM_REFUSALS,
    FxforgeError,
    ModelSpecError,
    first_line,
    format_location,
    graph_frame_source,
    is_user_file,
    offered,
    option,
    option_of,
    pass_inputs_hint,
    refuse_without_verification,
    require,
    said,
    says_data_dependent,
    strip_ansi,
    user_location,
)
from fxforge.graphs import ATEN, MethodCall, index_bounds, without_input_guards
from fxforge.inputs import specs_of
from fxforge.runtime import (
    BatchGuardRecorder,
    batch_conditions,
    batch_narrowed_at,
    batch_of,
    batch_range_text,
    cloned,
    device_of,
    dynamic_shapes_by_name,
    export_program,
    holds_tensor,
    keeps_rng_state,
    narrowed_batch,
    native_output_silenced,
    onednn_linear_op,
    preserved_state,
    quiet_torch_logs,
    record_example,
    run_reference,
    traced_at_batch_two,
    with_batch,
    with_constant_kwargs,
)
from fxforge.verify import DEFAULT_CASES, VerifyResult, reference_output, verify

ONNX_EXPORTERS = ("auto", "dynamo", "legacy")
BATCH_CONDITION = "batch-dependent code (a condition on the batch size)"
BATCH_FIXED = "batch-dependent code"  # the code holds for some batch sizes only (torch.export narrowed the batch)


class ExportError(FxforgeError):
    """A model could not be written in the requested format (the message names what failed, and where)."""

    exit_code = EXIT_CAPTURE

    def __init__(
        self, message: str, hint: str | None = None, construct: str | None = None, location: str | None = None
    ) -> None:
        super().__init__(message, hint)
        self.construct = construct  # the operator or language construct that failed, when known
        self.location = location  # "file.py:42 `source`" of the user's line, when known


@dataclass
class ExportResult:
    """What :func:`export_model` wrote and how the reloaded export compares with the original."""

    format: str
    path: Path | None  # None when nothing was written (verification failed)
    ok: bool
    exporter: str  # trace, script, dynamo, legacy or torch.export
    files: list[str] = field(default_factory=list)
    verification: VerifyResult | None = None
    verified_batches: list[int] = field(default_factory=list)
    dynamic_batch: bool = False
    opset: int | None = None
    size_bytes: int = 0
    export_s: float = 0.0  # writing the file (tracing, exporting, the checks of a traced batch)
    verify_s: float = 0.0  # loading it back and verifying it
    notes: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        return display.export_repr(self)

    def _repr_html_(self) -> str:  # Jupyter shows this for the last value of a cell
        return display.export_html(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "path": str(self.path) if self.path else None,
            "ok": self.ok,
            "exporter": self.exporter,
            "files": self.files,
            "verify": self.verification.to_dict() if self.verification else None,
            "verified_batches": self.verified_batches,
            "dynamic_batch": self.dynamic_batch,
            "opset": self.opset,
            "size_bytes": self.size_bytes,
            "export_s": round(self.export_s, 3),
            "verify_s": round(self.verify_s, 3),
            "notes": self.notes,
        }


# --------------------------------------------------------------------------------------------------
# atomic output


# --------------------------------------------------------------------------------------------------
# public entry point


def check_export_options(
    path: str | Path,
    to: str | None,
    *,
    exporter: str = "auto",
    opset: int | None = None,
    script: bool = False,
    onednn_fusion: bool = False,
    dynamic_batch: bool = False,
    freeze: bool = True,
    optimize: bool = True,
    verify_export: bool = True,
    cases: int | None = None,
    seeds: Sequence[int] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> str:
    """The format :func:`export_model` writes to ``path``; raises on options that do not fit it, before any model
    is loaded (the CLI calls it first: a misplaced option was refused after a 12 s capture, QA). ``freeze`` and
    ``optimize`` are the CLI's ``--no-freeze`` and ``--no-optimize`` (export_model passes them on for TorchScript
    alone, as its callers' defaults)."""
    refuse_without_verification(
        verify_export,
        "verify_export=False",
        {
            "--cases": cases is not None,
            "--seeds": seeds is not None,
            "--rtol": rtol is not None,
            "--atol": atol is not None,
        },
    )
    named = format_for(path)
    if to in SUFFIXES and named is not None and named != to:
        # fxforge (and every other tool) reads a file by its suffix: an ONNX file named .pt would not load again
        raise FxforgeError(
            f"{str(path)!r} is the name of {'an' if named[0] in 'aeiou' else 'a'} {named} file, not {to}",
            hint=f"name it {SUFFIXES[to]}, or leave {option('--to')} out to export {named}",
        )
    if to in SUFFIXES and named is None:
        # a file fxforge's own verify and load_exported could not read back (they go by the suffix)
        raise FxforgeError(f"{str(path)!r} has no suffix fxforge reads {to} files by", hint=f"name it {SUFFIXES[to]}")
    to = to or named
    if to is None:
        raise FxforgeError(
            f"cannot tell the format from {str(path)!r}", hint=f"pass {option('--to')} torchscript, onnx or pt2"
        )
    if to not in FORMATS:
        raise FxforgeError(f"unknown export format {to!r}", hint=f"one of {', '.join(FORMATS)}")
    if exporter not in ONNX_EXPORTERS:
        raise FxforgeError(f"unknown ONNX exporter {exporter!r}", hint=f"one of {', '.join(ONNX_EXPORTERS)}")
    if exporter != "auto" and to != "onnx":  # it chose nothing, silently
        raise FxforgeError(
            f"{option('--exporter')} applies to onnx, not {to}", hint=f"leave {option('--exporter')} out"
        )
    # options of one format given for another chose nothing, silently (QA: to="pt2", opset=17 ran)
    misplaced = [
        (name, fmt)
        for name, fmt, given in (
            ("--opset", "onnx", opset is not None),
            ("--script", "torchscript", script),
            ("--onednn-fusion", "torchscript", onednn_fusion),
            ("--no-freeze", "torchscript", not freeze),  # QA: ignored for onnx and pt2, silently
            ("--no-optimize", "torchscript", not optimize),
        )
        if given and to != fmt
    ]
    if misplaced:
        flag, fmt = misplaced[0]
        raise FxforgeError(f"{option(flag)} applies to {fmt}, not {to}", hint=f"leave {option(flag)} out")
    if dynamic_batch and to == "torchscript":
        raise FxforgeError(
            "a dynamic batch applies to onnx and pt2",
            hint="a TorchScript module runs any batch size its code allows: leave the option out",
        )
    if to == "onnx":
        _require_onnx(exporter)
        _check_opset_known(opset)
    return to


@keeps_rng_state
def export_model(
    target: Captured | nn.Module,
    to: str | None,
    path: str | Path,
    *,
    example_inputs: Sequence[Any] | None = None,
    script: bool = False,
    freeze: bool = True,
    optimize: bool = True,
    exporter: str = "auto",
    opset: int | None = None,
    dynamic_batch: bool = False,
    verify_export: bool = True,
    cases: int | None = None,
    seed: int = 0,
    seeds: Sequence[int] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    allow_trace_warnings: bool = False,
    force: bool = False,
    onednn_fusion: bool = False,
) -> ExportResult:
    """Export ``target`` to ``to`` (torchscript, onnx or pt2; None: from the suffix of ``path``), reload it and
    verify it.

    Args:
        target: a :class:`~fxforge.capture.Captured` (from :func:`fxforge.prepare`) or a module, in
            which case ``example_inputs`` are required.
        script: TorchScript by ``torch.jit.script`` instead of tracing.
        freeze / optimize: TorchScript ``torch.jit.freeze`` / ``optimize_for_inference``.
        exporter: ONNX exporter: ``auto`` (dynamo, then legacy on failure), ``dynamo`` or ``legacy``.
        opset: ONNX opset version (default: the exporter's).
        dynamic_batch: keep the batch dimension symbolic (ONNX and pt2); verified on a second batch.
        verify_export: reload and compare with the original on at least ``cases`` varied inputs (see
            :mod:`fxforge.verify`; at several batch sizes for TorchScript and dynamic-batch exports), with
            per-dtype tolerances unless ``rtol``/``atol`` are given. ``seeds`` (older API): see ``verify``.
            ``cases`` (default 16), ``seeds``, ``rtol`` and ``atol`` are refused with ``verify_export=False``.
        allow_trace_warnings: accept a TorchScript trace (or legacy ONNX export) during which torch warned
            that the trace fixed a value computed from the input (``if x.mean() > 0``): by default that is
            an :class:`ExportError`, because the file would compute one branch for every input.
        force: replace an existing file.
        onednn_fusion: TorchScript for oneDNN graph fusion (``torch.jit.enable_onednn_fusion``): frozen, without
            ``optimize_for_inference`` (whose MKLDNN rewrite the fuser does not take); the file records it and
            :func:`~fxforge.artifacts.load_exported` turns fusion on around each call.

    Returns an :class:`ExportResult`; when verification fails, ``ok`` is False and nothing is written.

    Raises:
        ExportError: the exporter failed; the message names the operator or construct and where.
    """
    to = check_export_options(
        path,
        to,
        exporter=exporter,
        opset=opset,
        script=script,
        onednn_fusion=onednn_fusion,
        dynamic_batch=dynamic_batch,
        verify_export=verify_export,
        cases=cases,
        seeds=seeds,
        rtol=rtol,
        atol=atol,
    )
    cases = DEFAULT_CASES if cases is None else cases
    source, reference, inputs = _export_source(target, example_inputs)
    if to in ("onnx", "torchscript"):
        _refuse_onednn_linear(source, to)
    # errors name the user's model, not the GraphModule or wrapper that is exported
    name = type(target.original if isinstance(target, Captured) else target).__name__
    if not script:
        _refuse_unregistered_dataclass(_example_output(reference, inputs), name)
    if to == "onnx":
        _refuse_no_tensor_output(_example_output(reference, inputs), name)
    start = time.perf_counter()
    # tracing and exporting run the caller's modules: a model in training mode would update its BatchNorm
    # statistics (even when the export then fails); whatever the runs wrote is undone
    training = _training_modules(reference)
    with _training_named(training), StagedOutput(path, force=force) as staged, preserved_state(source, reference):
        check_free_space(staged.path.parent, source, copies=2)  # the file, and the copy it may be verified from
        if to == "torchscript":
            output = _example_output(reference, inputs)
            # a number that follows the batch size gets its own advice: an ONNX file cannot return it at other batches
            following = (
                [] if script else [where for where, *_ in _numbers_following_the_batch(reference, inputs, output)]
            )
            result = _export_torchscript(
                source,
                name,
                inputs,
                staged.path,
                script=script,
                freeze=freeze or onednn_fusion,
                optimize=optimize and not onednn_fusion,
                allow=allow_trace_warnings,
                onednn_fusion=onednn_fusion,
                output_structure=scripted_output_structure(output),
                output=output,
                following=following,
            )
        elif to == "onnx":
            output = _example_output(reference, inputs)
            if dynamic_batch:
                _refuse_numbers_following_the_batch(reference, inputs, output, name)
            result = _traced_at_batch_two(
                lambda traced: _export_onnx(
                    _onnx_source(source, output, len(inputs)),
                    name,
                    reference,
                    traced,
                    staged.path,
                    exporter,
                    opset,
                    dynamic_batch,
                    allow_trace_warnings,
                ),
                inputs,
                dynamic_batch,
                staged.path,
                lambda: _reproduces_example(staged.path, to, reference, inputs),
            )
            bounds = index_bounds(target.graph_module) if isinstance(target, Captured) else {}
            if bounds:
                # ONNX's Gather takes -1 as the last row where the model's embedding raises: fxforge's loader checks
                # the bounds the file records (QA: an --auto ONNX file returned numbers for id -1)
                _record_metadata(staged.path, {BOUNDS_KEY: json.dumps(bounds)})
            if not _record_output_structure(staged.path, output):
                result.notes.append(
                    f"the model returns a {type(output).__name__}, whose structure an ONNX file cannot record: the "
                    "file returns its tensors as a flat tuple (torch.utils._pytree.tree_leaves order)"
                )
        else:
            result = _traced_at_batch_two(
                lambda traced: _export_pt2(source, name, traced, staged.path, dynamic_batch, example=inputs),
                inputs,
                dynamic_batch,
                staged.path,
                lambda: _reproduces_example(staged.path, to, reference, inputs),
            )
        result.export_s = time.perf_counter() - start
        loaded: Any = None
        if verify_export:
            try:
                loaded = load_exported(
                    staged.path, to, output_like=_example_output(reference, inputs), device=device_of(inputs, reference)
                )
            except ModelSpecError as exc:  # it read "cannot read <staging path>: ... (is the file corrupt?)" (QA)
                # both name the staging path
                read = exc.message.startswith(("cannot read ", "ONNX Runtime cannot run "))
                reason = exc.message.split(": ", 1)[1] if read else exc.message
                runtime = {"onnx": "ONNX Runtime", "torchscript": "torch.jit.load", "pt2": "torch.export.load"}[to]
                raise ExportError(
                    f"the exported {to} file does not load back in {runtime}: {reason}; nothing was written",
                    hint=f"export another format ({said('--to pt2, --to torchscript', 'to=pt2, to=torchscript')}), "
                    "or the model in float32 where it is in another dtype",
                ) from None
            # A traced TorchScript module runs any batch size its code allows, a dynamic-batch export any batch
            # size: prove that; a static ONNX/pt2 file takes the example's batch only.
            any_batch = to == "torchscript" or dynamic_batch
            result.verification = verify(
                reference,
                loaded,
                input_specs=specs_of(inputs),
                cases=cases,
                seed=seed,
                seeds=seeds,
                batch_sizes=None if any_batch else [None],
                rtol=rtol,
                atol=atol,
                bisect=False,
            )
            result.verify_s = time.perf_counter() - start - result.export_s
            result.verified_batches = list(result.verification.batch_sizes)
            result.ok = result.verification.ok
            check = result.verification
            if to == "torchscript" and not script and _reads_sizes(source) and not check.ok:
                # the trace records each aten.sym_size (torch.export's x.size(0)) as the example's number, with no
                # tracer warning: the file ran at that batch only, and "failed to run on batch 2" said nothing (QA)
                check.problems.append(
                    "torch.jit.trace recorded the graph's reads of its input sizes (aten.sym_size, as torch.export "
                    "writes x.size(0)) as the example's numbers, so the file runs at the example's shapes only: "
                    "export this program to pt2 or onnx, which keep sizes symbolic, or export the model's own code "
                    "to torchscript"
                )
            if dynamic_batch and (check.rejected_inputs or any("failed to run on" in p for p in check.problems)):
                result.verification.problems.append(
                    "the export does not run at every batch size: torch.export fixed the batch dimension, because "
                    "the model's code does (a loop over it, a shape check) or because torch specialises it for a "
                    "batch-1 example (size 1 broadcasts, and the program then holds for 1 only or for 2 and up); "
                    "export without a dynamic batch, one file per batch size"
                )
        if result.ok:
            result.size_bytes = sum(p.stat().st_size for p in staged.directory.iterdir())  # type: ignore[union-attr]
            result.files = staged.commit()
            result.path = Path(path)
            graphs = [m for m in (source, loaded) if isinstance(m, nn.Module)]
            custom = sorted(set().union(*(_custom_operators(m) for m in graphs))) if to != "onnx" else []
            if custom:  # the file names them; a fresh process cannot load it until they exist
                result.notes.append(
                    f"the file calls custom operators ({', '.join(custom)}): load it after importing the code that "
                    "registers them"
                )
    if training and result.verification is not None and not result.verification.ok:
        result.verification.problems.insert(0, _TRAINING.format(training))
    elif result.verification is not None and not result.verification.ok and not result.verification.rejected_inputs:
        lower = _lower_precision_inside(reference, result.verification)
        if lower:  # QA: a model with float16 layers inside a float32 output "computes something else"
            result.verification.problems.append(
                f"the model computes in {lower} inside and returns float32, which is held to float32's tolerance: "
                f"its own rounding may exceed it; if so, pass {option('--rtol')} / {option('--atol')}"
            )
    return result


def _reads_sizes(module: Any) -> bool:
    """Whether ``module`` is a graph that reads its values' sizes with ``aten.sym_size`` (an ATen-dialect program
    exported for more than one batch size)."""
    if not isinstance(module, torch.fx.GraphModule):
        return False
    size_ops = (torch.ops.aten.sym_size.int, torch.ops.aten.sym_size.default)
    return any(node.op == "call_function" and node.target in size_ops for node in module.graph.nodes)


def _lower_precision_inside(model: Any, check: Any) -> str:
    """The lower-precision float dtypes ``model`` holds weights in, where its outputs are compared as float32."""
    if not isinstance(model, nn.Module) or "float32" not in check.tolerances:
        return ""
    lower = (torch.float16, torch.bfloat16)
    found = {str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.dtype in lower}
    return " and ".join(sorted(found))


_TRAINING = "the model is in training mode ({}): an export is for inference, call model.eval() first"


@contextlib.contextmanager
def _training_named(training: str) -> Iterator[None]:
    """An export's refusal of a model in training mode (``training`` names its modules) says so first."""
    try:
        yield
    except ExportError as exc:
        if training:  # QA: torch's batch-size check of a training-mode BatchNorm was blamed on "the input"
            exc.hint = f"{_TRAINING.format(training)}; " + (exc.hint or "")
        raise


def _training_modules(model: Any) -> str:
    """The modules of ``model`` in training mode that compute differently there (dropout, batch norm), named."""
    if not isinstance(model, nn.Module):
        return ""
    named = [
        f"{type(module).__name__} {name}".strip()
        for name, module in model.named_modules()
        if module.training and _mode_matters(module)
    ]
    return ", ".join(named[:3]) + (f" and {len(named) - 3} more" if len(named) > 3 else "")


def _mode_matters(module: nn.Module) -> bool:
    return isinstance(module, (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._NormBase))


# Operator namespaces torch itself registers: every other one is a library's or the user's custom operator.
_TORCH_NAMESPACES = frozenset(
    {"aten", "prims", "quantized", "quantized_decomposed", "_quantized", "higher_order", "mkldnn", "mkl"}
)


def _refuse_onednn_linear(source: nn.Module, to: str) -> None:
    """A graph the ``onednn_linear`` pass rewrote calls oneDNN's linear, which neither ONNX nor TorchScript can
    express: said before the exporter fails on it (QA: "unsupported input list type: Scalar?", or an ONNX message
    about the legacy exporter)."""
    onednn = onednn_linear_op()
    graphs = [m for m in source.modules() if isinstance(m, fx.GraphModule)]
    if onednn is None or not any(n.target is onednn.default for g in graphs for n in g.graph.nodes):
        return
    raise ExportError(
        f"cannot export to {to}: the graph computes Linear layers with oneDNN's matmul (the onednn_linear pass), "
        f"which {'ONNX' if to == 'onnx' else 'TorchScript'} cannot express",
        hint="export the model itself, or an output optimized without onednn_linear; "
        f"{option_of('export', '--to', 'pt2')} keeps it",
    )


def _custom_operators(module: nn.Module) -> set[str]:
    """``namespace::name`` of the custom operators the fx graphs in ``module`` call (none for a module that is not
    a graph: what its Python code calls is unknown before it runs)."""
    found: set[str] = set()
    for sub in module.modules():
        if not isinstance(sub, fx.GraphModule):
            continue
        for node in sub.graph.nodes:
            target = node.target
            if isinstance(target, torch._ops.OpOverload):
                target = target.overloadpacket
            if node.op == "call_function" and isinstance(target, torch._ops.OpOverloadPacket):
                namespace, _, name = target._qualified_op_name.partition("::")
                if namespace not in _TORCH_NAMESPACES:
                    found.add(f"{namespace}::{name}")
    return found


def _traced_at_batch_two(
    export: Callable[[tuple[Any, ...]], ExportResult],
    inputs: tuple[Any, ...],
    dynamic_batch: bool,
    path: Path,
    reproduces_example: Callable[[], bool],
) -> ExportResult:
    """``export(inputs)``; for a dynamic batch, traced at batch 2 where that reproduces the example
    (:func:`fxforge.runtime.traced_at_batch_two`); otherwise, or where batch 2 cannot be exported, the example itself
    is exported, as asked, and the verification then says whether other batches run."""
    if not dynamic_batch:
        return export(inputs)

    def remove_partial_files() -> None:
        for partial in path.parent.iterdir():  # the staging directory: whatever the batch-2 export left there
            partial.unlink()

    result, at_two = traced_at_batch_two(
        export,
        inputs,
        lambda _: reproduces_example(),
        errors=(ExportError,),
        rejected=remove_partial_files,
        # traced at batch 1 the condition is gone (the batch is specialised): that file would be the wrong one
        final=lambda error: getattr(error, "construct", None) == BATCH_CONDITION,
    )
    if at_two:
        result.notes.append("traced at batch 2 (the example repeated): at batch 1, torch.export may fix the batch at 1")
    return result


def _reproduces_example(path: Path, to: str, reference: Any, inputs: tuple[Any, ...]) -> bool:
    """Whether the exported file at ``path`` gives the model's output on the example inputs."""
    expected = _example_output(reference, inputs)
    try:
        with quiet_torch_logs(), torch.no_grad():
            loaded = load_exported(path, to, output_like=expected, device=device_of(inputs, reference))
            return compare_outputs(expected, loaded(*inputs)).ok
    except Exception:  # a file that does not run the example at all: not the one to keep
        return False


def _export_source(target: Captured | nn.Module, example_inputs: Sequence[Any] | None):
    """(module to export, reference module, example inputs)."""
    if isinstance(target, Captured):
        keyword_tensors = [name for name, value in target.example_kwargs.items() if holds_tensor(value)]
        if keyword_tensors:
            raise FxforgeError(
                f"export takes positional inputs; keyword input {keyword_tensors[0]!r} holds a tensor",
                hint="pass every tensor input positionally",
            )
        inputs = tuple(example_inputs) if example_inputs is not None else target.example_inputs
        source = target.original if target.dialect == ATEN else target.graph_module
        # --concrete values are fixed in the file: it takes the positional inputs alone, as the model was captured
        source = with_constant_kwargs(source, target.example_kwargs)
        reference = with_constant_kwargs(target.original, target.example_kwargs)
    else:
        if example_inputs is None:
            raise FxforgeError("exporting a module needs example inputs", hint="pass example_inputs=(x,)")
        inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
        source = reference = target
    if not inputs:
        raise FxforgeError("export needs example inputs", hint=pass_inputs_hint())
    specs_of(inputs)  # every input must be a tensor: raises a clear InputSpecError otherwise
    if any(t.device.type == "meta" for t in inputs) or any(p.device.type == "meta" for p in source.parameters()):
        raise FxforgeError(
            "export needs real weights",
            hint=said("drop --device meta", "build the model with its weights (not on the meta device)"),
        )
    return source, reference, inputs


class _TensorOutputs(nn.Module):
    """``module`` returning only the leaves of its output (pytree order) at ``positions``: those that are tensors in
    the model's own output. Picked by position, not by type: a trace (the legacy exporter's) turns ``x.shape[0]``
    into a tensor, and its file had one output more than the structure fxforge records (QA: "metadata describes 1
    outputs, and the graph has 2"). In ``module``'s mode (see :class:`~fxforge.runtime.ConstantKeywords`: the
    legacy exporter left a BatchNorm in training mode, and verification said MISMATCH)."""

    def __init__(self, module: nn.Module, positions: Sequence[int]) -> None:
        super().__init__()
        self.module = module
        self.positions = list(positions)
        self.training = module.training

    def forward(self, *args: Any) -> tuple[torch.Tensor, ...]:
        leaves = pytree.tree_leaves(self.module(*args))
        return tuple(leaves[i] for i in self.positions)


def _onnx_source(module: nn.Module, output: Any, count: int) -> nn.Module:
    """What is exported to ONNX: ``module`` returning its tensors alone (:func:`_tensor_outputs_only`), taking its
    ``count`` inputs under the model's own names (:func:`_with_input_names`)."""
    names = argument_names(unwrapped(module), count)
    return _with_input_names(_tensor_outputs_only(module, output), names)


def _tensor_outputs_only(module: nn.Module, output: Any) -> nn.Module:
    """An ONNX graph outputs tensors: both exporters fail on a model that also returns a number (``(y, None, 3)``:
    "'int' object has no attribute 'name'"). Such a model is exported with its tensors alone; the loader puts
    them back into the model's structure with the constants from its output (``output_like``), as for a dict."""
    leaves = pytree.tree_leaves(output)
    if all(isinstance(leaf, torch.Tensor) for leaf in leaves):
        return module
    return _TensorOutputs(module, [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)])


def _with_input_names(module: nn.Module, names: Sequence[str] | None) -> nn.Module:
    """``module`` as a shallow copy whose ``forward`` takes exactly its positional inputs, named ``names``, where its
    own takes others: ``*args`` (fxforge's wrappers: fixed keywords, channels-last layout, tensor outputs only),
    or parameters past the inputs given, with defaults.

    The exporters name the file's inputs after ``forward``'s parameters, and a ``forward(*args)`` gave ``args_0``
    (dynamo) or ``input_0`` (legacy) where the model says ``image`` (QA: ``--concrete``, and ``optimize --auto``'s
    model.onnx, which ONNX Runtime users feed by name). The legacy exporter passes a parameter's default as one
    more input: a captured graph's ``flag=False``, which the graph checks (``flag == False``), failed the export
    with "INTERNAL ASSERT FAILED ... We don't have an op for aten::eq ... Tensor, bool" (QA).

    The copy shares the module's submodules and parameters, so the file's weights keep their names, and is in the
    module's mode (a copied GraphModule is made in training mode, which the legacy exporter restores on the
    shared submodules after exporting); ``module`` itself is left as it is."""
    own = positional_names(module)
    if not names or own == list(names):
        return module
    try:
        renamed = copy.copy(module)  # a GraphModule's copy is of a class of its own
    except Exception:  # a module that cannot be copied (a ScriptModule) is exported as it is
        return module
    base = type(renamed)

    def forward(self: nn.Module, *args: Any) -> Any:
        return base.forward(self, *args)

    parameter = inspect.Parameter.POSITIONAL_OR_KEYWORD
    forward.__signature__ = inspect.Signature([inspect.Parameter(n, parameter) for n in ("self", *names)])  # type: ignore[attr-defined]
    named = type(base.__name__, (base,), {"forward": forward, "__doc__": base.__doc__, "__module__": base.__module__})
    renamed.__class__ = named
    renamed.training = module.training
    return renamed


def _numbers_following_the_batch(
    reference: nn.Module, inputs: tuple[Any, ...], output: Any
) -> list[tuple[str, Any, Any, int]]:
    """``(where, value, other, batch)`` of each Python number in ``output`` (the model's output on ``inputs``) that
    follows the batch size (``x.shape[0]``): ``value`` at the example's ``batch``, ``other`` at one more sample.
    Found by running the model at that batch, as :func:`_output_batch_axes` does; none where it cannot run there."""
    batch = batch_of(inputs)
    numbers = _python_numbers(output)
    if batch is None or not numbers:
        return []
    try:
        with torch.no_grad():
            others = dict(_python_numbers(run_reference(reference, with_batch(inputs, batch + 1), {})))
    except Exception:  # the model runs at the example's batch only: verification says so
        return []
    return [(where, value, others[where], batch) for where, value in numbers if others.get(where, value) != value]


def _python_numbers(output: Any) -> list[tuple[str, Any]]:
    """``(where, value)`` of each Python number among ``output``'s leaves, ``where`` as ``output[1]['n']``."""
    leaves = pytree.tree_flatten_with_path(output)[0]
    return [(f"output{pytree.keystr(path)}", v) for path, v in leaves if isinstance(v, (int, float, complex))]


def _refuse_numbers_following_the_batch(reference: nn.Module, inputs: tuple[Any, ...], output: Any, name: str) -> None:
    """A Python number in the output that changes with the batch size (``x.shape[0]``) cannot be a dynamic-batch ONNX
    file's: the graph returns tensors only, and the number is put back as the constant the example gave (QA: the
    dynamo exporter failed with a bare IndexError, the legacy one wrote a file that did not load back). Refused
    before anything is exported."""
    following = _numbers_following_the_batch(reference, inputs, output)
    if not following:
        return
    where, value, changed, batch = following[0]
    raise ExportError(
        f"cannot export {name} to ONNX with a dynamic batch: {where} is a Python number that follows the batch "
        f"size ({value!r} at batch {batch}, {changed!r} at batch {batch + 1}), and an ONNX file returns tensors "
        "only: it would return the example's number at every batch",
        hint=f"return it as a tensor (torch.tensor(x.shape[0]) is one the file computes), "
        f"{_without_dynamic_batch()} (a file for the example's batch), or export to pt2, whose program returns "
        "the number at each batch",
        construct="Python number output",
    )


def _refuse_no_tensor_output(output: Any, name: str) -> None:
    """An ONNX graph needs at least one output tensor: a model returning None (or only None and numbers) was exported
    to a file ONNX Runtime refuses to load, and said so in a line of C++ ("OrtValue indexes should have been
    populated") with a hint about dtypes (QA). Refused before anything is exported or staged."""
    leaves = pytree.tree_leaves(output)
    if any(isinstance(leaf, torch.Tensor) for leaf in leaves):
        return
    if output is None:
        shown = "None"
    elif all(leaf is None for leaf in leaves):
        shown = "only None values"
    else:
        shown = "no tensor, only constants"
    raise ExportError(
        f"cannot export {name} to onnx: the model returns {shown}, and an ONNX file needs at least one output tensor",
        hint="return the tensors the model computes",
        construct="output without a tensor",
    )


def _example_output(reference: Any, inputs: tuple[Any, ...]) -> Any:
    """The model's output on the example inputs, kept from an earlier run on equal inputs where there is one
    (:func:`~fxforge.verify.reference_output`); read it only."""
    try:
        with quiet_torch_logs():
            return reference_output(reference, inputs, {})
    except Exception:
        return run_reference(reference, inputs, {})  # the one-line error that says the inputs do not fit


def _require_onnx(exporter: str) -> None:
    require("onnx", "onnx", "ONNX export")
    require("onnxruntime", "onnx", "verifying an ONNX export")
    if exporter != "legacy":
        require("onnxscript", "onnx", "the dynamo ONNX exporter")


# --------------------------------------------------------------------------------------------------
# TorchScript


def _export_torchscript(
    module: nn.Module,
    name: str,
    inputs: tuple[Any, ...],
    path: Path,
    *,
    script: bool,
    freeze: bool,
    optimize: bool,
    allow: bool,
    onednn_fusion: bool = False,
    output_structure: Any = None,
    output: Any = None,
    following: Sequence[str] = (),
) -> ExportResult:
    """``output``: the model's output on ``inputs``, for the refusal of what a trace cannot return; ``following``:
    where its Python numbers that follow the batch size are (:func:`_numbers_following_the_batch`)."""
    method = "script" if script else "trace"
    if not script:
        _refuse_traced_numbers(output, name, following)
    notes: list[str] = []
    # where TorchScript returns another structure than the model (a transformers output as a plain dict, a namedtuple
    # as a tuple), the model's is recorded for fxforge's loader to rebuild
    recorded = {"output_structure": output_structure} if output_structure is not None else {}
    if isinstance(module, fx.GraphModule):  # a saved program's graph: its shape check is no part of the model
        module = without_input_guards(module)
    kept = [type(m.owner).__name__ + "." + m.method for m in module.modules() if isinstance(m, MethodCall)]
    if script and kept:
        # its forward takes *args: torch.jit.script cannot compile it, and the refusal named fxforge's file, with a
        # hint to trace, whose refusal in turn said to script (QA)
        raise ExportError(
            f"cannot export {name} to TorchScript (script): it calls {kept[0]}, a method capture kept as one call "
            "because it cannot be traced, and torch.jit.script cannot compile that call",
            hint="express the method's branch with torch.where or torch.cond; a trace (the default) holds it where "
            "the branch goes the same way for every input",
        )
    with _exporting(f"{name} to TorchScript ({method})", notes, allow, kept):
        if script:
            scripted = torch.jit.script(_scriptable(module))
        else:
            scripted = _trace(module, inputs)
        scripted = scripted.eval()
        if optimize:
            # freeze returns a copy, and optimize_for_inference rewrites that copy in place
            if _saves_and_reloads(torch.jit.optimize_for_inference(torch.jit.freeze(scripted)), path, recorded):
                notes.append("frozen, optimize_for_inference applied, and the result reloads: saved as is")
                return ExportResult("torchscript", None, True, method, notes=notes)
            notes.append(
                "optimize_for_inference's MKLDNN weights cannot be reloaded by torch.jit.load: the file holds the "
                "frozen module, and fxforge.load_exported re-applies optimize_for_inference after loading"
            )
        if freeze or optimize:
            scripted = torch.jit.freeze(scripted)
        metadata = {"optimize_at_load": optimize, "onednn_fusion": onednn_fusion, **recorded}
        torch.jit.save(scripted, str(path), _extra_files={METADATA_FILE: json.dumps(metadata)})
        if onednn_fusion:
            notes.append("frozen for oneDNN graph fusion (turned on around each call when loaded by fxforge)")
    return ExportResult("torchscript", None, True, method, notes=notes)


def _trace(module: nn.Module, inputs: tuple[Any, ...]) -> torch.jit.ScriptModule:
    """``torch.jit.trace``, on copies of the inputs (a model that writes into its input leaves the caller's alone).

    A traced file names its inputs after ``forward``'s parameters, and fxforge's wrappers (channels-last layout,
    fixed keywords) take ``*args``: their files named the input ``input`` and refused the model's ``x=``. A wrapper
    is traced under the names of the model inside it (a signature on its ``forward`` for the trace's length)."""
    names = argument_names(unwrapped(module), len(inputs)) if unwrapped(module) is not module else None
    if not names:
        return torch.jit.trace(module, cloned(inputs), strict=False, check_trace=False)

    def forward(*args: Any) -> Any:
        return type(module).forward(module, *args)

    parameter = inspect.Parameter.POSITIONAL_OR_KEYWORD
    forward.__signature__ = inspect.Signature([inspect.Parameter(name, parameter) for name in names])  # type: ignore[attr-defined]
    module.forward = forward  # on fxforge's own wrapper only, and taken off again
    try:
        return torch.jit.trace(module, cloned(inputs), strict=False, check_trace=False)
    finally:
        del module.forward


def _scriptable(module: nn.Module) -> nn.Module:
    """A GraphModule's code annotates inputs with mangled type names (``_torch_Tensor_``) that TorchScript
    cannot resolve: script a copy without annotations (TorchScript then assumes Tensor, which they are)."""
    if not isinstance(module, fx.GraphModule):
        return module
    untyped = copy.deepcopy(module)
    for node in untyped.graph.nodes:
        node.type = None
    untyped.recompile()
    return untyped


def _saves_and_reloads(scripted: torch.jit.ScriptModule, path: Path, recorded: dict[str, Any]) -> bool:
    try:
        metadata = json.dumps({"optimize_at_load": False, **recorded})
        torch.jit.save(scripted, str(path), _extra_files={METADATA_FILE: metadata})
        torch.jit.load(str(path))
        return True
    except Exception:  # the MKLDNN constants: see the module docstring
        path.unlink(missing_ok=True)
        return False


# --------------------------------------------------------------------------------------------------
# ONNX


def _export_onnx(
    module: nn.Module,
    name: str,
    reference: nn.Module,
    inputs: tuple[Any, ...],
    path: Path,
    exporter: str,
    opset: int | None,
    dynamic_batch: bool,
    allow_trace_warnings: bool,
) -> ExportResult:
    import onnx

    notes: list[str] = []
    used = exporter
    dynamo_error: ExportError | None = None
    conditions = _batch_conditions(module, inputs) if dynamic_batch else []  # one trace, for either exporter
    if exporter in ("auto", "dynamo"):
        try:
            with _exporting(f"{name} to ONNX (dynamo exporter)", notes), _AttentionAs4D() as mode:
                _onnx_dynamo(module, name, inputs, path, opset, dynamic_batch, conditions)
            _check_opset(path, opset)
            if mode.reshaped:
                notes.append(f"{mode.reshaped} attention call(s) on non-4-D tensors exported as 4-D attention")
            used = "dynamo"
        except ExportError as error:
            # code that branches on the batch size: the legacy exporter's trace would fix the branch just the same,
            # with no condition to see (QA: it wrote the wrong file after this refusal)
            if exporter == "dynamo" or error.construct == BATCH_CONDITION:
                raise
            dynamo_error = error
        # the fallback runs outside the except block: there, the legacy exporter's own exception would chain to
        # the dynamo error (__context__), and its report would name the dynamo failure instead of its own
        if dynamo_error is not None:
            for partial in path.parent.iterdir():  # the staging directory: whatever dynamo left there
                partial.unlink()
            if dynamo_error.construct == BATCH_FIXED:
                # the dynamo refusal's words ("a file for any batch would compute the wrong thing") read as a
                # contradiction of the file written next (QA): the legacy trace records the ops themselves, which
                # compute what the model does wherever it runs, and fail where it fails
                notes.append(
                    "torch.export found the model's code holds for some batch sizes only; the legacy exporter wrote "
                    "the file with a free batch dimension: it runs where the model runs (verified at the batches "
                    "listed) and fails where the model fails"
                )
            else:
                notes.append(f"dynamo exporter failed ({dynamo_error.message}); used the legacy exporter")
            try:
                with _exporting(f"{name} to ONNX (legacy exporter)", notes, allow_trace_warnings):
                    _onnx_legacy(module, reference, inputs, path, opset, dynamic_batch, conditions)
            except ExportError as legacy_error:
                same = legacy_error.construct == dynamo_error.construct
                also = "on it too" if same else f"too: {_after_colon(legacy_error.message)}"
                raise ExportError(
                    f"{dynamo_error.message}; the legacy exporter fails {also}",
                    dynamo_error.hint,
                    dynamo_error.construct or legacy_error.construct,
                    dynamo_error.location or legacy_error.location,
                ) from None
            used = "legacy"
    else:
        with _exporting(f"{name} to ONNX (legacy exporter)", notes, allow_trace_warnings):
            _onnx_legacy(module, reference, inputs, path, opset, dynamic_batch, conditions)
    try:
        onnx.checker.check_model(str(path))
    except Exception as exc:
        raise ExportError(f"the ONNX model written by the {used} exporter is invalid: {first_line(exc)}") from None
    model = onnx.load(str(path), load_external_data=False)
    written_opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    return ExportResult("onnx", None, True, used, opset=written_opset, dynamic_batch=dynamic_batch, notes=notes)


def _record_metadata(path: Path, entries: dict[str, str]) -> None:
    """Set ``entries`` in the ONNX file's metadata (replacing those keys), weights left where they are."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    kept = [entry for entry in model.metadata_props if entry.key not in entries]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    for key, value in entries.items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(path))


def _record_output_structure(path: Path, output: Any) -> bool:
    """Write the model's output structure into the file's metadata (:data:`~fxforge.artifacts.OUTPUT_STRUCTURE_KEY`),
    so that :func:`~fxforge.artifacts.load_exported` gives back the dict or model output the model returns, not the
    graph's flat list of tensors. False for a structure JSON cannot carry (another library's container)."""
    structure = describe_structure(output)
    if structure is None:
        return False
    if structure == "tensor":  # one tensor is what the graph returns anyway
        return True
    _record_metadata(path, {OUTPUT_STRUCTURE_KEY: json.dumps(structure)})
    return True


def _check_opset_known(opset: int | None) -> None:
    """An opset newer than the installed onnx package knows is refused up front: it read "the dynamo exporter wrote
    opset 18, not the opset 99 asked for" after a whole export (QA)."""
    if opset is None:
        return
    import onnx

    latest = onnx.defs.onnx_opset_version()
    if opset > latest:
        raise FxforgeError(
            f"{option('--opset')} {opset} is newer than any opset the installed onnx package knows (up to {latest})",
            hint=f"pass {option('--opset')} {latest} or lower, or leave it out for the exporter's own",
        )


def _check_opset(path: Path, opset: int | None) -> None:
    """The dynamo exporter writes opset 18 or later and, asked for another, converts when it can and otherwise keeps
    its own without an error (torch 2.14: ``--opset 17`` and ``--opset 99`` both wrote 18): a file of another
    opset than the one asked for is a failed export (``auto`` then tries the legacy exporter)."""
    if opset is None:
        return
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    written = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if written != opset:
        raise ExportError(
            f"the dynamo exporter wrote opset {written}, not the opset {opset} asked for",
            hint=f"the dynamo exporter writes opset 18 and later, the legacy exporter "
            f"({option('--exporter', 'legacy')}) older ones",
        )


def _batch_conditions(module: nn.Module, inputs: tuple[Any, ...]) -> list[str]:
    """What torch.export's own program of ``module`` checks on the batch size beyond a range (``x.size()[0] != 3``;
    :func:`~fxforge.runtime.batch_conditions`). The ONNX exporter's program keeps no such check: exported at batch
    2, a model branching on ``x.shape[0] == 3`` became a file computing the batch-2 branch at batch 3, "verified"
    at batches 1 and 2 (QA). One more trace of the model, for dynamic-batch ONNX exports only."""
    shapes = _batch_shapes(module, inputs, torch.export.Dim.DYNAMIC)
    try:
        # attention on non-4-D tensors, as the ONNX export itself runs it
        # torch prints the graph of a failed trace to stderr past its loggers' levels (QA: 22 stray lines in --auto)
        with (
            quiet_torch_logs(),
            contextlib.redirect_stderr(io.StringIO()),
            preserved_state(module, runs=False),
            _AttentionAs4D(),
        ):
            probe = torch.export.export(module, inputs, dynamic_shapes=shapes, strict=False)
    except Exception:  # the ONNX exporter managed what this cannot: its own checks stand
        return []
    return batch_conditions(probe)


def _batch_shapes(module: nn.Module, inputs: tuple[Any, ...], batch: Any) -> dict[str, Any]:
    """torch.export's ``dynamic_shapes`` with dimension 0 of each input tensor ``batch``, keyed by ``module.forward``'s
    parameters: a tuple, one entry per input, did not fit a ``forward(*args)`` (fxforge's wrappers: a model that
    also returns a number, fixed keywords), and the dynamo exporter failed with "IndexError: list index out of
    range" (QA)."""
    shapes = tuple({0: batch} if isinstance(t, torch.Tensor) and t.dim() > 0 else None for t in inputs)
    return dynamic_shapes_by_name(module, {"args": shapes, "kwargs": {}})


def _condition_refusal(name: str, conditions: list[str]) -> ExportError:
    return ExportError(
        f"cannot export {name} to ONNX with a dynamic batch: torch.export traced its code on the condition "
        f"{conditions[0]} (it branches on the batch size), which an ONNX file cannot record: a file for any "
        "batch would compute the traced branch where the condition fails",
        hint=f"{_without_dynamic_batch()} (a file for the example's batch), or export to pt2, whose "
        "program checks the condition at each call",
        construct=BATCH_CONDITION,
    )


def _onnx_dynamo(
    module: nn.Module,
    name: str,
    inputs: tuple[Any, ...],
    path: Path,
    opset: int | None,
    dynamic_batch: bool,
    conditions: list[str],
) -> None:
    dynamic_shapes = _batch_shapes(module, inputs, torch.export.Dim("batch")) if dynamic_batch else None
    with BatchGuardRecorder() as narrowed_at:
        program = torch.onnx.export(
            module, inputs, dynamo=True, opset_version=opset, dynamic_shapes=dynamic_shapes, verbose=False
        )
    captured = getattr(program, "exported_program", None)
    limits = narrowed_batch(captured) if dynamic_batch and captured is not None else None
    if conditions and limits is None:
        raise _condition_refusal(name, conditions)
    if limits is not None:
        # the file would declare a free batch and compute the traced batch's branch at every other one (QA: a model
        # doubling its output above batch 2, exported at batch 2, was verified at batches 1 and 2 and wrong at 3)
        at = f" at {narrowed_at.location}" if narrowed_at.location else ""
        raise ExportError(
            f"cannot export {name} to ONNX with a dynamic batch: its code holds for {batch_range_text(limits)} only "
            f"as torch.export traced it (it branches on the batch size or fixes it{at}), which an ONNX file cannot "
            "record: a file for any batch would compute the wrong thing at others",
            hint=f"{_without_dynamic_batch()} (a file for the example's batch), or export to pt2, whose "
            "program checks the batch at each call",
            construct=BATCH_FIXED,
        )
    program.save(str(path))  # external data only for models over 2 GB


class _AttentionAs4D(TorchFunctionMode):
    """Runs ``F.scaled_dot_product_attention`` on tensors of rank other than 4 as attention on 4-D views.

    q, k, v and the mask are broadcast over their leading dimensions (all but the last two), which are
    merged into the head dimension of a batch of one; the output is viewed back. Counts the calls it
    reshaped in ``reshaped``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.reshaped = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        bound = _ATTENTION_SIGNATURE.bind(*args, **kwargs)
        query, key, value, mask = (bound.arguments.get(n) for n in ("query", "key", "value", "attn_mask"))
        four_d = query.dim() == key.dim() == value.dim() == 4 and (mask is None or mask.dim() <= 4)
        if four_d or bound.arguments.get("enable_gqa"):  # grouped heads do not merge with other leading dimensions
            return func(*args, **kwargs)
        self.reshaped += 1
        return _attention_on_4d(*bound.args, **bound.kwargs)


def _attention_on_4d(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    shapes = [query.shape[:-2], key.shape[:-2], value.shape[:-2]]
    if attn_mask is not None:
        shapes.append(attn_mask.shape[:-2])
    lead = torch.broadcast_shapes(*shapes)
    length, source = query.shape[-2], key.shape[-2]

    def as_4d(t: torch.Tensor, rows: Any, cols: Any) -> torch.Tensor:
        return t.expand(*lead, rows, cols).reshape(1, -1, rows, cols)

    mask = None if attn_mask is None else as_4d(attn_mask, length, source)
    out = F.scaled_dot_product_attention(
        as_4d(query, length, query.shape[-1]),
        as_4d(key, source, key.shape[-1]),
        as_4d(value, source, value.shape[-1]),
        attn_mask=mask,
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=scale,
    )
    return out.reshape(*lead, length, value.shape[-1])


_ATTENTION_SIGNATURE = inspect.signature(_attention_on_4d)  # F.scaled_dot_product_attention's parameters


def _output_batch_axes(reference: nn.Module, inputs: tuple[Any, ...], outputs: list[torch.Tensor]) -> list[dict]:
    """Which dimensions of each output follow the batch, found by running the model at one more sample: the legacy
    exporter declared dimension 0 of every output "batch", also of ``fc(x).t()`` (4 x batch) and of a buffer
    returned as it is (QA; the dynamo exporter gets them right). Dimension 0 of each, where the run fails."""
    batch = batch_of(inputs)
    fallback = [{0: "batch"} if t.dim() > 0 else {} for t in outputs]
    if batch is None:
        return fallback
    try:
        with torch.no_grad():
            other = run_reference(reference, with_batch(inputs, batch + 1), {})
    except Exception:
        return fallback
    others = [v for v in pytree.tree_leaves(other) if isinstance(v, torch.Tensor)]
    if len(others) != len(outputs):
        return fallback
    return [
        {i: "batch" for i, (a, b) in enumerate(zip(t.shape, o.shape)) if a != b} if t.dim() == o.dim() else {}
        for t, o in zip(outputs, others)
    ]


def _onnx_legacy(
    module: nn.Module,
    reference: nn.Module,
    inputs: tuple[Any, ...],
    path: Path,
    opset: int | None,
    dynamic_batch: bool,
    conditions: list[str],
) -> None:
    if conditions:  # the legacy trace fixes the branch just as the dynamo exporter does
        raise _condition_refusal(type(reference).__name__, conditions)
    # the legacy exporter runs the model on the tensors it is given: a forward writing into its input (x.mul_(2))
    # changed the caller's tensor (QA; the other exporters run on copies)
    inputs = pytree.tree_map_only(torch.Tensor, torch.clone, inputs)
    outputs = [v for v in pytree.tree_leaves(_example_output(reference, inputs)) if isinstance(v, torch.Tensor)]
    output_names = [f"output_{i}" for i in range(len(outputs))]
    # the inputs named as the model's forward names them, as the dynamo exporter does: a loaded file is then called
    # by the same keywords as the model (OnnxRuntimeModule), and ONNX Runtime users feed it by those names
    input_names = argument_names(module, len(inputs))
    if not input_names or not all(isinstance(t, torch.Tensor) for t in inputs) or set(input_names) & set(output_names):
        input_names = [f"input_{i}" for i in range(len(inputs))]
    dynamic_axes = None
    if dynamic_batch:
        dynamic_axes = {name: {0: "batch"} for name, t in zip(input_names, inputs) if t.dim() > 0}
        dynamic_axes.update(
            {name: axes for name, axes in zip(output_names, _output_batch_axes(reference, inputs, outputs)) if axes}
        )
    torch.onnx.export(
        module,
        inputs,
        str(path),
        dynamo=False,
        opset_version=opset,
        input_names=input_names,
        output_names=output_names,
        dynamic_axes=dynamic_axes,
    )


# --------------------------------------------------------------------------------------------------
# torch.export


def _refuse_unregistered_dataclass(output: Any, name: str) -> None:
    """A dataclass in the output that torch's pytree does not know (a transformers ModelOutput is registered): every
    tracing exporter stops on it, each with its own words (QA: ONNX Runtime's "OrtValue indexes should have been
    populated" and a hint about dtypes; torch.export's pytree link). Said once, with what to do."""
    stuck = next((leaf for leaf in pytree.tree_leaves(output) if is_dataclass_instance(leaf)), None)
    if stuck is None:
        return
    kind = type(stuck).__name__
    raise ExportError(
        f"cannot export {name}: it returns a {kind}, a dataclass torch's exporters cannot take apart",
        hint=f"return a dict or tuple, or register the class before exporting: torch.export.register_dataclass({kind})"
        " (then it loads back only where it is registered too)",
        construct=f"output type {kind}",
    )


def _export_pt2(
    module: nn.Module, name: str, inputs: tuple[Any, ...], path: Path, dynamic_batch: bool, example: tuple[Any, ...]
) -> ExportResult:
    """Export ``module`` traced at ``inputs`` to a ``.pt2`` that records ``example`` (the user's example, where
    ``inputs`` is it at batch 2) as its example inputs: inspect and bench of the file run at those."""
    notes: list[str] = []
    with _exporting(f"{name} with torch.export", notes):
        program = export_program(module, inputs, {}, dynamic_batch=dynamic_batch)
        _refuse_fixed_batch(program, name, dynamic_batch)
        record_example(program, example, {})
        try:
            save_program(program, path, module)
        except FxforgeError as exc:  # what the file cannot hold (a namedtuple output), said as the export's refusal
            raise ExportError(f"cannot export {name} to pt2: {exc.message}", hint=exc.hint) from None
    return ExportResult("pt2", None, True, "torch.export", dynamic_batch=dynamic_batch, notes=notes)


def _refuse_fixed_batch(program: torch.export.ExportedProgram, name: str, dynamic_batch: bool) -> None:
    """A dynamic-batch export whose batch the trace fixed to one size is no dynamic-batch file: refused here, naming
    the line that fixed it, rather than by the verification at other batches (QA: ``len(x)`` gave "the export does
    not run at every batch size" and a list of reasons it might)."""
    limits = narrowed_batch(program) if dynamic_batch else None
    if limits is None or limits[0] != limits[1]:
        return
    where = batch_narrowed_at(program)
    because = f"the line {where} fixed it" if where else "the model's code or torch fixed it"
    raise ExportError(
        f"cannot export {name} with a dynamic batch: torch.export traced it for {batch_range_text(limits)} only "
        f"({because}: a loop over the batch, len(), a Python number taken from a size, or a branch on it)",
        hint=f"{_without_dynamic_batch()} (a file for the example's batch), or keep the batch size a "
        "tensor size in that code (x.shape[0] passed to torch ops, not turned into a Python number)",
        construct=BATCH_FIXED,
        location=where,
    )


# --------------------------------------------------------------------------------------------------
# reload


# --------------------------------------------------------------------------------------------------
# failures: name the operator or construct, and the user's line


_OPERATOR_PATTERNS = [
    re.compile(r"No ONNX function found for <OpOverload\(op='([\w.:]+)'"),
    re.compile(r"target=torch\.ops\.([\w.]+?)(?:\.default)?\]"),
    re.compile(r"Exporting the operator '([\w:.]+)' to ONNX opset version \d+ is not supported"),
    re.compile(r"unrecognized namespace ([\w:.]+)"),
]


def _interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` wraps a KeyboardInterrupt (an exporter re-raises what it caught as its own error)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


@contextlib.contextmanager
def _exporting(
    what: str, notes: list[str], allow_trace_warnings: bool = False, kept_methods: Sequence[str] = ()
) -> Iterator[None]:
    """Run an exporter quietly (they print progress and warnings) and turn its failure into an ExportError.

    Tracer warnings say where a trace fixed a value computed from the input (a Python bool, int or float of a
    tensor, a loop over one): the file would then compute what that one example computed, for every input.
    They are an :class:`ExportError` naming the user's line unless ``allow_trace_warnings``, which keeps them
    as notes. ``kept_methods``: the methods capture kept as one call, which no other exporter takes either.
    """
    sink = io.StringIO()
    where_from: dict[int, tuple[str, int]] = {}  # id of a recorded warning -> the user's line that raised it
    try:
        with (
            warnings.catch_warnings(record=True) as caught,
            quiet_torch_logs(),
            contextlib.redirect_stdout(sink),
            contextlib.redirect_stderr(sink),
            native_output_silenced(),
            torch.no_grad(),
        ):
            warnings.simplefilter("always", torch.jit.TracerWarning)
            _note_where_warnings_come_from(where_from)
            yield
    except ExportError:
        raise
    except OSError as exc:
        if exc.errno in SYSTEM_REFUSALS:  # a full disk, a read-only folder: the machine's state, said as such
            raise
        raise _export_error(what, exc) from None
    except Exception as exc:
        if _interrupted(exc):  # Ctrl-C inside the dynamo exporter came out wrapped, and fell back to legacy (QA)
            raise KeyboardInterrupt from None
        raise _export_error(what, exc) from None
    # (first sentence, file, line) of each trace warning, at the user's line where one was found
    traced = [
        (first_line(w.message).split(". ")[0].rstrip("."), *where_from.get(id(w), (w.filename, w.lineno)))
        for w in caught
        if issubclass(w.category, torch.jit.TracerWarning)
    ]
    for first_sentence, filename, lineno in traced:
        note = f"trace: {first_sentence} ({Path(filename).name}:{lineno})"
        if note not in notes:
            notes.append(note)
    if traced and not allow_trace_warnings:
        first_sentence, filename, lineno = traced[0]
        where = format_location(filename, lineno)
        raise ExportError(
            f"cannot export {what}: the trace fixed a value computed from the input at {where} ({first_sentence}); "
            "the file would compute what the example computed, for every input",
            hint=(
                f"the value is computed in {kept_methods[0]}, a method capture kept as one call, which "
                f"{option_of('export', '--script', python='script=True')}, onnx and pt2 cannot take either: express "
                "its branch with torch.where or torch.cond"
                if kept_methods
                else f"export with {option_of('export', '--script', True)}, or to onnx (dynamo) or pt2"
            )
            + "; if that value cannot change with the input, pass "
            + option_of("export", "--allow-trace-warnings", True),
            construct="data-dependent value in a trace",
            location=where,
        )


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _note_where_warnings_come_from(where_from: dict[int, tuple[str, int]]) -> None:
    """Inside ``catch_warnings(record=True)``: also note, per recorded warning, the innermost line of the user's
    code on the stack. A warning names the line that called ``warnings.warn``, which for ``torch._assert`` (ViT's
    image-size check) is torch's own ``if not condition:``, not the model's line that made the value.
    CPython's recording hook is private: without it, warnings keep their own line."""
    record = getattr(warnings, "_showwarnmsg_impl", None)
    if record is None:  # pragma: no cover - every CPython fxforge supports has it
        return

    def record_with_the_users_line(message: warnings.WarningMessage) -> None:
        if not is_user_file(message.filename):
            stack = traceback.extract_stack()
            # only frames the exporter called into (below its first torch frame): the model's code, not the caller's
            entry = next((k for k, frame in enumerate(stack) if frame.filename.startswith(_TORCH_DIR)), len(stack))
            user_frames = [frame for frame in stack[entry:] if is_user_file(frame.filename)]
            if user_frames:
                where_from[id(message)] = (user_frames[-1].filename, user_frames[-1].lineno or 0)
            elif (recorded := _innermost_graph_source()) is not None:  # a captured graph: its node's line
                where_from[id(message)] = recorded
        record(message)

    warnings._showwarnmsg_impl = record_with_the_users_line  # type: ignore[attr-defined]  # restored on exit


def _innermost_graph_source() -> tuple[str, int] | None:
    """The user's line behind the innermost captured-graph frame on the stack (:func:`graph_frame_source`)."""
    frame = sys._getframe(1)
    while frame is not None:
        recorded = graph_frame_source(frame, frame.f_lineno)
        if recorded is not None:
            return recorded
        frame = frame.f_back
    return None


def _without_dynamic_batch() -> str:
    """Advice to export at the example's batch: leave --dynamic-batch out, where the running command took it; bench's
    and optimize --auto's ``streams`` variant asked for the dynamic batch itself (they have no --dynamic-batch)."""
    return offered(f"leave {option('--dynamic-batch')} out", "--dynamic-batch") or "export without a dynamic batch"


def _export_error(what: str, exc: BaseException) -> ExportError:
    chain = _chain(exc)
    text = strip_ansi("\n".join(str(e) for e in chain))
    location = user_location(exc) or _script_location(text)
    construct = next((m.group(1) for p in _OPERATOR_PATTERNS if (m := p.search(text))), None)
    if construct:  # one spelling whichever exporter named it: the legacy one says 'ns::op' (and ends a sentence)
        construct = construct.rstrip(".").replace("::", ".")
    where = f" at {location}" if location else ""
    if construct:
        return ExportError(
            f"cannot export {what}: operator {construct} has no translation{where}",
            hint="rewrite that call with supported ops, register a translation (torch.onnx custom_translation_table), "
            "or export to another format",
            construct=construct,
            location=location,
        )
    if says_data_dependent(text):
        return ExportError(
            f"cannot export {what}: data-dependent control flow{where}",
            hint="express the branch with torch.where or torch.cond, or export to torchscript with "
            f"{option_of('export', '--script', True)}",
            construct="data-dependent control flow",
            location=location,
        )
    innermost = chain[-1]
    reason = f"{type(innermost).__name__}: {first_line(innermost)}"
    hint = (
        # not only "trace instead": where the trace had just refused a fixed value, the two hints sent the user
        # back and forth (QA, timm's ViT)
        f"export with trace (the default) instead; where the trace stops on a fixed value (a shape check), "
        f"{option_of('export', '--allow-trace-warnings', python='allow_trace_warnings=True')} keeps it as a note, or "
        "export to onnx or pt2"
        if "script" in what
        else "try another format or exporter"
    )
    if "can be output from traced functions" in str(innermost) or "can be a dictionary output of a traced" in str(
        innermost
    ):
        # QA: the bare torch line, "try another format or exporter", and no word of --script, which keeps them
        reason = "the model's output holds a value a trace cannot return (None, a Python number, a non-string key)"
        hint = _untraceable_output_hint()
    untyped = re.search(r"\n:(.+)$", str(innermost)) if "cannot infer type of" in str(innermost) else None
    if untyped:
        # "Tracer cannot infer type of {<every output tensor printed>}\n:<the reason>": the reason, not the values
        reason = f"the trace cannot type the model's output: {untyped.group(1).strip()}"
        hint = (
            f"export with {option_of('export', '--script', True)} (scripting can type more outputs), or to onnx or "
            "pt2; or return tensors, and tuples and dicts of tensors of one type (no None)"
        )
    if "Expected a single top-level function" in str(innermost):
        # a lambda (a forward hook, a function passed in) is a line of source TorchScript cannot compile alone; the
        # bare message named that line and not what it is (QA: a hook registered on a conv)
        line = str(innermost).partition("top-level function:")[2].strip().splitlines()
        where = where or (f" at {line[0]}" if line else "")
        reason = "TorchScript cannot compile a lambda the model calls (a forward hook, a function it was given)"
        hint = "export with trace (the default), or to onnx or pt2; or make the lambda a def"
    construct = type(innermost).__name__
    return ExportError(f"cannot export {what}: {reason}{where}", hint=hint, construct=construct, location=location)


def _untraceable_output_hint(follows_batch: bool = False) -> str:
    """What to do with an output a trace cannot return. ``follows_batch``: it is a Python number that follows the
    batch size, which an ONNX file cannot return at other batches (a dynamic-batch ONNX export refuses it, and a
    static one returns the example's number): pt2 with a dynamic batch, not "onnx or pt2" (QA)."""
    script = f"export with {option_of('export', '--script', True)} (scripting keeps such outputs)"
    if follows_batch:
        spelled = said("--to pt2 --dynamic-batch", "to='pt2', dynamic_batch=True")
        pt2 = offered(spelled, "--dynamic-batch") or f"fxforge export {spelled}"
        return (
            f"{script}, or with {pt2}, whose program returns the number at each batch (an ONNX file returns "
            "the example's number: it is refused with a dynamic batch); or return it as a tensor "
            "(torch.tensor(x.shape[0]))"
        )
    return f"{script}, or to onnx or pt2; or return tensors, and tuples, lists and string-keyed dicts of them"


def _refuse_traced_numbers(output: Any, name: str, following: Sequence[str] = ()) -> None:
    """A Python number in the model's output cannot be a traced module's: torch.jit.trace refuses a constant ("Only
    tensors ... can be output from traced functions", said by :func:`_export_error`), but records a number taken
    from a size (``x.shape[0]``) as a tensor op, and the file returned ``tensor(2)`` where the model returns 2
    (QA: a bare MISMATCH "output[1]: tensor(2) != 2", no hint). Both said alike, before tracing; ``following``
    (where each number that follows the batch size is, ``output[1]``) picks the hint, and such a number is named
    first."""
    numbers = _python_numbers(output)
    if not numbers:
        return
    where, value = next(((w, v) for w, v in numbers if w in following), numbers[0])
    raise ExportError(
        f"cannot export {name} to TorchScript (trace): the model's output holds a value a trace cannot return: "
        f"{where} is a Python number ({value!r}), which a trace turns into a tensor (a size, x.shape[0]) or refuses "
        "(a constant)",
        hint=_untraceable_output_hint(follows_batch=where in following),
        construct="Python number output",
    )


def _chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _script_location(text: str) -> str | None:
    # torch.jit.script errors quote the source as 'File "x.py", line 12' followed by the line itself
    match = re.search(r'File "([^"]+)", line (\d+)', text)
    if not match or match.group(1).startswith("<"):
        return None
    filename = os.path.relpath(match.group(1))
    return f"{match.group(1) if filename.startswith('..') else filename}:{match.group(2)}"


def _after_colon(message: str) -> str:
    return message.split(": ", 1)[1] if ": " in message else message
