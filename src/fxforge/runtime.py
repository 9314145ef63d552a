"""Running user models without side effects: quiet torch logs, state snapshots, and the reference run.

Owns the promise that fxforge never changes the caller's objects: every time fxforge runs, traces or
exports a user's module it does so inside :func:`preserved_state`, which puts back attribute bindings,
buffer values, training flags and hooks afterwards, on success and on failure alike, and it runs the
module on copies of the inputs. Imports only torch and the standard library.
"""

from __future__ import annotations

import builtins
import collections
import contextlib
import contextvars
import functools
import inspect as pyinspect
import io
import logging
import os
import re
import sys
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import sympy
import torch
from torch import nn
from torch.fx import _symbolic_trace as fx_symbolic_trace
from torch.fx.experimental import _config as fx_config
from torch.utils import _pytree as pytree

from fxforge.compare import compare_outputs
from fxforge.errors import (
    FxforgeError,
    InputSpecError,
    command_name,
    format_location,
    is_user_file,
    offered,
    one_line_reason,
    raised_in_user_code,
    said,
    user_location,
)


@contextlib.contextmanager
def quiet_torch_logs() -> Iterator[None]:
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


# --------------------------------------------------------------------------------------------------
# snapshots


def buffers_snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the module's (non-meta) buffers, so a check run that mutates them can be undone."""
    return {name: buf.detach().clone() for name, buf in module.named_buffers() if buf.device.type != "meta"}


def changed_buffers(module: nn.Module, snapshot: dict[str, torch.Tensor]) -> list[str]:
    """Names of the buffers whose value (or binding) differs from ``snapshot``."""
    buffers = dict(module.named_buffers())

    def same(now: torch.Tensor | None, before: torch.Tensor) -> bool:
        if not isinstance(now, torch.Tensor) or now.shape != before.shape or now.dtype != before.dtype:
            return False
        return _same_values(now, before)

    return [name for name, value in snapshot.items() if not same(buffers.get(name), value)]


def buffer_versions(module: nn.Module) -> dict[str, int]:
    """Each buffer's version counter, which every in-place write bumps, even one that leaves the value as it was."""
    return {name: buf._version for name, buf in module.named_buffers()}


def written_buffers(module: nn.Module, versions: dict[str, int]) -> list[str]:
    """Names of the buffers written in place since :func:`buffer_versions` gave ``versions``."""
    return [name for name, buf in module.named_buffers() if name in versions and buf._version != versions[name]]


def restore_buffers(module: nn.Module, snapshot: dict[str, torch.Tensor]) -> None:
    """Put back the buffer values saved by :func:`buffers_snapshot`."""
    buffers = dict(module.named_buffers())
    with torch.no_grad():
        for name, value in snapshot.items():
            buffer = buffers.get(name)
            # A self-overlapping buffer (an expanded view) cannot be written in place -- by forward either -- and
            # copy_ into it raises: there is nothing to restore. An unchanged buffer is not written either: it may
            # be a view of a parameter, whose version counter would then say it was written.
            writable = isinstance(buffer, torch.Tensor) and buffer.shape == value.shape and not _overlaps(buffer)
            if writable and not _same_values(buffer, value):
                buffer.copy_(value)


def _same_values(now: torch.Tensor, before: torch.Tensor) -> bool:
    if now.layout != before.layout:
        return False
    if now.layout != torch.strided:  # sparse buffers: torch.equal has no sparse kernel, their dense form compares
        now, before = now.to_dense(), before.to_dense()
    # equal_nan: buffers made with torch.empty may hold NaN, which torch.equal never calls equal
    return torch.equal(now, before) or (
        now.is_floating_point() and torch.allclose(now, before, rtol=0.0, atol=0.0, equal_nan=True)
    )


def _overlaps(tensor: torch.Tensor) -> bool:
    """Whether elements of ``tensor`` share memory (stride 0, as ``expand`` makes): 0 means no overlap."""
    return torch._debug_has_internal_overlap(tensor) != 0


_PLAIN_DICTS = (dict, collections.OrderedDict)


@dataclass
class _ModuleState:
    module: nn.Module
    attributes: dict[str, Any]
    containers: dict[str, dict[Any, Any]]  # _parameters, _buffers, _modules, the hook dicts


def _module_state(module: nn.Module) -> _ModuleState:
    attributes = dict(module.__dict__)
    # Plain dicts only (nn.Module's own, and its hook dicts): a dict subclass held as an attribute (a transformers
    # ModelOutput kept as a reference output) may forbid clear/update, and it is not module state anyway.
    containers = {name: dict(value) for name, value in attributes.items() if type(value) in _PLAIN_DICTS}
    return _ModuleState(module, attributes, containers)


def _restore_module_state(state: _ModuleState) -> None:
    namespace = state.module.__dict__
    namespace.clear()
    namespace.update(state.attributes)
    for name, contents in state.containers.items():
        container = namespace[name]
        container.clear()
        container.update(contents)


# Parameters are copied before a run only when they might be written: the first time fxforge runs them (the
# model may write into them in forward, which no rewrite or check may leave behind) and after a write was seen.
# Copying every parameter before every run would double the memory and time of verification.
class _TensorSet:
    """Tensors by identity, forgotten when they are freed. (``weakref.WeakSet`` compares tensors with ``==``, which
    for tensors is elementwise and has no truth value.)"""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref] = {}

    def add(self, tensor: torch.Tensor) -> None:
        key = id(tensor)
        if key not in self._refs:
            self._refs[key] = weakref.ref(tensor, lambda _, key=key: self._refs.pop(key, None))

    def update(self, tensors: Iterable[torch.Tensor]) -> None:
        for tensor in tensors:
            self.add(tensor)

    def __contains__(self, tensor: torch.Tensor) -> bool:
        ref = self._refs.get(id(tensor))
        return ref is not None and ref() is tensor


_PARAMETERS_SEEN = _TensorSet()
_PARAMETERS_WRITTEN = _TensorSet()
# Above this size the first-run copy is skipped: a write is then detected (by the tensor's version counter)
# and reported, not undone.
FIRST_RUN_COPY_LIMIT = 2**30


@contextlib.contextmanager
def preserved_state(*modules: nn.Module, runs: bool = True) -> Iterator[None]:
    """Undo, on exit, what running or tracing ``modules`` changed in them.

    Restores every submodule's attribute bindings (a tracer that left ``self.count`` a Proxy, an
    attribute set in ``forward``), the contents of its parameter, buffer, child and hook dictionaries,
    its training flag, and the values of its buffers (written in place by ``self.count += 1`` or by a
    BatchNorm in training mode) and parameters (``self.w.add_(1)`` in forward). A parameter is copied
    before the run the first time fxforge runs it and whenever it has been seen written; a write into
    a parameter that was not copied (a model over :data:`FIRST_RUN_COPY_LIMIT` bytes) raises an error.
    ``runs=False`` for tracing, which does not run the model's ops on its parameters (proxies, fake tensors):
    parameters are then left out.
    """
    states: list[_ModuleState] = []
    snapshots: list[tuple[nn.Module, dict[str, torch.Tensor]]] = []
    seen: set[int] = set()
    parameters: dict[int, torch.Tensor] = {}
    for root in modules:
        if not isinstance(root, nn.Module) or id(root) in seen:
            continue
        for sub in root.modules():
            if id(sub) not in seen:
                seen.add(id(sub))
                states.append(_module_state(sub))
        snapshots.append((root, buffers_snapshot(root)))
        if runs:
            parameters.update({id(p): p for p in root.parameters() if p.device.type != "meta"})
    versions = {key: p._version for key, p in parameters.items()}
    copies = _parameter_copies(parameters.values())
    try:
        yield
    finally:
        for state in states:
            _restore_module_state(state)
        for root, snapshot in snapshots:
            restore_buffers(root, snapshot)
        _restore_parameters(parameters, versions, copies)


def _parameter_copies(parameters: Iterable[torch.Tensor]) -> dict[int, torch.Tensor]:
    parameters = list(parameters)
    if any(nn.parameter.is_lazy(p) for p in parameters):
        # a lazy module (nn.LazyLinear) makes its weights on its first call, which would change the caller's model;
        # reading their size failed as "the model rejected the example inputs" (QA)
        raise FxforgeError(
            "the model has lazy modules (nn.LazyLinear, nn.LazyConv2d...) whose parameters are not made yet: they "
            "are made on the model's first call, which fxforge does not make on your model",
            hint="call the model once on an example input first (model(x)), then give it to fxforge",
        )
    unseen = {id(p): p for p in parameters if p not in _PARAMETERS_SEEN}  # by id: `in` on tensors compares values
    first_run = sum(p.numel() * p.element_size() for p in unseen.values()) <= FIRST_RUN_COPY_LIMIT
    wanted = [p for p in parameters if p in _PARAMETERS_WRITTEN or (first_run and id(p) in unseen)]
    copies = {id(p): p.detach().clone() for p in wanted}
    _PARAMETERS_SEEN.update(parameters)
    return copies


def _restore_parameters(
    parameters: dict[int, torch.Tensor], versions: dict[int, int], copies: dict[int, torch.Tensor]
) -> None:
    lost = []
    with torch.no_grad():
        for key, parameter in parameters.items():
            if parameter._version == versions[key]:
                continue
            _PARAMETERS_WRITTEN.add(parameter)
            if key in copies and not _overlaps(parameter):
                parameter.copy_(copies[key])
            else:
                lost.append(tuple(parameter.shape))
    if lost:
        raise FxforgeError(
            f"the model writes into {len(lost)} of its parameters in forward (shape {lost[0]}), and fxforge did not "
            "keep a copy to undo it",
            hint="avoid in-place writes to parameters in forward (use a buffer), or run fxforge on a copy of the model",
        )


def cloned(value: Any) -> Any:
    """A copy of ``value`` in which every tensor is cloned: what fxforge runs a model on, so that a model
    writing into its input (``x.add_(1)``) changes neither the caller's tensors nor the next run's."""
    return pytree.tree_map_only(torch.Tensor, torch.clone, value)


# --------------------------------------------------------------------------------------------------
# running a model


def run_isolated(module: Any, args: Sequence[Any], kwargs: dict[str, Any], *others: nn.Module) -> Any:
    """Call ``module`` on copies of the inputs, with its state (and that of ``others``) restored afterwards."""
    args, kwargs = cloned((tuple(args), dict(kwargs)))
    states = preserved_state(*(m for m in (module, *others) if isinstance(m, nn.Module)))
    with states, torch.no_grad(), graph_error_report_dropped():
        return module(*args, **kwargs)


@contextlib.contextmanager
def graph_error_report_dropped() -> Iterator[None]:
    """Drop what is written to stderr during a call that raises; pass it on after one that returns.

    torch.fx prints its own report of an error raised in a GraphModule's generated code (a traceback and an excerpt
    of the generated forward) to stderr before re-raising it, and fxforge reports that error itself in one line: QA
    saw a raw traceback from capture's check of a symbolic trace that then fell back to torch.export."""
    held = io.StringIO()
    with contextlib.redirect_stderr(held):
        yield
    passed_on = held.getvalue()  # reached only when the call returned
    if passed_on:
        # a stderr that cannot be written (a full device) is no fault of the model's: the write is given up (QA:
        # every capture read "the model rejected the example inputs: OSError: No space left on device")
        with contextlib.suppress(OSError):
            sys.stderr.write(passed_on)


def describe_inputs(args: Sequence[Any], values: bool = False) -> str:
    """``1x3x224x224, 2x16:int64`` for a list of inputs, as ``--input`` spells them (float32, the default dtype,
    left out; type names for non-tensors); ``values``: with the range of each integer input's values."""

    def spec(value: Any) -> str:
        if not isinstance(value, torch.Tensor):
            return type(value).__name__
        shape = "x".join(map(str, value.shape)) or "scalar"
        if value.dtype == torch.float32:
            return shape
        text = f"{shape}:{str(value.dtype).removeprefix('torch.')}"
        if values and is_integer_dtype(value.dtype) and value.numel() and value.device.type != "meta":
            # the ids drawn, not only the dtype: an --input's max= is what an "index out of range" is about (QA: the
            # message said "2x3:int64" for --input 2x3:int64:max=50)
            text += f" with values {int(value.min())}..{int(value.max())}"
        return text

    return ", ".join(spec(a) for a in args)


def is_integer_dtype(dtype: torch.dtype) -> bool:
    """Integer tensors (ids, indices), which ``max=`` bounds; bool is no integer here."""
    return not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool


def run_reference(module: Any, args: Sequence[Any], kwargs: dict[str, Any], *others: nn.Module) -> Any:
    """Run the user's model eagerly, isolated; a failure here means the inputs do not fit the model."""
    try:
        with quiet_torch_logs():
            return run_isolated(module, args, kwargs, *others)
    except FxforgeError:  # fxforge's own refusal (a lazy module), not the inputs'
        raise
    except Exception as exc:
        raise inputs_rejected(module, args, kwargs, exc) from None


def inputs_rejected(module: Any, args: Sequence[Any], kwargs: dict[str, Any], exc: Exception) -> InputSpecError:
    """The one-line error for ``module`` failing on ``args``/``kwargs`` with ``exc``: the inputs, the reason, the
    user's line, and a hint for what fits (a shape, a dtype, a keyword, ids in range), or, where the model's own code
    raised it, to fix the model there."""
    keyword_only = _keyword_only_inputs(module)
    hint = said(
        "pass --input with the shape and dtype the model expects, e.g. --input 1x3x224x224",
        "pass inputs with the shape and dtype the model expects, e.g. fxforge.prepare(model, '1x3x224x224')",
    )
    if keyword_only and args and not kwargs:
        # the positional inputs stay positional (QA: the example dropped them, capture(model, (), ...)); a
        # constant keyword (a scale, a flag) is fixed with --concrete where the command takes it
        concrete = offered(f"--concrete {keyword_only[0]}=VALUE", "--concrete")
        hint = (
            f"forward takes {', '.join(keyword_only)} by keyword only, and the CLI passes inputs by position: "
            + said(
                f"fix a constant with {concrete}, or for a tensor use the Python API, "
                if concrete
                else "give it a default in forward, or use the Python API, ",
                "",
            )
            + _keyword_call(module, keyword_only[0])
        )
    missing = re.search(r"forward\(\) missing \d+ required (?:positional|keyword-only) arguments?: (.+)$", str(exc))
    # (the keyword-only hint above, where it applies, says more: it names the Python API's form too)
    if isinstance(exc, TypeError) and missing and not (keyword_only and args and not kwargs):
        # a forward argument the inputs do not give, often a number or a flag (QA: the hint asked for a shape)
        name = re.findall(r"'(\w+)'", missing.group(1))[:1] or ["ARG"]
        by_keyword = "keyword-only" in missing.group(0)
        concrete = offered(f"--concrete {name[0]}=VALUE", "--concrete")
        if by_keyword:
            cli = (
                f"fix a constant with {concrete}"
                if concrete
                else f"give it a default in forward, or use the Python API, {_keyword_call(module, name[0])}"
            )
        else:
            cli = "pass one more --input" + (f" for a tensor, or fix a constant with {concrete}" if concrete else "")
        hint = f"forward also takes {name[0]}: " + said(
            cli, f"pass it among the inputs, or fix a constant with concrete_args={{{name[0]!r}: VALUE}}"
        )
    # ids below the size of the embedding that raised (QA: the example said max=999 for a vocabulary of 100)
    tables = [frame.f_locals.get("self") for frame, _ in traceback.walk_tb(exc.__traceback__)]
    rows = [table.num_embeddings for table in tables if isinstance(table, nn.Embedding)]
    limit = rows[-1] - 1 if rows else 999
    # the shape the user gave, with an integer dtype (QA: the example always said 1x16)
    first = next((t for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor) and t.dim()), None)
    ids = "x".join(map(str, first.shape)) if first is not None else "1x16"
    if "'indices' to have one of the following scalar types" in str(exc):
        # a float input where the model indexes an embedding (QA: the hint asked for 1x3x224x224)
        hint = said(
            f"the model takes integer ids: give the input an integer dtype, e.g. --input {ids}:int64:max={limit}",
            f"the model takes integer ids: pass an integer tensor, e.g. fxforge.prepare(model, "
            f"'{ids}:int64:max={limit}')",
        )
    out_of_range = "index out of range" in str(exc)
    if out_of_range:  # an id past an embedding's rows: the shape was not the problem
        hint = said(
            "an integer input indexes past an embedding's rows: draw ids below its size with max=, e.g. "
            f"--input {ids}:int64:max={limit}",
            "an integer input indexes past an embedding's rows: pass ids below its size, e.g. "
            f"fxforge.prepare(model, '{ids}:int64:max={limit}')",
        )
    where = user_location(exc)
    # a name the model's code misspells (torch.hardtanh, an undefined variable): no input would run it (QA)
    misspelt = isinstance(exc, NameError) or (
        isinstance(exc, AttributeError) and (str(exc).startswith("module '") or _module_attribute_missing(exc))
    )
    if raised_in_user_code(exc) or (misspelt and where):
        # raised by the model's own code (a raise, a recursion), not by a torch op its inputs did not fit: QA
        # got "pass --input with the shape..." and no line for `raise RuntimeError(...)` in forward
        hint = "the model's own code raised it: fix the model there, or pass the inputs it expects"
    fixed = _fixed_batch(str(exc))
    if fixed is not None:  # a program exported for one batch size: another --input shape will not do
        # debug and inspect have no --batch: the batch is the --input's there
        via = offered(f"--batch {fixed}", "--batch") or offered(f"an --input of batch {fixed}", "--input")
        hint = (
            f"the model takes batch {fixed} only (a program exported for that batch size): run it at batch "
            f"{fixed}{said(f' ({via})' if via else '', '')}, or export it again with a dynamic batch"
        )
    at = f" at {where}" if where else ""
    return InputSpecError(
        f"the model rejected the example inputs ({describe_inputs(args, values=out_of_range) or 'none'}): "
        f"{one_line_reason(exc)}{at}",
        hint=hint,
    )


def _keyword_call(module: Any, name: str) -> str:
    """The Python API's call that passes ``name`` by keyword, for the command running (``debug`` runs the model as
    debug_model does; every other command captures it first)."""
    positional = "(x, ...)" if _takes_positional(module) else "()"
    if command_name() == "debug":
        return f"fxforge.debug_model(model, {positional}, {{{name!r}: ...}})"
    return f"fxforge.capture(model, {positional}, example_kwargs={{{name!r}: ...}})"


def _module_attribute_missing(exc: AttributeError) -> bool:
    """Whether ``exc`` is nn.Module's own "object has no attribute" (``self.lienar``): the model's code names a
    submodule or weight it does not have, which no input changes (QA: the hint asked for other --input shapes)."""
    frames = list(traceback.walk_tb(exc.__traceback__))
    if not frames:
        return False
    code = frames[-1][0].f_code
    return code.co_name == "__getattr__" and code.co_filename.endswith(os.path.join("nn", "modules", "module.py"))


def _fixed_batch(message: str) -> int | None:
    """The batch size a torch.export program's guard insists on (``Guard failed: x.size()[0] == 2``, ``Expected
    input at *args[0].shape[0] to be equal to 2``), else None."""
    match = re.search(r"size\(\)\[0\] == (\d+)", message) or re.search(r"shape\[0\] to be equal to (\d+)", message)
    return int(match.group(1)) if match else None


def _forward_parameters(module: Any) -> list[pyinspect.Parameter] | None:
    """The parameters of ``module``'s forward (of ``module`` itself when it is a function), or None for a builtin or
    a C++ module, which has no signature to read."""
    function = module.forward if isinstance(module, nn.Module) else module
    try:
        return list(pyinspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return None


def unprovided_defaults(model: Any, inputs: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``forward``'s parameters that ``inputs`` and ``kwargs`` leave out and whose default is a plain constant
    (``scale=False``): the values a call runs with unless told otherwise."""
    defaults = {}
    for index, parameter in enumerate(_forward_parameters(model) or ()):
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD) or index < len(inputs):
            continue
        if parameter.name in kwargs or parameter.default is parameter.empty:
            continue
        if parameter.default is None or isinstance(parameter.default, (bool, int, float, str)):
            defaults[parameter.name] = parameter.default
    return defaults


def _keyword_only_inputs(module: Any) -> list[str]:
    """The names ``module``'s forward takes by keyword only (``forward(self, *, x)``)."""
    return [p.name for p in _forward_parameters(module) or () if p.kind is pyinspect.Parameter.KEYWORD_ONLY]


def _takes_positional(module: Any) -> bool:
    """Whether ``module``'s forward takes any argument by position (True where its signature cannot be read)."""
    parameters = _forward_parameters(module)
    positional = (pyinspect.Parameter.POSITIONAL_ONLY, pyinspect.Parameter.POSITIONAL_OR_KEYWORD)
    return parameters is None or any(p.kind in positional for p in parameters)


def batch_of(values: Any) -> int | None:
    """The example's batch size in ``values`` (a pytree): the first dimension of its first tensor of one or more
    dimensions. Tensors of another first dimension (a weight matrix passed to forward) are not batched inputs."""
    batched = [v for v in pytree.tree_leaves(values) if isinstance(v, torch.Tensor) and v.dim() > 0]
    return batched[0].shape[0] if batched else None


def with_batch_kwargs(kwargs: dict[str, Any], batch: int) -> dict[str, Any]:
    """Keyword inputs resized as :func:`with_batch` resizes positional ones: keyword tensors (masks) share the batch
    dimension, as torch.export assumes too."""
    return dict(zip(kwargs, with_batch(tuple(kwargs.values()), batch)))


def with_batch(inputs: Sequence[Any], batch: int) -> tuple[Any, ...]:
    """``inputs`` with every batched tensor resized along dim 0 to ``batch`` (repeating rows): those whose first
    dimension is the example's batch, the first tensor's of one or more dimensions (a weight matrix passed to forward,
    of another first dimension, is no batched input)."""
    example_batch = batch_of(tuple(inputs))

    def resize(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == example_batch > 0:
            reps = [1] * value.dim()
            reps[0] = -(-batch // value.shape[0])
            return value.repeat(*reps)[:batch].clone()
        return value

    # pytree, not fx's map_aggregate: that turns dicts and lists into fx's immutable containers.
    return tuple(pytree.tree_map(resize, value) for value in inputs)


# --------------------------------------------------------------------------------------------------
# torch.export as fxforge calls it


class ConstantKeywords(nn.Module):
    """``module`` called with keyword arguments fixed at capture (``--concrete flag=true``): a file written from
    it takes the positional inputs alone, the values being constants of the program, not inputs its loader must
    pass again (a ``model.pt2`` exported with ``flag`` as a keyword input refused ``model(x)``, and guarded
    ``flag == True`` on any other value).

    It is in the mode ``module`` is in: a new module is in training mode, and the legacy ONNX exporter, which puts
    the module it exports in eval mode and back in its own mode after, left the model's BatchNorm layers in
    training mode (QA: ``--concrete`` with ``--exporter legacy``, a false MISMATCH against the model in training
    mode)."""

    def __init__(self, module: nn.Module, kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.module = module
        self.kwargs = dict(kwargs)
        self.training = module.training  # this module's flag alone: train() would set the model's

    def forward(self, *args: Any) -> Any:
        return self.module(*args, **self.kwargs)


def holds_tensor(value: Any) -> bool:
    """Whether a (nested) value holds a tensor: a keyword input, not a constant to fix."""
    return any(isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves(value))


_P = ParamSpec("_P")
_R = TypeVar("_R")


@contextlib.contextmanager
def rng_preserved(seed: int | None = None) -> Iterator[None]:
    """Run the body on a fork of torch's random state: the caller's state is back afterwards, whatever the body
    drew. With ``seed`` the CPU generator (and the CUDA ones already in use) start from it, so that two bodies
    seeded alike draw the same numbers."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if cuda else []):
        if seed is not None:
            torch.default_generator.manual_seed(seed)
            if cuda:
                torch.cuda.manual_seed_all(seed)
        yield


@contextlib.contextmanager
def fx_wraps_kept_loadable() -> Iterator[None]:
    """Around ``torch.load`` of a pickled GraphModule: :func:`forget_unloadable_fx_wraps` before and after."""
    forget_unloadable_fx_wraps()
    try:
        yield
    finally:
        forget_unloadable_fx_wraps()


def forget_unloadable_fx_wraps() -> None:
    """Forget the function wraps torch.fx holds under a name their module's globals do not have. torch rebuilds a
    loaded GraphModule from its code, and where the graph guards an argument traced as None, compiling that code
    (at load, or at its first call) runs ``wrap("torch.fx._symbolic_trace._assert_is_none")``, registering a dotted
    name; every later trace in the process, the next model.pt's load included, then failed with KeyError (QA; a
    bug of torch's that plain ``torch.load`` still has). Called before fxforge loads or traces."""
    registry = fx_symbolic_trace._wrapped_fns_to_patch
    for key, frame_dict in list(registry.items()):
        if key[1] not in frame_dict and not hasattr(builtins, key[1]):
            del registry[key]


@contextlib.contextmanager
def generators_preserved(*modules: nn.Module) -> Iterator[None]:
    """Give back, on exit, the random streams the ``modules`` hold themselves: every ``torch.Generator`` attribute of
    a submodule (insert_after's noise keeps one per site) is rewound to its state at entry, and one made during the
    body where there was None is dropped again. :func:`preserved_state` restores the binding only, and a generator
    that already existed is the same object, advanced: the caller's next call drew other noise than it would have.
    Around a whole flow, not each run: two runs inside it still draw differently (the determinism check needs that)."""
    held: list[tuple[nn.Module, dict[str, torch.Generator | None]]] = []
    seen: set[int] = set()
    for root in modules:
        for sub in root.modules() if isinstance(root, nn.Module) else ():
            if id(sub) not in seen:
                seen.add(id(sub))
                # None too: a generator made lazily on the first call (a noise module not called yet)
                entry = {k: v for k, v in vars(sub).items() if v is None or isinstance(v, torch.Generator)}
                held.append((sub, entry))
    states = {id(g): (g, g.get_state()) for _, entry in held for g in entry.values() if g is not None}
    try:
        yield
    finally:
        for sub, entry in held:
            namespace = vars(sub)
            for name, value in entry.items():
                if namespace.get(name, value) is not value and isinstance(namespace.get(name), torch.Generator):
                    namespace[name] = value
        for generator, state in states.values():
            generator.set_state(state)


def keeps_rng_state(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """``function`` with the caller's random state given back afterwards (:func:`rng_preserved`: the CPU generator,
    and the CUDA ones where CUDA is in use): running a model in training mode (dropout) draws from the global
    generators, and a check of the caller's model must not move the caller's random stream (QA: verify, optimize,
    inspect... each advanced ``torch.get_rng_state()``). The streams the caller's modules hold themselves are given
    back too (:func:`generators_preserved`, for every module among the arguments and the ``graph_module``,
    ``original`` and ``module`` a ``Captured`` or ``LoadedModel`` argument holds): prepare, verify and inspect
    advanced an insert_after noise module's generator."""

    @functools.wraps(function)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        # the outermost call gives the module-held streams back (see _INSIDE_A_CALL); an inner one keeps none
        held = () if _INSIDE_A_CALL.get() else _modules_among(*args, *kwargs.values())
        token = _INSIDE_A_CALL.set(True)
        try:
            with rng_preserved(), generators_preserved(*held):
                return function(*args, **kwargs)
        finally:
            _INSIDE_A_CALL.reset(token)

    return wrapper


# Whether a keeps_rng_state function is running: the module-held streams are given back by the outermost call
# only. Rewound by each inner call (split -> verify -> Verifier.check), a noise module drew the same noise for the
# candidate as for the reference, and split passed a noisy graph as verified.
_INSIDE_A_CALL: contextvars.ContextVar[bool] = contextvars.ContextVar("fxforge_inside_a_call", default=False)


def _modules_among(*values: Any) -> list[nn.Module]:
    """The modules ``values`` are or hold as a ``Captured`` / ``LoadedModel`` does (read by attribute: both sit in
    layers above this one)."""
    found = []
    for value in values:
        held = [value] + [getattr(value, name, None) for name in ("graph_module", "original", "module")]
        found.extend(module for module in held if isinstance(module, nn.Module))
    return found


def with_constant_kwargs(module: nn.Module, kwargs: dict[str, Any]) -> nn.Module:
    """``module`` as it runs with ``kwargs`` fixed (see :class:`ConstantKeywords`); itself when there are none."""
    return ConstantKeywords(module, kwargs) if kwargs else module


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
        dynamic_shapes = dynamic_shapes_by_name(model, dynamic_shapes)

    oblivious = contextlib.nullcontext()
    leaves = torch.utils._pytree.tree_leaves((inputs, kwargs))
    batch_one = any(isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == 1 for v in leaves)
    if dynamic_batch and batch_one and hasattr(fx_config, "backed_size_oblivious"):
        # Without it a batch of 1 is specialised (0/1 specialisation) and the program rejects any
        # other batch size, although the model itself is batch-size agnostic. At batch 2 and up it is not
        # needed, and harmful: ViT's program then checked that the batch is not 1.
        oblivious = fx_config.patch(backed_size_oblivious=True)
    # torch.export prints the partial graph of a failed export straight to stderr; we report errors ourselves.
    recorder = BatchGuardRecorder()
    recording = recorder if dynamic_shapes is not None else contextlib.nullcontext()
    with torch.no_grad(), quiet_torch_logs(), contextlib.redirect_stderr(io.StringIO()), oblivious, recording:
        program = torch.export.export(model, inputs, kwargs=kwargs or None, dynamic_shapes=dynamic_shapes, strict=False)
    if recorder.location is not None:
        _BATCH_NARROWED_AT[program] = recorder.location
    return program


class BatchGuardRecorder(logging.Handler):
    """Where the model's code narrowed a dynamic batch while torch.export traced it: the first user line at which
    torch added a guard on a batch symbol (``len(x)``, ``int(x.shape[0])``, ``if x.shape[0] > 2``).

    torch.export reports a fixed batch only as the program's guard (``x.size()[0] == 2``) and says where it came
    from only in its INFO log of the symbolic-shapes engine, which this handler reads while it is active (a
    ``with`` block). Best effort: torch's log records are not an API, and nothing is found where they change."""

    _LOGGER = "torch.fx.experimental.symbolic_shapes"

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self._batch_symbols: set[str] = set()
        self._fixed_at: str | None = None  # the first guard that sets the batch to a number
        self._bounded_at: str | None = None  # else the first that bounds it (Ne(s, 1), for broadcasting, does not)

    @property
    def location(self) -> str | None:
        return self._fixed_at or self._bounded_at

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):  # a record of another shape: not ours to explain
            if "create_symbol" in str(record.msg) and re.search(r"\.size\(\)\[0\]$", str(record.args[2])):
                self._batch_symbols.add(str(record.args[0]))
            elif "[guard added]" in str(record.msg):
                guard = str(record.args[1])
                frame = record.args[2].framework_loc
                if not set(re.findall(r"\bs\d+\b", guard)) & self._batch_symbols or not is_user_file(frame.filename):
                    return
                if guard.startswith("Eq(") and self._fixed_at is None:
                    self._fixed_at = format_location(frame.filename, frame.lineno)
                elif not guard.startswith("Ne(") and self._bounded_at is None:
                    self._bounded_at = format_location(frame.filename, frame.lineno)

    def __enter__(self) -> BatchGuardRecorder:
        logger = logging.getLogger(self._LOGGER)
        self._saved = (logger.level, logger.propagate, logger.handlers)
        # this handler alone: torch gives the logger its own stderr handler, which INFO would make print
        # (levels set as attributes, as quiet_torch_logs does: setLevel clears every logger's cache)
        logger.handlers, logger.level, logger.propagate = [self], logging.INFO, False
        logging.root.manager._clear_cache()
        return self

    def __exit__(self, *exc_info: object) -> None:
        logger = logging.getLogger(self._LOGGER)
        logger.level, logger.propagate, logger.handlers = self._saved
        logging.root.manager._clear_cache()


# where each program exported with a dynamic batch had that batch narrowed (BatchGuardRecorder), by program
_BATCH_NARROWED_AT: weakref.WeakKeyDictionary[torch.export.ExportedProgram, str] = weakref.WeakKeyDictionary()


def batch_narrowed_at(program: Any) -> str | None:
    """The user's line (``model.py:5 `n = len(y)```) that fixed or bounded the batch of ``program`` as
    :func:`export_program` traced it with a dynamic batch; None where it was not recorded."""
    try:
        return _BATCH_NARROWED_AT.get(program)
    except TypeError:  # not weak-referenceable: not a program of ours
        return None


def narrowed_batch(program: torch.export.ExportedProgram) -> tuple[int, int] | None:
    """The batch sizes a program exported with a dynamic batch holds for, ``(lowest, highest)``, where the model's
    code narrowed them (it branches on the batch size, or the batch was specialised); None where the batch is free.

    torch.export records such a limit as the range of the batch symbol (``x.shape[0] > 2`` traced at batch 2:
    ``[0, 2]``), which a ``.pt2`` program checks at each call and an ONNX file cannot record."""
    for guard in getattr(program, "_guards_code", None) or []:  # torch.export's checks at each call, as Python
        fixed = re.fullmatch(r"L\[[^\]]*\]\.size\(\)\[0\] == (\d+)", guard.strip())
        if fixed:  # a batch-1 trace fixed by len(x) keeps the range [1, 2] and checks `== 1`
            return int(fixed.group(1)), int(fixed.group(1))
    user_inputs = set(program.graph_signature.user_inputs)
    narrowed: tuple[int, int] | None = None
    for node in program.graph.nodes:
        value = node.meta.get("val")
        if node.op != "placeholder" or node.name not in user_inputs or not isinstance(value, torch.Tensor):
            continue
        if value.dim() == 0:
            continue
        size = value.shape[0]
        if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Integer):
            # a symbol the trace replaced by a number (len(x) at batch 2: the program's guard is `== 2`), which
            # still reads as a SymInt, without a range: it was taken for a free batch
            size = int(size.node.expr)
        if isinstance(size, int):
            narrowed = narrowed or (size, size)
            continue
        ranges = program.range_constraints.get(size.node.expr)
        # an unbounded range ends at torch's int_oo, which is no sympy.Integer (and calls itself finite)
        if ranges is None or not isinstance(ranges.upper, sympy.Integer):
            return None  # a free batch (an input of another first dimension, a weight, may be fixed beside it)
        narrowed = narrowed or (int(ranges.lower), int(ranges.upper))
    return narrowed


def batch_conditions(program: torch.export.ExportedProgram) -> list[str]:
    """The conditions on the batch size that ``program`` checks at each call beyond the range of its batch symbol
    (``x.size()[0] != 3``: a model branching on ``x.shape[0] == 3`` traced at another batch): a range holds no
    such hole, and an ONNX file declaring a free batch computed the traced branch at batch 3 (QA). Conditions only
    tying the batches of two inputs together (``x.size()[0] == mask.size()[0]``) are not listed: both stay free."""
    found = []
    for guard in getattr(program, "_guards_code", None) or []:  # torch.export's checks, as Python text
        if "size()[0]" not in guard:
            continue
        without_sizes = re.sub(r"L\[[^\]]*\]\.size\(\)\[\d+\]", "", guard)
        if re.search(r"\d", without_sizes):  # compared with a number, not only with another input's size
            found.append(re.sub(r"L\['([^']*)'\]", r"\1", guard))
    return found


def batch_range_text(limits: tuple[int, int]) -> str:
    """``"batch 2"``, ``"batch sizes up to 2"`` or ``"batch sizes 2 to 8"`` for :func:`narrowed_batch`'s range."""
    low, high = limits
    if low == high:
        return f"batch {low}"
    return f"batch sizes up to {high}" if low <= 1 else f"batch sizes {low} to {high}"


def at_batch_two(values: Any) -> Any | None:
    """``values`` (a pytree) with every tensor of batch 1 repeated to batch 2, or None where no tensor has batch 1 or
    some other tensor has another batch (then which dimension is the batch is not clear)."""
    tensors = [v for v in torch.utils._pytree.tree_leaves(values) if isinstance(v, torch.Tensor) and v.dim() > 0]
    if not tensors or any(t.shape[0] != 1 for t in tensors):
        return None

    def doubled(value: Any) -> Any:
        return torch.cat([value, value]) if isinstance(value, torch.Tensor) and value.dim() > 0 else value

    return torch.utils._pytree.tree_map(doubled, values)


def export_program_any_batch(
    model: nn.Module, inputs: tuple[Any, ...], kwargs: dict[str, Any]
) -> torch.export.ExportedProgram:
    """:func:`export_program` with a dynamic batch, for a file that is to run batch 1 and more, traced at batch 2
    where that reproduces the example (:func:`traced_at_batch_two`)."""

    def export(example: tuple[tuple[Any, ...], dict[str, Any]]) -> torch.export.ExportedProgram:
        return export_program(model, example[0], example[1], dynamic_batch=True)

    def reproduces(program: torch.export.ExportedProgram) -> bool:
        # each from the state it was exported in: a forward that updates buffers would otherwise leave its update
        # in the caller's model and in the program that is then saved
        with torch.no_grad(), quiet_torch_logs():
            with preserved_state(model, runs=False):
                expected = model(*inputs, **kwargs)
            program_module = program.module()
            with preserved_state(program_module, runs=False):
                return compare_outputs(expected, program_module(*inputs, **kwargs)).ok

    with preserved_state(model, runs=False):  # tracing runs forward's Python, buffer writes included
        program, at_two = traced_at_batch_two(export, (inputs, kwargs), reproduces)
    if at_two:
        record_example(program, inputs, kwargs)
    return program


def traced_at_batch_two(
    build: Callable[[Any], _R],
    example: Any,
    reproduces: Callable[[_R], bool],
    *,
    errors: tuple[type[BaseException], ...] = (Exception,),
    rejected: Callable[[], None] = lambda: None,
    final: Callable[[BaseException], bool] = lambda _: False,
) -> tuple[_R, bool]:
    """``(build(example), False)``; for an example of batch 1, ``(build(the example repeated to batch 2), True)``
    first, where that builds and ``reproduces`` the example's own result.

    torch.export treats a dimension of size 1 as a constant (it broadcasts): traced at batch 1, torchvision's ViT
    and ConvNeXt and GPT-2 gave programs and files that run batch 1 only. The batch-2 trace must compute the
    example's result, not only run it: code that branches on the batch size took the batch-2 branch at batch 1,
    silently (QA: x * 3 where the model gives x * 2). ``errors``: what a failed batch-2 build may raise (then the
    example is built); ``rejected`` is called before that (to remove what the attempt left behind); an error that
    ``final`` accepts is raised at once (the model's code branches on the batch size: batch 1 would hide it)."""
    doubled = at_batch_two(example)
    if doubled is not None:
        try:
            built = build(doubled)
            if reproduces(built):
                return built, True
        except errors as exc:
            if final(exc):
                raise
        rejected()
    return build(example), False


def record_example(program: torch.export.ExportedProgram, inputs: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Make ``inputs`` the example a program records (traced at batch 2, it held the batch-2 copy: inspect of the
    file counted twice the FLOPs, bench timed batch 2). Left as it is where torch refuses the example."""
    with contextlib.suppress(Exception):
        program.example_inputs = (tuple(inputs), dict(kwargs))


def dynamic_shapes_by_name(model: nn.Module, shapes: dict[str, Any]) -> dict[str, Any]:
    """``shapes`` (``{"args": (...), "kwargs": {...}}``) keyed by ``model.forward``'s parameter names, as torch.export
    wants them: a ``forward(*args)`` (fxforge's wrappers) takes the positional ones as one tuple under its name."""
    params = [p for p in pyinspect.signature(model.forward).parameters.values() if p.kind != p.VAR_KEYWORD]
    by_name: dict[str, Any] = {}
    args = list(shapes["args"])
    for param in params:
        if not args:
            break
        if param.kind == param.VAR_POSITIONAL:  # forward(*args): the rest, as one tuple under its name
            by_name[param.name] = tuple(args)
            args = []
        else:
            by_name[param.name] = args.pop(0)
    by_name.update(shapes["kwargs"])
    return by_name


@contextlib.contextmanager
def quiet_quantization_notices() -> Iterator[None]:
    """Hide exactly the notices torch.ao.quantization prints on every call: FX graph mode is deprecated but
    chosen deliberately (see :mod:`fxforge.quantize`)."""
    # torch warns once per process that quantized tensors are deprecated; where the first quantized tensor is made
    # by TorchScript's loader or interpreter, no Python filter sees it and it prints a raw "[W... Quantizer.cpp]"
    # line (QA: on every command loading an int8 model.torchscript.pt). Made here first, under the filters below,
    # its once is spent.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.ao\.quantization is deprecated", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=r"Please use quant_min and quant_max", category=UserWarning)
        warnings.filterwarnings("ignore", message=r"torch\.quantize_per_tensor, torch\.quantize_per_channel and other")
        warnings.filterwarnings("ignore", message=r"TypedStorage is deprecated")  # torch.load of int8 tensors
        warnings.filterwarnings("ignore", message=r".*must run observer before calling calculate_qparams")
        # once, not once per cat of the model (QA: 33 copies for ghostnet, each with a line of generated code)
        warnings.filterwarnings("once", message=r"All inputs of this cat operator must share")
        # convert_fx copies LSTM weights with torch.tensor(tensor) inside torch itself
        warnings.filterwarnings("ignore", message=r"To copy construct", module=r"torch\.ao\.nn\.quantized\.reference")
        _spend_quantized_tensor_notice()
        yield


@functools.cache
def _spend_quantized_tensor_notice() -> None:
    torch.quantize_per_tensor(torch.zeros(1), 1.0, 0, torch.quint8)


def onednn_linear_op() -> Any | None:
    """oneDNN's fp32 linear kernel, ``torch.ops.mkldnn._linear_pointwise`` (the op packet), or None where this torch
    has none. What the onednn_linear pass calls, machine times for the fp32 peak, inspect counts and export refuses."""
    return getattr(torch.ops.mkldnn, "_linear_pointwise", None)


@contextlib.contextmanager
def native_output_silenced() -> Iterator[None]:
    """Point file descriptors 1 and 2 at /dev/null for the block: C++ code prints straight to them (the legacy ONNX
    exporter its IR, the profiler its start and stop lines), past Python's redirection."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


@contextlib.contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run the block with torch's intra-op thread count set to ``count`` (None or 0: as it is), then restore it."""
    previous = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def device_of(values: Any, module: nn.Module | None = None) -> torch.device:
    """Where a model runs: the device of the first tensor in ``values`` (a pytree of inputs), else of ``module``'s
    first parameter or buffer, else the CPU. Inputs fxforge draws for a model go to this device."""
    for leaf in pytree.tree_leaves(values):
        if isinstance(leaf, torch.Tensor):
            return leaf.device
    if module is not None:
        for tensor in (*module.parameters(), *module.buffers()):
            return tensor.device
    return torch.device("cpu")


def use_ieee_float32() -> tuple[Any, ...]:
    """Make float32 convolutions and matmuls on CUDA compute in float32, not TF32, and return the settings before.

    cuDNN computes float32 convolutions in TF32 by default on Ampere and later GPUs, which moves a resnet18's
    outputs by ~1e-3 relative (measured on an H100): 10x float32's tolerance, so an exact rewrite such as
    BatchNorm folding would fail verification there. Verification runs both sides in IEEE float32.
    """
    cudnn_conv = getattr(torch.backends.cudnn, "conv", None)
    if getattr(cudnn_conv, "fp32_precision", None) is not None:  # torch 2.9+: per-backend precision settings
        previous: tuple[Any, ...] = ("precision", cudnn_conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision)
        cudnn_conv.fp32_precision = "ieee"
        torch.backends.cuda.matmul.fp32_precision = "ieee"
    else:
        previous = ("allow_tf32", torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    return previous


def _restore_float32(previous: tuple[Any, ...]) -> None:
    kind, conv, matmul = previous
    if kind == "precision":
        torch.backends.cudnn.conv.fp32_precision = conv
        torch.backends.cuda.matmul.fp32_precision = matmul
    else:
        torch.backends.cudnn.allow_tf32 = conv
        torch.backends.cuda.matmul.allow_tf32 = matmul


@contextlib.contextmanager
def ieee_float32() -> Iterator[None]:
    """Run the block with float32 computed as float32 on CUDA (:func:`use_ieee_float32`), then restore."""
    previous = use_ieee_float32()
    try:
        yield
    finally:
        _restore_float32(previous)


def wait_for_device(values: Any) -> None:
    """Wait until the GPU that ``values`` (a pytree of inputs) live on has finished its queued work: a call on
    CUDA returns when its kernels are queued, so a timer must wait for them. Nothing to wait for on the CPU."""
    for leaf in pytree.tree_leaves(values):
        if isinstance(leaf, torch.Tensor) and leaf.device.type == "cuda":
            torch.cuda.synchronize(leaf.device)
            return
