"""Capture: turn an ``nn.Module`` into a ``torch.fx.GraphModule``, trying harder than plain tracing.

Strategy, in order:

1. ``torch.fx`` symbolic tracing (torch dialect), honouring user-given leaf modules, functions to
   wrap and concrete args;
2. when tracing fails, read the traceback, find the innermost submodule (or plain helper function)
   of the user's model whose code raised, make it a leaf (or wrap it as one call) and retry;
3. when tracing cannot succeed, or succeeds but computes something else, ``torch.export``
   (non-strict; ATen dialect);
4. when that fails too, raise :class:`~fxforge.errors.CaptureError` naming the user's source line
   that stopped both, and what to do about it.

After capture the original and the captured module run on the example inputs (and optionally on a
second batch size) and any difference is recorded, because tracing can silently bake shapes into
constants. The returned graph shares parameters with the original model; nothing here changes them.
"""

from __future__ import annotations

import contextlib
import functools
import io
import linecache
import logging
import os
import sysconfig
import traceback
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch import fx, nn

from fxforge.errors import CaptureError, InputSpecError
from fxforge.graphs import ATEN, TORCH
from fxforge.models import LoadedModel
from fxforge.verify import compare_outputs

SYMBOLIC_TRACE = "symbolic_trace"
EXPORT = "torch.export"
LOADED = "loaded"  # the model was already a graph (a .pt2 program or a saved GraphModule)

_TORCH_DIR = str(Path(torch.__file__).parent)
_FXFORGE_DIR = str(Path(__file__).parent)
_STDLIB_DIR = sysconfig.get_paths()["stdlib"]


@dataclass
class Attempt:
    """One failed try: what was tried, why it failed, and at which line of the user's code."""

    strategy: str
    error: str
    location: str | None = None
    action: str | None = None  # what fxforge did about it ("leaf layer1.0", "wrap helpers.norm")


@dataclass
class OutputCheck:
    """Original vs captured outputs on one batch size."""

    batch: int | None
    ok: bool
    max_abs_err: float
    message: str = ""


@dataclass
class CaptureRecord:
    """How a graph was captured; reported by ``inspect`` and kept alongside every output."""

    method: str
    dialect: str
    leaves: list[str] = field(default_factory=list)
    wrapped: list[str] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    checks: list[OutputCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)


@dataclass
class Captured:
    """A captured graph with the model it came from, the inputs it was captured with and the record."""

    graph_module: fx.GraphModule
    original: nn.Module
    example_inputs: tuple[Any, ...]
    record: CaptureRecord
    example_kwargs: dict[str, Any] = field(default_factory=dict)
    exported_program: Any | None = None

    @property
    def dialect(self) -> str:
        return self.record.dialect

    def flat_inputs(self, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None) -> list[Any]:
        """The values for the graph's placeholders, in order, for running it with an Interpreter."""
        args = self.example_inputs if args is None else tuple(args)
        kwargs = self.example_kwargs if kwargs is None else dict(kwargs)
        return placeholder_values(self.graph_module, args, kwargs)


def placeholder_values(gm: fx.GraphModule, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
    """Map a call's ``args``/``kwargs`` onto ``gm``'s placeholders (flattening pytrees for ATen graphs)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if getattr(gm, "_in_spec", None) is not None:  # torch.export's unlifted module takes flat inputs
        flat = torch.utils._pytree.tree_flatten((tuple(args), dict(kwargs)))[0]
        return list(flat)
    values = []
    for i, node in enumerate(placeholders):
        name = str(node.target).lstrip("*")
        if i < len(args):
            values.append(args[i])
        elif name in kwargs:
            values.append(kwargs[name])
        elif node.args:
            values.append(node.args[0])  # the parameter's default value
        else:
            raise InputSpecError(f"the model needs an input for {name!r}; pass one more --input")
    return values


# --------------------------------------------------------------------------------------------------
# symbolic tracing with leaves


class _LeafTracer(fx.Tracer):
    def __init__(self, leaf_names: set[str], leaf_types: tuple[type, ...]) -> None:
        super().__init__()
        self.leaf_names = leaf_names
        self.leaf_types = leaf_types

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if module_qualified_name in self.leaf_names or (self.leaf_types and isinstance(m, self.leaf_types)):
            return True
        return super().is_leaf_module(m, module_qualified_name)


@dataclass
class _Wrap:
    """A plain function called by name from ``caller_globals``, traced as one opaque call."""

    caller_globals: dict[str, Any]
    name: str
    function: Callable[..., Any]

    @property
    def label(self) -> str:
        return f"{getattr(self.function, '__module__', '?')}.{getattr(self.function, '__qualname__', self.name)}"


def _as_call_node(function: Callable[..., Any]) -> Callable[..., Any]:
    # Like torch.fx.wrap, but applied from outside the user's module and to private names too.
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        proxies: list[fx.Proxy] = []
        fx.node.map_aggregate((args, kwargs), lambda v: proxies.append(v) if isinstance(v, fx.Proxy) else None)
        if proxies:
            return proxies[0].tracer.create_proxy("call_function", function, args, kwargs)
        return function(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def _patched(wraps: Iterable[_Wrap]):
    saved = []
    try:
        for wrap in wraps:
            saved.append((wrap, wrap.caller_globals[wrap.name]))
            wrap.caller_globals[wrap.name] = _as_call_node(wrap.function)
        yield
    finally:
        for wrap, original in reversed(saved):
            wrap.caller_globals[wrap.name] = original


def _symbolic_trace(
    model: nn.Module,
    leaf_names: set[str],
    leaf_types: tuple[type, ...],
    wraps: list[_Wrap],
    concrete_args: dict[str, Any] | None,
    proxy_buffers: bool = False,
) -> fx.GraphModule:
    tracer = _LeafTracer(leaf_names, leaf_types)
    tracer.proxy_buffer_attributes = proxy_buffers
    snapshot = buffers_snapshot(model)
    try:
        with _patched(wraps):
            graph = tracer.trace(model, concrete_args=concrete_args)
    finally:
        # Tracing runs ops on real (non-proxy) tensors eagerly: a buffer written in place in forward
        # (a call counter) is changed in the model and the write is missing from the graph. Undo it.
        changed = _changed_buffers(model, snapshot)
        restore_buffers(model, snapshot)
    if changed:
        if not proxy_buffers:  # trace again with buffers as proxies, so that the write is recorded
            return _symbolic_trace(model, leaf_names, leaf_types, wraps, concrete_args, proxy_buffers=True)
        raise RuntimeError(f"tracing wrote into buffer {changed[0]} instead of recording the write")
    name = model.__class__.__name__
    # Forget our tracer class: GraphModule pickles it and would need fxforge (and its arguments) to reload.
    graph._tracer_cls = None
    graph._tracer_extras = None
    return fx.GraphModule(tracer.root, graph, name)


def _is_user_file(filename: str) -> bool:
    return not (
        filename.startswith(_TORCH_DIR)
        or filename.startswith(_FXFORGE_DIR)
        or filename.startswith(_STDLIB_DIR)
        or filename.startswith("<")
    )


def _frames(exc: BaseException) -> list[FrameType]:
    return [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]


def _frame_lines(exc: BaseException) -> list[tuple[FrameType, int]]:
    return list(traceback.walk_tb(exc.__traceback__))


def user_location(exc: BaseException) -> str | None:
    """``file:line: source`` of the innermost frame of the user's (model's) code in ``exc``'s traceback."""
    location = None
    seen: set[int] = set()
    current: BaseException | None = exc
    # torch.export re-raises with the original error chained: search the chain, innermost first.
    chain = []
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or current.__context__
    for error in chain:
        for frame, lineno in _frame_lines(error):
            if _is_user_file(frame.f_code.co_filename):
                location = _format_location(frame.f_code.co_filename, lineno)
        if location:
            return location
    return location


def _format_location(filename: str, lineno: int) -> str:
    with contextlib.suppress(ValueError):
        relative = os.path.relpath(filename)
        if not relative.startswith(".."):
            filename = relative
    source = linecache.getline(filename, lineno).strip() or linecache.getline(os.path.abspath(filename), lineno).strip()
    return f"{filename}:{lineno} `{source}`" if source else f"{filename}:{lineno}"


def _find_culprit(
    exc: BaseException, root: nn.Module, module_names: dict[int, str], leaf_names: set[str], wraps: list[_Wrap]
) -> str | _Wrap | None:
    """The submodule name or helper function whose code raised ``exc``, innermost first."""
    frames = _frame_lines(exc)
    wrapped_functions = {id(w.function) for w in wraps}
    for index in range(len(frames) - 1, -1, -1):
        frame, _ = frames[index]
        owner = frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and id(owner) in module_names:
            name = module_names[id(owner)]
            if name and name not in leaf_names:
                return name
            if name == "":
                return None  # the failure is in the root's own forward: no leaf can help
            continue
        code = frame.f_code
        if not _is_user_file(code.co_filename) or index == 0:
            continue
        function = frame.f_globals.get(code.co_name)
        if getattr(function, "__code__", None) is not code or id(function) in wrapped_functions:
            continue
        caller_globals = frames[index - 1][0].f_globals
        if caller_globals.get(code.co_name) is function:
            return _Wrap(caller_globals, code.co_name, function)
    return None


def _short_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:300]


# --------------------------------------------------------------------------------------------------
# checks


def buffers_snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the module's (non-meta) buffers, so a check run that mutates them can be undone."""
    return {name: buf.detach().clone() for name, buf in module.named_buffers() if buf.device.type != "meta"}


def _changed_buffers(module: nn.Module, snapshot: dict[str, torch.Tensor]) -> list[str]:
    buffers = dict(module.named_buffers())

    def same(now: torch.Tensor | None, before: torch.Tensor) -> bool:
        if now is None or now.shape != before.shape or now.dtype != before.dtype:
            return False
        # equal_nan: buffers made with torch.empty may hold NaN, which torch.equal never calls equal
        return torch.equal(now, before) or (
            now.is_floating_point() and torch.allclose(now, before, rtol=0.0, atol=0.0, equal_nan=True)
        )

    return [name for name, value in snapshot.items() if not same(buffers.get(name), value)]


def restore_buffers(module: nn.Module, snapshot: dict[str, torch.Tensor]) -> None:
    """Put back the buffer values saved by :func:`buffers_snapshot`."""
    buffers = dict(module.named_buffers())
    with torch.no_grad():
        for name, value in snapshot.items():
            buffers[name].copy_(value)


def _run_isolated(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *others: nn.Module) -> Any:
    """Call ``module`` without letting buffer (or input) writes in forward leak into later runs."""
    snapshots = [(m, buffers_snapshot(m)) for m in (module, *others)]
    # Fresh copies of the inputs: a model that writes into its input would otherwise feed the next run
    # (and the caller) changed values.
    args, kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, torch.clone, (args, kwargs))
    try:
        with torch.no_grad():
            return module(*args, **kwargs)
    finally:
        for owner, snap in snapshots:
            restore_buffers(owner, snap)


def _on_meta(model: nn.Module, inputs: Sequence[Any]) -> bool:
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    tensors += [p for p in model.parameters()][:1]
    return any(t.device.type == "meta" for t in tensors)


def _with_batch(inputs: tuple[Any, ...], batch: int) -> tuple[Any, ...]:
    def resize(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            reps = [1] * value.dim()
            reps[0] = -(-batch // value.shape[0])
            return value.repeat(*reps)[:batch].clone()
        return value

    # pytree, not fx's map_aggregate: that turns dicts and lists into fx's immutable containers.
    return tuple(torch.utils._pytree.tree_map(resize, value) for value in inputs)


def run_reference(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *others: nn.Module) -> Any:
    """Run the user's model eagerly; a failure here means the inputs do not fit the model."""
    try:
        with quiet_torch_logs():
            return _run_isolated(model, args, kwargs, *others)
    except Exception as exc:
        shapes = ", ".join(
            "x".join(map(str, a.shape)) if isinstance(a, torch.Tensor) else type(a).__name__ for a in args
        )
        raise InputSpecError(
            f"the model rejected the example inputs ({shapes or 'none'}): {_short_error(exc)}",
            hint="pass --input with the shape and dtype the model expects, e.g. --input 1x3x224x224",
        ) from None


def check_capture(captured: Captured, batch: int | None = None, expected: Any = None) -> OutputCheck:
    """Run original and captured module on the example inputs (resized to ``batch``) and compare."""
    args = captured.example_inputs if batch is None else _with_batch(captured.example_inputs, batch)
    kwargs = captured.example_kwargs
    if batch is not None:  # keyword tensors (masks) share the batch dimension, as torch.export assumes too
        kwargs = dict(zip(kwargs, _with_batch(tuple(kwargs.values()), batch)))
    if expected is None:
        expected = run_reference(captured.original, args, kwargs, captured.graph_module)
    try:
        actual = _run_isolated(captured.graph_module, args, kwargs, captured.original)
    except Exception as exc:
        return OutputCheck(batch, False, float("inf"), f"captured graph failed to run: {_short_error(exc)}")
    comparison = compare_outputs(expected, actual)
    return OutputCheck(batch, comparison.ok, comparison.max_abs_err, "; ".join(comparison.problems[:3]))


# --------------------------------------------------------------------------------------------------
# public entry point


def _refuse_compiled_forms(model: nn.Module) -> None:
    """A TorchScript module or an ONNX Runtime session has no Python forward to trace: say so plainly, instead
    of reporting whatever tracing trips over first inside it."""
    from fxforge.export import OnnxRuntimeModule

    kind = (
        "a TorchScript module"
        if isinstance(model, torch.jit.ScriptModule)
        else "an ONNX model (run by ONNX Runtime)"
        if isinstance(model, OnnxRuntimeModule)
        else None
    )
    if kind is not None:
        raise CaptureError(
            f"cannot capture {kind} as an fx graph: it has no Python code to trace",
            hint="inspect, lint or optimize the PyTorch model it was made from; verify can still compare it with "
            "that model (fxforge verify MODEL DIR)",
        )


def capture(
    model: nn.Module | LoadedModel,
    example_inputs: Sequence[Any] | torch.Tensor = (),
    *,
    example_kwargs: Mapping[str, Any] | None = None,
    method: str = "auto",
    leaf_modules: Iterable[str | type] = (),
    autowrap_functions: Iterable[Callable[..., Any]] = (),
    concrete_args: dict[str, Any] | None = None,
    check: bool = True,
    check_batch: int | None = None,
    max_retries: int = 64,
) -> Captured:
    """Capture ``model`` as a GraphModule; see the module docstring for the strategy.

    Args:
        model: the module (or a :class:`~fxforge.models.LoadedModel`).
        example_inputs: positional inputs used for checking, shape propagation and torch.export.
        method: ``"auto"`` (trace, then export), ``"symbolic_trace"`` or ``"export"``.
        leaf_modules: submodule names or types to keep as single ``call_module`` nodes.
        autowrap_functions: functions to record as single calls instead of tracing through them.
        check: compare original and captured outputs on the example inputs.
        check_batch: also compare on this batch size (catches shapes baked in as constants).

    Raises:
        CaptureError: when no strategy can capture the model; names the blocking source line.
    """
    exported_program = None
    if isinstance(model, LoadedModel):
        exported_program = model.exported_program
        model = model.module
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    inputs = tuple(example_inputs)
    kwargs = dict(example_kwargs or {})
    if method not in ("auto", SYMBOLIC_TRACE, "export", EXPORT):
        raise CaptureError(f"unknown capture method {method!r}", hint="auto, symbolic_trace or export")
    _refuse_compiled_forms(model)

    if exported_program is not None or isinstance(model, fx.GraphModule):
        from fxforge.graphs import dialect_of

        gm = model if isinstance(model, fx.GraphModule) else exported_program.module()
        record = CaptureRecord(LOADED, dialect_of(gm))
        captured = Captured(gm, model, inputs, record, kwargs, exported_program)
    else:
        captured = _capture_module(
            model,
            inputs,
            kwargs,
            method,
            leaf_modules,
            autowrap_functions,
            concrete_args,
            check,
            check_batch,
            max_retries,
        )
    if check and not captured.record.checks:
        if _on_meta(model, inputs):
            captured.record.notes.append("output check skipped: the model is on the meta device")
        elif inputs or kwargs:
            captured.record.checks.append(check_capture(captured))
            if check_batch is not None:
                captured.record.checks.append(check_capture(captured, check_batch))
    return captured


def _capture_module(
    model: nn.Module,
    inputs: tuple[Any, ...],
    kwargs: dict[str, Any],
    method: str,
    leaf_modules: Iterable[str | type],
    autowrap_functions: Iterable[Callable[..., Any]],
    concrete_args: dict[str, Any] | None,
    check: bool,
    check_batch: int | None,
    max_retries: int,
) -> Captured:
    attempts: list[Attempt] = []
    leaf_names = {m for m in leaf_modules if isinstance(m, str)}
    leaf_types = tuple(m for m in leaf_modules if isinstance(m, type))
    user_leaves = set(leaf_names)
    wraps = [_Wrap(vars(__import__(f.__module__, fromlist=["_"])), f.__name__, f) for f in autowrap_functions]
    module_names = {id(m): name for name, m in model.named_modules()}
    can_check = check and (inputs or kwargs) and not _on_meta(model, inputs)
    # Run the model once first: inputs it rejects are the user's error, not a capture failure.
    reference = run_reference(model, inputs, kwargs) if can_check else None
    trace_error: BaseException | None = None

    if method in ("auto", SYMBOLIC_TRACE):
        for _ in range(max_retries):
            try:
                with quiet_torch_logs():
                    gm = _symbolic_trace(model, leaf_names, leaf_types, wraps, concrete_args)
            except Exception as exc:
                trace_error = exc
                culprit = _find_culprit(exc, model, module_names, leaf_names, wraps)
                attempt = Attempt(SYMBOLIC_TRACE, _short_error(exc), user_location(exc))
                attempts.append(attempt)
                if isinstance(culprit, str):
                    leaf_names.add(culprit)
                    attempt.action = f"made {culprit} a leaf module"
                    continue
                if isinstance(culprit, _Wrap):
                    wraps.append(culprit)
                    attempt.action = f"wrapped {culprit.label} as one call"
                    continue
                break
            record = CaptureRecord(
                SYMBOLIC_TRACE,
                TORCH,
                leaves=sorted(leaf_names - user_leaves),
                wrapped=[w.label for w in wraps],
                attempts=attempts,
            )
            captured = Captured(gm, model, inputs, record, kwargs)
            if not can_check:
                return captured
            checks = [check_capture(captured, expected=reference)]
            if check_batch is not None:
                checks.append(check_capture(captured, check_batch))
            record.checks = checks
            if record.ok or method == SYMBOLIC_TRACE:
                return captured
            failed = next(c for c in checks if not c.ok)
            attempts.append(
                Attempt(SYMBOLIC_TRACE, f"traced graph differs from the model (batch {failed.batch}): {failed.message}")
            )
            break
        else:
            attempts.append(Attempt(SYMBOLIC_TRACE, f"gave up after {max_retries} retries"))

    if method in ("auto", "export", EXPORT):
        try:
            program = export_program(model, inputs, kwargs, dynamic_batch=check_batch is not None)
        except Exception as exc:
            attempts.append(Attempt(EXPORT, _short_error(exc), user_location(exc)))
            raise _capture_error(model, attempts, trace_error, exc) from None
        record = CaptureRecord(EXPORT, ATEN, attempts=attempts)
        captured = Captured(program.module(), model, inputs, record, kwargs, program)
        if can_check:
            record.checks = [check_capture(captured, expected=reference)]
            if check_batch is not None:
                record.checks.append(check_capture(captured, check_batch))
        return captured
    raise _capture_error(model, attempts, trace_error, None)


def export_program(
    model: nn.Module, inputs: tuple[Any, ...], kwargs: dict[str, Any], dynamic_batch: bool
) -> torch.export.ExportedProgram:
    """``torch.export.export`` (non-strict) as capture uses it, optionally with a dynamic batch dimension."""
    dynamic_shapes = None
    if dynamic_batch and hasattr(torch.export.Dim, "AUTO"):
        # AUTO: keep the batch dimension symbolic where the model allows, specialise silently otherwise.
        def batch_dim(value: Any) -> Any:
            return {0: torch.export.Dim.AUTO} if isinstance(value, torch.Tensor) and value.dim() > 0 else None

        dynamic_shapes = {
            "args": tuple(torch.utils._pytree.tree_map(batch_dim, v) for v in inputs),
            "kwargs": {k: torch.utils._pytree.tree_map(batch_dim, v) for k, v in kwargs.items()},
        }
        dynamic_shapes = _dynamic_shapes_by_name(model, dynamic_shapes)
    from torch.fx.experimental import _config as fx_config

    oblivious = contextlib.nullcontext()
    if dynamic_batch and hasattr(fx_config, "backed_size_oblivious"):
        # Without it a batch of 1 is specialised (0/1 specialisation) and the program rejects any
        # other batch size, although the model itself is batch-size agnostic.
        oblivious = fx_config.patch(backed_size_oblivious=True)
    # torch.export prints the partial graph of a failed export straight to stderr; we report errors ourselves.
    with torch.no_grad(), quiet_torch_logs(), contextlib.redirect_stderr(io.StringIO()), oblivious:
        return torch.export.export(model, inputs, kwargs=kwargs or None, dynamic_shapes=dynamic_shapes, strict=False)


@contextlib.contextmanager
def quiet_torch_logs():
    """Silence torch's own warnings (graph dumps on export failures): fxforge reports errors itself."""
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict) if name.startswith("torch")]
    loggers.append(logging.getLogger("torch"))
    levels = [logger.level for logger in loggers]
    _set_levels(loggers, [logging.ERROR] * len(loggers))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        _set_levels(loggers, levels)


def _set_levels(loggers: list[logging.Logger], levels: list[int]) -> None:
    # Logger.setLevel clears the level cache of every logger in the process on each call: for torch's
    # hundreds of loggers that cost ~6 ms per quiet block and dominated verify-heavy pipelines.
    # Assign the levels, then clear the cache once.
    for logger, level in zip(loggers, levels):
        logger.level = level
    clear = getattr(logging.root.manager, "_clear_cache", None)
    if clear is not None:
        clear()
    else:  # pragma: no cover - every CPython since 3.7 has it; fall back to the public, slower path
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _dynamic_shapes_by_name(model: nn.Module, shapes: dict[str, Any]) -> dict[str, Any]:
    # torch.export wants dynamic_shapes keyed by forward's parameter names.
    import inspect as pyinspect

    params = [p for p in pyinspect.signature(model.forward).parameters.values() if p.kind != p.VAR_KEYWORD]
    by_name: dict[str, Any] = {}
    for param, shape in zip(params, shapes["args"]):
        by_name[param.name] = shape
    by_name.update(shapes["kwargs"])
    return by_name


def _capture_error(
    model: nn.Module, attempts: list[Attempt], trace_error: BaseException | None, export_error: BaseException | None
) -> CaptureError:
    # The line that stopped capture: the first failure fxforge could not work around (earlier trace
    # failures were fixed with a leaf or a wrap and no longer block anything).
    location = next((a.location for a in attempts if a.location and a.action is None), None)
    if export_error is not None and user_location(export_error):
        location = user_location(export_error) if location is None else location
    reasons = []
    errors = [e for e in (trace_error, export_error) if e is not None]
    text = " ".join(str(e) for e in errors).lower()
    if "control flow" in text or "data-dependent" in text or "data dependent" in text:
        reasons.append("data-dependent control flow (a Python branch or loop on a tensor's value)")
        hint = (
            "express the branch with torch.where or torch.cond, or move it into a submodule so that "
            "fxforge can keep that submodule as a leaf (--leaf NAME)"
        )
    else:
        last = attempts[-1].error if attempts else "unknown error"
        reasons.append(last)
        hint = "mark the offending submodule with --leaf NAME, or wrap the helper function with torch.fx.wrap"
    where = f" at {location}" if location else ""
    strategies = " and ".join(sorted({a.strategy for a in attempts}))
    message = f"cannot capture {type(model).__name__}: {strategies} stopped{where}: {reasons[0]}"
    return CaptureError(message, hint=hint, location=location, attempts=attempts)
