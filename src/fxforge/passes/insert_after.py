"""insert_after: insert a module after every node a selector matches.

What goes in (option ``insert``); each is a small ``nn.Module`` registered on the GraphModule and called by a new
``call_module`` node that the selected node's users now read:

* ``stats`` -- :class:`StatsRecorder`: running min, max, mean and (population) standard deviation of the finite
  values, NaN and Inf counts and the number of calls, over every batch the graph runs (float64 accumulators,
  merged per batch with Chan's parallel update). Read back with ``result.artifacts["stats"]`` (live) or
  :func:`collect_stats`; reset with :func:`reset_stats`. Returns its input itself, so outputs are bit-identical.
* ``nan_guard`` -- :class:`NonFiniteGuard`: raises :class:`NonFiniteError` (an ``FxforgeError`` and a
  ``RuntimeError``) naming the node and its module when the value holds a NaN or Inf; returns its input otherwise.
* ``noise`` -- :class:`GaussianNoise` (``x + sigma * N(0, 1)``) or :class:`LaplaceNoise` (``x + Laplace(0, b)``),
  drawn from a ``torch.Generator`` seeded per site (from ``seed`` and the node's name), so a run is reproducible and
  sites draw independent noise. With ``epsilon`` the noise is calibrated for differential privacy: the analytic
  Gaussian mechanism (:func:`analytic_gaussian_sigma`) or the Laplace mechanism, at a sensitivity derived from a
  ``clip_min``/``clip_max`` range the module clips to first (and the value's number of elements) or stated; the
  result's ``artifacts["privacy"]`` and log say what was guaranteed per site (docs/privacy.md). A raw ``sigma``
  claims nothing.
* ``clamp`` -- :class:`Clamp`: ``x.clamp(min, max)``.
* ``callable`` -- :class:`CallableModule`: ``fn(x)``, for a Python callable or a ``"pkg.mod:fn"`` reference.

Selectors (option ``select``: one string or a list; a node matching any of them is selected):

* ``type:Conv2d`` -- the class of the module a ``call_module`` node calls; for other call nodes, of the innermost
  module whose code made the node (``nn_module_stack``, so ATen ops select by the module they came from). Exact
  class, by name (``Conv2d``), qualified name (``torch.nn.Conv2d``) or glob (``Conv*``);
* ``name:layer1.*`` -- glob over module paths: a ``call_module`` target, else the owning module's path
  (:func:`fxforge.graphs.module_path`);
* ``target:relu`` -- glob over what a ``call_function``/``call_method`` node calls: ``relu`` matches ``F.relu``,
  ``torch.relu``, ``x.relu()`` and ``aten.relu.default``; ``aten.relu_.*`` names one ATen overload;
* ``op:call_function`` -- the node's op (the only selector that can pick ``placeholder`` or ``get_attr`` nodes);
* ``kind:relu`` -- what the node computes, in any form and dialect (:func:`fxforge.graphs.node_kind`).

Saving (``fxforge optimize`` writes ``torch.save`` and ``GraphModule.to_folder`` output): stats recorders, NaN
guards and clamps pickle as plain ``torch.fx.GraphModule`` s of their own forward (see :class:`_SavedAsGraph`), so
``model.pt`` and ``optimized_model/`` load and run with torch alone, without fxforge installed. A reloaded recorder
keeps counting in its buffers (``calls count mean m2 min max nan_count inf_count zero_count``;
``std = sqrt(m2 / count)``),
which :func:`collect_stats` still reads; a reloaded guard raises a plain ``RuntimeError`` with the same message (a
torch-only graph cannot raise fxforge's error class, nor count). Noise and callable modules pickle by reference to
their class: reloading them needs fxforge (and the callable's module) importable, because a seeded generator and an
arbitrary Python function have no torch-only form. ATen-dialect results are saved by re-exporting the graph
(``model.pt2``): torch.export traces through every inserted module (the guard becomes an ``aten._assert_async``,
the recorder's updates buffer mutations, the noise generator a lifted object), so the program runs with torch
alone; :func:`collect_stats` also reads the recorders of ``torch.export.load(...).module()``, by their buffers.
Noise is in the ``model.pt2`` of either dialect (drawn with ``normal_``, which torch.export takes at a dynamic batch),
its generators pickled in the program: torch loads them, fxforge only with ``trust_pickle``.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import fnmatch
import hashlib
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import TensorMetadata

from fxforge import references
from fxforge.effects import AliasClasses
from fxforge.errors import FxforgeError
from fxforge.graphs import ATEN, NODE_KINDS, aten_packet, dialect_of, module_path, node_kind, node_value, target_name
from fxforge.passes import PassError, PassResult, free_attribute_name, mark, register_pass
from fxforge.passes._privacy import (
    MECHANISMS,
    UNITS,
    analytic_gaussian_sigma,
    describe_noise,
    gaussian_delta,
    laplace_scale,
    privacy_summary,
)

NAME = "insert_after"
KINDS = ("stats", "nan_guard", "noise", "clamp", "callable")
SELECTOR_KEYS = ("type", "name", "target", "op", "kind")
MARKER = "fxforge_insert"  # attribute on every inserted module: {"kind", "node", "module_path", ...}
_STATS_BUFFERS = ("calls", "count", "mean", "m2", "min", "max", "nan_count", "inf_count", "zero_count")
_SELECTOR_HINT = "selectors: type:Conv2d, name:layer1.*, target:relu, op:call_function, kind:relu"


class InsertAfterError(FxforgeError, TypeError):
    """An inserted module was given a value it cannot handle (a non-tensor; integers for noise)."""


class NonFiniteError(FxforgeError, RuntimeError):
    """A NaN/Inf guard inserted by ``insert_after`` saw a non-finite value."""

    def __init__(self, node: str, path: str, nan_count: int, inf_count: int, numel: int) -> None:
        where = f"node {node}" + (f" (module {path})" if path else "")
        super().__init__(
            f"non-finite values after {where}: {nan_count} NaN and {inf_count} Inf of {numel} elements",
            hint="the NaN/Inf guard inserted by insert_after stopped the run here; check this module's inputs",
        )
        self.node, self.module_path = node, path
        self.nan_count, self.inf_count = nan_count, inf_count


# --------------------------------------------------------------------------------------------------
# the inserted modules


def _capturing() -> bool:
    """True while fx, torch.export or torch.compile traces the module rather than running it."""
    symbolic = getattr(torch.fx._symbolic_trace, "is_fx_symbolic_tracing", None)  # newer torch; the old one warns
    tracing = symbolic() if symbolic is not None else torch.fx._symbolic_trace.is_fx_tracing()
    return bool(tracing or torch.compiler.is_exporting() or torch.compiler.is_compiling())


class InsertedModule(nn.Module):
    """Base of the modules ``insert_after`` inserts; ``fxforge_insert`` says what and where."""

    kind = ""

    def __init__(self, node: str, path: str = "", **settings: Any) -> None:
        super().__init__()
        setattr(self, MARKER, {"kind": self.kind, "node": node, "module_path": path, **settings})

    @property
    def site(self) -> str:
        return getattr(self, MARKER)["node"]

    def _where(self) -> str:
        path = getattr(self, MARKER)["module_path"]
        return f"node {self.site}" + (f" (module {path})" if path else "")

    def _require_tensor(self, value: Any) -> None:
        if not isinstance(value, torch.Tensor):
            raise InsertAfterError(
                f"{self.kind} after {self._where()} got {type(value).__name__}, not a tensor",
                hint="narrow insert_after's select to nodes that produce tensors",
            )

    def extra_repr(self) -> str:
        settings = {k: v for k, v in getattr(self, MARKER).items() if k != "kind"}
        return ", ".join(f"{k}={v!r}" for k, v in settings.items())


class _SavedAsGraph(InsertedModule):
    """A module whose pickled form is the ``fx.GraphModule`` of its own forward, so that a saved model loads with
    torch alone. The forward must trace to the same computation: tensor ops only, and every op on a buffer takes a
    traced value too (reloading re-traces the code with a tracer that treats a buffer alone as a constant)."""

    def __reduce__(self) -> tuple[Any, ...]:
        graph = fx.Tracer().trace(self)
        for node in graph.nodes:
            node.type = None  # no annotations: the reloaded code then needs no names beyond torch
        saved = fx.GraphModule(self, graph, class_name=type(self).__name__)
        saved._graphmodule_cls_name = type(self).__name__  # the class name a reload gives it
        setattr(saved, MARKER, dict(getattr(self, MARKER)))
        return saved.__reduce__()

    def __deepcopy__(self, memo: dict[int, Any]) -> _SavedAsGraph:
        # deepcopy would go through __reduce__ and return the GraphModule; a copy must stay this class.
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        clone.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return clone

    def __copy__(self) -> _SavedAsGraph:
        clone = type(self).__new__(type(self))
        clone.__dict__.update(self.__dict__)
        return clone


class StatsRecorder(_SavedAsGraph):
    """Running statistics of the values passing through; returns its input itself."""

    kind = "stats"

    def __init__(self, node: str, path: str = "") -> None:
        super().__init__(node, path)
        f64 = torch.float64
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.register_buffer("count", torch.zeros((), dtype=f64))  # finite values seen (exact in float64 to 2**53)
        self.register_buffer("mean", torch.zeros((), dtype=f64))
        self.register_buffer("m2", torch.zeros((), dtype=f64))  # sum of squared deviations from the mean
        self.register_buffer("min", torch.full((), math.inf, dtype=f64))
        self.register_buffer("max", torch.full((), -math.inf, dtype=f64))
        self.register_buffer("nan_count", torch.zeros((), dtype=torch.int64))
        self.register_buffer("inf_count", torch.zeros((), dtype=torch.int64))
        self.register_buffer("zero_count", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _capturing():
            self._require_tensor(x)
        values = x.detach().to(torch.float64)
        finite = torch.isfinite(values)
        nan = torch.isnan(values)
        batch_count = finite.sum().to(torch.float64)
        batch_mean = torch.where(finite, values, 0.0).sum() / batch_count.clamp(min=1.0)
        batch_m2 = torch.where(finite, values - batch_mean, 0.0).square().sum()
        # Chan et al.'s merge of (count, mean, M2) pairs: stable where sum-of-squares cancels.
        total = self.count + batch_count
        delta = batch_mean - self.mean
        weight = batch_count / total.clamp(min=1.0)
        self.m2.add_(batch_m2 + delta * delta * self.count * weight)
        self.mean.add_(delta * weight)
        self.count.add_(batch_count)
        # padding with +-inf keeps the reductions defined on empty tensors
        low = torch.nn.functional.pad(torch.where(finite, values, math.inf).reshape(-1), (0, 1), value=math.inf)
        high = torch.nn.functional.pad(torch.where(finite, values, -math.inf).reshape(-1), (0, 1), value=-math.inf)
        self.min.copy_(torch.minimum(self.min, low.amin()))
        self.max.copy_(torch.maximum(self.max, high.amax()))
        self.nan_count.add_(nan.sum())
        self.inf_count.add_(torch.isinf(values).sum())
        self.zero_count.add_((values == 0).sum())
        self.calls.add_(torch.ones_like(batch_count, dtype=torch.int64))
        return x

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> StatsRecorder:
        # model.half() / .to(dtype) must not turn the float64 accumulators into fp16 ones.
        super()._apply(fn, recurse)
        for name in ("count", "mean", "m2", "min", "max"):
            buffer = self._buffers[name]
            if buffer is not None and buffer.dtype != torch.float64:
                self._buffers[name] = buffer.to(torch.float64)
        return self


class NonFiniteGuard(_SavedAsGraph):
    """Raises when the value holds a NaN or Inf; returns its input itself."""

    kind = "nan_guard"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _capturing():
            torch._assert_async(torch.isfinite(x).all(), f"fxforge nan_guard: NaN or Inf after {self._where()}")
            return x
        self._require_tensor(x)
        if (x.is_floating_point() or x.is_complex()) and not bool(torch.isfinite(x).all()):
            nan_count, inf_count = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
            raise NonFiniteError(self.site, getattr(self, MARKER)["module_path"], nan_count, inf_count, x.numel())
        return x


class Clamp(_SavedAsGraph):
    """``x.clamp(min, max)``."""

    kind = "clamp"

    def __init__(self, node: str, path: str = "", min: float | None = None, max: float | None = None) -> None:
        super().__init__(node, path, min=min, max=max)
        self.low, self.high = min, max

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _capturing():
            self._require_tensor(x)
        return torch.clamp(x, self.low, self.high)


def site_seed(seed: int, node: str) -> int:
    """The generator seed of one noise site: stable across runs and processes, different per node."""
    digest = hashlib.blake2b(f"{seed}:{node}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


# --------------------------------------------------------------------------------------------------
# noise (its calibration and privacy report are fxforge.passes._privacy)

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _inward(value: float, dtype: torch.dtype, up: bool) -> float:
    """The ``dtype`` number nearest ``value`` on the inside of the clip range (rounding may not widen it)."""
    t = torch.tensor(value, dtype=dtype)
    if not math.isfinite(float(t)) or (float(t) < value if up else float(t) > value):
        t = torch.nextafter(t, torch.tensor(math.inf if up else -math.inf, dtype=dtype))
    return float(t)


class _Noise(InsertedModule):
    """Base of the noise modules: optionally clip (NaN and +-Inf too) to ``clip = (low, high)``, then add noise from
    a generator seeded per site. Pickles with the generator's state, so a copy continues the same stream."""

    kind = "noise"

    def __init__(
        self,
        node: str,
        path: str = "",
        seed: int = 0,
        clip: tuple[float, float] | None = None,
        max_elements: int | None = None,
        **settings: Any,
    ) -> None:
        if clip is not None:
            settings["clip"] = clip
        super().__init__(node, path, **settings, seed=seed)
        self.generator_seed = site_seed(seed, node)
        self.clip = clip
        self.max_elements = max_elements  # the element count the sensitivity was derived for (unit: tensor)
        # each dtype's clip bounds, rounded inwards: a clamped value never leaves [low, high]
        self.clip_bounds = (
            {dtype: (_inward(clip[0], dtype, up=True), _inward(clip[1], dtype, up=False)) for dtype in _FLOAT_DTYPES}
            if clip is not None
            else {}
        )
        self._generator: torch.Generator | None = None

    def _generator_for(self, device: torch.device) -> torch.Generator:
        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device=device).manual_seed(self.generator_seed)
        return self._generator

    def _draw(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._require_tensor(x)
        if not x.is_floating_point():
            raise InsertAfterError(f"noise after {self._where()} needs floating point values, got {x.dtype}")
        if self.max_elements is not None:
            self._check_elements(x)
        if self.clip is not None:
            low, high = self.clip_bounds.get(x.dtype, self.clip)
            # NaN would pass a clamp and announce itself; +-Inf clamp anyway
            x = torch.clamp(torch.nan_to_num(x, nan=low, posinf=high, neginf=low), low, high)
        return x + self._draw(x, self._generator_for(x.device))

    def _check_elements(self, x: torch.Tensor) -> None:
        """Refuse more elements than the sensitivity was derived for (fewer only lower it). An exported program
        keeps the check as a constraint on its input sizes."""
        if torch.compiler.is_exporting() or torch.compiler.is_compiling():
            torch._check(
                x.numel() <= self.max_elements, lambda: f"fxforge noise: more than {self.max_elements} elements"
            )
            return
        if not _capturing() and x.numel() > self.max_elements:
            raise InsertAfterError(
                f"noise after {self._where()} was calibrated for at most {self.max_elements} elements (its "
                f"sensitivity grows with their number) and got {x.numel()}: the privacy guarantee would not hold",
                hint="run insert_after with example inputs of the largest shape the model will see",
            )

    def __getstate__(self) -> dict[str, Any]:
        # torch.Generator does not pickle; its state (a byte tensor) does, so a copy continues the same stream.
        # (A generator on an accelerator is not carried: the copy restarts that site's stream from its seed.)
        state = self.__dict__.copy()
        generator = state.pop("_generator")
        state["_generator_state"] = None
        if generator is not None and generator.device.type == "cpu":
            state["_generator_state"] = generator.get_state()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = {"clip": None, "max_elements": None, "clip_bounds": {}, **state}  # saved before clipping existed
        generator_state = state.pop("_generator_state", None)
        super().__setstate__(state)
        self._generator = None
        if generator_state is not None:
            self._generator = torch.Generator()
            self._generator.set_state(generator_state)


class GaussianNoise(_Noise):
    """``x + sigma * N(0, 1)`` (after clipping, when ``clip`` is given) from a generator seeded per site; drawn in
    float64 (float32 draws would cut the tails off near 5.8 sigma), added in the value's dtype."""

    mechanism = "gaussian"

    def __init__(self, node: str, path: str = "", sigma: float = 1.0, seed: int = 0, **calibration: Any) -> None:
        super().__init__(node, path, seed, sigma=sigma, **calibration)
        self.sigma = sigma

    def _draw(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        # the values torch.randn(x.shape, generator=...) draws, but exportable at a dynamic batch: torch.export
        # refused randn's generator overload on a symbolic shape ("SymIntArrayRef expected to contain only concrete
        # integers"), and optimize wrote no model.pt2 for a noisy graph
        normal = x.new_empty(x.shape, dtype=torch.float64).normal_(generator=generator)
        return (self.sigma * normal).to(x.dtype)


class LaplaceNoise(_Noise):
    """``x + Laplace(0, scale)`` (after clipping, when ``clip`` is given): ``scale * (E1 - E2)`` for two standard
    exponential draws (``-log Phi(N)`` of float64 standard normals), from a generator seeded per site."""

    mechanism = "laplace"

    def __init__(self, node: str, path: str = "", scale: float = 1.0, seed: int = 0, **calibration: Any) -> None:
        super().__init__(node, path, seed, scale=scale, **calibration)
        self.scale = scale

    def _draw(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        # Phi(N) of a standard normal N is uniform, so -log Phi(N) is a standard exponential (log_ndtr keeps its tail
        # exact). Drawn from normals because torch.export takes normal_ with a generator at a dynamic batch, where
        # torch.rand's generator overload failed and a program with uniform_ (whose argument is named `from`) could
        # not be loaded: optimize wrote no model.pt2 for a noisy graph
        normal = x.new_empty((2, *x.shape), dtype=torch.float64).normal_(generator=generator)
        exponential = -torch.special.log_ndtr(normal)
        return (self.scale * (exponential[0] - exponential[1])).to(x.dtype)


def resolve_callable(reference: str) -> Callable[..., Any]:
    """Import ``"pkg.mod:fn"`` or ``"path/file.py:fn"`` (``fn`` may be dotted: ``"pkg.mod:Class.method"``)."""
    value = references.import_reference(reference, what="fn", error=PassError, hint="e.g. fn: torch.nn.functional:gelu")
    if not callable(value):
        raise PassError(f"fn {reference!r} is a {type(value).__name__}, not callable")
    return value


def reference_of(function: Callable[..., Any]) -> str | None:
    """``"module:qualname"`` when importing that gives back ``function`` itself (not for lambdas or closures)."""
    module, qualname = getattr(function, "__module__", None), getattr(function, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        return None
    try:
        return f"{module}:{qualname}" if resolve_callable(f"{module}:{qualname}") is function else None
    except PassError:
        return None


class CallableModule(InsertedModule):
    """``fn(x)`` for a user function; pickles the function as a ``"module:name"`` reference where it has one."""

    kind = "callable"

    def __init__(self, node: str, path: str = "", fn: Callable[..., Any] | str | None = None) -> None:
        if fn is None:
            raise PassError("insert=callable needs fn")
        function = resolve_callable(fn) if isinstance(fn, str) else fn
        reference = fn if isinstance(fn, str) else reference_of(fn)
        super().__init__(node, path, fn=reference or repr(fn))
        self.reference = reference
        self.function = function

    def forward(self, x: Any) -> Any:
        return self.function(x)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if self.reference is not None:
            state["function"] = None  # re-imported on load: the function's code is not pickled anyway
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if self.function is None:
            self.function = resolve_callable(self.reference)


# --------------------------------------------------------------------------------------------------
# reading statistics back


@dataclass(frozen=True)
class SiteStats:
    """Statistics of one selected node's values; min/max/mean/std are over finite values (None before any)."""

    node: str
    module_path: str
    calls: int
    count: int
    nan_count: int
    inf_count: int
    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    zero_fraction: float | None = None  # of the values seen (ReLU outputs, pruned weights, dead units)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def read_stats(site: str, recorder: nn.Module) -> SiteStats:
    """A recorder's statistics so far (``site``: the name to report them under)."""
    info = getattr(recorder, MARKER, {})
    count = float(recorder.count)
    seen = count > 0
    return SiteStats(
        node=site,
        module_path=info.get("module_path", ""),
        calls=int(recorder.calls),
        count=int(count),
        nan_count=int(recorder.nan_count),
        inf_count=int(recorder.inf_count),
        min=float(recorder.min) if seen else None,
        max=float(recorder.max) if seen else None,
        mean=float(recorder.mean) if seen else None,
        std=math.sqrt(max(float(recorder.m2), 0.0) / count) if seen else None,
        zero_fraction=_zero_fraction(recorder),
    )


def _zero_fraction(recorder: nn.Module) -> float | None:
    zeros = getattr(recorder, "zero_count", None)  # absent from recorders saved before it was counted
    total = float(recorder.count) + float(recorder.nan_count) + float(recorder.inf_count)
    return float(zeros) / total if zeros is not None and total > 0 else None


class ActivationStats(Mapping[str, SiteStats]):
    """Selected node name -> :class:`SiteStats`, read from the recorders on every access (so always current)."""

    def __init__(self, recorders: Mapping[str, nn.Module]) -> None:
        self.recorders = dict(recorders)

    def __getitem__(self, node: str) -> SiteStats:
        return read_stats(node, self.recorders[node])

    def __iter__(self) -> Iterator[str]:
        return iter(self.recorders)

    def __len__(self) -> int:
        return len(self.recorders)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {node: self[node].to_dict() for node in self}

    def reset(self) -> None:
        for recorder in self.recorders.values():
            _reset(recorder)

    def __repr__(self) -> str:
        return f"ActivationStats({len(self)} sites: {', '.join(self)})"


def _recorder_site(name: str, module: nn.Module) -> str | None:
    """The selected node a recorder watches, or None when ``module`` is not a recorder."""
    info = getattr(module, MARKER, None)
    if isinstance(info, dict):
        return info["node"] if info.get("kind") == "stats" else None
    # torch.export's unlifted module keeps the buffers but not the marker: go by the buffer names
    if name.endswith("_stats") and set(_STATS_BUFFERS) <= set(module._buffers):
        return name.removesuffix("_stats")
    return None


def collect_stats(gm: nn.Module) -> ActivationStats:
    """The statistics recorders in ``gm``: as inserted, or reloaded from ``torch.save``, ``to_folder`` or
    ``torch.export.save`` output (keyed by the selected node's name)."""
    recorders = {}
    for name, module in gm.named_modules():
        site = _recorder_site(name, module)
        if site is not None:
            recorders[site] = module
    return ActivationStats(recorders)


def _reset(recorder: nn.Module) -> None:
    with torch.no_grad():
        for name in _STATS_BUFFERS:
            fill = {"min": math.inf, "max": -math.inf}.get(name, 0)
            getattr(recorder, name).fill_(fill)


def reset_stats(gm: nn.Module) -> None:
    """Zero every recorder in ``gm`` (verification runs, for one, count as calls)."""
    collect_stats(gm).reset()


# --------------------------------------------------------------------------------------------------
# options and selectors


@dataclass(frozen=True)
class Selector:
    key: str
    pattern: str

    def __str__(self) -> str:
        return f"{self.key}:{self.pattern}"


def parse_selector(text: Any) -> Selector:
    if not isinstance(text, str):
        raise PassError(f"selector {text!r} is not a string", hint=_SELECTOR_HINT)
    key, sep, pattern = text.partition(":")
    key, pattern = key.strip(), pattern.strip()
    if not sep or key not in SELECTOR_KEYS:
        guess = f"did you mean type:{text}? " if not sep and text[:1].isupper() else ""
        close = difflib.get_close_matches(key, SELECTOR_KEYS, n=1) if sep else []
        guess = guess or (f"did you mean {close[0]}:{pattern}? " if close else "")
        raise PassError(f"unknown selector {text!r}", hint=f"{guess}{_SELECTOR_HINT}")
    if not pattern:
        raise PassError(f"selector {text!r} has an empty pattern", hint=_SELECTOR_HINT)
    if key == "kind" and not fnmatch.filter(NODE_KINDS, pattern):
        raise PassError(f"unknown node kind in {text!r}", hint=f"kinds: {', '.join(NODE_KINDS)}")
    return Selector(key, pattern)


def _number(name: str, value: Any, kind: type) -> Any:
    if value is None:
        return None
    if isinstance(value, bool):
        raise PassError(f"option {NAME}.{name} must be a number, got {value!r}")
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise PassError(f"option {NAME}.{name} must be a number, got {value!r}") from None
    if kind is int and isinstance(value, float) and value != number:
        raise PassError(f"option {NAME}.{name} must be a whole number, got {value!r}")
    if number != number:
        raise PassError(f"option {NAME}.{name} is NaN")
    return number


@dataclass
class InsertAfterOptions:
    """Options of ``insert_after``; the settings after ``insert`` each belong to one kind.

    ``select``: a selector or a list (a node matching any is selected): ``type:Conv2d``, ``name:layer1.*``,
    ``target:relu``, ``op:call_function``, ``kind:relu``. ``insert``: ``stats``, ``nan_guard``, ``noise``, ``clamp``
    (``min`` and/or ``max``) or ``callable`` (``fn``: a Python callable, or ``"pkg.module:function"`` from YAML and
    the CLI). Numbers may be given as strings (``"1e-3"``).

    ``noise`` is calibrated differential-privacy noise (docs/privacy.md) or raw Gaussian noise:

    * calibrated: ``epsilon`` (> 0), ``mechanism`` ``gaussian`` (default; needs ``delta`` in (0, 1), analytic
      Gaussian mechanism) or ``laplace`` (no ``delta``), and the sensitivity: ``clip_min`` and ``clip_max`` clip
      the value first, and fxforge derives it from that range and the value's number of elements (``unit:
      tensor``, the default: any change of the whole value is protected) or the range alone (``unit: element``: a
      change of one element is); or ``sensitivity``, stated (L2 for gaussian, L1 for laplace). The result's
      ``artifacts["privacy"]`` and log give mechanism, epsilon, delta, sensitivity and its derivation, sigma or
      scale and the seed per site.
    * raw: ``sigma`` (> 0), Gaussian; no (epsilon, delta) guarantee is claimed (``clip_min``/``clip_max`` still clip).

    ``seed`` makes the noise reproducible (each site draws its own stream); without one, one is drawn at random.
    """

    select: str | list[str] | None = None  # required: None is refused by name (a missing argument read as Python's)
    insert: str = "stats"
    sigma: float | None = None  # noise: raw Gaussian standard deviation (> 0); no privacy claimed
    seed: int | None = None  # noise: seed; None draws one at random (not logged)
    min: float | None = None  # clamp
    max: float | None = None  # clamp
    fn: Callable[..., Any] | str | None = None  # callable: a function or "pkg.mod:function"
    epsilon: float | None = None  # noise: privacy budget per call and site (> 0)
    delta: float | None = None  # noise, gaussian: in (0, 1)
    mechanism: str | None = None  # noise: gaussian (default) or laplace
    sensitivity: float | None = None  # noise: stated sensitivity (L2 gaussian, L1 laplace) instead of clip_min/max
    clip_min: float | None = None  # noise: clip to [clip_min, clip_max] first (and derive the sensitivity)
    clip_max: float | None = None
    unit: str | None = None  # noise: tensor (default) or element: what a neighbouring input may change

    def __post_init__(self) -> None:
        raw = [self.select] if isinstance(self.select, str) else self.select
        if self.select is None or raw == [""] or (isinstance(raw, (list, tuple)) and not raw):
            raise PassError(f"{NAME} needs select: a selector or a list of them", hint=_SELECTOR_HINT)
        if not isinstance(raw, (list, tuple)):  # given, but not a selector (QA: select=1 read "needs select")
            shown = f"{self.select!r} ({type(self.select).__name__})"
            raise PassError(f"{NAME}'s select is a selector or a list of them, got {shown}", hint=_SELECTOR_HINT)
        self.selectors = [parse_selector(s) for s in raw]
        if self.insert not in KINDS:
            close = difflib.get_close_matches(str(self.insert), KINDS, n=1)
            guess = f"did you mean {close[0]!r}? " if close else ""
            raise PassError(f"{NAME} cannot insert {self.insert!r}", hint=f"{guess}insert is one of {', '.join(KINDS)}")
        for name in ("sigma", "min", "max", "epsilon", "delta", "sensitivity", "clip_min", "clip_max"):
            setattr(self, name, _number(name, getattr(self, name), float))
        self.seed = _number("seed", self.seed, int)
        self._check_settings()

    @property
    def calibrated(self) -> bool:
        """Noise calibrated from (epsilon, delta) and a sensitivity, rather than a raw sigma."""
        return self.insert == "noise" and self.epsilon is not None

    def _check_settings(self) -> None:
        owners = {"sigma": "noise", "seed": "noise", "min": "clamp", "max": "clamp", "fn": "callable"}
        owners.update(dict.fromkeys(("epsilon", "delta", "mechanism", "sensitivity", "clip_min", "clip_max"), "noise"))
        owners["unit"] = "noise"
        for option, kind in owners.items():
            if getattr(self, option) is not None and self.insert != kind:
                raise PassError(f"option {option} is for insert={kind}, not insert={self.insert}")
        if self.insert == "noise":
            self._check_noise()
        if self.insert == "clamp":
            if self.min is None and self.max is None:
                raise PassError("insert=clamp needs min, max or both")
            if self.min is not None and self.max is not None and self.min > self.max:
                raise PassError(f"clamp min {self.min} is greater than max {self.max}")
        if self.insert == "callable":
            if self.fn is None:
                raise PassError("insert=callable needs fn", hint="a Python callable, or 'pkg.module:function'")
            if isinstance(self.fn, str):
                resolve_callable(self.fn)  # fail now, when the options are read, on a bad reference
            elif not callable(self.fn):
                raise PassError(f"fn must be callable or 'pkg.module:function', got {type(self.fn).__name__}")

    def _check_noise(self) -> None:
        example = "e.g. epsilon: 1, delta: 1e-5, clip_min: 0, clip_max: 1 (calibrated) or sigma: 0.1 (raw)"
        if self.mechanism is None:
            self.mechanism = "gaussian"
        if self.mechanism not in MECHANISMS:
            raise PassError(f"option mechanism must be gaussian or laplace, got {self.mechanism!r}")
        if self.clip_min is not None or self.clip_max is not None:
            if self.clip_min is None or self.clip_max is None:
                missing = "clip_max" if self.clip_max is None else "clip_min"
                raise PassError(f"option {missing} is missing: clipping needs both clip_min and clip_max")
            if not (math.isfinite(self.clip_min) and math.isfinite(self.clip_max)):
                raise PassError("options clip_min and clip_max must be finite")
            if not self.clip_min < self.clip_max:
                raise PassError(f"option clip_min ({self.clip_min:g}) must be less than clip_max ({self.clip_max:g})")
        if self.sigma is not None and self.epsilon is not None:
            raise PassError(
                "options sigma and epsilon exclude each other: sigma is raw noise (no privacy claimed), epsilon "
                "calibrates it",
                hint="drop sigma to calibrate the noise from epsilon, or drop epsilon for raw noise",
            )
        if self.sigma is None and self.epsilon is None:
            raise PassError("insert=noise needs epsilon (calibrated noise) or sigma > 0 (raw noise)", hint=example)
        if self.sigma is not None:
            if not (self.sigma > 0 and math.isfinite(self.sigma)):
                raise PassError(f"insert=noise needs sigma > 0, got {self.sigma:g}", hint="e.g. sigma: 0.1, seed: 0")
            if self.mechanism == "laplace":
                raise PassError("option sigma is the Gaussian's standard deviation: mechanism=laplace needs epsilon")
            for option in ("delta", "sensitivity", "unit"):
                if getattr(self, option) is not None:
                    raise PassError(f"option {option} calibrates noise from epsilon; sigma is raw noise", hint=example)
            return
        assert self.epsilon is not None
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise PassError(f"option epsilon must be > 0 and finite, got {self.epsilon:g}")
        if self.mechanism == "gaussian":
            if self.delta is None:
                raise PassError("option delta is missing: the Gaussian mechanism needs delta in (0, 1)", hint=example)
            if not 0 < self.delta < 1:
                raise PassError(f"option delta must be in (0, 1) for the Gaussian mechanism, got {self.delta:g}")
        elif self.delta is not None:
            raise PassError(
                "option delta is not for mechanism=laplace: the Laplace mechanism is (epsilon, 0)-DP",
                hint="drop delta, or use mechanism: gaussian",
            )
        if self.sensitivity is not None:
            if not (self.sensitivity > 0 and math.isfinite(self.sensitivity)):
                raise PassError(f"option sensitivity must be > 0 and finite, got {self.sensitivity:g}")
            if self.clip_min is not None:
                raise PassError(
                    "options sensitivity and clip_min/clip_max exclude each other: fxforge derives the sensitivity "
                    "from the clip range",
                    hint="drop sensitivity to use the derived one, or drop clip_min/clip_max to state your own",
                )
            if self.unit is not None:
                raise PassError("option unit applies to a sensitivity derived from clip_min/clip_max, not a stated one")
        elif self.clip_min is None:
            raise PassError(
                "no sensitivity: give clip_min and clip_max (fxforge derives it from the range) or sensitivity",
                hint=example,
            )
        if self.clip_min is not None:
            self.unit = self.unit or "tensor"
            if self.unit not in UNITS:
                raise PassError(f"option unit must be tensor or element, got {self.unit!r}")


# --------------------------------------------------------------------------------------------------
# matching


def _type_names(cls: type | str) -> list[str]:
    if isinstance(cls, str):  # torch.export records the class as "torch.nn.modules.conv.Conv2d"
        qualified = cls
        name = cls.rpartition(".")[2]
        module = cls.rpartition(".")[0]
    else:
        name, module = cls.__name__, cls.__module__
        qualified = f"{module}.{cls.__qualname__}"
    names = [name, qualified]
    if module.startswith("torch.nn.modules"):
        names += [f"torch.nn.{name}", f"nn.{name}"]
    return names


def _owner_type(gm: fx.GraphModule, node: fx.Node) -> type | str | None:
    if node.op == "call_module":
        return type(gm.get_submodule(str(node.target)))
    stack = node.meta.get("nn_module_stack")
    return list(stack.values())[-1][1] if stack else None


def _target_names(node: fx.Node) -> list[str]:
    names = [target_name(node)]
    packet = aten_packet(node)
    if packet is not None:
        names += [packet, f"aten.{packet}"]
    elif node.op == "call_function":
        names.append(getattr(node.target, "__name__", str(node.target)))
    return names


def _matches(gm: fx.GraphModule, node: fx.Node, selector: Selector) -> bool:
    key, pattern = selector.key, selector.pattern
    if key == "op":
        return fnmatch.fnmatchcase(node.op, pattern)
    if not node.op.startswith("call"):
        return False
    if key == "name":
        return fnmatch.fnmatchcase(module_path(node), pattern)
    if key == "type":
        owner = _owner_type(gm, node)
        return owner is not None and any(fnmatch.fnmatchcase(n, pattern) for n in _type_names(owner))
    if key == "target":
        return node.op != "call_module" and any(fnmatch.fnmatchcase(n, pattern) for n in _target_names(node))
    kind = node_kind(gm, node)
    return kind is not None and fnmatch.fnmatchcase(kind, pattern)


def _nothing_matched(gm: fx.GraphModule, selectors: Sequence[Selector]) -> str:
    """The skip line for selectors that matched nothing, with the closest names the graph has."""
    known: dict[str, set[str]] = {"type": set(), "name": set(), "target": set()}
    for node in gm.graph.nodes:
        if node.op.startswith("call"):
            owner = _owner_type(gm, node)
            if owner is not None:
                known["type"].add(_type_names(owner)[0])
            known["name"].add(module_path(node))
            if node.op != "call_module":
                known["target"].update(_target_names(node)[-1:])
    hints = []
    for selector in selectors:
        close = difflib.get_close_matches(selector.pattern, sorted(known.get(selector.key, ())), n=3)
        if close:
            hints.append(f"{selector}: did you mean {', '.join(f'{selector.key}:{c}' for c in close)}?")
    names = ", ".join(str(s) for s in selectors)
    return f"no node matched select {names}" + (f" ({' '.join(hints)})" if hints else "")


# --------------------------------------------------------------------------------------------------
# the pass

_SCALAR_METHODS = {"size", "dim", "ndimension", "numel", "nelement", "item", "tolist", "__len__", "stride"}


def _value_problem(gm: fx.GraphModule, node: fx.Node, dialect: str, insert: str) -> str | None:
    """Why ``node``'s value cannot take the insertion (not a tensor; integers for noise), or None."""
    if node.op == "call_module" and isinstance(getattr(gm.get_submodule(str(node.target)), MARKER, None), dict):
        return f"it was itself inserted by {NAME}"
    value = node_value(node)
    if value is None:
        if dialect == ATEN:
            return "it produces no tensor"
        if (node.op == "call_method" and node.target in _SCALAR_METHODS) or node.target in (getattr, len):
            return f"it produces a {node.target} value, not a tensor"
        return None  # torch dialect without shape facts: the inserted module checks at run time
    if not isinstance(value, (torch.Tensor, TensorMetadata)):
        return f"it produces a {type(value).__name__}, not a tensor"
    if insert == "noise" and not value.dtype.is_floating_point:
        return f"noise needs floating point values and it produces {value.dtype}"
    return None


class _StaleReaders:
    """Finds nodes that read a selected node's storage under another name after it (through in-place ops).

    A transform (noise, clamp, callable) re-points the selected node's users to a new tensor; a node that reads
    the same storage through an earlier alias (``y = x.relu_(); z = x + 1``) would still see the old values.
    """

    def __init__(self, gm: fx.GraphModule) -> None:
        self.aliases = AliasClasses(gm)
        self.position = {node: i for i, node in enumerate(gm.graph.nodes)}
        self._earlier_by_class: dict[fx.Node, list[fx.Node]] | None = None

    def reader(self, node: fx.Node) -> fx.Node | None:
        if not self.aliases.written(node):
            return None
        if self._earlier_by_class is None:  # built on first need: most graphs have no written classes
            self._earlier_by_class = {}
            for other in self.position:
                self._earlier_by_class.setdefault(self.aliases._find(other), []).append(other)
        here = self.position[node]
        for other in self._earlier_by_class.get(self.aliases._find(node), ()):
            if self.position[other] >= here:
                break
            for user in other.users:
                if user is not node and self.position.get(user, -1) > here:
                    return user
        return None


def _build(options: InsertAfterOptions, node: fx.Node, path: str) -> nn.Module:
    if options.insert == "stats":
        return StatsRecorder(node.name, path)
    if options.insert == "nan_guard":
        return NonFiniteGuard(node.name, path)
    if options.insert == "noise":
        raise AssertionError("noise modules are built by _noise_site, with their calibration")
    if options.insert == "clamp":
        return Clamp(node.name, path, min=options.min, max=options.max)
    return CallableModule(node.name, path, fn=options.fn)


def _insertion_point(gm: fx.GraphModule, node: fx.Node) -> fx.Node:
    # inputs stay together at the top of the graph: a site after an input goes after the last one
    if node.op != "placeholder":
        return node
    return [n for n in gm.graph.nodes if n.op == "placeholder"][-1]


def _element_count(node: fx.Node) -> int:
    """The number of elements of ``node``'s value, from the shape capture recorded; -1 when none was recorded or
    a size is symbolic (a dynamic batch: any count is possible)."""
    shape = getattr(node_value(node), "shape", None)
    if shape is None or not all(type(size) is int for size in shape):
        return -1
    return math.prod(shape)


def _noise_site(options: InsertAfterOptions, node: fx.Node, path: str, seed: int) -> tuple[_Noise, dict[str, Any]]:
    """The noise module for one site and its privacy report: mechanism, epsilon, delta, the sensitivity and how it
    was derived, sigma or scale, seed."""
    clip = (options.clip_min, options.clip_max) if options.clip_min is not None else None
    report: dict[str, Any] = {
        "node": node.name,
        "module_path": path,
        "mechanism": options.mechanism,
        "guarantee": options.calibrated,
        "epsilon": options.epsilon,
        "delta": options.delta,
        "sensitivity": None,
        "norm": None,
        "derivation": None,
        "unit": options.unit,
        "elements": None,
        "clip": list(clip) if clip is not None else None,
        "sigma": None,
        "scale": None,
        "seed": seed,
        "site_seed": site_seed(seed, node.name),
    }
    if not options.calibrated:
        assert options.sigma is not None
        report.update(sigma=options.sigma, derivation="none: raw sigma, no (epsilon, delta) guarantee is claimed")
        return GaussianNoise(node.name, path, sigma=options.sigma, seed=seed, clip=clip), report
    assert options.epsilon is not None
    gaussian = options.mechanism == "gaussian"
    norm = "L2" if gaussian else "L1"
    max_elements = None
    if options.sensitivity is not None:
        sensitivity, derivation = options.sensitivity, "stated: option sensitivity"
    else:
        assert clip is not None
        width = clip[1] - clip[0]
        where = f"clip range [{clip[0]:g}, {clip[1]:g}]"
        if options.unit == "element":
            sensitivity, derivation = width, f"{where}, one element (unit: element): {norm} = {width:g}"
        else:
            elements = _element_count(node)
            if elements < 0:
                raise PassError(
                    f"option unit=tensor: cannot derive the sensitivity of {node.name}, whose number of elements is "
                    "not recorded (no shape metadata, or a dynamic size)",
                    hint="state the sensitivity (option sensitivity), or protect one element at a time (unit: element)",
                )
            max_elements = elements
            factor = math.sqrt(elements) if gaussian else float(elements)
            sensitivity = width * factor
            times = f"sqrt({elements})" if gaussian else f"{elements}"
            derivation = f"{where} x {elements} elements (unit: tensor): {norm} = {width:g} x {times}"
        report["elements"] = max_elements
    report.update(sensitivity=sensitivity, norm=norm, derivation=derivation)
    settings: dict[str, Any] = {
        "seed": seed,
        "clip": clip,
        "max_elements": max_elements,
        "epsilon": options.epsilon,
        "sensitivity": sensitivity,
    }
    if gaussian:
        assert options.delta is not None
        sigma = analytic_gaussian_sigma(options.epsilon, options.delta, sensitivity)
        report["sigma"] = sigma
        return GaussianNoise(node.name, path, sigma=sigma, delta=options.delta, **settings), report
    report["delta"] = 0.0
    scale = laplace_scale(options.epsilon, sensitivity)
    report["scale"] = scale
    return LaplaceNoise(node.name, path, scale=scale, **settings), report


@register_pass(
    NAME,
    summary=(
        "Insert a statistics recorder, NaN/Inf guard, noise (Gaussian or Laplace, calibrated for differential "
        "privacy), clamp or callable after selected nodes."
    ),
    guarantees=(
        "stats and nan_guard return their input tensor itself, so outputs are bit-identical (verify passes); noise, "
        "clamp and callable change values by design: verification against the model fails by design (noise is not "
        "exact; insert_after is not in lint --fix's FIX_ORDER), and verify names the inserted node (it stands for "
        "the node it follows). Noise with epsilon is calibrated differential privacy for the value released at each "
        "site per call: the analytic Gaussian mechanism (Balle & Wang 2018, exact for every epsilon > 0) or the "
        "Laplace mechanism (b = L1 sensitivity / epsilon), from a stated sensitivity or one derived from the "
        "clip_min/clip_max range (NaN and Inf clipped too) and the number of elements recorded at capture (a call "
        "with more elements is refused at run time); the result reports mechanism, epsilon, delta, sensitivity "
        "and its derivation, sigma or b and the seed per site, the basic-composition total per call and whether "
        "every input-to-output path passes a site. With epsilon every selected node must take the noise, or the "
        "pass fails; raw sigma claims no guarantee. Not DP training; no protection of the weights; see "
        "docs/privacy.md. Selects by module type, module-path glob, call target, op or node kind; a selector "
        "that matches nothing leaves the graph alone and says so. Never inserts after a non-tensor value, noise "
        "after integer values, or a transform where an in-place op lets another name read the node's storage after "
        "it (each refusal is listed). Saved models: stats, nan_guard and clamp load with torch alone; noise and "
        "callable in model.pt need fxforge importable; noise in model.pt2 loads with torch alone, its seeded "
        "generators pickled in it (fxforge loads it with --trust-pickle). Torch and ATen dialects."
    ),
    options=InsertAfterOptions,
)
def insert_after(gm: fx.GraphModule, options: InsertAfterOptions) -> PassResult:
    result = PassResult(NAME, gm)
    seed_given = options.seed is not None
    if options.insert == "noise":
        if options.seed is None:
            # not written to the log: whoever knows the seed can subtract the noise again
            options = dataclasses.replace(options, seed=int.from_bytes(os.urandom(8), "little") >> 1)
            result.log.append("noise seed drawn at random; it is in result.artifacts['seed'] and on each noise module")
        result.artifacts["seed"] = options.seed
    if options.insert == "callable" and reference_of(options.fn) is None and not isinstance(options.fn, str):
        result.skip(f"fn {options.fn!r} has no importable name: the result runs but cannot be saved with torch.save")
    dialect = dialect_of(gm)
    stale = _StaleReaders(gm) if options.insert in ("noise", "clamp", "callable") else None
    sites: list[fx.Node] = []
    refused: list[str] = []
    matched = 0
    for node in gm.graph.nodes:
        if node.op == "output" or not any(_matches(gm, node, s) for s in options.selectors):
            continue
        matched += 1
        problem = _value_problem(gm, node, dialect, options.insert)
        reader = stale.reader(node) if stale is not None and problem is None else None
        if reader is not None:
            problem = f"{reader.name} reads its storage after it (in-place aliasing), so {options.insert} would miss it"
        if problem:
            refused.append(f"{node.name}: {problem}")
        else:
            sites.append(node)
    if not matched:
        refused.append(_nothing_matched(gm, options.selectors))
    if options.calibrated and refused:
        # fail closed: a value the user asked to protect must not be released without noise
        raise PassError(
            f"insert=noise with epsilon must protect every selected node, but {'; '.join(refused)}",
            hint="narrow select to the floating-point tensors to release",
        )
    for line in refused:
        result.skip(line)
    inserted: dict[str, str] = {}
    privacy: dict[str, dict[str, Any]] = {}
    noise_nodes: set[fx.Node] = set()
    for node in sites:
        path = module_path(node)
        report: dict[str, Any] | None = None
        if options.insert == "noise":
            assert options.seed is not None
            module, report = _noise_site(options, node, path, options.seed)
        else:
            module = _build(options, node, path)
        module_name = free_attribute_name(gm, f"{node.name}_{options.insert}")
        gm.add_submodule(module_name, module)
        with gm.graph.inserting_after(_insertion_point(gm, node)):
            new = gm.graph.call_module(module_name, (node,))
        node.replace_all_uses_with(new, delete_user_cb=lambda user, new=new: user is not new)
        # the new node stands for the value it follows: verify compares it with that node and, for a
        # transform, names it as the first divergence
        mark(new, NAME, origin_of=node)
        inserted[node.name] = module_name
        where = f" (module {path})" if path and path != str(node.target) else ""
        line = f"inserted {options.insert} after {node.name}{where} as {module_name}"
        if report is not None:
            report["module"] = module_name
            privacy[node.name] = report
            noise_nodes.add(new)
            line += f": {describe_noise(report, seed_given)}"
        result.note(line, inserted=1)
    result.artifacts["inserted"] = inserted
    if options.insert == "stats":
        result.artifacts["stats"] = ActivationStats({site: gm.get_submodule(name) for site, name in inserted.items()})
    if options.insert == "noise":
        if options.calibrated:
            summary, lines = privacy_summary(gm, privacy, noise_nodes)
            result.log.extend(lines)
        else:
            summary = {"sites": privacy, "per_call": None, "outputs_covered": None, "uncovered_path": None}
        result.artifacts["privacy"] = summary
    return result


__all__ = [
    "MECHANISMS",
    "UNITS",
    "ActivationStats",
    "CallableModule",
    "Clamp",
    "GaussianNoise",
    "InsertAfterError",
    "InsertAfterOptions",
    "LaplaceNoise",
    "NonFiniteError",
    "NonFiniteGuard",
    "SiteStats",
    "StatsRecorder",
    "analytic_gaussian_sigma",
    "collect_stats",
    "gaussian_delta",
    "insert_after",
    "laplace_scale",
    "reset_stats",
]
