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
constants. Both run under the same random seed, so that random ops (``torch.rand_like``, dropout in
training mode) draw the same numbers in each; a model whose own outputs still differ between two calls
is reported as random rather than blamed on the trace. The returned graph shares parameters with the
original model; nothing here changes them, nor the caller's random state.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import difflib
import functools
import inspect as pyinspect
import io
import itertools
import linecache
import operator
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch.fx import _symbolic_trace as fx_tracer
from torch.fx.passes.shape_prop import ShapeProp

from fxforge import display
from fxforge.artifacts import AotiModule, CompiledModule, OnednnFusion, OnnxRuntimeModule, StructuredOutputs
from fxforge.compare import compare_outputs
from fxforge.errors import (
    DECORATOR_FILES,
    CaptureError,
    FxforgeError,
    InputSpecError,
    ModelSpecError,
    caller_location,
    is_user_file,
    one_line_reason,
    option,
    own_call_site,
    said,
    user_code,
    user_location,
    with_article,
)
from fxforge.graphs import (
    ATEN,
    TORCH,
    MethodCall,
    MutableArguments,
    called_parameters,
    dialect_of,
    draws_random_numbers,
    is_var_keyword,
    outside_torch,
    reads_metadata_only,
    runs_hooks,
    submodule,
)
from fxforge.inputs import make_inputs, specs_of
from fxforge.models import TRUST_PICKLE_ENV, LoadedModel
from fxforge.references import as_names
from fxforge.runtime import (
    batch_narrowed_at,
    batch_of,
    buffer_versions,
    buffers_snapshot,
    changed_buffers,
    cloned,
    device_of,
    export_program,
    export_program_any_batch,
    forget_unloadable_fx_wraps,
    keeps_rng_state,
    preserved_state,
    quiet_torch_logs,
    rng_preserved,
    run_isolated,
    run_reference,
    unprovided_defaults,
    with_batch,
    with_batch_kwargs,
    written_buffers,
)

SYMBOLIC_TRACE = "symbolic_trace"
RANDOM_NOTE = "the model is random"  # how a capture note says two calls on one input differ
EXPORT = "torch.export"
LOADED = "loaded"  # the model was already a graph (a .pt2 program or a saved GraphModule)


@dataclass
class Attempt:
    """One failed try: what was tried, why it failed, and at which line of the user's code."""

    strategy: str
    error: str
    location: str | None = None
    action: str | None = None  # what fxforge did about it ("leaf layer1.0", "wrap helpers.norm")

    def where(self) -> str:
        """Where it stopped, for "it stopped{where}": at the user's line, or, with none to name (transformers'
        ``**kwargs`` forward), with its error (QA: "it stopped)" said nothing)."""
        return f" at {self.location}" if self.location else f" with {self.error}"


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
    # the constructor/config arguments the model was built with (``--model-arg``), as text: an output directory
    # then says which configuration of a model it was written from (a diff against another one draws nonsense)
    model_args: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def trace_failure(self) -> Attempt | None:
        """The first symbolic_trace attempt that failed, where the graph came from another capture (None: symbolic
        tracing was never tried, or it made the graph): advice to capture with it would send the user to a failure."""
        if self.method == SYMBOLIC_TRACE:
            return None
        return next((a for a in self.attempts if a.strategy == SYMBOLIC_TRACE), None)

    @property
    def random(self) -> bool:
        """Whether capture found that two calls of the model on one input differ (its notes say so): an error
        measured against it then holds its own randomness."""
        return any(RANDOM_NOTE in note for note in self.notes)


def model_args_text(model_kwargs: Mapping[str, Any] | None) -> dict[str, str]:
    """Constructor/config arguments as :attr:`~fxforge.capture.CaptureRecord.model_args` records them."""
    return {str(key): str(value) for key, value in sorted((model_kwargs or {}).items())}


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

    def __repr__(self) -> str:
        return display.captured_repr(self)

    def _repr_html_(self) -> str:  # Jupyter shows this for the last value of a cell
        return display.captured_html(self)

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
        if is_var_keyword(node.target):
            # ``**kwargs``: its keywords are placeholders of their own; the Interpreter gives it what is left of
            # the positional values, which is nothing (a transformers ``forward(pixel_values, ..., **kwargs)``)
            continue
        name = str(node.target).lstrip("*")
        if i < len(args):
            values.append(args[i])
        elif name in kwargs:
            values.append(kwargs[name])
        elif node.args:
            values.append(node.args[0])  # the parameter's default value
        else:
            one_more = option("--input", python="input")
            raise InputSpecError(f"the model needs an input for {name!r}; pass one more {one_more}")
    return values


# --------------------------------------------------------------------------------------------------
# symbolic tracing with leaves


_TRACE_CODE = fx.Tracer.trace.__code__
# gm.meta key: buffers written in place to the value they had, whose write the graph does not record
UNRECORDED_WRITES = "fxforge_unrecorded_buffer_writes"


class _OrderedDictOutput(fx.graph.CodeGen):
    """Generated code that returns the graph's output dict as the ``collections.OrderedDict`` (or subclass of it)
    the model returned: torch.fx turns every dict it traces into a plain one. torchvision's segmentation models
    return an OrderedDict, transformers models a ``ModelOutput`` (an OrderedDict subclass whose fields are its keys:
    ``out.last_hidden_state`` failed on the plain dict, QA); verify then warned that the type differs. The graph
    keeps its plain dict, so passes see the usual output node. torch.export keeps the type (model.pt2); a
    GraphModule pickled and loaded again is traced anew by torch from its code and returns a plain dict
    (docs/capture.md)."""

    def __init__(self, output_type: type = collections.OrderedDict) -> None:
        super().__init__()
        self.output_type = output_type

    def additional_globals(self) -> list[tuple[str, Any]]:
        if self.output_type is collections.OrderedDict:
            return [("collections", collections)]
        return [(self.output_type.__name__, self.output_type)]  # torch imports it from its module when reloading

    def generate_output(self, output_args: Any, **kwargs: Any) -> str:
        statement = super().generate_output(output_args, **kwargs).removeprefix("return ")
        if self.output_type is collections.OrderedDict:
            return f"return collections.OrderedDict({statement})"
        return f"return {self.output_type.__name__}(**{statement})"

    def process_outputs(self, outputs: Any) -> Any:
        # what an Interpreter over the graph returns (torch.export runs a GraphModule that way, not its code)
        return self.output_type(**outputs)


def _restorable_dict_type(kind: type | None) -> type | None:
    """``kind`` when it is an OrderedDict (or a subclass, such as transformers' ModelOutput) that generated code can
    name through its module and build from keywords, else None (a plain dict stays one)."""
    if kind is None or not issubclass(kind, collections.OrderedDict):
        return None
    module = sys.modules.get(kind.__module__)
    if module is None or "." in kind.__qualname__ or getattr(module, kind.__qualname__, None) is not kind:
        return None  # a class defined in a function, or shadowed in its module
    return kind


class _LeafTracer(fx.Tracer):
    def __init__(self, leaf_names: set[str], leaf_types: tuple[type, ...]) -> None:
        super().__init__()
        self.leaf_names = leaf_names
        self.leaf_types = leaf_types
        self.output_dict_type: type | None = None
        self._arg_depth = 0
        self._last_outer_arg_type: type | None = None

    def create_arg(self, a: Any) -> Any:
        # the outermost argument converted last, before the output node is made, is what forward returned
        self._arg_depth += 1
        try:
            return super().create_arg(a)
        finally:
            self._arg_depth -= 1
            if not self._arg_depth:
                self._last_outer_arg_type = type(a)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if module_qualified_name in self.leaf_names or (self.leaf_types and isinstance(m, self.leaf_types)):
            return True
        return super().is_leaf_module(m, module_qualified_name)

    def create_node(self, *args: Any, **kwargs: Any) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        if node.op == "output":
            self.output_dict_type = _restorable_dict_type(self._last_outer_arg_type)
        # The model's line that made the node, as torch.export records it (node.meta["stack_trace"]): a warning or
        # error raised while the captured graph runs then names that line, not the generated code's
        # (errors.graph_frame_source). Only the innermost frame of the user's code: torch.fx's own
        # record_stack_traces extracts and formats the whole stack per node and made capture 3x slower.
        frame = sys._getframe(1)
        while frame is not None and not is_user_file(frame.f_code.co_filename):
            # no further than the trace's start: a model in fxforge's own files (demo) got the CLI's caller,
            # click's line, which split then named as the place to cut (QA)
            frame = frame.f_back if frame.f_code is not _TRACE_CODE else None
        if frame is not None:
            code, lineno = frame.f_code, frame.f_lineno
            source = linecache.getline(code.co_filename, lineno).strip()
            node.meta["stack_trace"] = f'  File "{code.co_filename}", line {lineno}, in {code.co_name}\n    {source}\n'
        return node


@dataclass
class _Wrap:
    """A plain function called by name from ``caller_globals``, traced as one opaque call."""

    caller_globals: dict[str, Any]
    name: str
    function: Callable[..., Any]
    requested: bool = False  # the user asked for it (--wrap), rather than capture's retry loop
    # one label for every place a requested function is patched: as the model's code imported it
    shared_label: str = ""

    @property
    def label(self) -> str:
        return self.shared_label or _function_label(self.function, self.name)


@dataclass(frozen=True)
class _MethodWrap:
    """A method of one of the model's modules other than ``forward`` (``self.gate(x)``), traced as one call:
    the module (``owner``, its path in the model, "" for the model itself) and the method's name."""

    owner: str
    method: str
    label: str
    requested: bool = False  # the user asked for it (--wrap file.py:Block.gate), rather than the retry loop


def _requested_methods(
    functions: Iterable[Callable[..., Any]], model: nn.Module
) -> tuple[list[Callable[..., Any]], list[_MethodWrap]]:
    """The functions to wrap that are methods of the model's own modules (``--wrap file.py:Block.gate``), as one
    call per module that has them, and the other functions. Capture already keeps such a method as one call when it
    stops tracing; named by the user, it was looked up as a global and refused ("never calls it by name")."""
    plain: list[Callable[..., Any]] = []
    methods: list[_MethodWrap] = []
    for function in functions:
        name = getattr(function, "__name__", "")
        found = [
            _MethodWrap(path, name, f"{type(module).__name__}.{name}" if not path else f"{path}.{name}", True)
            for path, module in model.named_modules()
            if "." in getattr(function, "__qualname__", "")
            and name != "forward"
            and any(
                _same_function(pyinspect.unwrap(defined), function)
                for defined in (vars(cls).get(name) for cls in type(module).__mro__)
                if pyinspect.isfunction(defined)
            )
        ]
        if found:
            methods += found
        else:
            plain.append(function)
    return plain, methods


def _function_label(function: Any, name: str = "?") -> str:
    module = getattr(function, "__module__", "?") or "?"
    qualname = getattr(function, "__qualname__", name)
    if module.startswith("fxforge_user_"):  # a file fxforge imported (--wrap file.py:fn): named as the user wrote it
        return f"{module.removeprefix('fxforge_user_')}.py:{qualname}"
    return f"{module}.{qualname}"


def _wraps_for(function: Callable[..., Any], model: nn.Module) -> list[_Wrap]:
    """Every place the model's code can call ``function`` by name: the globals of its own module and of the
    modules that define the model's classes (``from helpers import norm`` binds ``norm`` in the caller's module,
    which is where the call is looked up). A function the model's code never names is an error."""
    if not callable(function):
        raise CaptureError(f"cannot wrap {function!r}: it is not a function")
    # the model's own modules first: the function as the model's code imported it names the wrap
    spaces = [getattr(type(m).forward, "__globals__", None) for m in model.modules()]
    spaces += [vars(sys.modules[type(m).__module__]) for m in model.modules() if type(m).__module__ in sys.modules]
    spaces.append(getattr(function, "__globals__", None))
    # the modules loaded from the function's own file: ``import helpers`` then ``helpers.norm(x)`` looks the name
    # up in that module, which is not the copy --wrap helpers.py:norm imported (the wrap changed nothing)
    spaces += [vars(module) for module in _modules_of_file(function)]
    found, seen = [], set()
    for space in spaces:
        if not isinstance(space, dict) or id(space) in seen:
            continue
        seen.add(id(space))
        found += [
            _Wrap(space, name, value, requested=True)
            for name, value in list(space.items())
            if _same_function(value, function)
        ]
    if not found:
        owner, _, name = getattr(function, "__qualname__", "").rpartition(".")
        if owner and "<" not in owner:  # a method; methods of the model's modules were taken before this
            raise CaptureError(
                f"cannot wrap {_function_label(function)}: "
                + (
                    f"it is the forward of {owner}: keep a module as one call with --leaf"
                    if name == "forward"
                    else f"it is a method of {owner}, and no module of this model is one"
                ),
                hint="--leaf names a submodule (e.g. layer1.0), --wrap a function or a method of the model's modules",
            )
        raise CaptureError(
            f"cannot wrap {_function_label(function)}: the model's code never calls it by name",
            hint="wrap the function the model's forward calls (as it is imported there)",
        )
    return [dataclasses.replace(wrap, shared_label=found[0].label) for wrap in found]


def _modules_of_file(function: Any) -> list[Any]:
    """The loaded modules whose file is the one ``function`` (or a code object) is defined in."""
    filename = getattr(getattr(function, "__code__", function), "co_filename", None)
    if not filename:
        return []
    try:
        source = Path(filename).resolve()
    except (OSError, ValueError):
        return []
    found = []
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and Path(file).name == source.name:  # resolve only the few that can match
            with contextlib.suppress(OSError, ValueError):
                if Path(file).resolve() == source:
                    found.append(module)
    return found


def _inside(name: str, leaves: set[str]) -> bool:
    """Whether module ``name`` is, or is inside, one of ``leaves``."""
    return any(name == leaf or name.startswith(leaf + ".") for leaf in leaves)


def _unused_wraps(wraps: Sequence[_Wrap], gm: fx.GraphModule | None) -> list[str]:
    """The functions the user asked to wrap that are no call in ``gm`` (None: torch.export, which traces through
    every function), so that --wrap never fails silently."""
    requested: dict[str, list[_Wrap]] = {}
    for wrap in wraps:
        if wrap.requested:
            requested.setdefault(wrap.label, []).append(wrap)
    if gm is None:
        return list(requested)
    # the call's target, and what it wraps: a function decorated with functools.wraps is called as itself (QA:
    # unwrapped only, it read as never called, and the note said wrapping it changed nothing)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    called = targets + [t.__wrapped__ for t in targets if hasattr(t, "__wrapped__")]
    return [
        label
        for label, group in requested.items()
        if not any(_same_function(target, wrap.function) for target in called for wrap in group)
    ]


def _same_function(value: Any, function: Callable[..., Any]) -> bool:
    """``value`` is ``function``, or the same source function imported a second time under another module name
    (``--wrap helpers.py:norm`` imports helpers.py itself, while the model's file did ``from helpers import norm``)."""
    if value is function:
        return True
    code, other = getattr(value, "__code__", None), getattr(function, "__code__", None)
    if code is None or other is None or getattr(value, "__qualname__", None) != getattr(function, "__qualname__", 0):
        return False
    try:
        same_file = Path(code.co_filename).resolve() == Path(other.co_filename).resolve()
    except (OSError, ValueError):
        return False
    return same_file and code.co_firstlineno == other.co_firstlineno


def _as_call_node(function: Callable[..., Any], target: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """``function``, recorded as one ``call_function`` node of ``target`` (``function`` itself by default) when
    called on proxies. Like torch.fx.wrap, but applied from outside the user's module and to private names too."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        proxies: list[fx.Proxy] = []
        fx.node.map_aggregate((args, kwargs), lambda v: proxies.append(v) if isinstance(v, fx.Proxy) else None)
        if proxies:
            return proxies[0].tracer.create_proxy("call_function", target or function, args, kwargs)
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


@contextlib.contextmanager
def _methods_patched(model: nn.Module, methods: Iterable[_MethodWrap]) -> Iterator[dict[Any, _MethodWrap]]:
    """While tracing, each method in ``methods`` is one call: shadowed on its module's instance by a function that
    records a call of a stand-in (yielded: stand-in -> method), which :func:`_methods_as_modules` then turns into a
    :class:`~fxforge.graphs.MethodCall`. The instances are as they were afterwards."""
    stand_ins: dict[Any, _MethodWrap] = {}
    saved: list[tuple[nn.Module, str, Any]] = []
    try:
        for wrap in methods:
            owner = model.get_submodule(wrap.owner)

            def stand_in(*args: Any, **kwargs: Any) -> Any:
                raise AssertionError("replaced by a MethodCall module after tracing")

            stand_in.__name__ = f"{wrap.method}_method"
            stand_ins[stand_in] = wrap
            saved.append((owner, wrap.method, vars(owner).get(wrap.method, _ABSENT)))
            # an instance attribute shadows the class's method (a non-data descriptor) for this instance only
            object.__setattr__(owner, wrap.method, _as_call_node(getattr(owner, wrap.method), stand_in))
            defining = _class_defining_static(type(owner), wrap.method)
            if defining is not None:
                # a static or class method is also called through its class (``Model.act(x)``), which the instance
                # attribute does not shadow (QA: that call still failed the capture). It computes the same for
                # every instance, so any instance's stand-in records it
                saved.append((defining, wrap.method, vars(defining)[wrap.method]))
                setattr(defining, wrap.method, _class_call_recorder(owner, vars(defining)[wrap.method], stand_in))
        yield stand_ins
    finally:
        for owner, name, original in reversed(saved):
            if isinstance(owner, type):
                setattr(owner, name, original)
            elif original is _ABSENT:
                vars(owner).pop(name, None)
            else:
                object.__setattr__(owner, name, original)


def _class_defining_static(cls: type, name: str) -> type | None:
    """The class of ``cls``'s MRO whose own ``name`` is the static or class method ``cls.name`` finds; None when
    ``cls.name`` is none (a plain method, which needs its instance)."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass if isinstance(vars(klass)[name], (staticmethod, classmethod)) else None
    return None


def _class_call_recorder(owner: nn.Module, method: Any, stand_in: Any) -> Any:
    """What the class of a static or class method holds while tracing: a call recorded on ``stand_in``. A class
    method called through another class than the instance's (``Base.gate(x)`` on a subclass) binds ``cls`` to that
    class, which the kept call would not (QA: a subclass's ``scale`` was read, a silently wrong graph): such a call
    runs the method as it is, traced (and fails loudly where it branches on a value)."""
    recorded = _as_call_node(method.__get__(None, type(owner)), stand_in)
    if isinstance(method, staticmethod):
        return staticmethod(recorded)

    def dispatch(klass: type, *args: Any, **kwargs: Any) -> Any:
        if klass is type(owner):
            return recorded(*args, **kwargs)
        return method.__get__(None, klass)(*args, **kwargs)

    return classmethod(dispatch)


_ABSENT = object()
_NOTHING_ELSE = " left nothing else in the graph"  # how an attempt says a method kept as one call did all the work


def _methods_as_modules(gm: fx.GraphModule, model: nn.Module, stand_ins: Mapping[Any, _MethodWrap]) -> None:
    """Replace the calls of :func:`_methods_patched`'s stand-ins in ``gm`` with ``call_module`` nodes of
    :class:`~fxforge.graphs.MethodCall` submodules (named ``<module>_<method>_method``), so that the graph runs,
    copies and saves as any other (a stand-in is a function of this trace, which nothing could reload)."""
    names: dict[_MethodWrap, str] = {}
    held = {id(module) for module in gm.modules()}  # what the graph holds, MethodCalls added below included
    for node in gm.graph.nodes:
        wrap = stand_ins.get(node.target) if node.op == "call_function" else None
        if wrap is None:
            continue
        if wrap not in names:
            base = "_".join(filter(None, (wrap.owner.replace(".", "_"), wrap.method, "method")))
            name = next(f"{base}{k or ''}" for k in itertools.count() if not hasattr(gm, f"{base}{k or ''}"))
            owner = model.get_submodule(wrap.owner)
            if id(owner) in held:
                call = MethodCall(owner, wrap.method, registered=False)
            else:
                call = MethodCall(_shell(owner, held), wrap.method)
            gm.add_submodule(name, call)
            held |= {id(module) for module in call.modules()}
            names[wrap] = name
        node.op, node.target = "call_module", names[wrap]
    if names:
        gm.recompile()


def _shell(module: nn.Module, held: set[int]) -> nn.Module:
    """A copy of the instance ``module`` for a :class:`~fxforge.graphs.MethodCall` to call its method on: its own
    dicts are new, its tensors and other values shared; a submodule the graph holds (``held``: ids) is a plain
    attribute, so that it has one name (the graph's), and one holding such a submodule is a shell in turn. Its
    other submodules and its own weights, which only the method can read, stay registered."""
    shell = type(module).__new__(type(module))
    state = {key: copy.copy(value) if isinstance(value, (dict, set)) else value for key, value in vars(module).items()}
    state["_modules"] = {}
    vars(shell).update(state)
    for name, child in module._modules.items():
        if child is not None and id(child) in held:
            vars(shell)[name] = child  # found by attribute lookup before nn.Module's __getattr__ is asked
        elif child is not None and any(id(inner) in held for inner in child.modules()):
            shell._modules[name] = _shell(child, held)
        else:
            shell._modules[name] = child
    return shell


def _only_method_calls(gm: fx.GraphModule) -> bool:
    """Whether every computing node of ``gm`` is a :class:`~fxforge.graphs.MethodCall` (or takes an item of one's
    result): the wrapped method did all of the model's work, and the graph would show nothing of it."""
    computing = [n for n in gm.graph.nodes if n.op in ("call_module", "call_function", "call_method")]
    method_calls = {n for n in computing if n.op == "call_module" and isinstance(submodule(gm, n), MethodCall)}
    return bool(method_calls) and all(
        n in method_calls or (n.target is operator.getitem and n.args[0] in method_calls) for n in computing
    )


@contextlib.contextmanager
def wrapped_calls_kept(gm: fx.GraphModule) -> Iterator[None]:
    """While ``gm`` is traced again (FX quantization's ``prepare_fx`` traces the captured graph), its calls of
    wrapped functions stay single calls: traced into, timm's "same" padding branched on a size again and every
    such model failed to quantize (QA)."""
    functions = {
        id(node.target): node.target
        for node in gm.graph.nodes
        if node.op == "call_function" and outside_torch(node.target)
    }
    space = getattr(gm.forward, "__globals__", {})
    # a second trace of a graph with an input specialized to None (timm's ViT) raised KeyError on torch's dotted
    # wrap name: quantize --sensitivity or --float-layer (a probe trace, then the quantization's) failed so
    forget_unloadable_fx_wraps()
    # a function torch.fx.wrap registered in these globals (the graph's code calls wrap() for each) is kept whole by
    # the tracer itself; patched here as well, torch's patch wrapped ours and the graph called our wrapper, which
    # torch.save could not name (QA: quantize of a model with torch.fx.wrap("my_fn"), timm's ViT without fused
    # attention: ObjMismatchError, exit 4)
    registered = fx_tracer._wrapped_fns_to_patch
    wraps = [
        _Wrap(space, name, value)
        for name, value in list(space.items())
        if id(value) in functions and (id(space), name) not in registered
    ]
    with _patched(wraps):
        yield


class BufferWriteError(RuntimeError):
    """``forward`` assigns a traced value to a buffer (``self.count += 1``): symbolic tracing records the
    arithmetic but not the assignment, so the graph would silently stop updating the buffer."""

    def __init__(self, buffer: str, location: str | None) -> None:
        where = f" at {location}" if location else ""
        super().__init__(
            f"forward assigns buffer {buffer!r}{where}, a write symbolic tracing cannot record "
            "(torch.export records it)"
        )
        self.buffer = buffer
        self.location = location


@contextlib.contextmanager
def _buffer_assignments_refused(model: nn.Module) -> Iterator[None]:
    """While tracing with proxied buffers, turn ``self.<buffer> = <Proxy>`` into :class:`BufferWriteError`."""
    names = {id(m): name for name, m in model.named_modules()}
    original_setattr = nn.Module.__setattr__

    def guarded_setattr(module: nn.Module, name: str, value: Any) -> None:
        if isinstance(value, fx.Proxy) and name in module.__dict__.get("_buffers", {}) and id(module) in names:
            qualified = f"{names[id(module)]}.{name}".lstrip(".")
            raise BufferWriteError(qualified, caller_location())
        original_setattr(module, name, value)

    nn.Module.__setattr__ = guarded_setattr  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.__setattr__ = original_setattr  # type: ignore[method-assign]


def _symbolic_trace(
    model: nn.Module,
    leaf_names: set[str],
    leaf_types: tuple[type, ...],
    wraps: list[_Wrap],
    concrete_args: dict[str, Any] | None,
    proxy_buffers: bool = False,
    methods: Sequence[_MethodWrap] = (),
) -> fx.GraphModule:
    forget_unloadable_fx_wraps()  # a GraphModule loaded earlier in the process may have left one
    tracer = _LeafTracer(leaf_names, leaf_types)
    tracer.proxy_buffer_attributes = proxy_buffers
    snapshot = buffers_snapshot(model)
    versions = buffer_versions(model)
    refuse_buffer_writes = _buffer_assignments_refused(model) if proxy_buffers else contextlib.nullcontext()
    # preserved_state: a failed trace must leave the user's module as it was (a leaked Proxy in a buffer
    # made every later model(x) return a Proxy), and tracing runs ops on real buffers eagerly.
    with preserved_state(model, runs=False):
        with _patched(wraps), refuse_buffer_writes, _methods_patched(model, methods) as stand_ins:
            graph = tracer.trace(model, concrete_args=concrete_args)
        # a buffer written in place in forward (a call counter) changed, and the write is missing from the graph;
        # or it was written to the value it had (a running mean of zeros scaled by 0.9, QA), which its version
        # counter tells: the write ran once while tracing and is missing from the graph all the same
        changed = changed_buffers(model, snapshot)
        written_alike = [] if changed else written_buffers(model, versions)
        if not changed:
            # Forget our tracer class: GraphModule pickles it and would need fxforge (and its arguments) to reload.
            graph._tracer_cls = None
            graph._tracer_extras = None
            # A module written with ``from __future__ import annotations`` annotates forward with strings
            # ("torch.Tensor"), which fx keeps as the nodes' types; torch 2.11 then cannot pickle the GraphModule
            # (model.pt: "'str' object has no attribute '__name__'"; 2.14 can). Types are only annotations.
            for node in graph.nodes:
                if isinstance(node.type, str):
                    node.type = None
            _drop_unused_attribute_reads(graph)
            if tracer.output_dict_type is not None:
                graph.set_codegen(_OrderedDictOutput(tracer.output_dict_type))
            # Built before the state is restored: tracing stores tensor constants (``_tensor_constant0``) on the
            # root, and the GraphModule takes them from there.
            gm = fx.GraphModule(tracer.root, graph, model.__class__.__name__)
            _methods_as_modules(gm, model, stand_ins)
    if changed:
        if not proxy_buffers:  # trace again with buffers as proxies, so that the write is recorded
            return _symbolic_trace(model, leaf_names, leaf_types, wraps, concrete_args, True, methods)
        raise BufferWriteError(changed[0], None)
    if written_alike and not proxy_buffers:
        try:
            return _symbolic_trace(model, leaf_names, leaf_types, wraps, concrete_args, True, methods)
        except Exception:
            # with buffers as proxies, Python use of one (a branch on a flag buffer) fails: the first trace stands,
            # as it did before the write was seen (QA: a clamp_ within range made such a model uncapturable), and
            # the record says what it lacks
            gm.meta[UNRECORDED_WRITES] = written_alike
    if not proxy_buffers and _holds_tensor_constants(gm) and next(model.buffers(), None) is not None:
        # By default tracing reads buffers as the tensors they are: arithmetic on a buffer alone (``self.s * 3``,
        # ``0.9 * self.mean``) ran while tracing and is a constant in the graph, which goes stale when the buffer
        # changes (a loaded state dict, a running statistic updated in place: the graph's second call differed
        # from the model's, QA). With buffers as proxies that arithmetic is recorded on the buffer.
        with contextlib.suppress(Exception):  # e.g. a branch on a buffer's value: the constants stay
            return _symbolic_trace(model, leaf_names, leaf_types, wraps, concrete_args, True, methods)
    if concrete_args:
        _name_concrete_placeholders(gm, model, concrete_args)
    return gm


def _holds_tensor_constants(gm: fx.GraphModule) -> bool:
    """Whether tracing stored tensors it computed as constants (``_tensor_constant0``) in ``gm``."""
    return any(n.op == "get_attr" and str(n.target).startswith("_tensor_constant") for n in gm.graph.nodes)


def _drop_unused_attribute_reads(graph: fx.Graph) -> None:
    """Erase traced reads of a tensor's metadata (``x.ndim``, ``x.size()``) that no node uses. Formatting a Proxy
    into a message records the read as a node nothing uses: timm's BatchNormAct2d checks ``_assert(x.ndim == 4,
    f"expected 4D input (got {x.ndim}D input)")``, and every such layer left an unused ``getattr(x, 'ndim')``, which
    lint reported as dead code (34 warnings, exit 1, on timm's mobilenetv3) that the user's code does not have."""
    for node in reversed(list(graph.nodes)):
        # an element of a shape nothing uses, as ``B, N, C = x.shape`` leaves for an unused C, goes first
        element = node.op == "call_function" and node.target is operator.getitem and node.args
        if not node.users and (_reads_metadata(node) or (element and _reads_metadata(node.args[0]))):
            graph.erase_node(node)


def _reads_metadata(value: Any) -> bool:
    return isinstance(value, fx.Node) and bool(value.args) and reads_metadata_only(value, value.args[0])


def _name_concrete_placeholders(gm: fx.GraphModule, model: nn.Module, concrete_args: dict[str, Any]) -> None:
    """Give the placeholders of concrete args their parameter's name back, with the concrete value as default.

    ``symbolic_trace`` renames them (``flag`` becomes ``flag_1``, defaulting to the original default) and asserts
    the concrete value, so the graph rejected ``gm(x, flag=False)`` and, called as ``gm(x)``, failed its own
    assertion. fxforge passes concrete args as keywords to the model and the graph alike.
    """
    parameters = list(pyinspect.signature(model.forward).parameters)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for parameter, node in zip(parameters, placeholders):
        if parameter in concrete_args and str(node.target) != parameter:
            node.target = parameter
            node.args = (concrete_args[parameter],)
    gm.recompile()


def _find_culprit(
    exc: BaseException,
    root: nn.Module,
    module_names: dict[int, str],
    leaf_names: set[str],
    wraps: list[_Wrap],
    methods: Sequence[_MethodWrap] = (),
) -> str | _Wrap | _MethodWrap | None:
    """The submodule name, helper function or method whose code raised ``exc``, innermost first."""
    frames = list(traceback.walk_tb(exc.__traceback__))
    wrapped_functions = {id(w.function) for w in wraps}
    for index in range(len(frames) - 1, -1, -1):
        frame, _ = frames[index]
        owner = _bound_self(frame)
        if isinstance(owner, nn.Module) and id(owner) in module_names:
            name = module_names[id(owner)]
            method = _method_to_wrap(frame, frames[index - 1][0] if index else None, owner, name, methods)
            # a leaf is called through its forward: a method called from outside its module (self.block.gate(x))
            # runs as traced code whatever its module is
            called_from_outside = method is not None and _bound_self(frames[index - 1][0]) is not owner
            if name and name not in leaf_names and not called_from_outside:
                return name
            if method is not None:
                return method
            if name == "":
                return None  # the failure is in the root's own forward: no leaf can help
            continue
        code = frame.f_code
        if not is_user_file(code.co_filename) or index == 0:
            continue
        caller = index - 1
        while caller > 0 and frames[caller][0].f_code.co_filename.endswith(DECORATOR_FILES):
            caller -= 1  # a decorator's frames (@torch.no_grad()): the call is in the frame before them
        static = _static_method_to_wrap(frame, frames[caller][0], module_names, leaf_names, methods)
        if static is not None:
            return static
        function = frame.f_globals.get(code.co_name)
        # a decorated function (torchvision's make_grid under torch.no_grad()) is the wrapper by its name
        unwrapped = pyinspect.unwrap(function) if callable(function) else function
        if getattr(unwrapped, "__code__", None) is not code or id(function) in wrapped_functions:
            continue
        caller = index - 1
        while caller > 0 and frames[caller][0].f_code.co_filename.endswith(DECORATOR_FILES):
            caller -= 1  # the decorator's own frames: the call is in the frame before them
        caller_globals = frames[caller][0].f_globals
        if caller_globals.get(code.co_name) is function:
            return _Wrap(caller_globals, code.co_name, function)
    return None


def _bound_self(frame: Any) -> Any:
    """The object a method's frame runs on: its ``self``, whatever the method names it (``def forward(s, x)``, QA:
    such a model's methods were never kept as one call). A first argument not named ``self`` counts only where the
    frame's code is a method of that argument's class, so a helper taking a module first (``def f(block, x)``) is
    not taken for the module's own code."""
    code = frame.f_code
    if not code.co_argcount:
        return None
    first = frame.f_locals.get(code.co_varnames[0])
    if code.co_varnames[0] == "self":
        return first
    if not isinstance(first, nn.Module):
        return None
    for cls in type(first).__mro__:
        for value in vars(cls).values():
            if callable(value) and getattr(pyinspect.unwrap(value), "__code__", None) is code:
                return first
    return None


def _method_to_wrap(
    frame: Any, caller: Any, owner: nn.Module, name: str, methods: Sequence[_MethodWrap]
) -> _MethodWrap | None:
    """The method ``frame`` runs, to be traced as one call, where it is a method of ``owner`` other than forward,
    called by name from code (the caller's frame) and not wrapped already; None otherwise."""
    code = frame.f_code
    if caller is None or code.co_name == "forward" or _bound_self(frame) is not owner:
        return None
    defined = (vars(cls).get(code.co_name) for cls in type(owner).__mro__)
    # the method as a class defines it (a base class's, reached by super(); undecorated: @torch.no_grad())
    if not any(getattr(pyinspect.unwrap(f), "__code__", None) is code for f in defined if callable(f)):
        return None  # a nested function, a static method, a method reached some other way
    if any(m.owner == name and m.method == code.co_name for m in methods):
        return None
    label = f"{type(owner).__name__}.{code.co_name}" if not name else f"{name}.{code.co_name}"
    return _MethodWrap(name, code.co_name, label)


def _static_method_to_wrap(
    frame: Any, caller: Any, module_names: dict[int, str], leaf_names: set[str], methods: Sequence[_MethodWrap]
) -> str | _MethodWrap | None:
    """The static or class method ``frame`` runs, called from its own module's code (``self.act(x)``,
    ``Model.act(x)``), as :func:`_method_to_wrap` takes a method (QA: a @staticmethod with a branch on a value failed
    the capture, where the same code as a method was kept as one call); the module's name where it is a submodule to
    make a leaf first."""
    owner = _bound_self(caller)
    if not isinstance(owner, nn.Module) or id(owner) not in module_names:
        return None
    code = frame.f_code
    defined = (vars(cls).get(code.co_name) for cls in type(owner).__mro__)
    if not any(
        isinstance(f, (staticmethod, classmethod)) and getattr(pyinspect.unwrap(f.__func__), "__code__", None) is code
        for f in defined
    ):
        return None
    name = module_names[id(owner)]
    if name and name not in leaf_names:
        return name
    if any(m.owner == name and m.method == code.co_name for m in methods):
        return None
    label = f"{type(owner).__name__}.{code.co_name}" if not name else f"{name}.{code.co_name}"
    return _MethodWrap(name, code.co_name, label)


# --------------------------------------------------------------------------------------------------
# randomness

# The seed the model and the captured graph both run under in the output checks: random ops then draw the same
# numbers in each, as long as the graph calls them in the model's order (which tracing and exporting keep).
CHECK_SEED = 0

_RANDOM_MODULES = (nn.modules.dropout._DropoutNd, nn.RReLU)
# insert_after's noise modules, known by the marker they carry (``fxforge_insert``) or, in an ATen graph, by the
# class in the ``nn_module_stack`` of their random op; named rather than imported, as the passes import capture.
_INSERT_MARKER = "fxforge_insert"
_NOISE_CLASSES = ("fxforge.passes.insert_after.GaussianNoise", "fxforge.passes.insert_after.LaplaceNoise")
NOISE_SOURCE = "noise inserted by insert_after"


def _inserted_noise(module: nn.Module) -> bool:
    info = getattr(module, _INSERT_MARKER, None)
    return isinstance(info, dict) and info.get("kind") == "noise"


def _noise_site(node: fx.Node) -> str | None:
    """The path of the insert_after noise module whose code made ``node`` (an ATen graph's ``normal_``), or None."""
    stack = node.meta.get("nn_module_stack") or {}
    for path, owner in reversed(list(stack.values())):
        if (owner if isinstance(owner, str) else getattr(owner, "__module__", "") + "." + owner.__qualname__) in (
            _NOISE_CLASSES
        ):
            return path
    return None


def random_sources(gm: fx.GraphModule) -> list[str]:
    """What in ``gm`` may draw random numbers: random calls (``rand_like``), dropout in training mode and the noise
    insert_after inserted, as named in the notes. Static and conservative: :func:`_differs_on_rerun` says whether
    the model is random."""
    found = []
    for node in gm.graph.nodes:
        if node.op == "call_module":
            try:
                module = gm.get_submodule(str(node.target))
            except AttributeError:
                continue
            # a graph in eval mode stays random with insert_after's noise: "call model.eval()" would not help (QA)
            found += [f"{NOISE_SOURCE} ({node.target})" for sub in module.modules() if _inserted_noise(sub)][:1]
            found += [
                f"{'dropout' if isinstance(sub, nn.modules.dropout._DropoutNd) else 'RReLU'} in training mode"
                for sub in module.modules()
                if sub.training and isinstance(sub, _RANDOM_MODULES)
            ]
        elif node.op in ("call_function", "call_method"):
            target = node.target
            if isinstance(target, torch._ops.OpOverload):
                name = target._overloadpacket.__name__
            else:
                name = target if isinstance(target, str) else getattr(target, "__name__", "")
            if not draws_random_numbers(name):
                continue
            site = _noise_site(node)
            if site is not None:
                found.append(f"{NOISE_SOURCE} ({site})")
            elif "dropout" in name:
                # F.dropout(x, p, training), aten.dropout(x, p, train): only a training-mode call draws
                positional = node.args[2] if len(node.args) > 2 else True
                training = node.kwargs.get("training", node.kwargs.get("train", positional))
                if training is False:
                    continue
                found.append("dropout in training mode")
            else:
                found.append(name)
    return list(dict.fromkeys(found))


def _seeded_reference(captured: Captured, seed: int, args: Sequence[Any] | None = None, kwargs: Any = None) -> Any:
    args = captured.example_inputs if args is None else args
    kwargs = captured.example_kwargs if kwargs is None else kwargs
    with rng_preserved(seed):
        return run_reference(captured.original, args, kwargs, captured.graph_module)


def _differs_on_rerun(captured: Captured, reference: Any, seed: int) -> bool:
    """Whether the model, run again on the example inputs under ``seed``, gives other outputs than ``reference``
    (its run under :data:`CHECK_SEED`)."""
    again = _seeded_reference(captured, seed)
    return not compare_outputs(reference, again, allow_nonfinite=True).ok


def randomness_hint(sources: Sequence[str], model: Any = None) -> str:
    sites = [s.removeprefix(f"{NOISE_SOURCE} (").removesuffix(")") for s in sources if s.startswith(NOISE_SOURCE)]
    if sites:
        # random by design, in eval mode too: model.eval() is no advice for it, only for the other sources
        others = [s for s in sources if not s.startswith(NOISE_SOURCE)]
        also = f"; it also has {', '.join(others)}" if others else ""
        return f"{NOISE_SOURCE} ({', '.join(sites)}) draws new noise on every call, by design{also}"
    if any("training mode" in source for source in sources):
        return f"{' and '.join(s for s in sources if 'training mode' in s)}: call model.eval() for inference"
    if sources:
        return f"it calls {', '.join(sources)}"
    if getattr(model, "training", False):
        return "training mode? call model.eval()"
    # no torch random op in the graph and the model is in eval mode: numpy's or Python's random numbers in
    # forward, which tracing records as one constant
    return (
        "no random op of torch's is in the graph: its forward draws random numbers outside torch (numpy, Python's "
        "random) or reads Python state that changes from call to call (a global counter, the time), which the "
        "captured graph holds as the constant it had while tracing"
    )


def _batch_one_check(captured: Captured, check_batch: int) -> OutputCheck | None:
    """The check at batch 1 of a graph captured for any batch, where it runs there: torch.export assumes a dynamic
    size is at least 2, so ``if x.shape[0] == 1:`` in the model's code was traced as False with no guard, and the
    graph ran batch 1 without the branch, checked at the example's batch and ``check_batch`` alone (QA). None where
    batch 1 was checked already, or where the graph (or the model) refuses it: a refusal is no wrong answer."""
    example_batch = batch_of(captured.example_inputs)
    if example_batch is None or 1 in (example_batch, check_batch):
        return None
    try:
        check = check_capture(captured, 1)
    except Exception:  # the model itself refuses batch 1 (BatchNorm in training mode)
        return None
    return None if check.message.startswith("captured graph failed to run") else check


def _batch_refused(exc: InputSpecError, captured: Captured, check_batch: int) -> InputSpecError:
    """The model itself failing at the ``--check-batch`` size, said as such: it read "the model rejected the example
    inputs (3x3x8x8)" with a hint to change --input, which was not what failed (QA)."""
    reason = re.sub(r"^the model rejected the example inputs \([^)]*\): ", "", exc.message)
    fixed = re.search(r"the model takes batch (\d+) only", exc.hint or "")
    holds = (
        f"the model takes batch {fixed.group(1)} only (a program exported for that batch size): export it again with "
        "a dynamic batch"
        if fixed
        else "the model's code holds its batch size (a literal size in a view or reshape?): derive it from the input "
        "(x.size(0))"
    )
    leaves = torch.utils._pytree.tree_leaves(captured.example_inputs)
    example = next((t for t in leaves if isinstance(t, torch.Tensor)), None)
    batch = f"; the example inputs are batch {example.shape[0]}" if example is not None and example.dim() else ""
    return InputSpecError(
        f"the model rejects batch {check_batch} ({option('--check-batch', check_batch)}{batch}): {reason}",
        hint=f"{holds}, or capture without {option('--check-batch')}",
    )


def _check(captured: Captured, reference: Any, check_batch: int | None) -> bool:
    """Fill ``captured.record.checks`` (model and graph under the same seed) and say whether the graph passed.

    A model whose random ops make two calls differ gets a note; one whose outputs differ between two calls even
    under the same seed cannot be compared with any graph: its checks are dropped, with a note, and the graph is
    not blamed (True). False: the graph computes something else than a model that repeats itself.
    """
    record = captured.record
    if reference is None:
        reference = _seeded_reference(captured, CHECK_SEED)
    record.checks = [check_capture(captured, expected=reference)]
    if check_batch is not None:
        try:
            record.checks.append(check_capture(captured, check_batch))
        except InputSpecError as exc:
            raise _batch_refused(exc, captured, check_batch) from None
        batch_one = _batch_one_check(captured, check_batch)
        if batch_one is not None:
            record.checks.append(batch_one)
    sources = random_sources(captured.graph_module)
    if record.ok:
        if sources and _differs_on_rerun(captured, reference, CHECK_SEED + 1):
            why = randomness_hint(sources, captured.original)
            record.notes.append(
                f"{RANDOM_NOTE}: two calls on the same input differ ({why}); "
                "the output check ran the model and the graph under the same random seed"
            )
        return True
    if not _differs_on_rerun(captured, reference, CHECK_SEED):
        return False
    failed = next(c for c in record.checks if not c.ok)
    why = randomness_hint(sources, captured.original)
    record.checks = []
    record.notes.append(
        f"output check skipped: {RANDOM_NOTE}: two calls on the same input differ, even under the same "
        f"random seed ({why}), so no captured graph can be compared with it "
        f"(model vs graph: max abs err {failed.max_abs_err:.3g})"
    )
    return True


# --------------------------------------------------------------------------------------------------
# checks


def _on_meta(model: nn.Module, inputs: Sequence[Any]) -> bool:
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    tensors += [p for p in model.parameters()][:1]
    return any(t.device.type == "meta" for t in tensors)


def check_capture(captured: Captured, batch: int | None = None, expected: Any = None) -> OutputCheck:
    """Run original and captured module on the example inputs (resized to ``batch``) and compare.

    Both run under :data:`CHECK_SEED` (``expected``, when given, must have too), so that random ops draw the same
    numbers in each; the caller's random state is left as it was.
    """
    args = captured.example_inputs if batch is None else with_batch(captured.example_inputs, batch)
    kwargs = captured.example_kwargs
    if batch is not None:  # keyword tensors (masks) share the batch dimension, as torch.export assumes too
        kwargs = with_batch_kwargs(kwargs, batch)
    if expected is None:
        expected = _seeded_reference(captured, CHECK_SEED, args, kwargs)
    try:
        with rng_preserved(CHECK_SEED):
            actual = run_isolated(captured.graph_module, args, kwargs, captured.original)
    except Exception as exc:
        where = batch_narrowed_at(captured.exported_program) if batch is not None else None
        # the guard says which batch the graph holds for, not why: the line that fixed it does (QA: len(x.squeeze()))
        fixed_by = f"; torch.export fixed the batch size at {where}" if where else ""
        return OutputCheck(
            batch, False, float("inf"), f"captured graph failed to run: {one_line_reason(exc)}{fixed_by}"
        )
    # NaN matches NaN here: a model whose outputs are all NaN was said to differ from both its graphs "by 0" and to
    # compute Python values from tensors (QA); verify, later, says there is nothing to compare
    comparison = compare_outputs(expected, actual, allow_nonfinite=True)
    said = comparison.problems if not comparison.ok else comparison.warnings  # a match says what it could not see
    return OutputCheck(batch, comparison.ok, comparison.max_abs_err, "; ".join(said[:3]))


# --------------------------------------------------------------------------------------------------
# public entry point


def compiled_form(model: nn.Module) -> str | None:
    """What ``model`` is when it runs compiled code, not Python (``"a TorchScript module"``, an ONNX Runtime session,
    an AOTInductor package), or None: such a model has no Python forward to trace, nor submodule calls that run
    Python hooks."""
    if isinstance(model, StructuredOutputs):
        # what it restores the structure of: a TorchScript file, or a split directory's model.pt2, whose program
        # is captured as any .pt2 is (QA: `inspect SPLIT_DIR` was refused as "a TorchScript module")
        inner = model.scripted
        return compiled_form(inner) if isinstance(inner, nn.Module) else "a TorchScript module"
    if isinstance(model, (torch.jit.ScriptModule, OnednnFusion)):
        return "a TorchScript module"
    if isinstance(model, OnnxRuntimeModule):
        return "an ONNX model (run by ONNX Runtime)"
    if isinstance(model, AotiModule):
        return "an AOTInductor package (compiled code)"
    return None


def refuse_compiled_forms(model: nn.Module, pickle_passed_over: str | None = None) -> None:
    """A compiled form (:func:`compiled_form`) has no Python forward to trace: say so plainly, instead of reporting
    whatever tracing trips over first inside it (tracing into a package printed a C++ error, then blamed
    data-dependent control flow). ``pickle_passed_over``: the pickled graph beside it in the directory, which the
    opt-in would have loaded (a quantize output's model.pt, QA)."""
    kind = compiled_form(model)
    if kind is None:
        return
    hint = (
        "inspect, lint or optimize the PyTorch model it was made from; verify compares it with that model "
        "(fxforge verify MODEL FILE), bench times it next to it (fxforge bench MODEL --artifact FILE)"
    )
    if pickle_passed_over:
        # the opt-in is what is missing, as for a directory whose only model is the pickle (a QAT output): bad
        # input, exit 2, not a model that cannot be captured (was exit 3)
        raise ModelSpecError(
            f"the directory's fx graph is {pickle_passed_over}, a pickled module, loaded only with "
            f"{option('--trust-pickle', True)} (unpickling can run arbitrary code); without it there is {kind}, "
            "which has no Python code to trace",
            hint=f"if you trust it, pass {option('--trust-pickle', True)} (or set {TRUST_PICKLE_ENV}=1); or " + hint,
        )
    raise CaptureError(f"cannot capture {kind} as an fx graph: it has no Python code to trace", hint=hint)


# torch.fx writes each attribute path into Python source between double quotes, unescaped: a name holding one of
# these made torch's generated code a SyntaxError (or an AttributeError for a backslash) that escaped capture bare (QA)
_UNWRITABLE_IN_NAMES = ('"', "\\", "\n", "\r")


def _refuse_unwritable_names(model: nn.Module) -> None:
    named = itertools.chain(
        model.named_modules(remove_duplicate=False),
        model.named_parameters(remove_duplicate=False),
        model.named_buffers(remove_duplicate=False),
    )
    for name, _ in named:
        bad = [c for c in _UNWRITABLE_IN_NAMES if c in name]
        if bad:
            raise CaptureError(
                f"cannot capture a model with the attribute name {name!r}: torch.fx writes attribute names into "
                f"generated Python code unescaped, and {bad[0]!r} breaks it",
                hint="rename the submodule, parameter or buffer (add_module/register_buffer take any name; give "
                "one without quotes, backslashes or line breaks)",
            )


@keeps_rng_state  # tracing, exporting and checking draw from torch's RNG and the modules' own: given back
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
        example_inputs: positional inputs used for checking, shape propagation and torch.export (for a
            LoadedModel given none, inputs made from its ``default_inputs``).
        method: ``"auto"`` (trace, then export), ``"symbolic_trace"`` or ``"export"``.
        leaf_modules: submodule names or types to keep as single ``call_module`` nodes.
        autowrap_functions: functions to record as single calls instead of tracing through them.
        check: compare original and captured outputs on the example inputs.
        check_batch: also compare on this batch size (catches shapes baked in as constants).

    Raises:
        CaptureError: when no strategy can capture the model; names the blocking source line.
    """
    exported_program = None
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    passed_over = None
    if isinstance(model, LoadedModel):
        exported_program = model.exported_program
        passed_over = model.pickle_passed_over
        if not example_inputs and not example_kwargs and model.default_inputs:
            # the inputs the model is known to take (its recorded ones, a transformers model's token ids): without
            # them BERT failed to capture with an error about its arguments (QA)
            example_inputs = tuple(make_inputs(model.default_inputs))
        model = model.module
    # Copies: nothing fxforge runs later (shape propagation, checks, verification) can write into the caller's tensors.
    inputs = cloned(tuple(example_inputs))
    kwargs = cloned(dict(example_kwargs or {}))
    if method not in ("auto", SYMBOLIC_TRACE, "export", EXPORT):
        raise CaptureError(f"unknown capture method {method!r}", hint="auto, symbolic_trace or export")
    if check_batch is not None and not (isinstance(check_batch, int) and check_batch >= 1):
        # batch 0 or -1 made empty tensors, and a check on them passed (QA)
        hint = f"e.g. {option('--check-batch', 2)}"
        raise InputSpecError(f"{option('--check-batch')} must be at least 1, got {check_batch!r}", hint=hint)
    leaf_modules = list(as_names(leaf_modules) or ())  # one name, a comma list, or an iterable of names or types
    if method in ("export", EXPORT) and leaf_modules:
        # torch.export traces through every submodule: the leaves were ignored, and a failure then advised --leaf
        raise FxforgeError(
            f"{option('--leaf', python='leaf_modules')} applies to symbolic tracing, and "
            f"{option('--method', 'export')} traces through every submodule",
            hint=f"drop {option('--method', 'export')} (auto tries symbolic tracing with the leaves first), "
            f"or drop {option('--leaf', python='leaf_modules')}",
        )
    if not isinstance(model, nn.Module):
        kind = type(model).__name__
        exported = isinstance(model, torch.export.ExportedProgram)
        raise CaptureError(
            f"capture takes an nn.Module, not {with_article(kind)}",
            hint="an exported program is captured already: save it with torch.export.save and name the file "
            "(fxforge.prepare('model.pt2')), or capture the module it was exported from"
            if exported
            else "put a function in a module's forward, or name a model spec with fxforge.prepare",
        )
    refuse_compiled_forms(model, passed_over)
    _refuse_unwritable_names(model)
    compiled_recipe = isinstance(model, CompiledModule)
    if compiled_recipe:
        # an --auto output's model.pt2 + recipe.json, loaded compiled: the graph is the program's, not the code of
        # torch.compile's wrapper (export blamed fxforge's own line for data-dependent control flow, QA)
        model = model.model

    if exported_program is not None or isinstance(model, fx.GraphModule):
        gm = model if isinstance(model, fx.GraphModule) else exported_program.module()
        record = CaptureRecord(LOADED, dialect_of(gm))
        asked = {"symbolic_trace": TORCH, SYMBOLIC_TRACE: TORCH, "export": ATEN, EXPORT: ATEN}.get(method)
        if asked is not None and asked != record.dialect:
            # a graph is used as it is, not captured again: --method was silently ignored (QA)
            names = {TORCH: "a torch-dialect", ATEN: "an ATen"}
            raise FxforgeError(  # bad input (exit 2), not a capture that failed
                f"{option('--method', method)} asks for {names[asked]} graph, but the model is already "
                f"{names[record.dialect]} graph (a saved program or GraphModule), used as it is, not captured again",
                hint=f"drop {option('--method', method)}, or capture the model the graph was made from",
            )
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
    if compiled_recipe:
        captured.record.notes.append(
            "captured the program of a compile recipe (model.pt2 + recipe.json), without the torch.compile that "
            "fxforge.load_model applies to it"
        )
    if getattr(model, "training", False) and any(m.training for m in model.modules() if _has_mode(m)):
        captured.record.notes.append(
            "the model is in training mode (dropout and batch statistics active, BatchNorms not foldable); "
            "call model.eval() before capture for inference"
        )
    if captured.dialect == TORCH and (inputs or kwargs):
        # symbolic_trace records no shapes or dtypes: record them once here, for inspect, lint and the passes
        record_shapes(captured.graph_module, captured.flat_inputs())
    if check and not captured.record.checks:
        if not (inputs or kwargs):  # a model of no inputs is run by nothing: say so, a check claims nothing
            captured.record.notes.append("no output check: no example inputs were given")
        elif _on_meta(model, inputs):
            captured.record.notes.append("output check skipped: the model is on the meta device")
        elif captured.record.method == LOADED and (inputs or kwargs):
            # The model is the graph: comparing the two could not fail. Running it still proves that it takes the
            # example inputs (a rejection is an error); a check line would claim more than that.
            reference = _seeded_reference(captured, CHECK_SEED)
            sources = random_sources(captured.graph_module)
            if sources and _differs_on_rerun(captured, reference, CHECK_SEED + 1):
                why = randomness_hint(sources, captured.original)
                captured.record.notes.append(f"{RANDOM_NOTE}: two calls on the same input differ ({why})")
            if check_batch is not None:
                batched = with_batch(captured.example_inputs, check_batch)
                try:
                    run_reference(captured.graph_module, batched, dict(captured.example_kwargs))
                except InputSpecError as exc:  # a program exported for one batch: said as the batch (QA)
                    raise _batch_refused(exc, captured, check_batch) from None
            ran = "the inputs" if check_batch is None else f"the inputs and at batch {check_batch}"
            captured.record.notes.append(f"no output check: the model is already a graph (it ran on {ran})")
    return captured


class _ShapeRecorder(MutableArguments, ShapeProp):
    """torch's ShapeProp, calling functions from outside torch with plain containers (a traced T5's config)."""


def record_shapes(gm: fx.GraphModule, values: Sequence[Any]) -> bool:
    """Run ``gm`` once on copies of ``values`` (its placeholder values) with ``ShapeProp``, filling every node's
    ``meta['tensor_meta']`` (shape, dtype, strides): the facts lint rules and passes read in the torch dialect,
    where tracing records none. The graph's state is restored; False when the run fails (the facts stay unknown).
    """
    try:
        # ShapeProp prints the traceback of a failing node itself before raising: the caller reports the failure
        with (
            torch.no_grad(),
            quiet_torch_logs(),
            preserved_state(gm),
            rng_preserved(),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            _ShapeRecorder(gm).propagate(*cloned(list(values)))
    except Exception:  # shape facts are an optimisation: passes that need them skip with a reason instead
        return False
    return True


def has_shapes(gm: fx.GraphModule) -> bool:
    """Whether ``gm``'s nodes carry shape facts (``tensor_meta`` from :func:`record_shapes`, or export's ``val``)."""
    return any("tensor_meta" in n.meta or "val" in n.meta for n in gm.graph.nodes if n.op == "placeholder")


def at_batch(captured: Captured, batch: int, seed: int = 0) -> Captured:
    """``captured`` with seeded example inputs of ``batch`` rows; an ATen graph is exported again (torch.export
    fixes the batch size of the program it writes)."""
    where = device_of(captured.example_inputs, captured.original)
    inputs = make_inputs(specs_of(captured.example_inputs), seed=seed, device=where, batch=batch)
    example_batch = captured.example_inputs[0].shape[0] if captured.example_inputs[0].dim() else None
    if captured.dialect == ATEN and batch != example_batch:
        return capture(captured.original, inputs, example_kwargs=captured.example_kwargs, method="export", check=False)
    return dataclasses.replace(captured, example_inputs=inputs)


def require_captured(value: Any, what: str) -> None:
    """Refuse, in one line, a ``value`` that is not a :class:`Captured` (a module, a GraphModule, a spec string):
    ``what`` (the function's name) needs the graph and the example inputs that capture records. Without this, the
    first use of ``captured.original`` raised a bare AttributeError (QA)."""
    if isinstance(value, Captured):
        return
    given = "GraphModule" if isinstance(value, fx.GraphModule) else type(value).__name__
    raise FxforgeError(
        f"{what} takes a captured model, not {with_article(given)}",
        hint="capture it first: fxforge.capture(model, example_inputs), or fxforge.prepare('torchvision:resnet18')",
    )


def require_real_weights(captured: Captured, what: str) -> None:
    """Raise a clear error when ``captured`` lives on the meta device: ``what`` needs values, not just shapes."""
    if _on_meta(captured.original, captured.example_inputs) or _on_meta(captured.graph_module, ()):
        raise FxforgeError(
            f"{what} needs real weights, and this model is on the meta device",
            hint=said("drop --device meta", "build the model with its weights (not on the meta device)"),
        )


def _has_mode(module: nn.Module) -> bool:
    """Whether ``module`` behaves differently in training mode (dropout, batch norm, instance norm with stats)."""
    return isinstance(module, (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._NormBase))


def _plain_function(code: Any) -> bool:
    """A module-level function's code (what --wrap takes), not a method's, a lambda's or a module's."""
    first = code.co_varnames[0] if code.co_argcount else None
    return code.co_name.isidentifier() and first not in ("self", "cls") and "." not in code.co_qualname


def _other_method(code: Any) -> bool:
    """A method's code other than ``forward`` (``Block.compute``)."""
    if code is None or not code.co_argcount or code.co_varnames[0] != "self":
        return False
    return code.co_name != "forward" and "." in code.co_qualname


def _wrap_option() -> str:
    """How the user wraps a function, in their own terms: capture() takes the function itself, prepare() a name."""
    return said("--wrap file.py:function", "autowrap_functions=[function] (fxforge.prepare: wrap='file.py:function')")


def _leaf_option() -> str:
    """How the user makes a submodule a leaf, in their own terms (the CLI's option or the Python parameter)."""
    return said("--leaf NAME", "leaf_modules=['NAME']")


def _check_leaf_names(leaf_names: set[str], submodules: set[str]) -> None:
    """A leaf name that names no submodule would be ignored by the tracer: say so rather than capture as if it
    had not been given."""
    unknown = sorted(leaf_names - submodules)
    if not unknown:
        return
    close = difflib.get_close_matches(unknown[0], sorted(submodules), n=3)
    raise FxforgeError(
        f"{said('--leaf', 'leaf_modules')} {unknown[0]!r} names no submodule of the model",
        hint=f"did you mean {' or '.join(close)}?"
        if close
        else "leaf names are dotted submodule paths such as layer1.0 (fxforge inspect MODEL --depth N lists them)",
    )


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
    leaf_modules = as_names(leaf_modules)
    leaf_names = {m for m in leaf_modules if isinstance(m, str)}
    leaf_types = tuple(m for m in leaf_modules if isinstance(m, type))
    user_leaves = set(leaf_names)
    functions, methods = _requested_methods(autowrap_functions, model)
    wraps = [wrap for f in functions for wrap in _wraps_for(f, model)]
    module_names = {id(m): name for name, m in model.named_modules()}
    _check_leaf_names(user_leaves, set(module_names.values()) - {""})
    # A module that runs hooks stays one call, so that they run when the graph does: traced through, a hook ran
    # once, on proxies, and what it stored (a dict of features) held torch.fx Proxy objects while the graph never
    # called it again (QA). Plain symbolic_trace of a leaf keeps its hooks: the module itself is called.
    hooked = sorted(
        name for name, m in model.named_modules() if name and runs_hooks(m) and not _inside(name, leaf_names)
    )
    hooked = [name for name in hooked if not _inside(name, set(hooked) - {name})]  # the outermost of nested ones
    leaf_names |= set(hooked)
    # Concrete args are passed as keywords to the model and the graph alike, on every capture path, so that
    # checks and every later run compute the branch the user chose (torch.export guards on their values).
    kwargs = {**kwargs, **(concrete_args or {})}
    # Parameters the example leaves out run with their defaults (``mask=None``): tracing them as inputs would
    # record the branch for a tensor the model never gets, so they are traced as the constants they are.
    traced_constants = {**unprovided_defaults(model, inputs, kwargs), **(concrete_args or {})}
    can_check = check and (inputs or kwargs) and not _on_meta(model, inputs)
    # Run the model once first: inputs it rejects are the user's error, not a capture failure. Under the seed the
    # captured graph will run under too: random ops draw the same numbers in both.
    reference = None
    state_writes: list[_StateWrite] = []
    if can_check:
        with rng_preserved(CHECK_SEED), _attribute_writes_recorded(model) as state_writes:
            reference = run_reference(model, inputs, kwargs)
    trace_error: BaseException | None = None
    trace_mismatch: OutputCheck | None = None  # the traced graph's failed check, where it ran and differed
    deferred: Captured | None = None  # a trace that keeps methods as calls hiding most weights: if export fails

    if method in ("auto", SYMBOLIC_TRACE):
        for _ in range(max_retries):
            try:
                with quiet_torch_logs():
                    gm = _symbolic_trace(model, leaf_names, leaf_types, wraps, traced_constants, methods=methods)
            except Exception as exc:
                trace_error = exc
                culprit = _find_culprit(exc, model, module_names, leaf_names, wraps, methods)
                location = exc.location if isinstance(exc, BufferWriteError) else user_location(exc)
                called_from = own_call_site(exc)
                if location and called_from:  # a line of torchvision's: the user's own call names where (QA)
                    location += f" (called from {called_from})"
                reason = one_line_reason(exc)
                if "co_varnames is too small" in reason:  # torch.fx's words for it say nothing to a user
                    reason += " (its forward takes **kwargs, as in transformers)"
                attempt = Attempt(SYMBOLIC_TRACE, reason, location)
                attempts.append(attempt)
                if isinstance(culprit, str):
                    leaf_names.add(culprit)
                    attempt.action = f"made {culprit} a leaf module"
                    continue
                if isinstance(culprit, _Wrap):
                    wraps.append(culprit)
                    attempt.action = f"wrapped {culprit.label} as one call"
                    continue
                if isinstance(culprit, _MethodWrap):
                    methods.append(culprit)
                    attempt.action = f"kept the method {culprit.label} as one call"
                    continue
                break
            if methods and _only_method_calls(gm):
                # a graph of one opaque call shows and changes nothing of the model: torch.export may do better,
                # and if it cannot either, the error names the line that stopped tracing, as without the wrap
                for attempt in attempts:
                    if attempt.action and attempt.action.startswith("kept the method"):
                        attempt.action = None
                attempts.append(Attempt(SYMBOLIC_TRACE, f"keeping {methods[-1].label} as one call{_NOTHING_ELSE}"))
                break
            unused = _unused_wraps(wraps, gm)
            called = {str(node.target) for node in gm.graph.nodes if node.op == "call_module"}
            record = CaptureRecord(
                SYMBOLIC_TRACE,
                TORCH,
                # a leaf made on an earlier attempt that the graph does not call (a method kept as one call later
                # covered it, QA) is no leaf of this graph
                leaves=sorted(name for name in leaf_names - user_leaves if name in called),
                wrapped=[label for label in dict.fromkeys(w.label for w in wraps) if label not in unused]
                + [m.label for m in methods],
                attempts=attempts,
                notes=[
                    f"--wrap {label}: the traced code never called it, so wrapping changed nothing" for label in unused
                ]
                + (
                    [f"kept as one call, so that their hooks run as in the model: {', '.join(hooked[:5])}"]
                    if hooked
                    else []
                )
                + (
                    [
                        f"{', '.join(gm.meta[UNRECORDED_WRITES][:3])} written in place while tracing, to the value it "
                        "had: the write is not in the graph (recording it needs buffers traced as proxies, which "
                        "this model's code does not allow): where a later call's write would change it, the graph "
                        "will not"
                    ]
                    if gm.meta.get(UNRECORDED_WRITES)
                    else []
                ),
            )
            captured = Captured(gm, model, inputs, record, kwargs)
            if any(not m.requested for m in methods) and method == "auto" and _hides_most_weights(gm):
                # torch.export may capture what the kept methods hide (a branch on a shape, which it records): it
                # goes first, and this trace stands where it fails
                deferred = captured
                kept = ", ".join(m.label for m in methods)
                attempts.append(
                    Attempt(SYMBOLIC_TRACE, f"keeping {kept} as one call hides most of the weights: torch.export first")
                )
                break
            if not can_check:
                return captured
            if _check(captured, reference, check_batch) or method == SYMBOLIC_TRACE:
                _check_second_call(captured, state_writes)
                return captured
            failed = next(c for c in record.checks if not c.ok)
            # the model repeats itself under one seed; if it is random, the trace ran a random op once, eagerly
            frozen = (
                " under the same random seed (the trace may have frozen a random draw into a constant)"
                if _differs_on_rerun(captured, reference, CHECK_SEED + 1)
                else ""
            )
            trace_mismatch = failed
            on = "the example inputs" if failed.batch is None else f"batch {failed.batch}"
            attempts.append(
                Attempt(SYMBOLIC_TRACE, f"traced graph differs from the model{frozen} on {on}: {failed.message}")
            )
            break
        else:
            attempts.append(Attempt(SYMBOLIC_TRACE, f"gave up after {max_retries} retries"))

    if method in ("auto", "export", EXPORT):
        try:
            with preserved_state(model, runs=False):
                if check_batch is None:
                    program = export_program(model, inputs, kwargs, dynamic_batch=False)
                else:
                    # a symbolic batch; from a batch-1 example torch.export fixes it at 1 (size 1 broadcasts) and
                    # the check at another batch failed on its guard: traced at batch 2 where that reproduces
                    program = export_program_any_batch(model, inputs, kwargs)
        except Exception as exc:
            attempts.append(Attempt(EXPORT, one_line_reason(exc), user_location(exc)))
            if deferred is not None and _passes(deferred, can_check, reference, check_batch, state_writes):
                return deferred
            raise _capture_error(model, attempts, trace_error, exc) from None
        notes = [
            f"--wrap {label}: torch.export traced through it (wrapping is for symbolic tracing)"
            for label in _unused_wraps(wraps, None)
        ]
        if hooked:
            # torch.export traces through a hook: what it returns is in the graph, what it does besides (a dict of
            # features it fills) happened while exporting, on fake tensors, and the graph never calls it (QA: no
            # word, where the torch dialect says it keeps such a module as one call)
            keep = f"; {option('--method', 'symbolic_trace')} keeps them as one call" if method != "auto" else ""
            notes.append(
                f"traced through by torch.export, so the graph never calls their hooks (what a hook returns is "
                f"recorded; what it stores, such as features, is not): {', '.join(hooked[:5])}{keep}"
            )
        record = CaptureRecord(EXPORT, ATEN, attempts=attempts, notes=notes)
        captured = Captured(program.module(), model, inputs, record, kwargs, program)
        if not can_check:
            return captured
        passed = _check(captured, reference, check_batch)
        if not passed and check_batch is not None:
            captured, passed = _for_the_example_batch(captured, reference, check_batch) or (captured, passed)
        if passed:
            _check_second_call(captured, state_writes)
        elif method == "auto" and not captured.record.checks[0].ok:
            if deferred is not None and _passes(deferred, can_check, reference, check_batch, state_writes):
                return deferred
            raise _both_graphs_differ(model, captured.record.checks[0], trace_mismatch, attempts)
        return captured
    raise _capture_error(model, attempts, trace_error, None)


def _hides_most_weights(gm: fx.GraphModule) -> bool:
    """Whether the methods kept as one call (:class:`~fxforge.graphs.MethodCall`) hold most of ``gm``'s weights."""
    total = sum(p.numel() for p in gm.parameters())
    hidden = sum(
        p.numel()
        for node in gm.graph.nodes
        if node.op == "call_module" and isinstance(submodule(gm, node), MethodCall)
        for _, p in called_parameters(gm, str(node.target))
    )
    return hidden * 2 > total > 0


def _passes(
    captured: Captured, can_check: bool, reference: Any, check_batch: int | None, writes: Sequence[_StateWrite]
) -> bool:
    """Whether a deferred trace (one torch.export could not better) computes the model's outputs, as checked."""
    if not can_check:
        return True
    if not _check(captured, reference, check_batch):
        return False
    _check_second_call(captured, writes)
    return True


def _for_the_example_batch(captured: Captured, reference: Any, check_batch: int) -> tuple[Captured, bool] | None:
    """The program for the example's batch alone and whether it passed every check, where the one for any batch
    differs from the model on the example itself; None where it does not, or where that one differs too.

    torch.export takes a dynamic batch to be other than 1, so at a batch-1 example ``x.squeeze()`` keeps the batch
    dimension the model drops (QA: ``len(x.squeeze())`` was blamed on "Python values" and nothing was captured).
    The graph it gives instead holds for the example's batch, and the check at ``check_batch`` says so."""
    if captured.record.checks and captured.record.checks[0].ok:
        return None
    model, inputs, kwargs = captured.original, captured.example_inputs, captured.example_kwargs
    try:
        with preserved_state(model, runs=False):
            program = export_program(model, inputs, kwargs, dynamic_batch=False)
    except Exception:  # the any-batch program's failed check is then what is reported
        return None
    record = dataclasses.replace(captured.record, checks=[], notes=list(captured.record.notes))
    fixed = Captured(program.module(), model, inputs, record, kwargs, program)
    passed = _check(fixed, reference, check_batch)
    if not passed and not record.checks[0].ok:
        return None
    record.notes.append(
        f"captured for batch {batch_of(inputs)} only: traced for any batch, torch.export takes the batch to be other "
        "than 1, and the graph differed from the model on the example (the model's code treats a batch of 1 "
        "differently: squeeze(), a broadcast)"
    )
    return fixed, passed


def _both_graphs_differ(
    model: nn.Module, exported: OutputCheck, traced: OutputCheck | None, attempts: list[Attempt]
) -> CaptureError:
    """Both strategies made a graph and neither computes the model's outputs on the example: no capture. It was
    returned with a failed check, which the CLI printed as a warning before a normal report and exit 0 (QA: a
    forward adding ``len(f"{x}")``, a number computed from the tensor's values while tracing)."""
    errors = ([f"symbolic_trace's by {traced.max_abs_err:.3g}"] if traced is not None else []) + [
        f"torch.export's by {exported.max_abs_err:.3g}"
    ]
    return CaptureError(
        f"cannot capture {type(model).__name__}: the graphs differ from the model on the example inputs "
        f"({', '.join(errors)}, max abs error): its forward computes Python values from tensors (an f-string, the "
        "length of a text, a Python number), which a graph holds as the constants of the call it was captured from",
        hint=f"keep such values tensors, or compute them outside forward; to look at a graph anyway, force one "
        f"method ({option('--method', 'symbolic_trace')}): its failed check is then a warning",
        attempts=attempts,
    )


@dataclass
class _StateWrite:
    """A Python attribute of the model that ``forward`` assigned: state no graph holds (only its value then)."""

    attribute: str  # qualified: "step", "blocks.0.cache"
    location: str | None  # the user's line that assigned it


# attributes whose assigning line is looked up (a stack walk each): a model writing many is named by its first ones
_WRITES_LOCATED = 8


@contextlib.contextmanager
def _attribute_writes_recorded(model: nn.Module) -> Iterator[list[_StateWrite]]:
    """Record the plain attributes (not parameters, buffers or submodules) that the model's modules assign while
    the body runs: a call counter (``self.step += 1``) or a cache (``self.cache = y``) in ``forward``."""
    names = {id(m): name for name, m in model.named_modules()}
    writes: list[_StateWrite] = []
    seen: set[str] = set()
    original_setattr = nn.Module.__setattr__

    def recording_setattr(module: nn.Module, name: str, value: Any) -> None:
        if (
            id(module) in names
            and not isinstance(value, nn.Module)
            and not any(name in module.__dict__.get(kind, {}) for kind in ("_parameters", "_buffers", "_modules"))
        ):
            qualified = f"{names[id(module)]}.{name}".lstrip(".")
            if qualified not in seen:
                seen.add(qualified)
                writes.append(_StateWrite(qualified, caller_location() if len(writes) < _WRITES_LOCATED else None))
        original_setattr(module, name, value)

    nn.Module.__setattr__ = recording_setattr  # type: ignore[method-assign]
    try:
        yield writes
    finally:
        nn.Module.__setattr__ = original_setattr  # type: ignore[method-assign]


def _check_second_call(captured: Captured, writes: Sequence[_StateWrite]) -> None:
    """For a model whose ``forward`` assigned Python attributes: compare the model's and the graph's *second* call
    from the same state. A graph holds the attribute's value of one call (a counter's 1, an empty cache) and the
    output check compares first calls only, where both agree (QA: ``self.step += 1`` captured as ``* 1``, the
    graph wrong from the second call on). Raises CaptureError where they differ; a note where they agree."""
    if not writes:
        return
    args, kwargs = captured.example_inputs, captured.example_kwargs

    def second_call(module: Any) -> Any:
        with preserved_state(captured.original, captured.graph_module), torch.no_grad(), quiet_torch_logs():
            for _ in range(2):
                with rng_preserved(CHECK_SEED):
                    output = module(*cloned(tuple(args)), **cloned(dict(kwargs)))
        return output

    named = ", ".join(f"self.{w.attribute}" + (f" ({w.location})" if w.location else "") for w in writes[:3])
    more = f" and {len(writes) - 3} more" if len(writes) > 3 else ""
    try:
        expected = second_call(captured.original)
        comparison = compare_outputs(expected, second_call(captured.graph_module))
        problem = None if comparison.ok else f"max abs err {comparison.max_abs_err:.3g}"
    except Exception as exc:  # the graph (or the model) fails on its second call: not a graph of this model either
        problem = f"the second call failed: {one_line_reason(exc)}"
    if problem is None:
        captured.record.notes.append(
            f"forward assigns {named}{more}, state the graph does not keep; a second call of the model and of the "
            "graph still gave the same outputs"
        )
        return
    raise CaptureError(
        f"cannot capture {type(captured.original).__name__}: forward assigns {named}{more}, and its outputs "
        f"depend on it: the graph holds the value of the call it was captured from, and a second call of "
        f"the model and of the graph differ ({problem})",
        # named after the attribute found (QA: the hint named a made-up 'step' for self.cache)
        hint=f"keep that state in a buffer updated in place (self.register_buffer({writes[0].attribute!r}, ...) in "
        f"__init__, then self.{writes[0].attribute}.copy_(...) or += in forward), which the graph records, or pass "
        "it to forward as an input",
        location=writes[0].location,
        attempts=captured.record.attempts,
    )


def _capture_error(
    model: nn.Module, attempts: list[Attempt], trace_error: BaseException | None, export_error: BaseException | None
) -> CaptureError:
    # The line that stopped capture: the first failure fxforge could not work around (earlier trace
    # failures were fixed with a leaf or a wrap and no longer block anything).
    blocking_trace = next((a for a in attempts if a.location and a.action is None), None)
    location = blocking_trace.location if blocking_trace is not None else None
    export_location = user_location(export_error) if export_error is not None else None
    # Where the two stopped at different lines, each is named with its own reason: one line for both blamed
    # torch.export's reason on symbolic_trace's line (QA: a loop over a shape in the root called data-dependent
    # control flow, while torch.export had stopped at a branch on a value in a submodule).
    split_stops = bool(export_location and location and export_location != location)
    location = location or export_location
    reasons = []
    errors = [e for e in (trace_error, export_error) if e is not None]
    text = " ".join(str(e) for e in errors).lower()
    if "control flow" in text or "data-dependent" in text or "data dependent" in text:
        reasons.append("data-dependent control flow (a Python branch or loop on a tensor's value)")
        hint = (
            "express the branch with torch.where or torch.cond, or move it into a submodule so that "
            f"fxforge can keep that submodule as a leaf ({_leaf_option()})"
        )
        code = re.search(r"`(.+)`", location or "")
        if code and not re.search(r"\b(if|elif|while|for|assert|and|or|not)\b", code.group(1)):
            # no branch on that line: a tensor's value read as a Python number (float(t), t.item(), int(t))
            reasons[-1] = "a tensor's value read as a Python number (float(), int(), .item()): it depends on the data"
            hint = (
                "keep the value a tensor (use it in torch ops instead of float()/.item()), or move that code into a "
                f"submodule so that fxforge can keep it as a leaf ({_leaf_option()})"
            )
        helper = user_code(trace_error) if trace_error is not None else None
        if helper is not None and _plain_function(helper):
            # the branch is in a function of theirs, called under another name (helpers.gate(x), `import gate as
            # g`), which capture's own wrapping did not find: naming it works (QA: the hint never said so)
            # an installed package's function by its module (torchvision.utils:make_grid), not a path into
            # site-packages (QA)
            modules = _modules_of_file(helper) if "site-packages" in helper.co_filename else []
            named = f"{modules[0].__name__ if modules else os.path.relpath(helper.co_filename)}:{helper.co_name}"
            hint = (
                f"keep the function {helper.co_name} as one call ("
                + said(f"--wrap {named}", f"autowrap_functions=[{helper.co_name}] (fxforge.prepare: wrap='{named}')")
                + "), or express the branch with torch.where or torch.cond"
            )
        elif _other_method(helper):
            # a method other than forward (QA: the hint said to move code that was in a submodule already into one)
            whole = any(attempt.error.endswith(_NOTHING_ELSE) for attempt in attempts)
            hint = f"the branch is in {helper.co_qualname}, " + (
                "which does all of the model's work (kept as one call, it would leave nothing in the graph): "
                "express the branch with torch.where or torch.cond, or move it into a method or submodule of "
                "its own"
                if whole
                else f"a method other than forward: express the branch with torch.where or torch.cond, or move "
                f"it into a submodule's forward (then {_leaf_option()})"
            )
        if location and re.search(r"`for \w+ in \w+:`", location):
            # `for img in images:` over an input: the model may want a list of tensors (torchvision's detection
            # models do), which no positional tensor input can be
            hint = (
                "a loop over a tensor: if the model takes a list of tensors (torchvision's detection models take a "
                "list of images), capture the part that takes tensors instead (e.g. its backbone)"
            )
    else:
        last = attempts[-1].error if attempts else "unknown error"
        reasons.append(last)
        export_untried = all(attempt.strategy != EXPORT for attempt in attempts)
        hint = f"mark the offending submodule with {_leaf_option()}, or wrap the helper function ({_wrap_option()})" + (
            f", or pass {option('--method', 'export')}" if export_untried else ""
        )
        if export_untried and type(model).__module__.startswith("transformers."):
            # its decorators and output classes stop symbolic tracing wherever the model's own code is
            hint = f"transformers models are captured with torch.export: pass {option('--method', 'export')} (or auto)"
        stopped_in = user_code(trace_error) if trace_error is not None else None
        method = getattr(type(model), stopped_in.co_name, None) if stopped_in is not None else None
        if stopped_in is not None and getattr(method, "__code__", None) is stopped_in:
            # the model's own methods cannot be leaves, and --wrap takes module-level functions, not methods
            where = f"{type(model).__name__}.{stopped_in.co_name}"
            where += " itself" if stopped_in.co_name == "forward" else ", a method of the model itself"
            hint = (
                f"the call is in {where}, which cannot be a leaf: move it into a submodule (then {_leaf_option()}) "
                f"or a module-level function ({_wrap_option()})"
                + (f", or pass {option('--method', 'export')}" if export_untried else "")
            )
        elif "co_varnames is too small" in last:
            hint = f"symbolic_trace cannot trace a forward that takes **kwargs: pass {option('--method', 'export')}"
        if "cache" in last.lower() and "found" in last.lower():
            # transformers' encoder-decoders return their key/value cache object, which torch.export cannot flatten
            # (the model-arg reaches the config of a transformers:NAME spec only; a factory of the user's builds its
            # own config, and a --model-arg it does not take is refused: QA)
            use_cache = said(
                "--model-arg use_cache=false for a transformers:NAME spec",
                "model_kwargs={'use_cache': False} for a 'transformers:NAME' spec",
            )
            hint = (
                f"a transformers model returning its key/value cache: build it with use_cache=False in its config "
                f"({use_cache}; config.use_cache = False in a factory of your own)"
            )
    name = type(model).__name__
    if split_stops and blocking_trace is not None:
        export_text = str(export_error).lower()
        dependent = any(words in export_text for words in ("control flow", "data-dependent", "data dependent"))
        category = "data-dependent control flow (a Python branch or loop on a tensor's value)" if dependent else None
        export_reason = category or one_line_reason(export_error)
        message = (
            f"cannot capture {name}: {SYMBOLIC_TRACE} stopped at {location}: {blocking_trace.error}; {EXPORT} "
            f"stopped at {export_location}: {export_reason}"
        )
        return CaptureError(message, hint=hint, location=location, attempts=attempts)
    where = f" at {location}" if location else ""
    strategies = " and ".join(sorted({a.strategy for a in attempts}))
    message = f"cannot capture {name}: {strategies} stopped{where}: {reasons[0]}"
    return CaptureError(message, hint=hint, location=location, attempts=attempts)
