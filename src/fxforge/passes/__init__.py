"""Passes: small graph rewrites registered by name, and the machinery that runs them.

A pass is a function ``(gm, options) -> PassResult`` registered with :func:`register_pass`. It may
change the GraphModule it is given: :func:`apply_pass` hands it a private copy unless the caller asks
for ``inplace=True``, so a user's model is never modified behind their back. Around the call,
:func:`apply_pass` runs the pass's ``requires`` check (preconditions), then the rewrite, then
``Graph.lint`` + ``recompile`` and the pass's ``ensures`` check (postconditions) -- the shape of
``torch.fx.passes.infra.PassBase``.

Provenance: before a pass runs, every node without one gets ``node.meta["fxforge_origin"]`` (the
name of the node in the captured graph whose value it computes). A pass that makes a node compute
another node's value (folding BN into a conv makes the conv compute the BN's output) moves the origin
with it through :func:`mark`; nodes a pass creates or rewrites get ``node.meta["fxforge_pass"]``.
``fxforge.verify`` uses both to name the first diverging node and the pass that produced it.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import pkgutil
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import fx, nn

from fxforge.errors import EXIT_INTERNAL, FxforgeError, first_line
from fxforge.graphs import dialect_of, graph_fingerprint
from fxforge.plugins import PASSES_GROUP, failures, load_group
from fxforge.references import import_reference
from fxforge.registry import BUILTIN, Registry, registering_from
from fxforge.vocabulary import ORIGIN, PASS


class PassError(FxforgeError):
    """A pass could not run (unknown name, bad option, unmet precondition, broken postcondition)."""


class PassCrashed(PassError):
    """A pass raised an exception of its own: a bug in the pass (fxforge's, or its plug-in's), not the user's input,
    so the exit code is the internal error's (QA: fold_bn crashing on a pruned conv exited 2, "bad input")."""

    exit_code = EXIT_INTERNAL


@dataclass
class PassResult:
    """What one pass did. ``changed`` is False when it found nothing to rewrite."""

    name: str
    graph_module: fx.GraphModule
    changed: bool = False
    replaced: int = 0
    removed: int = 0
    inserted: int = 0
    folded_params: int = 0
    log: list[str] = field(default_factory=list)  # one line per rewrite ("folded bn1 into conv1")
    skipped: list[str] = field(default_factory=list)  # one line per candidate left alone, with the reason
    artifacts: dict[str, Any] = field(default_factory=dict)  # e.g. the statistics recorder of insert_after

    def __repr__(self) -> str:  # the dataclass's would print the whole GraphModule
        if not self.changed:
            return f"<PassResult {self.name}: unchanged, {len(self.skipped)} skipped>"
        counts = ", ".join(
            f"{value} {label}"
            for label, value in (
                ("replaced", self.replaced),
                ("removed", self.removed),
                ("inserted", self.inserted),
                ("params folded", self.folded_params),
            )
            if value
        )
        return f"<PassResult {self.name}: {len(self.log)} rewrites{', ' + counts if counts else ''}>"

    def note(self, message: str, *, replaced: int = 0, removed: int = 0, inserted: int = 0, folded: int = 0) -> None:
        """Record one rewrite and mark the result changed."""
        self.changed = True
        self.log.append(message)
        self.replaced += replaced
        self.removed += removed
        self.inserted += inserted
        self.folded_params += folded

    def skip(self, message: str) -> None:
        self.skipped.append(message)

    def to_dict(self) -> dict[str, Any]:
        # field by field: asdict would deep-copy the GraphModule before any filter dropped it (1.2 s at 10k nodes)
        left_out = ("graph_module", "artifacts")
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self) if f.name not in left_out}


PassFunction = Callable[[fx.GraphModule, Any], PassResult]
Check = Callable[[fx.GraphModule, Any], "str | None"]


@dataclass(frozen=True)
class PassSpec:
    name: str
    function: PassFunction
    summary: str
    guarantees: str
    options: type | None = None  # a dataclass of typed options, or None when the pass takes none
    dialects: tuple[str, ...] = ("torch", "aten")
    requires: Check | None = None  # returns a reason string when the pass cannot run on this graph
    ensures: Callable[[fx.GraphModule, PassResult], str | None] | None = None

    def option_fields(self) -> list[dataclasses.Field]:
        return list(dataclasses.fields(self.options)) if self.options else []

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "summary": self.summary,
            "guarantees": self.guarantees,
            "dialects": list(self.dialects),
            "options": [{"name": f.name, "type": str(f.type)} for f in self.option_fields()],
            "origin": self.origin,
        }

    @property
    def origin(self) -> str:
        """Where the pass comes from: ``fxforge``, a plug-in package, or the user's file."""
        return PASSES.origin(self.name)


PASSES: Registry[PassSpec] = Registry("pass", PassError, listing="fxforge passes")

# The exact passes in the order ``lint --fix`` and ``optimize --auto`` run them: removals first, so that folding
# sees the simplified graph; dead code last, to sweep up what the others leave unused.
# remove_identity runs again after fold_constants: folding can turn a computed operand into a stored tensor of
# zeros (torch.export's attention mask of an unpadded transformer), and only then can x + zeros go.
FIX_ORDER = (
    "remove_dropout",
    "remove_identity",
    "remove_redundant_activation",
    "fold_bn",
    "merge_convs",
    "cse",
    "fold_constants",
    "remove_identity",
    "dead_code",
)


def register_pass(
    name: str,
    *,
    summary: str,
    guarantees: str,
    options: type | None = None,
    dialects: tuple[str, ...] = ("torch", "aten"),
    requires: Check | None = None,
    ensures: Callable[[fx.GraphModule, PassResult], str | None] | None = None,
) -> Callable[[PassFunction], PassFunction]:
    """Register a pass under ``name``; usable as a decorator by users for their own passes too."""

    # a name no command line can ask for, or a dialect no graph has, was accepted and failed later (QA: "" or
    # "has,comma" or "exact"; dialects=("Torch",) then said "works on Torch graphs, but this graph is torch")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][\w.-]*", name) or name == EXACT_GROUP:
        raise PassError(
            f"cannot register a pass named {name!r}",
            hint=f"a name of letters, digits, '_', '.' and '-', starting with a letter, and not {EXACT_GROUP!r}",
        )
    unknown = [d for d in dialects if d not in ("torch", "aten")]
    if unknown or not dialects:
        raise PassError(f"pass {name!r}: dialects are 'torch' and 'aten', got {tuple(dialects)!r}")

    def decorator(function: PassFunction) -> PassFunction:
        spec = PassSpec(name, function, summary, guarantees, options, dialects, requires, ensures)
        PASSES.register(name, spec, same=lambda old, new: old.function is new.function, module=function.__module__)
        return function

    return decorator


def _load_builtin_passes() -> None:
    """fxforge's own passes (one module each in this package), then the installed plug-ins' (entry points)."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    load_group(PASSES_GROUP, adopt_pass)


def adopt_pass(name: str, function: Any, origin: str) -> None:
    """Register a plain function a plug-in or a file names as a pass (one already registered stays as it is).

    The function is called ``function(gm)`` or ``function(gm, options)``; it may return a :class:`PassResult`, or
    rewrite ``gm`` and return it (or None), in which case the result says whether the code changed.
    """
    if any(spec.function is function for spec in PASSES.values()):
        return
    if not callable(function):
        raise PassError(f"{origin} names {function!r} as a pass, but it is not a function")
    summary = (function.__doc__ or "").strip().splitlines()[0] if function.__doc__ else f"a pass from {origin}"
    PASSES.register(
        name,
        PassSpec(name, _as_pass_function(name, function), summary, f"none stated ({origin} gives no guarantees)"),
        origin,
    )


def _as_pass_function(name: str, function: Callable[..., Any]) -> PassFunction:
    takes_options = len(inspect.signature(function).parameters) >= 2

    def run(gm: fx.GraphModule, options: Any) -> PassResult:
        before = gm.code
        returned = function(gm, options) if takes_options else function(gm)
        if isinstance(returned, PassResult):
            return returned
        if returned is not None and returned is not gm:
            raise PassError(
                f"pass {name!r} returned {str(returned)[:40]!r} (a {type(returned).__name__}), not a PassResult, "
                "the graph module or None",
                hint=PASS_CONTRACT,
            )
        result = PassResult(name, gm)
        gm.recompile()
        if gm.code != before:
            result.note(f"{name} changed the graph")
        return result

    run.__wrapped__ = function  # type: ignore[attr-defined]
    return run


PASS_CONTRACT = (
    "a pass takes (gm, options), may change gm (a private copy), and returns a PassResult -- or gm, or None; "
    "see docs/plugins.md"
)


def resolve_pass_reference(reference: str) -> str:
    """The registered name of the pass ``path/to/file.py:function`` or ``package.module:function`` names: the file
    (or module) is imported -- registering its ``@register_pass`` functions -- and an undecorated function is
    adopted as a pass under its own name."""
    # the built-in passes (and plug-ins') first, outside the file's registration: imported inside it, every one of
    # them was credited to the user's file ("pass 'fold_constants' (from file my_passes.py) crashed", QA)
    _load_builtin_passes()
    with registering_from(f"file {reference.rpartition(':')[0]}"):
        function = import_reference(reference, what="pass", error=PassError, hint="e.g. -p my_passes.py:my_pass")
        for spec in PASSES.values():
            if spec.function is function or getattr(spec.function, "__wrapped__", None) is function:
                return spec.name
        name = getattr(function, "__name__", reference.rpartition(":")[2])
        adopt_pass(name, function, f"file {reference.rpartition(':')[0]}")
    return name


def registered_passes() -> dict[str, PassSpec]:
    """Every registered pass by name (the built-in ones imported first)."""
    _load_builtin_passes()
    return dict(PASSES)


def all_passes() -> list[PassSpec]:
    _load_builtin_passes()
    return sorted(PASSES.values(), key=lambda p: p.name)


def get_pass(name: str) -> PassSpec:
    _load_builtin_passes()
    try:
        return PASSES.lookup(name)
    except PassError as exc:
        broken = failures(PASSES_GROUP)
        if not broken:
            raise
        # the pass may be a plug-in's that did not load: "unknown pass" alone sent the user looking for a typo (QA)
        raise PassError(exc.message, hint=f"{exc.hint + '; ' if exc.hint else ''}{broken[0].describe()}") from None


def parse_options(spec: PassSpec, raw: Any) -> Any:
    """Build the pass's options dataclass from a mapping (CLI/YAML values), checking names and types."""
    values = check_options(spec, raw)
    if values is None or dataclasses.is_dataclass(values):
        return values
    try:
        return spec.options(**values)
    except (TypeError, ValueError) as exc:
        raise PassError(f"bad options for {spec.name!r}: {exc}") from None


def check_options(spec: PassSpec, raw: Any) -> Any:
    """The option values of ``raw`` by name, each of its option's type (or the options dataclass itself, or None for
    a pass without options): what a pipeline checks when it is built. The options' own checks (a pass that needs
    one of two options) wait for :func:`parse_options` when the pass runs."""
    if spec.options is None:
        if raw:
            raise PassError(f"pass {spec.name!r} takes no options (got {', '.join(raw)})")
        return None
    if raw is None:
        raw = {}
    if dataclasses.is_dataclass(raw) and isinstance(raw, spec.options):
        return raw
    if not isinstance(raw, Mapping):
        raise PassError(f"options for {spec.name!r} must be a mapping, got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(spec.options)}
    unknown = set(raw) - set(fields)
    if unknown:
        raise PassError(
            f"pass {spec.name!r} has no option {sorted(unknown)[0]!r}",
            hint=f"its options: {', '.join(fields) or 'none'}",
        )
    hints = typing.get_type_hints(spec.options)
    return {key: _coerce(spec.name, key, value, hints.get(key)) for key, value in raw.items()}


def _coerce(pass_name: str, key: str, value: Any, hint: Any) -> Any:
    """``value`` as the option's type says: CLI values arrive as YAML scalars ("3" an int, 3 a float where the
    option takes one). A value of another kind is refused by name here, where it reached the pass before and read
    as the pass's crash, or ran (QA: count=2.5 into an int, factor=true as 1.0, an empty factor= as None)."""
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else ()
    if members and type(None) in members:
        if value is None:
            return None
        others = [m for m in members if m is not type(None)]
        hint = others[0] if len(others) == 1 else None  # a union of several types: left to the pass
    if hint not in (float, int, bool, str):
        return value
    try:
        if isinstance(value, bool) and hint is not bool:
            raise ValueError(value)
        if hint is float and isinstance(value, (int, float, str)):
            return float(value)
        if hint is int and isinstance(value, (int, str)):
            return int(value)
        if hint is int and isinstance(value, float) and value.is_integer():
            return int(value)
        if hint is bool and isinstance(value, str) and value.lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.lower()]
        if hint is bool and isinstance(value, bool):
            return value
        if hint is str and isinstance(value, (str, int, float)):
            return str(value)
        raise ValueError(value)
    except ValueError:
        kind = {float: "a number", int: "a whole number", bool: "true or false", str: "a string"}[hint]
        raise PassError(f"option {pass_name}.{key} must be {kind}, got {value!r}") from None


_BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def copy_graph_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of the graph and its module tree that shares the parameter and buffer tensors.

    Copy-on-write: passes never write into a stored tensor; they store new ones (:func:`store_tensor`, a
    fresh module for a fold), so sharing the tensors is safe and saves copying every weight once per pass.
    Submodules are copied one level deep (:func:`_copy_module`), not deep-copied attribute by attribute,
    which halves the copy of a graph with thousands of modules. Node names and meta are kept, so
    provenance survives.
    """
    memo: dict[int, Any] = {id(t): t for t in (*gm.parameters(), *gm.buffers())}
    for module in gm.modules():  # plain tensor attributes (torch.export constants) are shared too
        memo.update({id(v): v for v in vars(module).values() if isinstance(v, torch.Tensor)})
    for child in gm.children():
        _copy_module(child, memo)  # deepcopy then takes the copies from the memo instead of descending into them
    return copy.deepcopy(gm, memo=memo)


def _copy_module(module: nn.Module, memo: dict[int, Any]) -> nn.Module:
    """A copy of ``module`` and its submodules whose own dicts and sets are new (``_parameters``, ``_buffers``,
    ``_modules``, hooks): registering, replacing or deleting an attribute on the copy leaves the original
    alone. Other attribute values are shared, as the tensors are; passes replace values, never mutate them.
    A module reached twice is copied once (``memo``, deepcopy's)."""
    if id(module) in memo:
        return memo[id(module)]
    if isinstance(module, (fx.GraphModule, torch.jit.ScriptModule)):
        # their code lives on a class made per instance (or in C++): only their own deepcopy rebuilds it
        return copy.deepcopy(module, memo)
    duplicate = module.__class__.__new__(module.__class__)
    memo[id(module)] = duplicate
    state = dict(vars(module))
    for key, value in state.items():
        if key == "_modules":
            state[key] = {name: None if sub is None else _copy_module(sub, memo) for name, sub in value.items()}
        elif isinstance(value, (dict, set)):
            state[key] = copy.copy(value)
    vars(duplicate).update(state)
    return duplicate


def stamp_provenance(gm: fx.GraphModule) -> None:
    """Give every node without an origin its own name as origin (done once, on the captured graph)."""
    for node in gm.graph.nodes:
        node.meta.setdefault(ORIGIN, node.name)


def mark(node: fx.Node, pass_name: str, origin_of: fx.Node | None = None) -> None:
    """Record that ``pass_name`` produced ``node``; with ``origin_of``, the node now computes that node's value."""
    node.meta[PASS] = pass_name
    if origin_of is not None:
        node.meta[ORIGIN] = origin_of.meta.get(ORIGIN, origin_of.name)


def free_attribute_name(owner: nn.Module, base: str) -> str:
    """``base``, or ``base_1``, ``base_2``... : the first name ``owner`` has no attribute of."""
    name, i = base, 0
    while hasattr(owner, name):
        i += 1
        name = f"{base}_{i}"
    return name


def store_tensor(gm: fx.GraphModule, base: str, value: torch.Tensor, *, parameter: bool = True) -> str:
    """Register ``value`` on ``gm`` under a free name derived from ``base`` (``base``, ``base_1``, ...).

    Passes store what they compute (folded weights, constants) as new attributes rather than overwrite the
    old ones, which the user's model may share. ``parameter=False`` stores a buffer (e.g. a folded constant).
    """
    name = free_attribute_name(gm, base)
    if parameter:
        gm.register_parameter(name, nn.Parameter(value, requires_grad=False))
    else:
        gm.register_buffer(name, value)
    return name


def apply_pass(gm: fx.GraphModule, name: str | PassSpec, options: Any = None, *, inplace: bool = False) -> PassResult:
    """Run one pass on ``gm`` (a copy of it unless ``inplace``); raises :class:`PassError` on misuse."""
    if not isinstance(gm, fx.GraphModule):  # a Captured or the model itself raised a bare AttributeError
        hint = "pass captured.graph_module" if hasattr(gm, "graph_module") else "capture it first: fxforge.capture"
        raise PassError(f"apply_pass takes a GraphModule, not a {type(gm).__name__}", hint=hint)
    spec = name if isinstance(name, PassSpec) else get_pass(name)
    parsed = parse_options(spec, options)
    dialect = dialect_of(gm)
    if dialect not in spec.dialects:
        raise PassError(
            f"pass {spec.name!r} works on {' and '.join(spec.dialects)} graphs, but this graph is {dialect}",
            hint="capture with --method symbolic_trace" if "torch" in spec.dialects else None,
        )
    if not inplace:
        gm = copy_graph_module(gm)
    stamp_provenance(gm)
    if spec.requires is not None:
        reason = spec.requires(gm, parsed)
        if reason:
            raise PassError(f"pass {spec.name!r} cannot run: {reason}")
    before = set(gm.graph.nodes)
    stored = _stored_tensor_versions(gm)
    # a plug-in's pass is also checked by value: a write through .data moves no counter (QA: it doubled the user's
    # weight, and verify then blamed rounding)
    plugin = spec.origin != BUILTIN
    sums = _stored_tensor_sums(gm) if plugin else {}
    shape = graph_fingerprint(gm.graph) if plugin else None
    held = _held_tensors(gm) if plugin else None
    result = spec.function(gm, parsed)
    if result is None or result is gm:  # as a plain function may (QA: AttributeError, RecursionError before)
        result = PassResult(spec.name, gm)
    if not isinstance(result, PassResult):
        raise PassError(
            f"pass {spec.name!r} returned {str(result)[:40]!r} (a {type(result).__name__}), not a PassResult",
            hint=PASS_CONTRACT,
        )
    result.name = spec.name  # the change log names the pass that ran, whatever name its result was given
    if shape is not None and not result.changed and graph_fingerprint(gm.graph) != shape:
        # a plug-in's pass that changed the graph without a note read "changed: no", and verification, finding
        # the difference, could blame no pass (QA): what it did is its change, said
        result.note("changed the graph without reporting it (no note)")
    if held is not None and not result.changed:
        # a plug-in's pass that only swapped a weight (a new Parameter, another module under the same name) leaves the
        # graph's code as it was: it read "changed: no", was not checked as it ran, and the next pass that changed the
        # graph was blamed for its difference and rolled back (QA: fold_bn, after a pass scaling conv1's weight)
        now = _held_tensors(gm)
        replaced = sorted(name for name in held.keys() | now.keys() if held.get(name) is not now.get(name))
        if replaced:
            result.note(f"replaced stored tensors without reporting it (no note): {', '.join(replaced[:3])}")
            for node in gm.graph.nodes:
                target = node.target if isinstance(node.target, str) else None
                if target is not None and (
                    (node.op == "get_attr" and target in replaced)
                    or (node.op == "call_module" and any(name.startswith(target + ".") for name in replaced))
                ):
                    node.meta[PASS] = spec.name  # so that verify names the pass on the node reading them
    written = [name for name, (tensor, version) in stored.items() if tensor._version != version]
    written += [name for name, (tensor, total) in sums.items() if name not in written and _sums(tensor) != total]
    if written:
        # the copy shares its tensors with the caller's graph and model (copy-on-write): an in-place write changed
        # them too. Detected, not undone: the pass must store new tensors (store_tensor) instead
        raise PassError(
            f"pass {spec.name!r} wrote into stored tensors in place ({', '.join(written[:3])}), which the "
            "original graph and model share: they are changed too",
            hint="a pass must store new tensors (fxforge.passes.store_tensor), never write into existing ones",
        )
    result.graph_module = gm
    for node in gm.graph.nodes:
        if node not in before:
            node.meta.setdefault(PASS, spec.name)
    try:
        gm.graph.lint()
    except Exception as exc:
        # first_line: torch.fx appends the whole graph to its message (QA: a 15-line error)
        raise PassError(f"pass {spec.name!r} left an invalid graph: {first_line(exc)}") from None
    gm.recompile()
    if spec.ensures is not None:
        reason = spec.ensures(gm, result)
        if reason:
            raise PassError(f"pass {spec.name!r} broke its guarantee: {reason}")
    return result


def _stored_tensor_versions(gm: fx.GraphModule) -> dict[str, tuple[torch.Tensor, int]]:
    """Every parameter and buffer of ``gm`` with its in-place write counter (``Tensor._version``)."""
    versions = {}
    for name, tensor in _held_tensors(gm).items():
        if not tensor.is_inference():  # an inference-mode tensor keeps no counter (and cannot be written outside)
            versions[name] = (tensor, tensor._version)
    return versions


def _held_tensors(gm: fx.GraphModule) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of ``gm`` by name: the very tensor objects, to tell a replaced one."""
    return {**dict(gm.named_parameters(remove_duplicate=False)), **dict(gm.named_buffers(remove_duplicate=False))}


def _stored_tensor_sums(gm: fx.GraphModule) -> dict[str, tuple[torch.Tensor, tuple[Any, ...]]]:
    """Every parameter and buffer of ``gm`` with where its data is and two sums of its values."""
    return {name: (tensor, _sums(tensor)) for name, tensor in _held_tensors(gm).items() if tensor.device.type != "meta"}


def _sums(tensor: torch.Tensor) -> tuple[Any, ...]:
    try:
        with torch.no_grad():
            values = torch.view_as_real(tensor.detach()) if tensor.is_complex() else tensor.detach()
            values = values.double() if values.is_floating_point() else values.long()
            return tensor.data_ptr(), float(values.sum()), float(values.abs().sum())
    except (RuntimeError, NotImplementedError):  # a quantized or opaque tensor: where its data is, only
        return (tensor.data_ptr(),)


def exact_passes() -> list[str]:
    """The registered exact passes, in the order ``lint --fix`` runs them."""
    _load_builtin_passes()
    return [name for name in FIX_ORDER if name in PASSES]


# What a list of passes may say for exact_passes(): `-p exact`, a pipeline file's step.
EXACT_GROUP = "exact"


def expand_groups(items: Sequence[Any]) -> list[Any]:
    """``items`` (pass names or pipeline steps) with each ``"exact"`` replaced by :func:`exact_passes`."""
    return [name for item in items for name in (exact_passes() if item == EXACT_GROUP else [item])]
