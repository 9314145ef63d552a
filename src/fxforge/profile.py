"""Profile: where a model's time goes, node by node and module by module, against the machine's measured peak.

FLOPs are not time: elementwise ops count as zero FLOPs and memory-bound layers are invisible in ``inspect``.
:func:`profile_model` times every node:

* ``fx`` (default): the captured graph through an ``fx.Interpreter``, every node timed with the wall clock;
* ``eager``: the model itself, with forward hooks around every leaf module (for models whose graph you do not
  want, or cannot get, to time).

Each node's time is the median over ``repeats`` runs (after warm-up runs). Timing is by the clock around each
node, not by ``torch.profiler``'s events: the profiler records every ATen op inside a node, which on a small
input cost three times the model's own time (resnet18 at 64x64). One more run under ``torch.profiler``, with a
``record_function`` range per node, gives the memory each node allocated and, when asked, the
Chrome/Perfetto trace. The sum of the node times is compared with the median of unprofiled whole-model runs,
warmed up like the node runs and interleaved with them (one after each), so that both see the same machine: a
shared machine's load changes within seconds, and a whole-model time taken after the node runs compared two
different machines. Nodes adding up to more is the interpreter's (or hooks') overhead; to less, either other
work interrupted the runs (a node's median leaves the interruptions out, a whole run cannot) or time is spent
outside the nodes (eager: outside leaf modules). A note says which, unless the gap is small or within the
whole-model runs' own spread.

Achieved GFLOP/s per node (FLOPs from ``inspect``) is compared with the machine's measured matmul peak for the
node's dtype, and its arithmetic intensity (FLOPs per byte read and written) with the machine's balance (peak
FLOP/s over measured memory bandwidth): above it a node is compute-bound, below it memory-bound.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch.profiler import ProfilerActivity, record_function
from torch.profiler import profile as torch_profile
from torch.utils import _pytree as pytree
from torch.utils.flop_counter import FlopCounterMode

from fxforge import display
from fxforge.artifacts import StagedOutput, check_writable, output_target, refuse_special_file
from fxforge.capture import Captured, at_batch, compiled_form, require_captured, require_real_weights
from fxforge.compare import tensors_in
from fxforge.errors import FxforgeError, one_line_reason, option, pass_inputs_hint, user_location
from fxforge.graphs import INPUT_GUARDS, GraphRunner, aten_packet, is_input_guard
from fxforge.inputs import InputSpec, check_fits_in_memory, specs_of
from fxforge.inspect import NodeInfo, inspect_graph
from fxforge.machine import Peak, cached_peak, current_load
from fxforge.runtime import (
    cloned,
    device_of,
    inputs_rejected,
    keeps_rng_state,
    native_output_silenced,
    preserved_state,
    quiet_torch_logs,
    torch_threads,
    with_batch,
    with_batch_kwargs,
)

BACKENDS = ("fx", "eager")
_NODE = "fxnode::"
_MODULE = "fxmodule::"
# Below this share of the total a node is not worth a verdict on what bounds it (noise dominates).
_HOT_SHARE = 0.01
# Whole-model runs timed at least, whatever --repeats: their spread decides whether a gap is noise.
_MIN_WHOLE_RUNS = 3
# Node sum and whole model closer than this (relative) are not worth a note.
_NOTED_GAP = 0.25
# A node's verdict where it beat the measured limit (NodeTime.verdict), by bound.
ABOVE_LIMIT = {"memory": ">100%: in cache", "compute": ">100%: peak measured low"}


@dataclass
class NodeTime:
    """One node (``fx``) or leaf module call (``eager``): its median time and what that time achieved."""

    name: str
    op: str
    target: str
    module: str
    dtype: str  # of the node's output: picks the peak it is compared with
    time_ms: float
    share: float  # of the sum of node times
    bytes: int  # memory the node allocated (its output, workspaces), as the profiler counts it
    bytes_moved: int  # what it reads and writes: inputs, output, parameters
    flops: int
    gflops: float  # achieved
    intensity: float | None  # FLOPs per byte read and written; None without FLOPs
    bound: str  # "compute", "memory" or "" for nodes too small to judge or doing no work
    # of the compute peak (compute-bound) or the bandwidth (memory-bound); above 1 where the node beat the measured
    # limit (see ``verdict``)
    peak_fraction: float | None

    @property
    def verdict(self) -> str:
        """What the tables print for the bound: ``memory (58%)``; above the measured limit, no impossible percentage
        but why -- a memory-bound node whose data stayed in cache beats the bandwidth, which is measured on a buffer
        larger than any cache, and a compute peak measured while other work held the cores can be beaten too."""
        if not self.bound and self.dtype in _UNMEASURED and self.flops and self.share >= _HOT_SHARE:
            return f"not judged: no {self.dtype} peak"  # an empty cell read as if nothing were said (QA)
        if not self.bound or self.peak_fraction is None:
            return self.bound
        if self.peak_fraction <= 1:
            return f"{self.bound} ({self.peak_fraction:.0%})"
        return f"{self.bound} ({ABOVE_LIMIT[self.bound]})"


@dataclass
class ModuleTime:
    path: str
    time_ms: float
    share: float
    nodes: int
    flops: int


@dataclass
class ProfileReport:
    """Per-node and per-module times; ``to_dict()`` is the ``--json`` form (and what ``graph --profile`` reads)."""

    backend: str
    inputs: list[str]
    repeats: int
    total_ms: float  # the sum of the node medians
    whole_ms: float  # median of unprofiled runs of the whole model
    overhead: float  # total_ms / whole_ms - 1: what profiling node by node adds
    peak: Peak
    nodes: list[NodeTime]
    modules: list[ModuleTime]
    trace: str | None = None
    notes: list[str] = field(default_factory=list)

    def top(self, count: int = 15) -> list[NodeTime]:
        return sorted(self.nodes, key=lambda n: n.time_ms, reverse=True)[:count]

    def __repr__(self) -> str:  # the dataclass's would print every node (27,502 characters for resnet18)
        return display.profile_repr(self)

    def _repr_html_(self) -> str:  # Jupyter shows this for the last value of a cell
        return display.profile_html(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "inputs": self.inputs,
            "repeats": self.repeats,
            "total_ms": round(self.total_ms, 4),
            "whole_ms": round(self.whole_ms, 4),
            "overhead": round(self.overhead, 4),
            "peak": asdict(self.peak),
            "nodes": [{**asdict(n), "verdict": n.verdict} for n in self.nodes],
            "modules": [asdict(m) for m in self.modules],
            "trace": self.trace,
            "notes": self.notes,
        }


@keeps_rng_state
def profile_model(
    captured: Captured | nn.Module,
    *,
    backend: str = "fx",
    example_inputs: Sequence[Any] | torch.Tensor | None = None,
    batch: int | None = None,
    repeats: int = 10,
    warmup: int = 2,
    threads: int | None = None,
    trace: str | Path | None = None,
    peak: Peak | None = None,
    seed: int = 0,
    force: bool = False,
) -> ProfileReport:
    """Profile ``captured`` (see the module docstring) and return the per-node and per-module report.

    The ``eager`` backend runs the model, not a graph: ``captured`` may also be a plain ``nn.Module`` with its
    ``example_inputs``, for a model that cannot be captured. ``batch``: run at this batch size instead of the
    example's. ``peak``: the machine's peak to compare with
    (default: measured once per process, about 2 s). ``trace``: write a Chrome/Perfetto trace of one profiled
    run there (atomically; ``force`` to replace a file).
    """
    if backend not in BACKENDS:
        raise FxforgeError(
            f"cannot profile the {backend!r} backend node by node",
            hint=f"one of {', '.join(BACKENDS)}: compiled and exported backends have no per-node view (use bench)",
        )
    if repeats < 1 or warmup < 0:
        raise FxforgeError("profile needs at least one repeat (and a non-negative warm-up)")
    if threads is not None and threads < 1:
        raise FxforgeError(f"{option('--threads')} must be at least 1")
    if batch is not None and batch < 1:
        raise FxforgeError(f"{option('--batch')} must be at least 1")
    if isinstance(captured, nn.Module) and backend == "eager":
        model, args, kwargs = captured, _as_inputs(example_inputs), {}
    else:
        if isinstance(captured, nn.Module):
            raise FxforgeError(
                f"profile_model takes a captured model, not a {type(captured).__name__}, for the fx backend (it "
                "times the graph node by node)",
                hint="capture it first (fxforge.capture(model, inputs)), or profile it leaf module by leaf module: "
                "backend='eager', example_inputs=(x,)",
            )
        require_captured(captured, "profile_model")
        require_real_weights(captured, "profile")
        if example_inputs is not None:  # they were dropped without a word: a wrong shape "profiled" fine (QA)
            raise FxforgeError(
                "profile_model runs a Captured on its own example inputs; example_inputs are for a plain module "
                "(backend='eager')",
                hint="capture with the inputs to profile (fxforge.capture(model, (x,))), or pass batch=N",
            )
        model, args, kwargs = captured.original, captured.example_inputs, captured.example_kwargs
    device = device_of((args, kwargs), model)
    if device.type != "cpu":
        # its clocks stop when a GPU's kernels are queued, not done, and its peak and memory are the CPU's
        raise FxforgeError(
            f"profile times models on the CPU, and this model is on {device}",
            hint="profile a CPU copy (model.cpu()), or use torch.profiler with ProfilerActivity.CUDA on the GPU; "
            "fxforge.bench times GPU models",
        )
    if not args and not kwargs:
        raise FxforgeError("profile needs example inputs", hint=pass_inputs_hint())
    if trace is not None:
        check_trace_path(trace, force=force)
    if batch is not None and backend == "fx":
        captured = at_batch(captured, batch, seed)  # type: ignore[arg-type]
    elif batch is not None:
        # sized first, as the fx path's inputs are: the allocator's refusal was an internal error (exit 4)
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.dim()]
        check_fits_in_memory([InputSpec.of(t).with_batch(batch) for t in tensors], batch=batch)
        args = with_batch(args, batch)
        kwargs = with_batch_kwargs(kwargs, batch)
    with torch_threads(threads):
        peak = peak or cached_peak(threads)
        if backend == "fx":
            return _profile_graph(captured, repeats, warmup, trace, peak, force)  # type: ignore[arg-type]
        return _profile_eager(model, args, kwargs, repeats, warmup, trace, peak, force)


def _as_inputs(example_inputs: Sequence[Any] | torch.Tensor | None) -> tuple[Any, ...]:
    if example_inputs is None:
        raise FxforgeError("profiling a plain module needs its inputs", hint="pass example_inputs=(x,)")
    return (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)


# --------------------------------------------------------------------------------------------------
# running under the profiler


class _TimedInterpreter(GraphRunner):
    """Runs the graph, adding each node's wall-clock time to ``times`` -- or, with ``ranges``, opening a
    ``record_function`` range named after each node for the profiler instead."""

    def __init__(
        self,
        gm: fx.GraphModule,
        times: dict[str, list[float]],
        ranges: bool = False,
        moves_nothing: dict[str, bool] | None = None,
    ) -> None:
        super().__init__(gm)
        self.times, self.ranges = times, ranges
        # per node, whether it gave only views of its inputs (_moves_nothing): judged once, in the first run given it
        self.moves_nothing = moves_nothing if moves_nothing is not None else {}

    def run_node(self, n: fx.Node) -> Any:
        # torch.export's input guard checks shapes and a get_attr fetches a tensor: no work of the model's, and
        # timed they filled the slowest rows with weights' names (QA); their time is the interpreter's, outside
        if n.op in ("placeholder", "output", "get_attr") or is_input_guard(n):
            return super().run_node(n)
        if self.ranges:
            with record_function(_NODE + n.name):
                return super().run_node(n)
        start = time.perf_counter()
        result = super().run_node(n)
        self.times.setdefault(n.name, []).append((time.perf_counter() - start) * 1e3)
        if n.name not in self.moves_nothing:  # outside its clock
            self.moves_nothing[n.name] = _moves_nothing(n, self.fetch_args_kwargs_from_env(n), result)
        return result


def _moves_nothing(node: fx.Node, inputs: Any, output: Any) -> bool:
    """Whether ``node`` gave only views of its inputs, or read only their shapes: a ``getitem``, a ``view``, a
    dataclass built of its inputs, a ``size()``. It read and wrote no data, so it has no bandwidth to be measured
    against (QA: such nodes read ``memory (0%)``, their inputs counted as moved). An op that writes into its input
    returns it too, and does move it: a module call (``ReLU(inplace=True)``), ``relu_``, ``inplace=True``, ``out=``,
    ``x[i] = y`` are never taken; nor a node returning only Python values, which may read all of its inputs
    (``torch.allclose``: regression QA, 40% of a run without a verdict)."""
    if node.op == "call_module" or _writes_in_place(node):
        return False
    written = tensors_in(output)
    if not written:
        return _reads_metadata_only(node)
    try:
        read = {t.untyped_storage().data_ptr() for t in tensors_in(inputs)}
        return all(t.untyped_storage().data_ptr() in read for t in written)
    except (RuntimeError, NotImplementedError):  # a tensor without storage (quantized, sparse): not judged here
        return False


def _writes_in_place(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)  # an ATen op says what it writes
    if schema is not None:
        return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    in_place_name = name.endswith("_") and not name.endswith("__")
    writes = in_place_name or name in ("setitem", "__setitem__") or node.kwargs.get("out") is not None
    return writes or bool(node.kwargs.get("inplace")) or any(a is True for a in node.args)


_METADATA_METHODS = frozenset({"size", "dim", "numel", "stride"})
_METADATA_ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "device"})
_METADATA_ATEN = frozenset({"sym_size", "sym_numel", "sym_stride", "sym_storage_offset"})


def _reads_metadata_only(node: fx.Node) -> bool:
    """A node whose value is a tensor's shape, rank or dtype (``x.size(0)``, ``x.shape``, ATen's ``sym_size``)."""
    if node.op == "call_method":
        return node.target in _METADATA_METHODS
    if node.target is getattr:
        return len(node.args) > 1 and node.args[1] in _METADATA_ATTRIBUTES
    return aten_packet(node) in _METADATA_ATEN


def _profiled_run(run: Any, trace: str | Path | None, force: bool) -> list[Any]:
    """The profiler's events for one call of ``run``: the memory each range allocated, and the trace."""
    # native_output_silenced: the profiler's C++ side prints its start and stop (and a GPU probe) on stderr
    with native_output_silenced(), torch_profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    if trace is not None:
        _write_trace(prof, Path(trace), force)
    return list(prof.events())


def check_trace_path(trace: str | Path, *, force: bool = False) -> Path:
    """Refuse a trace path that cannot be written before the runs (the CLI: before the model loads), not after
    them, and with a hint about --trace (StagedOutput's, checked again when writing, is about export's -o). Missing
    folders are no reason: they are made when the trace is written, as every output's are."""
    target = output_target(trace)
    refuse_special_file(target)
    if target.is_dir():
        raise FxforgeError(
            f"{option('--trace', trace)} is a directory",
            hint=f"name a file, e.g. {option('--trace', str(target / 'trace.json'))}",
        )
    if target.exists() and not force:
        raise FxforgeError(f"{option('--trace', trace)} exists", hint=f"pass {option('--force', True)} to replace it")
    # a read-only mount, no permission, /proc ("its file system takes no new files", not ENOENT's "No such file or
    # directory" about a folder that exists), as every other output is checked
    check_writable(target)
    return target


def _write_trace(prof: Any, path: Path, force: bool) -> None:
    # the profiler's C++ writer reports a failed write (a full disk) only in a log line, wrote no file, and left
    # its temporary TARGET.tmp beside the target (QA: an internal error, exit 4, and a 20 KiB t.json.tmp)
    stray = path.with_name(path.name + ".tmp")
    stray_before = stray.exists()
    with StagedOutput(path, force=force) as staged:
        with native_output_silenced():
            prof.export_chrome_trace(str(staged.path))
        if not staged.path.is_file() or staged.path.stat().st_size == 0:
            if not stray_before:
                stray.unlink(missing_ok=True)
            raise FxforgeError(
                f"the profiler could not write the trace to {path}", hint="is the disk full? nothing was written"
            )
        staged.commit()


def _timed_ms(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1e3


@dataclass
class _RunTotals:
    """Whole runs as the clock saw them: each unprofiled whole-model run, and each node-timed run's node times
    added up. The second tells apart a whole model slower than its nodes because of time outside them (the
    node-timed runs add up to little too) from one slowed by other work on the machine (they add up to as
    much: a node's median leaves out the interruptions, a sum over one run cannot)."""

    whole: list[float] = field(default_factory=list)
    node_timed: list[float] = field(default_factory=list)

    def time_nodes(self, times: dict[str, list[float]], run: Callable[[dict[str, list[float]]], Any]) -> None:
        """``run(run_times)`` once; each node's time in that run is added to ``times`` and their total to
        ``node_timed``. A leaf module called twice in a run (one ReLU used twice) counts both calls, as its FLOPs
        do, so that its share is of the run."""
        run_times: dict[str, list[float]] = {}
        run(run_times)
        for name, calls in run_times.items():
            times.setdefault(name, []).append(sum(calls))
        self.node_timed.append(sum(sum(calls) for calls in run_times.values()))


def _allocated(events: Sequence[Any], prefix: str) -> dict[str, int]:
    """range name -> the most bytes one call of it allocated (its output, workspaces)."""
    found: dict[str, int] = {}
    for event in events:
        if event.name.startswith(prefix):
            name = event.name[len(prefix) :]
            found[name] = max(found.get(name, 0), max(0, int(event.cpu_memory_usage)))
    return found


# --------------------------------------------------------------------------------------------------
# fx: node by node


def _profile_graph(
    captured: Captured, repeats: int, warmup: int, trace: str | Path | None, peak: Peak, force: bool
) -> ProfileReport:
    gm = captured.graph_module
    facts = {info.name: info for info in inspect_graph(captured, depth=0, include_code=False).nodes}
    values = captured.flat_inputs()

    times: dict[str, list[float]] = {}
    totals = _RunTotals()

    def whole_call() -> Callable[[], Any]:
        # the inputs are copied before the clock starts, as the interpreter's are
        args, kwargs = cloned(list(captured.example_inputs)), cloned(captured.example_kwargs)
        return lambda: gm(*args, **kwargs)

    moves_nothing: dict[str, bool] = {}  # shared by the runs, so that each node is judged once

    def timed_run(run_times: dict[str, list[float]]) -> None:
        _TimedInterpreter(gm, run_times, moves_nothing=moves_nothing).run(*cloned(values))

    with torch.no_grad(), quiet_torch_logs(), preserved_state(gm, captured.original):
        for _ in range(warmup):
            timed_run({})
            whole_call()()
        for index in range(max(repeats, _MIN_WHOLE_RUNS)):
            if index < repeats:
                totals.time_nodes(times, timed_run)
            totals.whole.append(_timed_ms(whole_call()))
        ranged = _TimedInterpreter(gm, {}, ranges=True)
        allocated = _allocated(_profiled_run(lambda: ranged.run(*cloned(values)), trace, force), _NODE)
    producers = {n.name: [i.name for i in n.all_input_nodes] for n in gm.graph.nodes}
    nodes = []
    for node in gm.graph.nodes:
        if node.name not in times:
            continue
        info = facts[node.name]
        sizes = [allocated.get(node.name, 0)]
        read = sum(_bytes_out(facts[name]) for name in producers[node.name] if name in facts)
        moved = read + info.activation_bytes + info.params * _element_size(info.dtype)
        if moves_nothing.get(node.name):
            moved = 0
        # a module call is better named by its class (Conv2d) than by its path, which is the node's name already
        target = type(gm.get_submodule(str(node.target))).__name__ if node.op == "call_module" else info.target
        nodes.append(
            _node_time(node.name, node.op, target, info.module, times[node.name], sizes, info.flops, moved, info.dtype)
        )
    return _report("fx", captured.example_inputs, repeats, nodes, totals, peak, trace, _modules(nodes))


def _bytes_out(info: NodeInfo) -> int:
    """Bytes of the value a node gives the nodes that read it: its activation, or for a get_attr (the ATen dialect
    fetches each weight so) the tensor it fetches, which inspect counts as a parameter, not an activation."""
    if info.op == "get_attr" and info.shape and all(isinstance(d, int) for d in info.shape):
        return math.prod(info.shape) * _element_size(info.dtype)
    return info.activation_bytes


def _element_size(dtype: str | None) -> int:
    try:
        return torch.empty((), dtype=getattr(torch, dtype or "float32")).element_size()
    except (AttributeError, TypeError):
        return 4


def _node_time(
    name: str,
    op: str,
    target: str,
    module: str,
    times: list[float],
    sizes: list[int],
    flops: int,
    moved: int,
    dtype: str | None,
) -> NodeTime:
    milliseconds = statistics.median(times)
    gflops = flops / (milliseconds * 1e6) if milliseconds > 0 else 0.0
    intensity = flops / moved if flops and moved else None
    return NodeTime(
        name, op, target, module, dtype or "", milliseconds, 0.0, max(sizes), moved, flops, gflops, intensity, "", None
    )


def _judge(node: NodeTime, peak: Peak) -> None:
    """Compute- or memory-bound, and the fraction of that limit the node reached (set on hot nodes only)."""
    if node.share < _HOT_SHARE or node.time_ms <= 0:
        return
    if not node.flops and not node.bytes_moved:  # no tensor work (building a dataclass): no limit to be near (QA)
        return
    if node.dtype in _UNMEASURED and node.flops:  # against the fp32 peak, a float16 conv read compute-bound at 1% (QA)
        return  # (a node without FLOPs is judged against the bandwidth, which no dtype changes)
    compute = peak.gflops.get(_peak_key(node.dtype), peak.gflops.get("fp32", 0.0))
    balance = compute / peak.bandwidth_gbs if peak.bandwidth_gbs else float("inf")  # FLOP per byte
    if node.intensity is not None and node.intensity >= balance and compute > 0:
        node.bound, node.peak_fraction = "compute", node.gflops / compute
    else:
        achieved = node.bytes_moved / (node.time_ms * 1e6)  # GB/s
        node.bound = "memory"
        node.peak_fraction = achieved / peak.bandwidth_gbs if peak.bandwidth_gbs else None


# floating dtypes whose matmul peak fxforge does not measure: their nodes are timed, not judged
_UNMEASURED = frozenset({"float16", "float64", "complex64", "complex128"})


def _peak_key(dtype: str) -> str:
    return {"float32": "fp32", "bfloat16": "bf16", "int8": "int8", "quint8": "int8", "qint8": "int8"}.get(dtype, "fp32")


def _modules(nodes: list[NodeTime]) -> list[ModuleTime]:
    """Each module path's time: the sum over the nodes it owns, directly or through its children."""
    rolled: dict[str, ModuleTime] = {}
    for node in nodes:
        parts = node.module.split(".") if node.module else []
        for depth in range(1, len(parts) + 1):
            path = ".".join(parts[:depth])
            entry = rolled.setdefault(path, ModuleTime(path, 0.0, 0.0, 0, 0))
            entry.time_ms += node.time_ms
            entry.nodes += 1
            entry.flops += node.flops
    return list(rolled.values())


def _report(
    backend: str,
    example_inputs: Sequence[Any],
    repeats: int,
    nodes: list[NodeTime],
    totals: _RunTotals,
    peak: Peak,
    trace: str | Path | None,
    modules: list[ModuleTime],
) -> ProfileReport:
    total = sum(n.time_ms for n in nodes)
    whole_ms = statistics.median(totals.whole)
    for node in nodes:
        node.share = node.time_ms / total if total else 0.0
        _judge(node, peak)
    for module in modules:
        module.share = module.time_ms / total if total else 0.0
    # as the other commands spell them: 2x16:int64 (float32 goes unsaid)
    inputs = [str(spec) for spec in specs_of([t for t in example_inputs if isinstance(t, torch.Tensor)])]
    overhead = total / whole_ms - 1 if whole_ms > 0 else 0.0
    report = ProfileReport(backend, inputs, repeats, total, whole_ms, overhead, peak, nodes, modules)
    report.trace = str(trace) if trace is not None else None
    # a graph with no operation (an empty nn.Sequential) has nothing to time: the gap to the whole run is no load's
    # nor overhead's (QA: "-100%: other work held the cores")
    note = (
        f"nothing to time: the graph has no operations; the {whole_ms:.3f} ms of a whole run is the graph's own call"
        if not nodes
        else _overhead_note(backend, total, totals)
    )
    if note:
        report.notes.append(note)
    return report


def _overhead_note(backend: str, total_ms: float, totals: _RunTotals) -> str | None:
    """What the gap between the sum of the node medians and the whole model's median means, or None when it is
    small or within the spread (interquartile range) of the whole-model runs themselves."""
    whole_ms = statistics.median(totals.whole)
    if whole_ms <= 0:
        return None
    gap = total_ms - whole_ms
    if abs(gap) <= max(_NOTED_GAP * whole_ms, _interquartile_range(totals.whole)):
        return None
    parts = "nodes" if backend == "fx" else "leaf modules"
    compared = (
        f"the {parts}' times add up to {total_ms:.2f} ms against {whole_ms:.2f} ms for the whole model unprofiled "
        f"({gap / whole_ms:+.0%})"
    )
    if gap > 0:
        if backend == "fx":
            cost = "the interpreter's work around each node (fetching its arguments, reading the clock) is counted"
        else:
            cost = "the forward hooks around each leaf module are counted"
        return f"{compared}: {cost} in its time, and for many small {parts} that outweighs what they compute"
    node_timed_ms = statistics.median(totals.node_timed) if totals.node_timed else 0.0
    if node_timed_ms >= (1 - _NOTED_GAP) * whole_ms:
        return (
            f"{compared}: other work on this machine interrupted the runs -- the node-timed runs added up to "
            f"{node_timed_ms:.2f} ms each (median), but a node is short and its median leaves the interruptions "
            f"out. The {parts}' times are the uninterrupted ones; on a quiet machine the two agree"
        )
    load = current_load()
    if load is not None and load.busy(torch.get_num_threads()):
        # QA: "33 ms of each resnet18 call outside the nodes", on a machine other sessions kept busy
        return (
            f"{compared}: other work held the cores (load average {load.average:.1f} on {load.cpus} CPUs), and a "
            "whole run waits for them longer than a short node does, so the gap is the load's more than the "
            "model's; rerun with nothing else running to see what the model spends outside its "
            f"{parts}"
        )
    if backend == "eager":
        return (
            f"{compared}: {-gap:.2f} ms of each run are spent outside leaf modules, in the forward methods' own "
            "operations (torch.flatten, additions, functional calls), which no row shows; --backend fx times them"
        )
    return (
        f"{compared}: that time is spent outside the nodes, in the graph's own call (argument flattening, input "
        "checks, output packing)"
    )


def _interquartile_range(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    low, _, high = statistics.quantiles(values, n=4, method="inclusive")
    return high - low


# --------------------------------------------------------------------------------------------------
# eager: leaf module by leaf module


def _profile_eager(
    model: nn.Module,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    repeats: int,
    warmup: int,
    trace: str | Path | None,
    peak: Peak,
    force: bool,
) -> ProfileReport:
    """The model itself with clocks around its leaf modules: no graph, so a model capture fails on is profiled too
    (QA: the CLI captured for --backend eager, whose help says "no graph needed", and failed where capture did)."""
    kind = compiled_form(model)
    if kind is not None:
        # its submodules run inside compiled code, which calls no Python hooks: every run would time nothing (QA: a
        # TorchScript file gave an empty table, "0.00 ms summed over 0 leaf modules (-100%)"); and it has no Python
        # code to capture either, so --backend fx is no way out
        raise FxforgeError(
            f"cannot profile {kind} leaf module by leaf module: it runs its submodules as compiled code, which calls "
            "no forward hooks, and has no Python code to capture for --backend fx",
            hint="profile the PyTorch model it was made from; fxforge bench MODEL --artifact FILE times this file "
            "as a whole next to it",
        )
    leaves = {
        name: module
        for name, module in model.named_modules()
        # torch.export's input guard (an exported program's first call) checks shapes: no module of the user's model
        if name and not list(module.children()) and name.rpartition(".")[2] != INPUT_GUARDS
    }
    flops_by_module = _module_flops(model, args, kwargs)

    def run() -> None:
        model(*cloned(list(args)), **cloned(kwargs))

    def whole_call() -> Callable[[], Any]:
        # the inputs are copied before the clock starts
        copied_args, copied_kwargs = cloned(list(args)), cloned(kwargs)
        return lambda: model(*copied_args, **copied_kwargs)

    def timed_run(run_times: dict[str, list[float]]) -> None:
        with _module_clocks(leaves, run_times):
            run()

    times: dict[str, list[float]] = {}
    totals = _RunTotals()
    with torch.no_grad(), quiet_torch_logs(), preserved_state(model), _later_runs_failing():
        # first, which leaf modules a run calls: a module can hold weights that its parent's forward reads itself
        # (an exported program, such as an optimize output's model.pt2, keeps its weights in modules it never calls)
        traffic = _module_traffic(leaves, run)
        leaves = {name: module for name, module in leaves.items() if name in traffic}
        if not leaves:
            raise FxforgeError(
                f"cannot profile this {type(model).__name__} leaf module by leaf module: its forward calls no leaf "
                "module (a submodule with none of its own) to time, but computes everything itself, as a torch.export "
                "program does",
                hint="--backend fx times its operations node by node",
            )
        for _ in range(warmup):
            timed_run({})
            run()
        for index in range(max(repeats, _MIN_WHOLE_RUNS)):
            if index < repeats:
                totals.time_nodes(times, timed_run)
            totals.whole.append(_timed_ms(whole_call()))
        with _module_ranges(leaves):
            allocated = _allocated(_profiled_run(run, trace, force), _MODULE)
    nodes = []
    for name, module in leaves.items():
        if name not in times:
            continue
        sizes = [allocated.get(name, 0)]
        flops = flops_by_module.get(name, 0)
        moved, dtype = traffic.get(name, (max(sizes), None))
        nodes.append(
            _node_time(name, "call_module", type(module).__name__, name, times[name], sizes, flops, moved, dtype)
        )
    return _report("eager", args, repeats, nodes, totals, peak, trace, _modules(nodes))


def _module_traffic(leaves: dict[str, nn.Module], run: Callable[[], None]) -> dict[str, tuple[int, str | None]]:
    """Per leaf module, over one call of the model: the bytes it reads and writes (its tensor inputs, outputs and
    parameters, as the fx backend counts a node's) and the dtype of its first floating-point output,
    which picks the peak it is judged against. (It was the profiler's allocations plus the parameters, in float32:
    an in-place ReLU moved 0 bytes, a bf16 Linear was judged against the fp32 peak.)"""
    found: dict[str, tuple[int, str | None]] = {}

    def tensor_bytes(value: Any) -> int:
        return sum(t.numel() * t.element_size() for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor))

    def seen(name: str, module: nn.Module, inputs: Any, output: Any) -> None:
        weights = sum(p.numel() * p.element_size() for p in module.parameters())
        moved = tensor_bytes(inputs) + tensor_bytes(output) + weights
        floating = [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        before, _ = found.get(name, (0, None))
        found[name] = (before + moved, str(floating[0].dtype).removeprefix("torch.") if floating else None)

    handles = [
        module.register_forward_hook(lambda m, i, o, name=name: seen(name, m, i, o)) for name, module in leaves.items()
    ]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return found


@contextlib.contextmanager
def _around_calls(
    leaves: dict[str, nn.Module], start: Callable[[str], Any], stop: Callable[[str, Any], None]
) -> Iterator[None]:
    """``start(name)`` before and ``stop(name, token)`` after every call of every leaf module, by forward hooks;
    ``token`` is what ``start`` returned for that call (a module that calls itself pairs its calls up last in,
    first out)."""
    handles = []
    for name, module in leaves.items():
        pending: list[Any] = []

        def enter(module: nn.Module, inputs: Any, name: str = name, pending: list[Any] = pending) -> None:
            pending.append(start(name))

        def leave(module: nn.Module, inputs: Any, output: Any, name: str = name, pending: list[Any] = pending) -> None:
            if pending:
                stop(name, pending.pop())

        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _module_ranges(leaves: dict[str, nn.Module]) -> contextlib.AbstractContextManager[None]:
    """A ``record_function`` range around every call of every leaf module."""

    def start(name: str) -> Any:
        scope = record_function(_MODULE + name)
        scope.__enter__()
        return scope

    return _around_calls(leaves, start, lambda name, scope: scope.__exit__(None, None, None))


def _module_clocks(
    leaves: dict[str, nn.Module], times: dict[str, list[float]]
) -> contextlib.AbstractContextManager[None]:
    """The wall-clock time (ms) of every call of every leaf module, appended to ``times[name]``."""

    def stop(name: str, started: float) -> None:
        times.setdefault(name, []).append((time.perf_counter() - started) * 1e3)

    return _around_calls(leaves, lambda name: time.perf_counter(), stop)


@contextlib.contextmanager
def _later_runs_failing() -> Iterator[None]:
    """A model that ran once and fails on a later run (state its forward keeps between calls): said in one line,
    not as an internal error (QA). A run's own state is restored only after all of them, as the timed runs are."""
    try:
        yield
    except FxforgeError:
        raise
    except Exception as exc:
        where = user_location(exc)
        at = f" at {where}" if where else ""
        raise FxforgeError(
            f"the model ran once, then raised on a later run: {one_line_reason(exc)}{at}",
            hint="profile runs the model many times on the same inputs; it must take a repeated call",
        ) from None


def _module_flops(model: nn.Module, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, int]:
    """FLOPs per module path, from torch's FLOP counter (which tracks the module hierarchy)."""
    counter = FlopCounterMode(display=False)
    try:
        with torch.no_grad(), quiet_torch_logs(), preserved_state(model), counter:
            model(*cloned(list(args)), **cloned(kwargs))
    except Exception as exc:
        # the model's first run here: no capture ran it before, so its refusal of the inputs (a wrong shape, a raise
        # in forward) reached the CLI as an internal error (QA)
        raise inputs_rejected(model, args, kwargs, exc) from None
    counts = counter.get_flop_counts()
    root = type(model).__name__
    flops = {}
    for path, by_op in counts.items():
        name = path.removeprefix(root).removeprefix(".") if path != root else ""
        flops[name] = int(sum(by_op.values()))
    return flops
