"""Bench: latency, throughput and peak memory of one model on several backends, side by side.

Owns the backend registry -- named candidates ``name -> builder(captured, settings) -> callable``,
shared with ``optimize --auto`` -- and the measurement:

* every backend is built once per batch size (its build time, for ``compile`` the compilation on
  the first call, is reported as ``build_s`` and kept out of the latencies);
* each then runs ``warmup`` untimed calls; its first output is compared with eager's on the same
  inputs (``max_abs_err``, and ``within_tolerance`` with the per-dtype tolerances of
  :mod:`fxforge.verify`);
* then ``repeats`` rounds, each calling every backend once, timed individually, in an order shuffled
  afresh each round (seeded, so runs repeat). Interleaving means a burst of machine noise hits all
  backends alike instead of the one that happened to be running; shuffling (not rotating) means no
  backend always runs right after the same other one, which would charge it that one's after-effects
  (a float model's weights evicting the caches made the int8 model timed after it 10% slower);
* each timed call comes right after untimed calls of the same backend, for at least ``SETTLE_SECONDS`` and
  ``SETTLE_CALLS`` calls: the timed call then finds the backend's own threads awake and the other runtime's gone
  quiet, as when the model runs alone in a loop. Without it, ONNX Runtime timed after a torch backend (whose
  OpenMP threads spin for a while after their last op) was 19% slower than alone (mobilenet_v2, batch 1, 2 cores:
  3.78 vs 3.18 ms), and torch's oneDNN-fused TorchScript 21%; with one call, 3% and 14%. One call was not always
  enough: torch's OpenMP threads can spin for over 10 ms, and ONNX Runtime timed after `torch.compile` ran at
  two speeds (AMD EPYC, 2026-11-28: median 3.03 ms, p90 3.92, against 1.97 alone; after 10 ms of settling 2.16,
  after 20 ms 2.02 with a p90 of 2.24 as alone). That was the "two speeds" of ONNX Runtime at batch 1 in
  docs/benchmarks.md, which read as 0.90x the best peer for a candidate that was the peer itself;
* median and p90 latency over the timed calls, throughput = batch / median; the speedup (eager's median over
  the row's) with the 95% bootstrap interval of eager's time over the row's round by round (rounds are paired,
  so a slow moment of the machine cancels); a row whose rounds spread wider than :data:`NOISY_SPREAD` is ``noisy``;
* page faults per timed call (``faults_per_call``, the median; the calling thread's on Linux, the process's elsewhere):
  memory mapped afresh on every call. A row with many (:data:`FAULTS_NOTED` or more) gets a note: on CPython
  3.11/3.12 a caller at a frame-stack chunk boundary makes every Python call inside the backend map a chunk
  (:mod:`fxforge.callstack`; a reloaded BERT-base: 170 per call, 8% slower), or an allocator returns memory to the
  OS between calls.

Peak memory (``peak_mem_mib``) is the growth of the process's resident set while the backend runs
its warm-up calls: the kernel's high-water mark (``VmHWM`` in ``/proc/self/status``) is reset
(``/proc/self/clear_refs``) after returning freed heap memory to the OS (``malloc_trim``), and read
after the calls, minus the resident set before them. It counts every allocator (torch's, ONNX
Runtime's arenas, oneDNN's scratch pads) including one-time workspaces allocated on the first call;
it does not count weights loaded while building (those are the model's size, not the run's). Where
``/proc`` cannot be reset (not Linux) it is ``None``. tracemalloc would see none of torch's
allocations; the allocator counters of ``torch.profiler`` would miss ONNX Runtime.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import ctypes.util
import dataclasses
import functools
import gc
import io
import json
import os
import random
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from fxforge.artifacts import (
    ONNX_FILE,
    REPORT_FILE,
    AutocastModule,
    ChannelsLastModule,
    CompiledModule,
    RestructuredOutputs,
    load_exported,
)
from fxforge.capture import Captured, at_batch, require_captured, require_real_weights
from fxforge.compare import compare_outputs
from fxforge.display import counted
from fxforge.errors import FxforgeError, offered, one_line_reason, option, option_of, pass_inputs_hint, require, said
from fxforge.export import ExportError, export_model
from fxforge.graphs import ATEN
from fxforge.inputs import make_inputs, specs_of
from fxforge.inspect import count_flops
from fxforge.machine import Load, Peak, bf16_unavailable, cached_peak, current_load, describe, peak_dict
from fxforge.models import load_model
from fxforge.passes import copy_graph_module, exact_passes
from fxforge.pipeline import Pipeline, build_pipeline
from fxforge.plugins import BACKENDS_GROUP, load_group
from fxforge.quantize import DEFAULT_RANDOM_BATCHES, frozen_torchscript, int8_backend, load_calibration
from fxforge.quantize.ort import quantize_onnx
from fxforge.references import as_names
from fxforge.registry import BUILTIN, Registry
from fxforge.runtime import (
    batch_of,
    cloned,
    device_of,
    holds_tensor,
    keeps_rng_state,
    preserved_state,
    quiet_torch_logs,
    run_reference,
    torch_threads,
    wait_for_device,
    with_constant_kwargs,
)
from fxforge.visual import notebook

try:
    import resource  # Unix only: page faults per timed call
except ImportError:  # pragma: no cover - Windows
    resource = None  # type: ignore[assignment]

Runner = Callable[..., Any]
# The torchscript backend's file in its work directory (.pt: the suffix names the format for load_exported)
TORCHSCRIPT_BUILD_FILE = "model.pt"
ProgressHook = Callable[[int, int, str], None]  # (steps done, total steps, what is running)


@dataclass
class BuildSettings:
    """What a builder gets besides the captured model."""

    threads: int
    workdir: Path  # a private temporary directory for exported files
    output_like: Any  # eager's output on the bench inputs (ONNX Runtime restores its structure)
    passes: Sequence[Any] | None = None  # for "fx": pass names or steps to run (None: the exact passes)
    calibration: Any = None  # for "int8", "ort_int8": calibration data as fxforge.quantize takes it (None: random)
    # for "int8+fallback": the accuracy target of quantize's keep_float_until (None: INT8_FALLBACK_TARGET)
    keep_float_until: Any = None
    # and the data that target is judged on (None: the calibration data); --auto passes its --data, so a fallback
    # calibrated on other samples stops where the candidate will be judged, not where it was calibrated (QA)
    fallback_data: Any = None
    notes: list[str] = field(default_factory=list)  # builders add what the row should say
    variants: tuple[str, ...] = ()  # the backend's variants asked for: "compile+channels_last" -> ("channels_last",)


@dataclass(frozen=True)
class Backend:
    """A named way of running a captured model: ``build(captured, settings)`` returns the callable to time."""

    name: str  # with the variants asked for: "compile+channels_last"
    summary: str
    build: Callable[[Captured, BuildSettings], Runner]
    # why this machine cannot run it fast (None: it can); such a backend is left out of the default set
    unsupported: Callable[[], str | None] | None = None
    # what each variant changes ("channels_last": "4-D weights and inputs in NHWC layout"); asked for by name
    variants: Mapping[str, str] = field(default_factory=dict)
    precision: str = "fp32"  # the arithmetic it runs (fp32, bf16, int8): whose measured peak it is held to
    selected: tuple[str, ...] = ()
    cpu_only: bool = False  # runs on the CPU whatever device the model is on (ONNX Runtime's CPU provider, x86 int8)

    @property
    def base(self) -> str:
        return self.name.split("+")[0]

    def unsupported_here(self) -> str | None:
        """Why the backend cannot run on this machine, or None. A check that raises (a plug-in's bug) makes the
        backend unsupported, by its reason: it stopped bench and --list-backends for every backend (QA)."""
        if self.unsupported is None:
            return None
        try:
            reason = self.unsupported()
        except Exception as exc:
            return f"its check of this machine raised {one_line_reason(exc)}"
        return None if reason is None else str(reason)

    @property
    def origin(self) -> str:
        """Where the backend comes from: ``fxforge``, a plug-in package, or the user's file."""
        return BACKENDS.origin(self.base)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "summary": self.summary,
            "origin": self.origin,
            "variants": dict(self.variants),
            "precision": self.precision,
            "cpu_only": self.cpu_only,
            "unsupported_here": self.unsupported_here(),
        }


BACKENDS: Registry[Backend] = Registry("backend", listing="fxforge bench --list-backends")


def register_backend(
    name: str,
    summary: str,
    *,
    unsupported: Callable[[], str | None] | None = None,
    variants: Mapping[str, str] | None = None,
    precision: str = "fp32",
    cpu_only: bool = False,
) -> Callable[[Callable[[Captured, BuildSettings], Runner]], Any]:
    """Register a backend builder under ``name`` (``bench`` and ``optimize --auto`` share the registry).

    ``unsupported()`` says why this machine cannot run the backend fast (None when it can): such a backend is
    left out of the default set of ``bench`` and ``--auto`` (named explicitly, it still runs). ``variants``:
    options the builder reads from ``settings.variants``, asked for as ``name+variant[+variant]``.
    ``precision``: fp32, bf16 or int8, the peak its GFLOP/s are compared with. ``cpu_only``: it runs on the CPU
    even for a model on a GPU (left out of the default set there, a row with the reason when named).
    """

    def decorate(build: Callable[[Captured, BuildSettings], Runner]) -> Callable[[Captured, BuildSettings], Runner]:
        backend = Backend(name, summary, build, unsupported, dict(variants or {}), precision, cpu_only=cpu_only)
        BACKENDS.register(name, backend, same=lambda old, new: old.build is new.build, module=build.__module__)
        return build

    return decorate


def get_backend(name: str) -> Backend:
    """The backend called ``name``, or ``base+variant[+variant...]``: the base backend built with those variants."""
    load_backend_plugins()
    base, *variants = name.strip().split("+")
    backend = BACKENDS.lookup(base)
    unknown = [v for v in variants if v not in backend.variants]
    if unknown:
        known = ", ".join(backend.variants) or "none"
        raise FxforgeError(f"backend {base!r} has no variant {unknown[0]!r}", hint=f"its variants: {known}")
    if not variants:
        return backend
    ordered = tuple(v for v in backend.variants if v in variants)  # one name per combination
    return dataclasses.replace(backend, name="+".join((base, *ordered)), selected=ordered)


def all_backends() -> list[Backend]:
    """Every registered backend, fxforge's and the installed plug-ins', in registration order."""
    load_backend_plugins()
    return list(BACKENDS.values())


def load_backend_plugins() -> None:
    """The installed plug-ins' backends (entry point group ``fxforge.backends``), once."""
    load_group(BACKENDS_GROUP, _adopt_backend)


def _adopt_backend(name: str, build: Any, origin: str) -> None:
    if any(backend.build is build for backend in BACKENDS.values()):
        return
    if not callable(build):
        raise FxforgeError(f"{origin} names {build!r} as a backend, but it is not a builder function")
    summary = (build.__doc__ or "").strip().splitlines()[0] if build.__doc__ else f"a backend from {origin}"
    BACKENDS.register(name, Backend(name, summary, build), origin)


# --------------------------------------------------------------------------------------------------
# the backends


@register_backend("eager", "the model itself, called in Python")
def _eager(captured: Captured, settings: BuildSettings) -> Runner:
    if captured.example_kwargs:  # constants fixed by --concrete; the captured graphs have them built in
        settings.notes.append(f"called with {', '.join(f'{k}={v!r}' for k, v in captured.example_kwargs.items())}")
        return functools.partial(captured.original, **captured.example_kwargs)
    return captured.original


CHANNELS_LAST = {"channels_last": "4-D weights and inputs in channels-last (NHWC) layout, oneDNN's own"}
ONEDNN_LINEAR = {
    "onednn_linear": "float32 Linear layers computed by oneDNN's matmul instead of MKL's (the onednn_linear pass): "
    "faster on CPUs where MKL does not use the widest vectors"
}


@register_backend(
    "fx",
    "the captured GraphModule rewritten with the exact passes (or --passes)",
    variants={**CHANNELS_LAST, **ONEDNN_LINEAR},
)
def _fx(captured: Captured, settings: BuildSettings) -> Runner:
    names = exact_passes() if settings.passes is None else list(settings.passes)
    if "onednn_linear" in settings.variants:
        names.append("onednn_linear")
    graph_module = captured.graph_module
    if names:
        result = Pipeline(names, lint_between=False).run(captured)
        changed = [step.result.name for step in result.steps if step.result.changed]
        settings.notes.append(f"passes that changed the graph: {', '.join(changed) or 'none'}")
        graph_module = result.graph_module
    # --concrete values: the torch dialect's graph has them built in, the ATen dialect's still takes them
    return _laid_out(with_constant_kwargs(graph_module, captured.example_kwargs), settings)


def _laid_out(module: nn.Module, settings: BuildSettings) -> nn.Module:
    """``module`` in the memory layout the variants ask for (a copy when that is channels-last)."""
    return ChannelsLastModule(module).eval() if "channels_last" in settings.variants else module


def _export_source(captured: Captured) -> nn.Module:
    # what fxforge export exports from a Captured: the rewritten graph, or the model itself for torch.export's,
    # with the --concrete values fixed (a TorchScript trace without them timed the model with its defaults)
    source = captured.original if captured.dialect == ATEN else captured.graph_module
    return with_constant_kwargs(source, captured.example_kwargs)


@register_backend(
    "torchscript",
    "fxforge export --to torchscript (trace, freeze, optimize_for_inference)",
    variants={
        **CHANNELS_LAST,
        "onednn": "frozen for oneDNN graph fusion (torch.jit.enable_onednn_fusion) instead of optimize_for_inference",
    },
)
def _torchscript(captured: Captured, settings: BuildSettings) -> Runner:
    path = settings.workdir / TORCHSCRIPT_BUILD_FILE
    source = _laid_out(_export_source(captured), settings)
    result = export_model(
        source,
        "torchscript",
        path,
        example_inputs=captured.example_inputs,
        verify_export=False,
        force=True,
        onednn_fusion="onednn" in settings.variants,
    )
    settings.notes.extend(result.notes)
    return load_exported(path, "torchscript", device=model_device(captured))


STREAMS = {
    "streams": "the batch split over concurrent streams of one thread each, in micro-batches whose size is timed "
    "(dynamic-batch export; batch 2 or more)",
}


@register_backend(
    "onnxruntime",
    "fxforge export --to onnx, run by ONNX Runtime (CPU)",
    cpu_only=True,
    variants=STREAMS,
)
def _onnxruntime(captured: Captured, settings: BuildSettings) -> Runner:
    path = settings.workdir / ONNX_FILE
    streams = "streams" in settings.variants
    result = export_model(captured, "onnx", path, verify_export=False, force=True, dynamic_batch=streams)
    settings.notes.append(f"{result.exporter} exporter, opset {result.opset}{', dynamic batch' if streams else ''}")
    return _onnx_runner(path, captured, settings)


def _onnx_runner(path: Path, captured: Captured, settings: BuildSettings) -> Runner:
    """The ONNX file at ``path`` run by ONNX Runtime: in streams where the variant asks (:func:`ort_streams`)."""
    if "streams" in settings.variants:
        module, _, notes = ort_streams(path, captured, settings.threads, settings.output_like)
        settings.notes.extend(notes)
        return module
    return load_exported(path, "onnx", output_like=settings.output_like, threads=settings.threads)


# Micro-batch sizes a streams run tries. Which is fastest depends on the CPU's caches and the model, so each is
# timed: mobilenet_v2 at batch 8 on 2 cores of an AMD EPYC (Zen 5), against one call on both threads: 1.16x with
# micro-batches of 1, 1.21x of 2, 1.12x of 4; efficientnet_b0 1.05x, 1.12x, 1.09x.
MICRO_BATCHES = (1, 2, 4, 8)
STREAMS_TUNING_ROUNDS = 5


def ort_streams(
    path: Path, captured: Captured, threads: int, output_like: Any = None
) -> tuple[nn.Module, dict[str, Any], list[str]]:
    """The ONNX model at ``path`` (exported with a dynamic batch) run as one stream of one thread per thread
    (:meth:`~fxforge.artifacts.OnnxRuntimeModule.in_streams`), in the micro-batch size that ran ``captured``'s
    example inputs fastest here. Returns the module, the recipe that runs it so (``recipe.json``) and notes.

    Raises :class:`FxforgeError` where streams cannot apply: one thread, an example of one sample, or an output
    that is not per-sample (its first dimension is not the batch: the pieces' outputs could not be joined)."""
    batch = batch_of(captured.example_inputs)
    if threads < 2:
        raise FxforgeError(
            "streams need two threads or more", hint=f"run with {option_of('bench', '--threads', 2)} or more"
        )
    if batch is None or batch < 2:
        raise FxforgeError(
            "streams split the batch, and the example inputs have one sample",
            hint=said(
                f"run it at a batch of 2 or more ({option_of('bench', '--batch', 8)}, or --input 8x...)",
                "bench or capture it at a batch of 2 or more",
            ),
        )
    whole = load_exported(path, "onnx", output_like=output_like, threads=threads)
    inputs = captured.example_inputs
    with torch.no_grad():
        output = whole(*inputs)
    tensors = [v for v in pytree.tree_leaves(output) if isinstance(v, torch.Tensor)]
    if any(t.dim() == 0 or t.shape[0] != batch for t in tensors):
        raise FxforgeError(
            f"an output is not per-sample (its first dimension is not the batch, {batch}: the first dimension of the "
            "first input): the batch cannot run in pieces"
        )
    # the inputs split are those whose first dimension is the example's batch, recorded by name: one that every
    # sample shares (a mask, a bias) went into pieces whenever a batch happened to match its size (QA). One that
    # matches it at the example is split here too, and then the pieces compute something else: refused below
    leaves = [v for v in pytree.tree_leaves(inputs) if isinstance(v, torch.Tensor)]
    batched = [name for name, t in zip(whole.input_names, leaves) if t.dim() and t.shape[0] == batch]
    streams = min(threads, batch)
    share = -(-batch // streams)
    sizes = sorted({m for m in MICRO_BATCHES if m < share} | {share})
    module = whole.in_streams(streams, sizes[0], batched)
    _check_pieces(whole, module, inputs, batched, sizes)
    times: dict[int, list[float]] = {m: [] for m in sizes}
    with torch.no_grad():
        for round_ in range(STREAMS_TUNING_ROUNDS + 1):  # round 0 warms each size up
            for size in sizes:
                module.micro_batch = size
                start = time.perf_counter()
                module(*inputs)
                if round_:
                    times[size].append(time.perf_counter() - start)
    medians = {m: statistics.median(t) for m, t in times.items()}
    module.micro_batch = min(medians, key=medians.__getitem__)
    timed = ", ".join(f"{m}: {seconds * 1e3:.2f} ms" for m, seconds in medians.items())
    notes = [
        f"{streams} streams of one thread, micro-batches of {module.micro_batch} (batch {batch} timed here in "
        f"micro-batches of {timed})"
    ]
    recipe = {"run": "onnxruntime", "streams": streams, "micro_batch": module.micro_batch, "batched": batched}
    return module, recipe, notes


def _check_pieces(whole: Any, module: Any, inputs: tuple[Any, ...], batched: list[str], sizes: list[int]) -> None:
    """Refuse streams where the batch in pieces of any of ``sizes`` (every size timed, and so may be chosen: QA had
    only the first checked) computes something else than one call: on the example, and again with its
    floating-point inputs drawn at random (seeded), since an input every sample shares can be uniform at the
    example (an all-ones mask), which hides that it was cut (QA: ``x * mask.mean()``). One call's outputs are
    computed once per case."""
    generator = torch.Generator().manual_seed(0)

    def drawn(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            # in [0.5, 1.5): positive, so that a model taking a log or a square root stays finite
            return torch.rand(value.shape, generator=generator, dtype=value.dtype) + 0.5
        return value

    cases = [inputs, tuple(pytree.tree_map(drawn, list(inputs)))]
    expected: list[Any] = []
    for size in sizes:
        module.micro_batch = size
        for index, case in enumerate(cases):
            with torch.no_grad():
                try:
                    if len(expected) == index:
                        expected.append(whole(*case))
                    # each output dtype's round-off (compare.TOLERANCES: fewer samples per call may change a
                    # kernel's summation order); an int8 file's pieces run the same quantized kernels on the same values
                    problems = compare_outputs(expected[index], module(*case)).problems
                except Exception as exc:  # a shared input cut in pieces no longer fits the others' shapes
                    problems = [f"ONNX Runtime failed: {one_line_reason(exc)}"]
            if problems:
                raise FxforgeError(
                    f"run in pieces of {size}, the batch gives other outputs ({problems[0]}): the model mixes "
                    f"samples, or one of the inputs split as batched ({', '.join(batched)}) is shared by every sample "
                    "and has the batch's size at the example"
                )


COMPILE_VARIANTS = {
    **CHANNELS_LAST,
    "max_autotune": "Inductor's max-autotune mode (benchmarks kernel choices while compiling: slower to build)",
    "cpp_wrapper": "Inductor's C++ wrapper instead of the Python one (less per-call overhead)",
    # bench runs it like plain compile; what differs is the artifact --auto writes (fxforge.deploy)
    "recipe": "shipped as model.pt2 + recipe.json, compiled when loaded, instead of an AOTInductor package",
}


@register_backend(
    "compile",
    "torch.compile (Inductor, freezing on); build_s is the compilation on the first call",
    variants=COMPILE_VARIANTS,
)
def _compile(captured: Captured, settings: BuildSettings) -> Runner:
    # Freezing (weights as constants, oneDNN weight prepacking) is PyTorch's advice for CPU inference:
    # resnet18 at 64x64, one thread, measured 4.8 ms frozen, 12.2 ms not, 7.9 ms eager.
    compiled = CompiledModule(
        _laid_out(with_constant_kwargs(captured.original, captured.example_kwargs), settings),
        inductor_config(settings.variants),
        mode="max-autotune-no-cudagraphs" if "max_autotune" in settings.variants else None,
    )
    with torch.no_grad():  # as bench runs it: freezing applies to inference only
        compiled(*captured.example_inputs)  # compiles now, so that build_s holds the compile time
    return compiled


def inductor_config(variants: Sequence[str]) -> dict[str, Any]:
    """The Inductor settings a compile candidate runs with: freezing always, the C++ wrapper when asked."""
    config: dict[str, Any] = {"freezing": True}
    if "cpp_wrapper" in variants:
        config["cpp_wrapper"] = True
    return config


INT8_FALLBACK_TARGET = "agreement=0.99"


def int8_options(settings: BuildSettings, variants: Iterable[str], notes: list[str]) -> dict[str, Any]:
    """:func:`~fxforge.quantize.int8_backend`'s options: with the ``fallback`` variant, quantize's sensitivity
    fallback toward ``settings.keep_float_until`` (default :data:`INT8_FALLBACK_TARGET`), reported in ``notes``."""
    target = None
    if "fallback" in variants:
        target = settings.keep_float_until if settings.keep_float_until is not None else INT8_FALLBACK_TARGET
    eval_data = settings.fallback_data if target is not None else None
    return {"keep_float_until": target, "eval_data": eval_data, "notes": notes}


@register_backend(
    "int8",
    "fxforge.quantize int8 (static for traced graphs, dynamic for exported ones), as frozen TorchScript where its "
    "trace computes the same bits",
    precision="int8",
    cpu_only=True,
    variants={
        "fallback": "the units that cost most accuracy kept in float until an accuracy target holds on the "
        f"calibration data (quantize --keep-float-until; default {INT8_FALLBACK_TARGET})"
    },
)
def _int8(captured: Captured, settings: BuildSettings) -> Runner:
    model = int8_backend(captured, settings.calibration, **int8_options(settings, settings.variants, settings.notes))
    # what optimize --auto writes (deploy), so that bench times the int8 users get
    scripted, how = frozen_torchscript(model, captured.example_inputs, captured.example_kwargs)
    settings.notes.append(how if scripted is not None else f"run as the int8 GraphModule: {how}")
    return scripted if scripted is not None else model


@register_backend(
    "ort_int8",
    "fxforge export --to onnx (dynamic batch), quantized by ONNX Runtime (static QDQ int8, per-channel weights, "
    "calibrated), run by ONNX Runtime (CPU)",
    precision="int8",
    cpu_only=True,
    variants=STREAMS,
)
def _ort_int8(captured: Captured, settings: BuildSettings) -> Runner:
    path = settings.workdir / ONNX_FILE
    settings.notes.extend(write_ort_int8(captured, path, settings.calibration))
    return _onnx_runner(path, captured, settings)


def write_ort_int8(captured: Captured, path: Path, calibration: Any = None) -> list[str]:
    """Export ``captured`` to ONNX (batch dimension dynamic, so that any batch size runs) and write ``path``: that
    file quantized by ONNX Runtime (:func:`fxforge.quantize.ort.quantize_onnx`), calibrated on ``calibration``
    (as ``fxforge.quantize`` takes it; ``None``: random batches shaped like the example, an ``int``: random
    batches of that size). Returns notes."""
    require("onnxruntime", "onnx", "ONNX Runtime int8 (ort_int8)")
    if isinstance(calibration, int) and not isinstance(calibration, bool):
        calibration = _random_batches(captured, calibration)
    batches = load_calibration(calibration, captured.example_inputs).batches
    with tempfile.TemporaryDirectory(prefix="fxforge-ort-int8-") as tmp:
        float_path = Path(tmp) / ONNX_FILE
        result = export_model(captured, "onnx", float_path, verify_export=False, force=True, dynamic_batch=True)
        notes = [f"{result.exporter} exporter, opset {result.opset}, dynamic batch"]
        notes += quantize_onnx(float_path, path, batches)
    return notes


# --------------------------------------------------------------------------------------------------
# a written artifact, timed as a row next to the model it was made from

ARTIFACT_PREFIX = "file:"
UNKNOWN_PRECISION = "unknown"  # a file's arithmetic is not recorded: its row gets no fraction of any peak


def refuse_no_backends(backends: Sequence[Any] | None) -> None:
    """An empty list of backends (``--backends ""``, an unset shell variable) ran the whole default set, as if none
    had been asked for: refused, naming the known ones. Cheap, so the CLI calls it before the model loads."""
    if backends is not None and not backends:
        known = ", ".join(backend.name for backend in all_backends())
        raise FxforgeError(
            f"{option('--backends')} names no backend; the known ones: {known}",
            hint=f"leave {option('--backends')} out for the default set",
        )


def check_artifacts(
    artifacts: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
) -> list[str | os.PathLike[str]]:
    """``bench``'s ``artifacts`` as a list, each one there; cheap, so the CLI calls it before the model loads."""
    paths = [artifacts] if isinstance(artifacts, (str, os.PathLike)) else list(artifacts)
    missing = [path for path in paths if not Path(path).exists()]
    if missing:
        raise FxforgeError(f"{option('--artifact', python='artifacts')} {missing[0]}: no such file or directory")
    return paths


def artifact_backend(
    path: str | os.PathLike[str], *, name: str | None = None, trust_pickle: bool | None = None
) -> Backend:
    """A row that runs a written artifact -- a file or an output directory -- loaded by :func:`fxforge.load_model`
    the way users load it (an ONNX file by ONNX Runtime, an AOTInductor package, ``model.pt2`` + ``recipe.json``
    compiled on its first call): ``bench(captured, ["eager", artifact_backend("out/")])`` times what ``optimize``
    or ``export`` wrote next to the model it was made from, on the same inputs, and compares its outputs with
    eager's like any row's. The load and the first call count as its build time. ``name`` defaults to
    ``file:PATH``. ``trust_pickle`` as in :func:`fxforge.load_model` (a pickled ``model.pt`` needs it).

    The row's precision (whose measured peak its GFLOP/s are held to) is the one of the backend an ``--auto``
    directory's ``report.json`` says was chosen; for anything else it is not known and the row gets no fraction of
    a peak. An artifact written for one batch size (an ONNX file with fixed shapes) fails at another: its row
    says so, the others are timed.
    """
    path = os.fspath(path)
    label = name or f"{ARTIFACT_PREFIX}{path}"

    def build(captured: Captured, settings: BuildSettings) -> Runner:
        loaded = load_model(path, trust_pickle=trust_pickle)
        module = loaded.module
        try:
            with torch.no_grad(), quiet_torch_logs():
                output = module(*captured.example_inputs)  # a compile recipe compiles here, inside the build time
        except Exception as exc:
            _refuse_other_inputs(path, loaded.default_inputs, captured.example_inputs, exc)
            raise
        if loaded.file:
            settings.notes.append(f"ran {loaded.file}")
        if pytree.tree_structure(output) != pytree.tree_structure(settings.output_like):
            module = RestructuredOutputs(module, settings.output_like)
        return module

    summary = f"the artifact {path}, loaded by fxforge.load_model"
    return Backend(label, summary, build, precision=_artifact_precision(Path(path)))


def _refuse_other_inputs(path: str, written: Sequence[Any], inputs: Sequence[Any], exc: Exception) -> None:
    """Where the artifact failed on inputs of other shapes than those it records (its inputs.txt, a program's
    example), say both: another model's artifact failed with torch's "Guard failed: x.size()[2] == 224" (QA)."""
    if not written or not all(isinstance(value, torch.Tensor) for value in inputs):
        return
    asked = specs_of(inputs)
    if list(written) != asked:
        raise FxforgeError(
            f"{path} was written for inputs {', '.join(map(str, written))}, and bench runs it on "
            f"{', '.join(map(str, asked))}: {one_line_reason(exc)}",
            hint="bench it with the inputs it was written for ("
            + said(
                " ".join(f"--input {spec.text(with_range=True)}" for spec in written),
                f"fxforge.prepare(model, {[spec.text(with_range=True) for spec in written]!r})",
            )
            + "), or bench the model it was made from",
        ) from None


def _artifact_precision(path: Path) -> str:
    """The precision of the backend an --auto directory's report.json names as chosen, else unknown."""
    try:
        chosen = json.loads((path / REPORT_FILE).read_text()).get("chosen")
        return get_backend(chosen).precision if isinstance(chosen, str) else UNKNOWN_PRECISION
    except (OSError, ValueError, AttributeError, FxforgeError):  # no report, not JSON, not a backend we know
        return UNKNOWN_PRECISION


def _random_batches(captured: Captured, batch: int) -> list[tuple[Any, ...]]:
    specs = specs_of(captured.example_inputs)
    return [make_inputs(specs, seed=i, batch=batch) for i in range(DEFAULT_RANDOM_BATCHES)]


def model_device(captured: Captured) -> torch.device:
    """The device ``captured`` runs on: its example inputs' (else its weights')."""
    return device_of(captured.example_inputs, captured.original)


def _no_native_bf16() -> str | None:
    # every backend runs the model on the CPU: a GPU with bf16 beside it does not make these fast
    reason = bf16_unavailable()
    return f"{reason} (see fxforge doctor)" if reason else None


@register_backend(
    "bf16",
    "the captured graph in bfloat16 (weights and activations), float32 in and out",
    unsupported=_no_native_bf16,
    precision="bf16",
)
def _bf16(captured: Captured, settings: BuildSettings) -> Runner:
    return bfloat16_graph(captured.graph_module, captured.example_inputs, settings.output_like)


@register_backend(
    "autocast",
    "torch.autocast to bfloat16: matmuls and convolutions in bf16, the rest in float32; float32 outputs",
    unsupported=_no_native_bf16,
    precision="bf16",
)
def _autocast(captured: Captured, settings: BuildSettings) -> Runner:
    return AutocastModule(captured.graph_module, settings.output_like, device=model_device(captured).type)


def bfloat16_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], output_like: Any) -> fx.GraphModule:
    """A GraphModule running a bfloat16 copy of ``gm``: float inputs are cast to bfloat16 on the way in
    and float outputs back to their dtype on the way out, so it is a drop-in replacement that loads
    with torch alone. ``output_like`` (an output of ``gm``) gives the output structure."""
    import operator

    root = nn.Module()
    root.add_module("model", _in_bfloat16(gm))
    graph = fx.Graph()
    args = []
    for index, value in enumerate(example_inputs):
        node = graph.placeholder(f"input_{index}")
        floating = isinstance(value, torch.Tensor) and value.is_floating_point()
        args.append(graph.call_method("to", (node, torch.bfloat16)) if floating else node)
    result = graph.call_module("model", tuple(args))
    leaves, spec = pytree.tree_flatten_with_path(output_like)
    outputs = []
    for path, leaf in leaves:
        node = result
        for key in path:
            if not isinstance(key, (pytree.SequenceKey, pytree.MappingKey)):
                raise FxforgeError("the bf16 backend handles tensor, tuple, list and dict outputs")
            node = graph.call_function(operator.getitem, (node, key.idx if hasattr(key, "idx") else key.key))
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
            node = graph.call_method("to", (node, leaf.dtype))
        outputs.append(node)
    graph.output(pytree.tree_unflatten(outputs, spec))
    return fx.GraphModule(root, graph, class_name="Bfloat16Model").eval()


def _in_bfloat16(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` whose weights and float32 dtype arguments are bfloat16: an ATen graph spells out the dtypes
    the model computed from its inputs (``zeros(dtype=float32)`` for an attention mask, ``_to_copy(dtype=float32)``
    for ``.to(query.dtype)``), and those float32 tensors met bfloat16 ones in a matmul."""

    def bf16(value: Any) -> Any:
        return torch.bfloat16 if value is torch.float32 else value

    copied = copy.deepcopy(gm).to(torch.bfloat16)
    for node in copied.graph.nodes:
        node.args = fx.node.map_aggregate(node.args, bf16)
        node.kwargs = fx.node.map_aggregate(node.kwargs, bf16)
        if node.op == "call_method" and node.target == "float":
            node.target = "bfloat16"
    copied.recompile()
    return copied


# --------------------------------------------------------------------------------------------------
# results


@dataclass
class BenchRow:
    """One backend at one batch size; ``error`` is set when it could not be built or run."""

    backend: str
    batch: int
    error: str | None = None
    median_ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    min_ms: float | None = None
    mean_ms: float | None = None
    throughput: float | None = None  # samples per second: batch / median
    speedup: float | None = None  # eager's median / this median, same batch
    # the 95% bootstrap interval of eager's time over this row's, paired by round (ratio_interval)
    speedup_interval: tuple[float, float] | None = None
    peak_mem_mib: float | None = None
    max_abs_err: float | None = None  # vs eager on the same inputs
    within_tolerance: bool | None = None
    build_s: float | None = None
    samples: int = 0
    notes: list[str] = field(default_factory=list)
    gflops: float | None = None  # the model's float FLOPs / median time
    peak_fraction: float | None = None  # gflops / the machine's measured matmul peak for this row's precision
    precision: str = "fp32"
    faults_per_call: float | None = None  # median minor page faults per timed call (None: not counted here)
    round_ms: list[float] = field(default_factory=list, repr=False)  # one time per round, in round order

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def spread(self) -> float | None:
        """p90 over p10 of the rounds: how much the machine moved the timings."""
        return self.p90_ms / self.p10_ms if self.p10_ms and self.p90_ms else None

    @property
    def noisy(self) -> bool:
        """The rounds spread wider than :data:`NOISY_SPREAD`: the median, and every ratio read from medians, is a
        sample of a busy machine more than of the backend; the paired speedup interval still holds."""
        return self.spread is not None and self.spread > NOISY_SPREAD

    def set_rounds(self, round_ms: Sequence[float]) -> None:
        """Set the timed rounds (ms, in round order) and the statistics over them. Rates that follow the median
        (throughput, GFLOP/s, fraction of peak) are rescaled when rounds are added to a timed row; the speedup,
        which needs eager's median, is the caller's."""
        previous = self.median_ms
        self.round_ms = list(round_ms)
        self.samples = len(self.round_ms)
        self.median_ms = statistics.median(self.round_ms)
        self.p10_ms = _percentile(self.round_ms, 0.1)
        self.p90_ms = _percentile(self.round_ms, 0.9)
        self.min_ms = min(self.round_ms)
        self.mean_ms = statistics.fmean(self.round_ms)
        self.throughput = self.batch / (self.median_ms * 1e-3)
        if previous:
            scale = previous / self.median_ms
            self.gflops = self.gflops * scale if self.gflops else self.gflops
            self.peak_fraction = self.peak_fraction * scale if self.peak_fraction else self.peak_fraction

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("round_ms")
        data["ok"] = self.ok
        data["noisy"] = self.noisy
        return data


@dataclass
class BenchReport:
    rows: list[BenchRow]
    threads: int
    warmup: int
    repeats: int
    inputs: list[str]
    memory: str  # how peak memory was measured
    machine: str = ""  # CPU model, features, threads, torch, measured peaks (fxforge.machine.describe)
    peak: Peak | None = None  # the machine's measured matmul peaks the rows' peak_fraction divide by
    load: Load | None = None  # the load average when the timing ended (other work competing for the cores)

    def __repr__(self) -> str:
        return notebook.bench_repr(self)

    def _repr_html_(self) -> str:  # Jupyter shows this for the last value of a cell
        return notebook.bench_html(self)

    @property
    def noise_warning(self) -> str | None:
        """One line naming the noisy rows (:attr:`BenchRow.noisy`) and saying when other work competed for the cores
        (:attr:`load`), or None when neither."""
        noisy = [row for row in self.rows if row.noisy]
        busy = self.load is not None and self.load.busy(self.threads)
        if self.repeats < MIN_INTERVAL_ROUNDS and any(row.median_ms for row in self.rows):
            # QA: --repeats 2 printed "onnxruntime 254.10x" with no interval and no word of doubt
            return (
                f"{counted(self.repeats, 'round')}: too few for a speedup interval or a spread, so nothing here "
                f"says whether the machine was busy; time at least {MIN_INTERVAL_ROUNDS} rounds ({option('--repeats')})"
            )
        if not noisy and not busy:
            return None
        parts = []
        if noisy:
            spreads = sorted(row.spread or 0.0 for row in noisy)
            span = f"{spreads[0]:.1f}x" if len(noisy) == 1 else f"{spreads[0]:.1f}-{spreads[-1]:.1f}x"
            names = ", ".join(dict.fromkeys(row.backend for row in noisy))
            parts.append(f"the rounds of {names} spread {span} (p90 over p10, above {NOISY_SPREAD})")
        if busy:
            assert self.load is not None
            # QA: eager at 87 ms (0.27 ms with one thread) in every round alike, so neither noisy nor a wide
            # interval, and "onnxruntime 534x (387-672)": torch's threads waited for cores other work held
            parts.append(
                f"{self.load.describe(self.threads)}: a backend's threads can wait for busy cores and run many "
                "times slower in every round alike, which no interval shows, so its speedups are the load's"
            )
        # report --bench has no --threads: it is not offered there
        fewer = offered(f"with {option('--threads', 1)}", "--threads") if busy and self.threads > 1 else None
        if fewer:
            advice = f"rerun with nothing else running, or {fewer}"
        elif busy:
            advice = "rerun with nothing else running"
        else:
            advice = "compare backends by the speedup intervals, or rerun with nothing else running"
        return f"a busy machine: {'; '.join(parts)}; {advice}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "noise_warning": self.noise_warning,
            "threads": self.threads,
            "warmup": self.warmup,
            "repeats": self.repeats,
            "inputs": self.inputs,
            "memory": self.memory,
            "machine": self.machine,
            "peak": peak_dict(self.peak) if self.peak is not None else None,
            "load": dataclasses.asdict(self.load) if self.load is not None else None,
            "rows": [row.to_dict() for row in self.rows],
        }


# --------------------------------------------------------------------------------------------------
# peak memory


class ResidentPeak:
    """Growth of the resident set during a block (see the module docstring); ``mib`` is None if unknown."""

    def __init__(self) -> None:
        self.mib: float | None = None
        self._base_kib = 0

    @staticmethod
    def available() -> bool:
        return Path("/proc/self/clear_refs").exists() and _status_kib("VmHWM") is not None

    def __enter__(self) -> ResidentPeak:
        if not self.available():
            return self
        gc.collect()
        _malloc_trim()
        try:
            Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak RSS to the current RSS
        except OSError:
            return self
        self._base_kib = _status_kib("VmRSS") or 0
        self.mib = 0.0
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self.mib is not None:
            self.mib = max(0, (_status_kib("VmHWM") or 0) - self._base_kib) / 1024


def _status_kib(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _malloc_trim() -> None:
    name = ctypes.util.find_library("c")
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(name).malloc_trim(0)


MEMORY_METHOD = (
    "resident-set growth (VmHWM reset via /proc/self/clear_refs, after malloc_trim) during the warm-up calls"
)


# --------------------------------------------------------------------------------------------------
# the benchmark


def _percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    if len(ordered) == 1:
        return ordered[0]
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@keeps_rng_state
def bench(
    captured: Captured,
    backends: Sequence[str | Backend] | None = None,
    *,
    batches: Sequence[int] | None = None,
    threads: int | None = None,
    warmup: int = 3,
    repeats: int = 20,
    seed: int = 0,
    passes: Sequence[str] | None = None,
    progress: ProgressHook | None = None,
    peak: bool = True,
    pass_options: Mapping[str, Mapping[str, Any]] | Sequence[str] = (),
    artifacts: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] = (),
    trust_pickle: bool | None = None,
) -> BenchReport:
    """Time ``captured`` on ``backends`` (names or :class:`Backend` objects; default: all registered).

    ``batches``: batch sizes to run (default: the example inputs'). ``threads``: intra-op threads for
    torch and ONNX Runtime (default: torch's current setting). ``passes``: for the ``fx`` backend
    (default: the exact passes), with ``pass_options`` as ``optimize`` takes them (``{pass: {option: value}}`` or
    ``PASS.KEY=VALUE`` strings). ``artifacts``: written files or output directories to time too (``bench
    --artifact``), each a row of :func:`artifact_backend` after the backends (with ``backends`` left out: after
    eager alone), loaded with ``trust_pickle``. A backend that fails to build or run gives a row with its ``error``;
    the others are still measured. ``peak``: measure the machine's matmul peak (once per process, about 2 s)
    and give each row its fraction of it. See the module docstring for what is measured and how.
    """
    if warmup < 1 or repeats < 1:
        raise FxforgeError("bench needs at least one warm-up run and one repeat")
    require_captured(captured, "bench")
    require_real_weights(captured, "bench")
    if threads is not None and threads < 1:
        raise FxforgeError(f"{option('--threads')} must be at least 1")
    if batches is not None and any(b < 1 for b in batches):
        raise FxforgeError(f"{option('--batch', python='batches')} sizes must be at least 1")
    if not captured.example_inputs:
        raise FxforgeError("bench needs positional example inputs", hint=pass_inputs_hint())
    specs_of(captured.example_inputs, "bench")  # a dict or list argument: said here, not an AttributeError later
    keyword_tensors = [name for name, value in captured.example_kwargs.items() if holds_tensor(value)]
    if keyword_tensors:
        raise FxforgeError(
            f"bench times positional inputs; keyword input {keyword_tensors[0]!r} holds a tensor",
            hint=said(
                "pass it positionally (--input), or fix it with --concrete when it is a constant",
                "capture with it as a positional input, or fix it with concrete_args when it is a constant",
            ),
        )
    backends, passes = as_names(backends), as_names(passes)
    refuse_no_backends(backends)
    written = [artifact_backend(path, trust_pickle=trust_pickle) for path in check_artifacts(artifacts)]
    if written:  # here, not in the CLI alone: the API had no way to time a written file without a private import
        backends = [*(backends or ["eager"]), *written]
    device = model_device(captured)
    chosen = [b if isinstance(b, Backend) else get_backend(b) for b in (backends or default_backends())]
    if not backends and device.type != "cpu":  # the CPU runtimes would time the CPU, not the model's device
        chosen = [b for b in chosen if not b.cpu_only]
    named_twice = [b.name for i, b in enumerate(chosen) if b.name in {c.name for c in chosen[:i]}]
    if named_twice or len(set(batches or ())) != len(batches or ()):
        # each row's working directory is named by backend and batch: a second one crashed after every build
        twice = f"backend {named_twice[0]}" if named_twice else "a batch size"
        raise FxforgeError(
            f"{twice} is named twice", hint="name each backend and batch size once (variants in any order are one)"
        )
    # an unknown pass is the caller's mistake (exit 2), not a row that failed to build -- nor, without the fx
    # backend, nothing at all
    passes = pass_steps(passes, pass_options)
    if passes is not None:
        refuse_passes_without_fx(chosen)
    example_batch = captured.example_inputs[0].shape[0] if captured.example_inputs[0].dim() else 1
    batches = list(batches or [example_batch])
    threads = threads or torch.get_num_threads()
    steps_per_batch = 2 * len(chosen) + repeats
    counter = _Progress(progress, steps_per_batch * len(batches))
    rows: list[BenchRow] = []
    # the runners run the caller's modules (the graph shares them): a model in training mode would update its
    # BatchNorm statistics on every timed call, so whatever the calls wrote is undone at the end
    with (
        torch_threads(threads),
        tempfile.TemporaryDirectory(prefix="fxforge-bench-") as workdir,
        preserved_state(captured.original, captured.graph_module),
    ):
        # the measured peak is the CPU's: a model on a GPU gets no fraction of it
        measured = cached_peak(threads) if peak and device.type == "cpu" else None
        plan = _Plan(seed, threads, warmup, repeats, passes, Path(workdir), counter, measured)
        for batch in batches:
            rows += _bench_batch(captured, chosen, batch, plan)
        machine = describe(measured)
        if device.type == "cuda":
            gpu = torch.cuda.get_device_name(device)
            machine += f"; the model runs on {device} ({gpu}), each call timed to the end of its kernels"
    memory = MEMORY_METHOD if ResidentPeak.available() else "not measured (needs Linux /proc)"
    inputs = [str(s) for s in specs_of(captured.example_inputs)]
    return BenchReport(rows, threads, warmup, repeats, inputs, memory, machine, measured, current_load())


def pass_steps(
    passes: Sequence[str] | None, pass_options: Mapping[str, Mapping[str, Any]] | Sequence[str] = ()
) -> list[Any] | None:
    """The fx backend's pipeline steps for ``passes`` with ``pass_options`` (None: the exact passes; ``[]``: none),
    checked before any work: an unknown pass or option, options without a pass to take them."""
    if passes is None:
        if pass_options:
            raise FxforgeError(
                f"{option('--option', python='pass_options')} applies to {option('--passes')}",
                hint=said(
                    "e.g. -p replace_modules --option replace_modules.mapping='{ReLU: ReLU6}'",
                    "e.g. passes=['replace_modules'], pass_options={'replace_modules': {'mapping': {'ReLU': 'ReLU6'}}}",
                ),
            )
        return None
    if pass_options and not passes:  # no passes, but options for one: not the exact group in disguise (QA)
        raise FxforgeError(f"{option('--passes')} names no pass", hint="name the pass the option is for")
    return build_pipeline(passes, pass_options).steps if passes else []


def refuse_passes_without_fx(backends: Sequence[Backend]) -> None:
    """Passes for a bench none of whose backends runs them (only fx does): they would change nothing."""
    if not any(backend.base == "fx" for backend in backends):
        names = ", ".join(backend.name for backend in backends)
        raise FxforgeError(
            f"{option('--passes')} applies to the fx backend only, and it is not among the backends ({names})",
            hint=f"add fx to {option('--backends')}, or leave {option('--passes')} out",
        )


class _Progress:
    def __init__(self, hook: ProgressHook | None, total: int) -> None:
        self.hook, self.total, self.done = hook, total, 0

    def step(self, description: str, count: int = 1) -> None:
        self.done += count
        if self.hook is not None:
            self.hook(self.done, self.total, description)


@dataclass
class _Plan:
    seed: int
    threads: int
    warmup: int
    repeats: int
    passes: Sequence[Any] | None
    workdir: Path
    counter: _Progress
    peak: Peak | None = None


def build_backend(
    backend: Backend, captured: Captured, settings: BuildSettings
) -> tuple[Runner | None, str | None, float]:
    """(runner, None, seconds) when ``backend`` builds, else (None, "build failed: <reason>", seconds).

    A failed build is a result to report, never an exception: bench and auto show it as a row with its reason.
    ``settings.workdir`` is created here; for ``compile`` the seconds include the compilation.
    """
    settings.workdir.mkdir(parents=True)
    settings.variants = backend.selected
    if backend.origin != BUILTIN:
        # a plug-in's builder gets its own copy of the graph (sharing the tensors): one that edited the graph it
        # was given changed every later row's, and the built-in fx row failed for it (QA)
        captured = dataclasses.replace(captured, graph_module=copy_graph_module(captured.graph_module))
    start = time.perf_counter()
    try:
        with quiet_torch_logs():
            return backend.build(captured, settings), None, time.perf_counter() - start
    except Exception as exc:
        return None, f"build failed: {build_failure(exc)}", time.perf_counter() - start


def build_failure(exc: BaseException) -> str:
    """Why a build failed, in one line, with fxforge's hint where it gave one (what to install for a missing optional
    dependency, the opt-in a pickled artifact needs)."""
    reason = one_line_reason(exc)
    if isinstance(exc, ExportError) and exc.hint:
        # its hint names export's own options as fxforge export's (option_of): bench has none of them (QA), and
        # optimize --auto and report --bench have no --artifact either
        timed = said(
            offered("time the file with --artifact FILE", "--artifact")
            or "time the file with fxforge bench --artifact FILE",
            "time the file as a backend: artifact_backend(path)",
        )
        return f"{reason} (export it yourself, then {timed}: {exc.hint})"
    return f"{reason} ({exc.hint})" if isinstance(exc, FxforgeError) and exc.hint else reason


def _bench_batch(captured: Captured, chosen: Sequence[Backend], batch: int, plan: _Plan) -> list[BenchRow]:
    resized = at_batch(captured, batch, plan.seed)
    inputs = resized.example_inputs
    # constant keyword arguments (--concrete): the graph has them built in, the model gets them (see _eager)
    expected = run_reference(resized.original, inputs, resized.example_kwargs)
    # what each backend's compared call gets: the inputs as the reference saw them. A model that writes its input
    # in place (x.mul_(2)) changes ``inputs`` on every call, so the backends warmed up after eager were compared on
    # other values, "beyond tol" (QA)
    pristine = cloned(inputs)
    rows = {backend.name: BenchRow(backend.name, batch, precision=backend.precision) for backend in chosen}
    runners: dict[str, Runner] = {}
    device = model_device(resized)
    for backend in chosen:
        row = rows[backend.name]
        if backend.cpu_only and device.type != "cpu":
            row.error = f"runs on the CPU only; the model is on {device} (bench a CPU copy of it: model.cpu())"
            plan.counter.step(f"skipped {backend.name} (batch {batch})")
            continue
        # an artifact row's name holds its path: the working directory is named from it, kept inside the plan's
        workdir = plan.workdir / re.sub(r"[^\w.+-]", "_", f"{backend.name}-{batch}")
        settings = BuildSettings(plan.threads, workdir, expected, plan.passes)
        runner, row.error, row.build_s = build_backend(backend, resized, settings)
        row.notes = settings.notes
        if runner is not None:
            runners[backend.name] = runner
        plan.counter.step(f"built {backend.name} (batch {batch})")

    for backend in chosen:
        runner = runners.get(backend.name)
        if runner is not None:
            try:
                _warm_up(runner, inputs, plan.warmup, rows[backend.name], expected, pristine)
            except Exception as exc:
                rows[backend.name].error = f"run failed: {one_line_reason(exc)}"
                del runners[backend.name]
        plan.counter.step(f"warmed up {backend.name} (batch {batch})")

    samples, faults = _timed_rounds(runners, inputs, plan.repeats, rows, batch, plan.counter)
    for name, times in samples.items():
        row = rows[name]
        if not row.error and times:
            row.set_rounds([t * 1e3 for t in times])
            _note_faults(row, faults[name])
    _peak_fractions(rows.values(), resized, plan.peak)
    set_speedups(rows.values())
    if captured.record.random:
        # eager's own row "beyond tolerance" of eager read as a broken backend (QA); capture found the randomness
        for row in rows.values():
            if row.max_abs_err:
                row.notes.append("the model is random: its error against eager is in part the model's own randomness")
    return list(rows.values())


def set_speedups(rows: Iterable[BenchRow]) -> None:
    """Each timed row's speedup: eager's median over its median (rows of one batch size; no eager row, none),
    and the 95% interval of eager's time over the row's, round by round (:func:`ratio_interval`)."""
    rows = list(rows)
    eager = next((row for row in rows if row.backend == "eager"), None)
    for row in rows:
        if eager is not None and eager.median_ms and row.median_ms:
            row.speedup = eager.median_ms / row.median_ms
            paired = len(paired_ratios(eager.round_ms, row.round_ms))
            interval = ratio_interval(eager.round_ms, row.round_ms) if row is not eager else None
            row.speedup_interval = interval[1:] if interval and paired >= MIN_INTERVAL_ROUNDS else None


def paired_ratios(times: Sequence[float], reference: Sequence[float]) -> list[float]:
    """``times[i] / reference[i]`` for each round both were timed in."""
    return [t / r for t, r in zip(times, reference) if r > 0]


# Paired rounds below which a row's speedup is shown without an interval: from one round it had zero width
# (1.75-1.75), which reads as a sure speedup, from two it is their range
MIN_INTERVAL_ROUNDS = 3


def ratio_interval(
    times: Sequence[float], reference: Sequence[float], resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float] | None:
    """Median of the per-round ratios ``times[i] / reference[i]`` and its 95% bootstrap interval.

    Rounds are paired: bench runs every candidate once per round in a shuffled order, so a slow moment of the
    machine slows both times of a round, and the ratio cancels it. None when there are no paired rounds; from
    fewer than :data:`MIN_INTERVAL_ROUNDS` the median alone, as a zero-width interval (a bootstrap of two ratios
    is their range, not a 95% interval).
    """
    ratios = paired_ratios(times, reference)
    if not ratios:
        return None
    if len(ratios) < MIN_INTERVAL_ROUNDS:
        median = statistics.median(ratios)
        return median, median, median
    generator = random.Random(seed)
    medians = sorted(statistics.median(generator.choices(ratios, k=len(ratios))) for _ in range(resamples))
    low, high = medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]
    return statistics.median(ratios), low, high


def _peak_fractions(rows: Iterable[BenchRow], resized: Captured, peak: Peak | None) -> None:
    """GFLOP/s of each timed row and its fraction of the measured matmul peak of the row's precision: how far
    each backend is from what this machine can do (a matmul peak: convolutions and attention rarely reach it)."""
    timed = [row for row in rows if row.median_ms]
    if not timed:
        return
    try:
        flops = count_flops(resized.original, resized.example_inputs, resized.example_kwargs)
    except Exception:  # a model the FLOP counter cannot run: no GFLOP/s, the timings stand
        return
    arithmetic = _model_precision(resized)
    for row in timed:
        if row.precision == "fp32":  # an exact backend runs the model's own arithmetic (QA: a bf16 model at "834%")
            row.precision = arithmetic
        row.gflops = flops / (row.median_ms * 1e-3) / 1e9 if flops else None
        known = peak is not None and row.precision != UNKNOWN_PRECISION
        reference = (peak.gflops.get(row.precision) or peak.gflops.get("fp32")) if known else None
        if row.gflops and reference:
            row.peak_fraction = row.gflops / reference


def _model_precision(captured: Captured) -> str:
    """The precision the measured peaks know that the model computes in: that of most of its floating-point
    weights (of its floating inputs, without weights); fp16 and fp64 have no measured peak (unknown)."""
    counts: dict[torch.dtype, int] = {}
    for tensor in [*captured.original.parameters(), *captured.original.buffers()]:
        if tensor.is_floating_point():
            counts[tensor.dtype] = counts.get(tensor.dtype, 0) + tensor.numel()
    if not counts:
        for tensor in captured.example_inputs:
            if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
                counts[tensor.dtype] = counts.get(tensor.dtype, 0) + 1
    dtype = max(counts, key=counts.__getitem__) if counts else torch.float32
    return {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(dtype, UNKNOWN_PRECISION)


def _warm_up(
    runner: Runner, inputs: tuple[Any, ...], warmup: int, row: BenchRow, expected: Any, pristine: Any = None
) -> None:
    """``warmup`` calls; the first, the one compared with ``expected``, on a copy of ``pristine`` (the inputs
    before any backend ran: a model may write its input in place) where given."""
    peak = ResidentPeak()
    # A GraphModule whose generated code raises prints that code and a traceback to stderr itself (torch.fx's
    # _WrappedCall) before the exception reaches us; the row states the reason in one line. The timed calls
    # are left unsilenced (the progress bar draws on stderr): their inputs already ran here.
    with torch.no_grad(), quiet_torch_logs(), contextlib.redirect_stderr(io.StringIO()), peak:
        output = runner(*(cloned(pristine) if pristine is not None else inputs))
        for _ in range(warmup - 1):
            runner(*inputs)
        wait_for_device(inputs)
    row.peak_mem_mib = peak.mib
    comparison = compare_outputs(expected, output)
    row.max_abs_err = comparison.max_abs_err
    row.within_tolerance = comparison.ok
    if comparison.reference_values and comparison.reference_nonfinite == comparison.reference_values:
        # QA: every row, eager against itself too, read "max abs err 0" and "beyond tol" with no word why
        row.max_abs_err, row.within_tolerance = None, None
        row.notes.append("the model's output is all NaN or Inf on the bench inputs: no error can be measured")


SETTLE_CALLS = 1  # untimed calls of a backend right before each of its timed calls (module docstring) ...
SETTLE_SECONDS = 0.02  # ... and for at least this long, for the other runtimes' threads to go quiet
FAULTS_NOTED = 64  # page faults per timed call from which a row says so: a steady state faults a handful at most
# p90 over p10 of a row's rounds from which it says the machine was busy: on a quiet machine rows stay within
# 1.1-1.3x (docs/benchmarks.md tables); a second process on one of two cores gives 1.5-3x
NOISY_SPREAD = 1.5
# faults of the calling thread only (Linux); elsewhere the whole process's, which other threads can add to
_FAULT_SCOPE = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF) if resource is not None else None


def _page_faults() -> int:
    return resource.getrusage(_FAULT_SCOPE).ru_minflt if _FAULT_SCOPE is not None else 0


def _note_faults(row: BenchRow, faults: list[int]) -> None:
    if _FAULT_SCOPE is None or not faults:
        return
    row.faults_per_call = statistics.median(faults)
    if row.faults_per_call >= FAULTS_NOTED:
        row.notes.append(
            f"{row.faults_per_call:.0f} page faults per call: memory mapped afresh on every call (on CPython "
            "3.11/3.12 possibly a frame-stack chunk boundary under the caller, see fxforge.callstack; or an "
            "allocator returning memory to the OS between calls), which costs time"
        )


def _settle(runner: Runner, inputs: tuple[Any, ...]) -> None:
    """Untimed calls of ``runner`` until both ``SETTLE_CALLS`` and ``SETTLE_SECONDS`` are reached."""
    start, calls = time.perf_counter(), 0
    while calls < SETTLE_CALLS or time.perf_counter() - start < SETTLE_SECONDS:
        runner(*inputs)
        wait_for_device(inputs)
        calls += 1


def _timed_rounds(
    runners: dict[str, Runner],
    inputs: tuple[Any, ...],
    repeats: int,
    rows: dict[str, BenchRow],
    batch: int,
    counter: _Progress,
) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """(seconds, page faults) of each timed call per backend, in round order.

    ``repeats`` rounds; each times every backend once (after its settling calls), in a freshly shuffled order
    (see the module docstring)."""
    order = list(runners)
    shuffler = random.Random(0)
    samples: dict[str, list[float]] = {name: [] for name in order}
    faults: dict[str, list[int]] = {name: [] for name in order}
    with torch.no_grad(), quiet_torch_logs():
        for round_index in range(repeats):
            shuffler.shuffle(order)
            for name in order:
                if rows[name].error:
                    continue
                runner = runners[name]
                try:
                    _settle(runner, inputs)
                    faults_before = _page_faults()
                    start = time.perf_counter()
                    runner(*inputs)
                    wait_for_device(inputs)  # a GPU call returns when its kernels are queued, not done
                    samples[name].append(time.perf_counter() - start)
                    faults[name].append(_page_faults() - faults_before)
                except Exception as exc:
                    rows[name].error = f"run failed: {one_line_reason(exc)}"
            counter.step(f"round {round_index + 1}/{repeats} (batch {batch})")
    return samples, faults


def default_backends() -> list[str]:
    """Every registered backend this machine can run fast (``Backend.unsupported_here`` says why not)."""
    load_backend_plugins()
    return [name for name, backend in BACKENDS.items() if backend.unsupported_here() is None]
