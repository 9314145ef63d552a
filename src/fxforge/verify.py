"""Verify: prove that a candidate computes what a reference computes, and name where it does not.

Owns :class:`Verifier` (the reference side of a proof, computed once: the cases and the reference's
outputs on them), :func:`verify`, and the bisection that names the first diverging node. What
"verified" means -- which inputs are tried, with which tolerances, and what no finite test can prove --
is documented in docs/verified.md; in short:

* at least :data:`DEFAULT_CASES` cases: every distribution of :data:`fxforge.inputs.FLOAT_DISTRIBUTIONS`
  (signs, scales, sparsity) at the example's batch size and at a second batch size where the model (and
  the captured graph) accepts one, with a new seed for every case;
* the reference is the user's model itself, run twice on the first case: a model whose output is
  random (dropout in training mode) cannot be verified, and is reported as such;
* outputs must agree in structure, dtype and shape, and in value within the per-dtype tolerances of
  :mod:`fxforge.compare`; a reference that is entirely NaN/Inf proves nothing and is a failure;
* a case sensitive to rounding is judged against the exact result: when a candidate misses a case, the
  model is run once more in float64, and the candidate passes if it is within the tolerance plus
  :data:`ILL_CONDITIONED_FACTOR` times the model's own distance from that float64 value -- as close to the
  exact result as the model itself, give or take its rounding. The model's own distance is the largest of
  its output's and its outputs' on the case's input perturbed at the rounding level (every float input
  times ``1 + u``, ``|u|`` up to the dtype's epsilon, :data:`PERTURBED_RUNS` draws), and on runs where every
  operation's floating-point result is perturbed so (:data:`PERTURBED_RUNS` more draws): a float32
  computation of the same function that rounds differently -- at every operation, not only at the input --
  lands anywhere in that spread, and the model's own output is one draw of it, which can be lucky. Only
  where that spread (not the model's own draw alone) is a sizeable share of the tolerance
  (:data:`SENSITIVE_SHARE`): for a well-conditioned
  case the model is a few ulps from float64 and the ordinary tolerance decides. The result's warnings name
  every case judged this way.
  Seen on timm's visformer_tiny with random weights: on inputs of scale 8 its attention logits reach 1e4
  and its own float32 output is 17% away from float64, so a BatchNorm fold or an ONNX export (different
  float32 rounding, same math) missed the float32 output by as much.
"""

from __future__ import annotations

import copy
import math
import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch._ops import HigherOrderOperator
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from fxforge import display
from fxforge.artifacts import AotiModule, AutocastModule, CompiledModule, OnednnFusion, OnnxRuntimeModule
from fxforge.capture import Captured, placeholder_values, random_sources, randomness_hint
from fxforge.compare import (
    TOLERANCES,
    TYPE_DIFFERS,
    Comparison,
    as_structure,
    compare_outputs,
    diverges,
    paired_leaves,
    resolve_tolerances,
    tolerance_for,
)
from fxforge.errors import FxforgeError, InputSpecError, offered, one_line_reason, option, said
from fxforge.graphs import ATEN, TORCH, GraphRunner, dialect_of, graph_fingerprint, target_name
from fxforge.inputs import Case, InputSpec, case_plan, draw_like, make_inputs
from fxforge.models import load_model
from fxforge.runtime import (
    buffers_snapshot,
    changed_buffers,
    cloned,
    device_of,
    ieee_float32,
    keeps_rng_state,
    preserved_state,
    quiet_torch_logs,
    run_isolated,
)
from fxforge.vocabulary import ORIGIN, PASS, PICKLED_GRAPH_BESIDE

__all__ = [
    "DEFAULT_CASES",
    "ILL_CONDITIONED_FACTOR",
    "TOLERANCES",
    "Comparison",
    "Divergence",
    "Verifier",
    "VerifyResult",
    "as_structure",
    "bisect_graphs",
    "compare_outputs",
    "reference_output",
    "tolerance_for",
    "verify",
]

# A case the candidate misses is judged against float64, allowing the tolerance plus this many times the model's
# own distance from float64. Two float32 roundings of one ill-conditioned computation land at similar, not equal,
# distances; on a well-conditioned case the model's own distance is a few ulps, and the tolerance decides.
ILL_CONDITIONED_FACTOR = 4.0
# ... when the model's rounding spread, relative to the output, exceeds this share of rtol: below it the case is
# well-conditioned (float32 models are ~1e-7 from float64) and a miss at the edge of the tolerance stands.
SENSITIVE_SHARE = 0.1

# Rounding-level perturbations of a missed ill-conditioned case, each run once: this many of its input, and as many
# of every operation's result. The model's own spread is the largest distance from float64 among them (one draw can
# be lucky; see the module docstring). Perturbing the input alone under-estimated it: on efficientnet_b0 (random
# weights, a "wide" case at batch 2, 2026-11-28) the input draws lay 35-90 from float64 while ONNX Runtime, rounding
# every layer its own way, lay 3,005 away, and the draws that perturb every operation reached 1,570.
PERTURBED_RUNS = 3
# ... and the every-operation draws: more of them, as their distances are heavy-tailed on a chaotic case, and each
# counted at half its distance: a result perturbed and rounded back to its dtype lands on a neighbour of its correct
# rounding, up to 1.5 units in the last place from the exact value where another implementation's rounding lands at
# most 1 (QA: at full weight, a cancellation model's spread read 3x its own error, and with the 4x allowance a
# candidate off by 10x that error passed).
EVERY_OP_RUNS = 6
EVERY_OP_SHARE = 0.5

# Enough to cover every distribution at two batch sizes with seeds to spare, and still fast: the
# reference runs once per case for a whole pipeline, a candidate once per case per changed pass.
DEFAULT_CASES = 16


@dataclass
class Divergence:
    """The first candidate node whose value differs from the reference node it claims to compute."""

    node: str
    reference_node: str
    target: str
    pass_name: str | None
    max_abs_err: float

    def describe(self) -> str:
        # the pass that last rewrote the node, which is not always the culprit: a pass may change what a node
        # reads (remove a write before it, retarget a module) without marking it
        by = f", last rewritten by pass {self.pass_name!r}" if self.pass_name else ""
        return (
            f"first divergence at node {self.node} ({self.target}), which should equal reference node "
            f"{self.reference_node}: max abs error {self.max_abs_err:.3g}{by}"
        )


@dataclass
class VerifyResult:
    """The outcome of a verification and exactly what it tried.

    ``trials`` counts the cases compared; ``cases`` labels them; ``skipped`` says which batch sizes or
    cases were left out and why; ``warnings`` carries non-finite reference values and similar doubts.
    ``nondeterministic`` is True when the reference gave two different outputs for one input. ``unverifiable``:
    the reference itself gives nothing to check against (not deterministic, the same output for every input, NaN
    everywhere): no candidate was run, ``problems`` say why.
    """

    ok: bool
    max_abs_err: float
    max_rel_err: float
    trials: int
    problems: list[str] = field(default_factory=list)
    divergence: Divergence | None = None
    cases: list[str] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    distributions: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    nondeterministic: bool = False
    unverifiable: bool = False
    capture_differs: bool = False  # the captured graph itself differs from the model on a failing case
    rejected_inputs: str | None = None  # the case a program exported for other shapes refused to run
    # on a mismatch with no divergence: why no node could be named (the candidate is not a graph...)
    divergence_unknown: str | None = None
    hint: str | None = None  # on a failure: what to try (the --concrete values a file was written with)
    failing_case: int | None = field(default=None, repr=False)  # the Verifier's index of the first failing case
    # the (rtol, atol) each floating dtype of the outputs was compared with: "equal" is only as strict as these
    tolerances: dict[str, tuple[float, float]] = field(default_factory=dict)
    # for a side given as an output directory: the file of it that was compared ({"candidate": "model.pt2"})
    files: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        return display.verify_repr(self)

    def _repr_html_(self) -> str:  # Jupyter shows this for the last value of a cell
        return display.verify_html(self)

    @property
    def tried(self) -> str:
        """What was tried, as ``to_dict()["tried"]`` has it (:meth:`describe_inputs`)."""
        return self.describe_inputs()

    def describe_inputs(self) -> str:
        """One line: what was tried (``16 cases: batch 1, 2; N(0, 1), U[0, 1), ...``)."""
        parts = [f"{self.trials} case{'s' if self.trials != 1 else ''}"]
        details = []
        if self.batch_sizes:
            details.append("batch " + ", ".join(str(b) for b in self.batch_sizes))
        if self.distributions:
            details.append(", ".join(self.distributions))
        return parts[0] + (f" ({'; '.join(details)})" if details else "")

    def describe_tolerances(self) -> str:
        """The tolerances the outputs were compared with (``float32 within rtol 1e-04, atol 1e-05``); "" if none."""
        return display.tolerances_text(self.tolerances)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("failing_case")  # an index into one Verifier's cases: meaningless outside it
        data["tried"] = self.describe_inputs()
        return data


# --------------------------------------------------------------------------------------------------
# the reference side


def _example_batch(template: Any) -> int | None:
    sizes = {t.shape[0] for t in pytree.tree_leaves(template) if isinstance(t, torch.Tensor) and t.dim() > 0}
    return sizes.pop() if len(sizes) == 1 else None


def default_batch_sizes(example_batch: int | None) -> list[int | None]:
    """The example's batch size and one other (a batch size baked into a graph shows up at any other)."""
    if example_batch is None:
        return [None]
    return [example_batch, 2 if example_batch == 1 else 1]


def batches_a_candidate_takes(candidate: Any, args: Sequence[Any], seed: int = 0) -> tuple[list | None, str | None]:
    """The batch sizes to verify a candidate on that may be fixed to its example's batch (a static ONNX file or
    saved program): the default ones (None) if it runs one other batch size, else only the example's -- so all the
    cases run at the batch it takes instead of half of them being skipped -- and why the other is left out."""
    example_batch = _example_batch((tuple(args), {}))
    if example_batch is None:
        return None, None
    other = default_batch_sizes(example_batch)[1]
    other_args, other_kwargs = draw_like((tuple(args), {}), "normal", seed + 1, other)
    try:
        with quiet_torch_logs():
            run_isolated(candidate, other_args, other_kwargs)
    except Exception as exc:
        return [None], f"batch {other}: the candidate rejects it ({one_line_reason(exc, 120)})"
    return None, None


def _on_meta(values: Any, *modules: Any) -> bool:
    tensors = [t for t in pytree.tree_leaves(values) if isinstance(t, torch.Tensor)]
    for module in modules:
        if isinstance(module, nn.Module):
            tensors += [p for p in module.parameters()][:1]
    return any(t.device.type == "meta" for t in tensors)


# Reference outputs kept per model, so that verifications of one model (a pipeline's, then its export's) run it
# once per case: model -> (its state when they were computed, [(args, kwargs, output)]). Weak: they go with the model.
_KEPT: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, list[tuple[tuple, dict, Any]]]] = weakref.WeakKeyDictionary()
KEEP_LIMIT = 2**28  # bytes of inputs and outputs kept per model; past it, outputs are computed again


def _state(module: nn.Module, *, full: bool = False) -> tuple:
    """What the outputs of ``module`` depend on that fxforge can see: every submodule (its identity, training flag
    and plain attributes: numbers, strings, booleans), every parameter and buffer (identity, storage, version
    counter, which in-place writes such as ``load_state_dict`` or an optimizer step increment, and a digest of its
    values, as a write through ``.data`` leaves the version counter as it was). ``full``: the digest reads every
    value (for the rare check that the reference itself was changed); otherwise a sample of 64, cheap enough to
    take at every reference run (a full one cost 1 s per call on resnet50)."""
    state: list[Any] = []
    for name, sub in module.named_modules(remove_duplicate=False):
        plain = tuple((k, v) for k, v in vars(sub).items() if isinstance(v, (bool, int, float, str, type(None))))
        state.append((name, id(sub), sub.training, plain))
        for key, tensor in [*sub._parameters.items(), *sub._buffers.items()]:
            if isinstance(tensor, torch.Tensor):
                storage = tensor.data_ptr() if tensor.layout == torch.strided else None  # sparse: no data pointer
                identity = (key, id(tensor), storage, tensor._version, tuple(tensor.shape), tensor.dtype)
                state.append((*identity, _digest(tensor, full)))
    return tuple(state)


def _digest(tensor: torch.Tensor, full: bool) -> tuple[str, ...]:
    """The sum (and for floats the norm) of ``tensor``'s values, or of 64 of them spread over it, as hex strings (a
    NaN equals itself there); empty for tensors without plain values (meta, quantized, complex, sparse)."""
    if tensor.device.type == "meta" or tensor.is_quantized or tensor.is_complex() or tensor.layout != torch.strided:
        return ()
    with torch.no_grad():
        values = tensor.detach().reshape(-1)
        if values.is_floating_point() and values.element_size() < 4:  # fp16 sums overflow, bf16 sums lose the write
            values = values.float()
        if not full:
            values = values[:: max(1, values.numel() // 64)]
        parts = [values.sum()]
        if values.is_floating_point():
            parts.append(torch.linalg.vector_norm(values))
        return tuple(float(part).hex() for part in parts)


def _same_inputs(a: Any, b: Any) -> bool:
    leaves_a, spec_a = pytree.tree_flatten(a)
    leaves_b, spec_b = pytree.tree_flatten(b)
    if spec_a != spec_b:
        return False
    for x, y in zip(leaves_a, leaves_b):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            same = (
                isinstance(x, torch.Tensor)
                and isinstance(y, torch.Tensor)
                and x.dtype == y.dtype
                and x.shape == y.shape
                and x.device == y.device
                and bool(torch.equal(x, y))
            )
            if not same:
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def _bytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor))


# each model's full stamp (every value read) when a Verifier was last made for it: the kept outputs are checked
# against a sample of the values at every run, and against all of them once per Verifier
_STAMPS: weakref.WeakKeyDictionary[nn.Module, tuple] = weakref.WeakKeyDictionary()


def _forget_kept_outputs_if_changed(module: Any, stamp: tuple) -> None:
    """Drop the outputs kept for ``module`` where any of its values changed since the last Verifier of it: a write
    through ``.data`` to a value the sampled digest does not read reused stale outputs, which the determinism
    check then called "not deterministic" (QA)."""
    if not isinstance(module, nn.Module):
        return
    if _STAMPS.get(module, stamp) != stamp:
        _KEPT.pop(module, None)
    _STAMPS[module] = stamp


def reference_output(module: Any, args: tuple, kwargs: dict) -> Any:
    """``run_isolated(module, args, kwargs)``, or the output of an earlier run of ``module`` on equal inputs (same
    values, dtypes, shapes) while it was in the same state (:func:`_state`). The output is shared: read it only."""
    if not isinstance(module, nn.Module):
        return run_isolated(module, args, kwargs)
    state = _state(module)
    kept_state, entries = _KEPT.get(module, ((), []))
    if kept_state != state:
        entries = []
    for kept_args, kept_kwargs, output in entries:
        if _same_inputs((kept_args, kept_kwargs), (args, kwargs)):
            return output
    output = run_isolated(module, args, kwargs)
    if _state(module) == state:  # a run that changed the model (and was not undone) is not kept
        size = _bytes((args, kwargs, output)) + sum(_bytes(entry) for entry in entries)
        if size <= KEEP_LIMIT:
            entries = [*entries, (cloned(args), cloned(kwargs), output)]
        _KEPT[module] = (state, entries)
    return output


def _template(
    captured: Captured | None, example: Any, input_specs: Sequence[Any] | None, seed: int, module: Any = None
) -> tuple[tuple, dict]:
    """The inputs the cases are shaped like: ``example``, else ``input_specs`` (on ``module``'s device), else the
    Captured's examples."""
    if example is not None:
        return tuple(example[0]), dict(example[1])
    if input_specs is not None:
        where = device_of((), module) if isinstance(module, nn.Module) else torch.device("cpu")
        return make_inputs(list(input_specs), seed=seed, device=where), {}
    if captured is not None:
        return captured.example_inputs, dict(captured.example_kwargs)
    raise InputSpecError(
        "verify needs inputs or input shapes",
        hint=said(
            "pass --input, e.g. --input 1x3x224x224",
            "pass input_specs=['1x3x224x224'] (or inputs, the tensors themselves)",
        ),
    )


def _input_guard_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is a file refusing an input of another shape -- a torch.export program's input guard or
    shape check, an ONNX file's fixed input shape, an AOTInductor package's compiled shapes (fxforge's loaders
    check the last two) -- rather than a failure while computing."""
    text = str(exc)
    return (
        "Guard failed" in text
        or bool(re.search(r"Expected input at \S+ to be equal to", text))
        or bool(re.search(r"the ONNX model's input \S+ has shape", text))
        or "package was compiled for inputs" in text
    )


def _refusal_of_inputs(exc: BaseException, label: str) -> str | None:
    """Why the candidate refused the inputs of case ``label`` rather than failing while computing, or None."""
    if _input_count_refused(exc):  # a file written with other arguments (--concrete fixed one), another model
        return (
            f"the candidate does not take the inputs of {label} ({one_line_reason(exc, 160)}): the two do not take "
            "the same inputs"
        )
    if _input_guard_failed(exc):  # a program exported for other shapes checks its inputs
        return (
            f"the candidate rejects the inputs of {label} ({one_line_reason(exc, 120)}): it was exported for other "
            "input shapes; verify with those (an output directory's inputs.txt)"
        )
    return None


def _input_count_refused(exc: BaseException) -> bool:
    """Whether ``exc`` is a candidate refusing the number of inputs at its call (fxforge's loaders of an exported
    program or ONNX file check it; a Python forward raises TypeError), rather than a failure while computing."""
    text = str(exc)
    return bool(
        re.search(r"^the (exported program|ONNX model) takes \d+ inputs?\b", text)
        # TorchScript's own words for it (QA: a .ts.pt taking another count read MISMATCH)
        or bool(re.search(r"forward\(\) (is missing value for argument|Expected at most \d+ argument)", text))
        or (
            isinstance(exc, TypeError)
            and re.search(r"forward\(\) (takes \d+ positional arguments? but \d+ (were|was) given|missing \d+)", text)
        )
    )


def _identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same values in the same places, NaN as NaN: ``torch.equal`` calls a NaN unequal to itself, and a reference
    whose outputs were the same on every case but held a NaN was taken to depend on its input (QA: a zero classifier
    head beside a buffer with a NaN verified OK against zeros)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):
        return True
    if not (a.is_floating_point() or a.is_complex()):
        return False
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def _state_stamp(module: Any) -> tuple[Any, ...]:
    """What changes when a module is rewritten in place: its graph's nodes, and its :func:`_state`."""
    graph = graph_fingerprint(module.graph) if isinstance(module, fx.GraphModule) else None
    return graph, _state(module, full=True) if isinstance(module, nn.Module) else None


class Verifier:
    """The reference side of a verification: the cases and the reference's outputs on them, computed once.

    ``reference`` is a module or a :class:`~fxforge.capture.Captured` (then the user's model is the
    reference, its captured graph is used to bisect a mismatch, and the cases are shaped like its example
    inputs). Inputs, in order of precedence: ``inputs`` (exactly these positional inputs, one case);
    ``example`` (``(args, kwargs)`` to shape the cases like); ``input_specs``; the Captured's examples.
    ``batch_sizes`` defaults to :func:`default_batch_sizes`; ``None`` entries mean "as the example". A batch size
    the captured graph rejects (a static torch.export) is left out, unless ``keep_batches_the_graph_rejects``
    (the candidate takes it): then it is compared with the model, and only a mismatch there cannot be bisected.
    """

    # keeps_rng_state: the reference runs here (and the candidate in check), and a model in training mode (dropout)
    # draws from the global generator -- Verifier is public, so it must give the caller's random state back as
    # verify does, not only when verify wraps it
    @keeps_rng_state
    @ieee_float32()  # the reference's outputs in float32, not TF32 (see runtime.use_ieee_float32)
    def __init__(
        self,
        reference: Any,
        inputs: Sequence[Any] | None = None,
        *,
        example: tuple[Sequence[Any], Mapping[str, Any]] | None = None,
        input_specs: Sequence[Any] | None = None,
        cases: int = DEFAULT_CASES,
        seed: int = 0,
        batch_sizes: Sequence[int | None] | None = None,
        rtol: float | None = None,
        atol: float | None = None,
        allow_dtype_change: bool = False,
        allow_nonfinite: bool = False,
        keep_batches_the_graph_rejects: bool = False,
    ) -> None:
        if cases < 1:
            raise FxforgeError(f"verification needs at least one case, got {cases}")
        for batch in batch_sizes or ():
            if batch is not None and not (hasattr(batch, "__index__") and not isinstance(batch, bool) and batch >= 1):
                raise FxforgeError(f"batch sizes must be integers of at least 1 (None: the example's), got {batch!r}")
        self.captured = reference if isinstance(reference, Captured) else None
        self.module = reference.original if isinstance(reference, Captured) else reference
        self._reference_stamp = _state_stamp(self.module)
        _forget_kept_outputs_if_changed(self.module, self._reference_stamp)
        self.rtol, self.atol = rtol, atol
        self.allow_dtype_change, self.allow_nonfinite = allow_dtype_change, allow_nonfinite
        self.skipped: list[str] = []
        self.warnings: list[str] = []
        self.problems: list[str] = []
        self.nondeterministic = False
        # batch sizes the model takes but its captured graph (a static torch.export) does not: compared all the
        # same when keep_batches_the_graph_rejects (the candidate takes them), but not bisected there
        self.keep_batches_the_graph_rejects = keep_batches_the_graph_rejects
        self.graph_rejects: set[int] = set()
        if inputs is not None:
            args = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
            self.cases = [Case(None, "given", seed, args, dict(example[1]) if example else {})]
            self.batch_sizes: list[int] = []
            self.example_batch: int | None = None
        else:
            template = _template(self.captured, example, input_specs, seed, self.module)
            if _on_meta(template, self.module):
                raise FxforgeError("cannot verify on the meta device: there are no values to compare")
            self.example_batch = _example_batch(template)
            batches = self._usable_batches(template, batch_sizes, seed)
            self.batch_sizes = [b for b in batches if b is not None]
            # At the example's batch alone (a static export, or a model that takes no other), the cases are those
            # the two-batch plan gives that batch (seeds 0, 2, 4, ...), and more: their reference outputs are shared.
            step = 2 if self.example_batch is not None and batches == [self.example_batch] else 1
            self.cases = [
                Case(batch, distribution, case_seed, *draw_like(template, distribution, case_seed, batch))
                for batch, distribution, case_seed in case_plan(batches, cases, seed, step)
            ]
        self.expected = self._reference_outputs()
        self._double: nn.Module | None = None  # a float64 copy of the reference, made for an ill-conditioned case
        self._exact: dict[int, Any] = {}
        self._exact64: dict[int, Any] = {}  # the same outputs before they are cast back (_off_in_float64)
        self._parameter_spread: dict[int, dict[str, float]] = {}  # per case: see _parameter_rounding_spread
        self._candidate64: tuple[Any, nn.Module | None] | None = None  # (candidate, its float64 copy)
        self._shaken_double: nn.Module | None = None  # see _parameter_rounding_spread
        self._failed_in_float64: set[int] = set()  # cases failed by _off_in_float64: bisected in float64 too
        self._spread: dict[int, dict[str, float]] = {}  # per case: see _rounding_spreads
        self._own_distance: dict[int, dict[str, float]] = {}  # per case: the model's own output's part of it
        self._unjudged: set[int] = set()  # the cases of the current run that proved nothing (_against_float64)
        self._updates_buffers: bool | None = None  # whether the reference's forward writes its buffers (asked once)

    # -- setup

    def _usable_batches(
        self, template: tuple[tuple, dict], batch_sizes: Sequence[int | None] | None, seed: int
    ) -> list:
        """The batch sizes to try: those the model (and the captured graph) accept; the others are skipped.

        The model is tried on the first case the two-batch plan draws at that batch (N(0, 1), seed + 1): its
        output is kept (:func:`reference_output`) and is that case's reference output.
        """
        example_batch = _example_batch(template)
        wanted = list(batch_sizes) if batch_sizes is not None else default_batch_sizes(example_batch)
        usable = []
        for batch in dict.fromkeys(example_batch if b is None else b for b in wanted):
            if batch == example_batch or example_batch is None:
                usable.append(example_batch)
                continue
            args, kwargs = draw_like(template, "normal", seed + 1, batch)
            reason = self._rejects(self.module, args, kwargs, "the model", keep=True)
            if reason is None and self.captured is not None:
                reason = self._rejects(self.captured.graph_module, args, kwargs, "the captured graph")
                if reason is not None and self.keep_batches_the_graph_rejects:
                    self.graph_rejects.add(batch)
                    reason = None
                elif reason is not None:
                    # verify captures its reference itself, and takes no --check-batch
                    dynamic = offered(f"; capture with {option('--check-batch')} for a dynamic one", "--check-batch")
                    reason += f" (fixed to batch {example_batch}{dynamic or ''})"
            if reason is None:
                usable.append(batch)
            else:
                self.skipped.append(f"batch {batch}: {reason}")
        return list(dict.fromkeys(usable)) or [None]

    @staticmethod
    def _rejects(module: Any, args: tuple, kwargs: dict, what: str, keep: bool = False) -> str | None:
        try:
            with quiet_torch_logs():
                if keep:
                    reference_output(module, args, kwargs)
                else:
                    run_isolated(module, args, kwargs)
        except Exception as exc:
            return f"{what} rejects it ({one_line_reason(exc, 160)})"
        return None

    def _reference_outputs(self) -> list[Any]:
        expected: list[Any] = []
        kept: list[Case] = []
        for index, case in enumerate(self.cases):
            try:
                with quiet_torch_logs():
                    output = reference_output(self.module, case.args, case.kwargs)
            except Exception as exc:
                if index == 0:
                    raise InputSpecError(
                        f"the model rejected the verification inputs ({case.label}): {one_line_reason(exc)}",
                        hint=f"pass {option('--input', python='inputs')} with the shape and dtype the model expects",
                    ) from None
                self.skipped.append(f"{case.label}: the model rejects it ({one_line_reason(exc, 160)})")
                continue
            if index == 0:
                self._check_determinism(case, output)
            nonfinite = compare_outputs(output, output, allow_nonfinite=True)
            if nonfinite.reference_values and nonfinite.reference_nonfinite == nonfinite.reference_values:
                self.skipped.append(f"{case.label}: every reference value is NaN or Inf, nothing to compare")
                continue
            self.warnings.extend(w for w in nonfinite.warnings if w not in self.warnings)
            kept.append(case)
            expected.append(output)
        if not kept and not self.allow_nonfinite:
            self.problems.append(
                "every floating-point value of the reference is NaN or Inf on every case tried: nothing to compare"
            )
        self.cases = kept if kept else self.cases[:0]
        self._check_input_dependence(expected)
        return expected

    def _check_input_dependence(self, expected: list[Any]) -> None:
        """A reference whose outputs are the same on every case, though the inputs differ (a
        zero-initialised classifier head gives zeros for every input), makes any candidate that returns those
        values pass, whatever it computes from its inputs: no check could fail, so none is claimed."""
        if expected and all(all(leaf is None for leaf in pytree.tree_leaves(as_structure(out))) for out in expected):
            # QA: a forward returning None was reported "OK ... on 16 cases" though not one value was compared
            shown = "None" if all(out is None for out in expected) else "only None values"
            self.problems.append(
                f"the reference returns {shown} on every case: there is no value to compare, so no check could fail "
                "(return the tensors the model computes)"
            )
            return
        if len(self.cases) < 2 or self.cases[0].distribution == "given":
            return
        first_batch = self.cases[0].batch
        same_batch = [out for case, out in zip(self.cases, expected) if case.batch == first_batch]
        # every tensor, integers too: a reference that returns one constant count passed any candidate returning it;
        # Python numbers as well (a forward returning ``x.sum().item()``, or a constant 3)
        leaves = [
            [
                leaf if isinstance(leaf, torch.Tensor) else torch.tensor(leaf)
                for leaf in pytree.tree_leaves(as_structure(out))
                if isinstance(leaf, (torch.Tensor, bool, int, float))
            ]
            for out in same_batch
        ]
        if len(leaves) < 2 or not leaves[0]:
            return
        first = leaves[0]
        if all(
            len(other) == len(first) and all(_identical(a, b) for a, b in zip(other, first)) for other in leaves[1:]
        ):
            if all(not t.is_floating_point() and not t.is_complex() for t in first):
                # QA: an argmax / comparison output of random weights (one class wins on every drawn input) was
                # blamed on a zero-initialised layer the model did not have
                why = (
                    ": its outputs are integers or booleans only (an argmax, a comparison), which these inputs do not "
                    "move; return the float values they are taken from (the logits), or pass your own inputs"
                )
            else:
                why = " (a layer initialised to zeros, such as a classifier head? give it random weights)"
            self.problems.append(
                f"the reference's outputs are the same on all {len(leaves)} cases at batch "
                f"{first_batch}, whatever the input: nothing that depends on the input can be checked{why}"
            )

    def _tolerances(self) -> dict[str, tuple[float, float]]:
        # every output dtype, integer and bool ones too: they match exactly unless the caller loosened the
        # tolerance, and "OK" says so (QA: an argmax output was compared exactly, but only float32 was listed)
        dtypes = {
            leaf.dtype
            for output in self.expected[:1]
            for leaf in pytree.tree_leaves(as_structure(output))
            if isinstance(leaf, torch.Tensor)
        }
        return {
            str(dtype).removeprefix("torch."): resolve_tolerances(dtype, self.rtol, self.atol)
            for dtype in sorted(dtypes, key=str)
        }

    def _check_determinism(self, case: Case, first: Any) -> None:
        # from another random state than ``first``'s: that may be an output kept from an earlier call, which ran
        # from the state the caller's is given back at (keeps_rng_state), and a rerun from it draws the same numbers
        # (a random model passed as deterministic). A seed drawn from the current state moves off it.
        with quiet_torch_logs(), torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(int(torch.randint(0, 2**62, (1,))))
            second = run_isolated(self.module, case.args, case.kwargs)
        again = compare_outputs(first, second, self.rtol, self.atol, allow_nonfinite=True)
        if not again.ok:
            self.nondeterministic = True
            self.problems.append(
                f"the reference is not deterministic: two runs on the same inputs differ (max abs err "
                f"{again.max_abs_err:.3g}); {self._randomness_advice()}"
            )

    def _randomness_advice(self) -> str:
        """What makes the reference random, where its graph names it (as capture's note does): "call model.eval()"
        was the advice for a graph in eval mode whose randomness is insert_after's noise (QA). In capture's words, as
        its note on the same finding."""
        graph = self.captured.graph_module if self.captured is not None else self.module
        sources = random_sources(graph) if isinstance(graph, fx.GraphModule) else []
        if sources:
            return f"its outputs are unprovable: {randomness_hint(sources, self.module)}"
        return (
            "random ops (dropout in training mode, torch.rand) make its outputs unprovable -- call model.eval() or "
            "remove the randomness"
        )

    # -- the candidate side

    @keeps_rng_state  # see __init__
    @ieee_float32()
    def check(
        self,
        candidate: Any,
        *,
        bisect: bool = True,
        candidate_may_fix_batch: bool = False,
        only: Sequence[int] | None = None,
    ) -> VerifyResult:
        """Run ``candidate`` (a module, GraphModule, Captured or callable) on every case and compare.

        ``candidate_may_fix_batch``: a candidate that refuses a batch size other than the example's (a static
        torch.export or ONNX file) is not a mismatch: those cases are skipped and the result says so. Off for
        rewrites, where a graph that stopped taking other batch sizes is a broken rewrite.
        ``only``: the indices of the cases to run (a pipeline's quick check of one pass); the result's ``trials``
        and ``cases`` say which were run.
        """
        if isinstance(candidate, (str, Path)):  # it would fail every case as "not callable"
            raise FxforgeError(
                f"Verifier.check runs a model, not the spec or file {str(candidate)!r}",
                hint="pass it to fxforge.verify, which loads it, or load it with fxforge.load_model first",
            )
        module = candidate.graph_module if isinstance(candidate, Captured) else candidate
        chosen = list(range(len(self.cases))) if only is None else [i for i in only if 0 <= i < len(self.cases)]
        result = VerifyResult(
            True,
            0.0,
            0.0,
            len(chosen),
            cases=[self.cases[i].label for i in chosen],
            batch_sizes=[b for b in self.batch_sizes if any(self.cases[i].batch == b for i in chosen)],
            distributions=list(dict.fromkeys(self.cases[i].distribution for i in chosen)),
            skipped=list(self.skipped),
            warnings=list(self.warnings),
            nondeterministic=self.nondeterministic,
            tolerances=self._tolerances(),
        )
        if self.problems:
            result.ok, result.unverifiable = False, True
            result.problems.extend(self.problems)
            return result
        failing: Case | None = None
        bisectable: Case | None = None  # the first failing case at a batch size the captured graph takes
        self._unjudged = set()
        refused: set[int | None] = set()
        for index in chosen:
            case, expected = self.cases[index], self.expected[index]
            if case.batch in refused:
                continue
            try:
                with quiet_torch_logs():
                    actual = run_isolated(module, case.args, case.kwargs)
            except Exception as exc:
                if candidate_may_fix_batch and case.batch not in (None, self.example_batch):
                    refused.add(case.batch)
                    result.skipped.append(f"batch {case.batch}: the candidate rejects it ({one_line_reason(exc, 120)})")
                    continue
                result.ok = False
                result.max_abs_err = result.max_rel_err = math.inf
                refusal = _refusal_of_inputs(exc, case.label)
                if refusal is not None:
                    # it computed nothing, so no node can be named and there is nothing to bisect: what it takes
                    # (the shapes of an output directory's inputs.txt, the same arguments) is what can be verified
                    result.rejected_inputs = case.label
                    result.problems.append(refusal)
                    result.divergence_unknown = "the candidate did not run on these inputs"
                    result.failing_case = index
                    break
                result.problems.append(f"candidate failed to run on {case.label}: {one_line_reason(exc)}")
                failing = failing or case
                bisectable = bisectable or (case if case.batch not in self.graph_rejects else None)
                result.failing_case = index if result.failing_case is None else result.failing_case
                break
            comparison = compare_outputs(
                expected,
                actual,
                self.rtol,
                self.atol,
                allow_dtype_change=self.allow_dtype_change,
                allow_nonfinite=True,
            )
            # the output's container type differing (a dict for a dataclass) is said once, not per case
            differs = [w for w in comparison.warnings if w.endswith(TYPE_DIFFERS) and w not in result.warnings]
            result.warnings.extend(differs)
            if not comparison.ok:
                comparison = self._against_float64(index, actual, comparison, result, module)
            result.max_abs_err = max(result.max_abs_err, comparison.max_abs_err)
            result.max_rel_err = max(result.max_rel_err, comparison.max_rel_err)
            if not comparison.ok:
                result.ok = False
                result.problems.extend(f"{case.label}: {problem}" for problem in comparison.problems[:3])
                failing = failing or case
                bisectable = bisectable or (case if case.batch not in self.graph_rejects else None)
                result.failing_case = index if result.failing_case is None else result.failing_case
        result.cases = [self.cases[i].label for i in chosen if self.cases[i].batch not in refused]
        if result.ok and not self.nondeterministic and chosen:
            self._check_second_call(module, self.cases[chosen[0]], result)
        judged = [i for i in chosen if self.cases[i].batch not in refused and i not in self._unjudged]
        if module is self.module and _state_stamp(module) != self._reference_stamp:
            # rewritten in place since the reference outputs were taken: what the check still runs on the reference
            # (its float64 run, which sets the tolerance) runs the candidate, and a bias off by 1 passed (QA)
            result.ok, result.unverifiable = False, True
            result.problems.append(
                "the candidate is the reference model itself, changed in place since: keep an unchanged copy as the "
                "reference"
            )
        elif module is self.module and result.ok:
            # the same object on both sides: only randomness could have made it fail, so "OK" would prove nothing
            # (QA; fxforge.verify said so, Verifier.check, its reusable form, passed it: QA again)
            result.ok, result.unverifiable = False, True
            result.problems.append("the candidate is the reference model itself: the comparison could not fail")
        if result.ok and result.cases and not judged:
            result.ok, result.unverifiable = False, True
            result.problems.append(
                "no case could be judged: on every one the model's own float32 output is as far from its float64 "
                "value as the output is large (try other inputs, or compare in float64)"
            )
        result.trials = len(result.cases)
        result.batch_sizes = [b for b in result.batch_sizes if b not in refused]
        if failing is not None and bisectable is None and self.captured is not None:
            result.divergence_unknown = (
                f"the reference's captured graph, which bisection reruns, takes batch {self.example_batch} only, and "
                f"the candidate differs at batch {failing.batch} alone"
            )
        elif failing is not None and self.captured is not None:
            self._blame_capture(bisectable, result)
        if bisectable is not None and bisect and not result.capture_differs:  # if it does, the problems say so
            self._bisect(module, bisectable, result)
        return result

    def _check_second_call(self, module: Any, case: Case, result: VerifyResult) -> None:
        """For a reference that updates its buffers in ``forward`` (a running statistic, a call counter): compare
        the second call of the reference and of the candidate, each from its own starting state. Every case runs from
        that state, where a file that holds no state (ONNX, a constant-folded graph) agrees with the model; it is the
        next call that tells them apart (QA: an ONNX export of such a model was verified, and behaved as the first
        call forever)."""
        if not isinstance(self.module, nn.Module):
            return
        if self._updates_buffers is None:  # once per verifier: a pipeline checks every pass with the same one
            self._updates_buffers = _updates_buffers(self.module, case)
        if not self._updates_buffers:
            return
        try:
            expected = _second_call(self.module, case)
            actual = _second_call(module, case)
        except Exception as exc:
            result.ok = False
            result.problems.append(f"{case.label}, second call: {one_line_reason(exc)}")
            return
        comparison = compare_outputs(
            expected, actual, self.rtol, self.atol, allow_dtype_change=self.allow_dtype_change, allow_nonfinite=True
        )
        result.cases.append(f"{case.label}, second call")
        if not comparison.ok:
            result.ok = False
            result.max_abs_err = max(result.max_abs_err, comparison.max_abs_err)
            result.problems.append(
                f"{case.label}, second call: the model updates its buffers in forward, and the candidate's second "
                f"call differs from the model's ({'; '.join(comparison.problems[:2])}): it does not keep that state"
            )

    def _bisect(self, module: Any, failing: Case, result: VerifyResult) -> None:
        """Name the first candidate node that diverges on ``failing`` -- or say why none can be named."""
        if self.captured is None:
            result.divergence_unknown = "the reference is not a captured graph, so there are no nodes to compare"
            return
        if not isinstance(module, fx.GraphModule):
            result.divergence_unknown = (
                f"the candidate ({type(module).__name__}) is not an fx graph: a diverging node can be named only "
                "between two graphs"
            )
            return
        try:
            in_float64 = None
            if self.cases.index(failing) in self._failed_in_float64:
                in_float64 = self._bisect_in_float64(failing)
            result.divergence, compared, suspect = in_float64 or _first_divergence(
                self.captured.graph_module,
                module,
                placeholder_values(self.captured.graph_module, failing.args, failing.kwargs),
                placeholder_values(module, failing.args, failing.kwargs),
                self.rtol,
                self.atol,
            )
        except Exception as exc:  # the candidate already failed to run on that case: the problems say so
            result.divergence_unknown = f"the graphs could not be rerun node by node ({one_line_reason(exc, 120)})"
            return
        if result.divergence is not None:
            return
        reference_dialect, candidate_dialect = dialect_of(self.captured.graph_module), dialect_of(module)
        if suspect is not None:
            why = suspect
        elif not compared:
            cause = (
                f"the reference graph is in the {reference_dialect} dialect, "
                f"the candidate in the {candidate_dialect} dialect"
                if reference_dialect != candidate_dialect
                else "the candidate was not derived from this reference's graph by fxforge"
            )
            why = f"no candidate node corresponds to a reference node ({cause})"
        else:
            why = (
                f"the {compared} candidate nodes that correspond to reference nodes all agree: the difference "
                "arises in nodes with no reference counterpart"
            )
        beside = getattr(module, "meta", {}).get(PICKLED_GRAPH_BESIDE)
        if reference_dialect == TORCH and candidate_dialect == ATEN and beside:
            # the model.pt2 of a torch-dialect optimize output is an ATen re-export: few of its nodes match, and the
            # torch-dialect graph beside it is what bisects (a plain exported program has none: nothing is offered)
            why += f"; an optimize output of a torch-dialect graph is bisected from its {beside} (--trust-pickle)"
        result.divergence_unknown = why

    def _bisect_in_float64(self, failing: Case) -> tuple[Divergence | None, int, str | None] | None:
        """The first diverging node of a case that failed only in float64 (:meth:`_off_in_float64`), found in float64:
        in float32 the nodes before the change already differ by the model's rounding, and the first of them was
        named. Each reference node is allowed :data:`ILL_CONDITIONED_FACTOR` times how far it moves when the
        parameters are rounded again (as in :meth:`_parameter_rounding_spread`, 3 draws). None where that cannot run
        (the float32 bisection is used)."""
        assert self.captured is not None
        candidate = self._candidate64[1] if self._candidate64 is not None else None
        if not isinstance(candidate, fx.GraphModule):
            return None
        try:
            reference = copy.deepcopy(self.captured.graph_module).double()
            args, kwargs = pytree.tree_map(_to_float64, (failing.args, failing.kwargs))
            reference_inputs = placeholder_values(reference, args, kwargs)
            exact = _record_values(reference, reference_inputs)
            shaken = copy.deepcopy(reference)
            units = _unit_roundoffs(self.captured.graph_module)
            generator = torch.Generator().manual_seed(failing.seed)
            allowance: dict[str, float] = {}
            for _ in range(PERTURBED_RUNS):
                _rerounded(shaken, reference, units, generator)
                for name, value in _record_values(shaken, reference_inputs).items():
                    before = exact.get(name)
                    comparable = isinstance(value, torch.Tensor) and isinstance(before, torch.Tensor)
                    if comparable and value.is_floating_point() and value.shape == before.shape:
                        distance = (value - before).abs().max().item() if value.numel() else 0.0
                        allowance[name] = max(allowance.get(name, 0.0), ILL_CONDITIONED_FACTOR * distance)
            rtol64, atol64 = tolerance_for(torch.float64)
            return _first_divergence(
                reference,
                candidate,
                reference_inputs,
                placeholder_values(candidate, args, kwargs),
                rtol64,
                atol64,
                allowance,
            )
        except Exception:
            return None

    def _against_float64(
        self, index: int, actual: Any, failed: Comparison, result: VerifyResult, candidate: Any = None
    ) -> Comparison:
        """A case the candidate missed, judged output by output: an output sensitive to rounding against the
        float64 result with its own allowance (see the module docstring), every other output strictly against
        the model's, as before; else ``failed`` as it is. The allowance is per output: one output's rounding
        spread must not excuse another (QA: ``(sin(x * 1e11), x)`` passed ``(..., x + 1)``)."""
        spreads = self._rounding_spreads(index)
        exact = self._float64_output(index)
        if not spreads or exact is None:
            return failed
        against_exact = paired_leaves(exact, actual)
        against_model = paired_leaves(self.expected[index], actual)
        if against_exact is None or against_model is None:
            return failed  # a structure the model's does not have: the strict comparison's problems stand
        label = self.cases[index].label
        judged = Comparison(True)
        notes, beyond_use, lenient_paths = [], [], set()
        for (path, exact_leaf, candidate_leaf), (_, model_leaf, _) in zip(against_exact, against_model):
            if path not in spreads:
                judged.merge(
                    compare_outputs(
                        model_leaf,
                        candidate_leaf,
                        self.rtol,
                        self.atol,
                        path,
                        allow_dtype_change=self.allow_dtype_change,
                        allow_nonfinite=True,
                    )
                )
                continue
            floor = spreads[path] * ILL_CONDITIONED_FACTOR
            rtol, default_atol = resolve_tolerances(exact_leaf.dtype, self.rtol, self.atol)
            lenient = compare_outputs(
                exact_leaf,
                candidate_leaf,
                self.rtol,
                default_atol + floor,
                path,
                allow_dtype_change=self.allow_dtype_change,
                allow_nonfinite=True,
            )
            largest = exact_leaf.abs().max().item() if exact_leaf.numel() else 0.0
            if lenient.ok and floor >= largest:
                # the allowance is as large as the output: zeros would pass (QA: sin(x * 1e11) "verified" against
                # zeros_like). This output proves nothing either way; a case none of whose outputs proved anything
                # is left out, and a verification that judged no case at all says it cannot verify.
                beyond_use.append(
                    f"{path} (the model's rounding spread is {spreads[path]:.3g} from its float64 value, and "
                    f"the output is at most {largest:.3g} in size)"
                )
                continue
            verdict = "within" if lenient.ok else "outside"
            limit = default_atol + floor + rtol * largest
            own = self._own_distance.get(index, {}).get(path, spreads[path])
            notes.append(
                f"{path}: the candidate is {lenient.max_abs_err:.3g} from the float64 result, {verdict} the limit "
                f"{limit:.3g} (the tolerance + {ILL_CONDITIONED_FACTOR:g}x the model's rounding spread, "
                f"{spreads[path]:.3g}: the farthest from float64 of the model's own output, {own:.3g}, of its runs "
                f"with the input perturbed at the rounding level, and half that of its runs with every operation's "
                f"result perturbed)"
            )
            judged.merge(lenient)
            lenient_paths.add(path)
        if beyond_use:
            result.warnings.append(
                f"{label} cannot be judged on {', '.join(beyond_use)}: sensitive to rounding beyond use"
            )
            if len(beyond_use) == len(against_exact):
                self._unjudged.add(index)
                return Comparison(True, failed.max_abs_err, failed.max_rel_err)
        note = f"{label} is sensitive to rounding: " + "; ".join(notes) if notes else ""
        if judged.ok and notes:
            # the allowance covers any difference below the model's rounding spread, a wrong one too (QA: a folded
            # conv's bias off by 1% passed on timm's mixnet_s): where the candidate runs in float64, it must match
            # the model's float64 result as closely as an exact rewrite can
            off = self._off_in_float64(index, candidate, lenient_paths)
            if off:
                judged.ok = False
                judged.problems.extend(off)
                self._failed_in_float64.add(index)
        if judged.ok:
            if note:
                result.warnings.append(note)
            return judged
        if notes:  # check() puts the case's label in front of each problem
            judged.problems.append("sensitive to rounding: " + "; ".join(notes))
        return judged

    def _rounding_spreads(self, index: int) -> dict[str, float]:
        """How far float32 evaluations of the reference land from its float64 output on case ``index``, per
        output (by :func:`~fxforge.compare.paired_leaves` path): the largest distance of its own output and of
        its outputs on :data:`PERTURBED_RUNS` rounding-level perturbations of the input, and half that of its outputs
        on :data:`EVERY_OP_RUNS` perturbations of every operation's result. Only the outputs that are sensitive to
        rounding are named (that spread further than :data:`SENSITIVE_SHARE` of rtol from float64, relative to the
        output's largest value); elsewhere the tolerance decides. Once per case: it depends on the reference alone,
        not on the candidate that missed.

        Sensitivity is judged on the whole spread, not on the model's own output alone: that is one draw of it, and
        a lucky one called an ill-conditioned case well-conditioned (QA: timm's mixnet_s with random BatchNorm
        terms, its own output 6e-6 from float64 relative, its exact BatchNorm fold 2.5e-4, the every-operation
        draws as far as the fold: the fold was rolled back as wrong, a folded conv named as the divergence)."""
        if index in self._spread:
            return self._spread[index]
        spreads: dict[str, float] = {}
        scales: dict[str, tuple[float, torch.dtype]] = {}  # the output's largest value, and its dtype
        exact = self._float64_output(index)
        own = paired_leaves(exact, self.expected[index]) if exact is not None else None
        for path, exact_leaf, model_leaf in own or []:
            if not (_low_precision(model_leaf) and isinstance(exact_leaf, torch.Tensor)):
                continue
            distance = compare_outputs(exact_leaf, model_leaf, self.rtol, self.atol, path, allow_nonfinite=True)
            spreads[path], scales[path] = distance.max_abs_err, (distance.reference_scale, model_leaf.dtype)
        own_distance = dict(spreads)
        draws = [(draw, False) for draw in range(PERTURBED_RUNS)] + [(draw, True) for draw in range(EVERY_OP_RUNS)]
        for draw, every_op in draws if spreads else []:
            perturbed = self._perturbed_output(index, draw, every_op)
            shaken = paired_leaves(exact, perturbed) if perturbed is not None else None
            if shaken is None:
                continue  # a model that cannot run perturbed (this way): the draws that ran stand
            for path, exact_leaf, perturbed_leaf in shaken:
                if path in spreads:
                    distance = compare_outputs(
                        exact_leaf, perturbed_leaf, self.rtol, self.atol, path, allow_nonfinite=True
                    )
                    # an every-operation draw counts at EVERY_OP_SHARE (see there)
                    reach = distance.max_abs_err * (EVERY_OP_SHARE if every_op else 1.0)
                    if math.isfinite(reach):
                        spreads[path] = max(spreads[path], reach)
        for path in list(spreads):
            largest, dtype = scales[path]
            rtol, _ = resolve_tolerances(dtype, self.rtol, self.atol)
            if not spreads[path] > rtol * SENSITIVE_SHARE * largest:
                del spreads[path]  # well-conditioned: the tolerance alone decides
        self._own_distance[index] = {path: own_distance[path] for path in spreads}
        self._spread[index] = spreads
        return spreads

    def _perturbed_output(self, index: int, draw: int, every_op: bool = False) -> Any:
        """The reference run on case ``index`` with every floating-point input multiplied by ``1 + u``, ``u``
        uniform in +-epsilon of its dtype (seeded by the case and ``draw``) or, with ``every_op``, the inputs as
        they are and every operation's floating-point result perturbed so: the same computation, rounded
        differently. None where it cannot run."""
        case = self.cases[index]
        # a stride of the larger run count: with PERTURBED_RUNS (3) as stride, the every-operation draws 3-5 of one
        # case were draws 0-2 of the next case's seed, and the two cases' spreads were not independent
        stride = max(PERTURBED_RUNS, EVERY_OP_RUNS)
        generator = torch.Generator().manual_seed((case.seed * stride + draw) * 2 + every_op)
        try:
            if every_op:
                # the model's call alone runs perturbed: run_isolated's copies of the inputs and snapshot of the
                # buffers must not (a perturbed snapshot, restored, changed the caller's buffers: self-QA)
                with quiet_torch_logs():
                    shaken = _every_op_shaken(self.module, generator)
                    return as_structure(run_isolated(shaken, case.args, case.kwargs, self.module))
            args, kwargs = pytree.tree_map(lambda value: _shaken(value, generator), (case.args, case.kwargs))
            with quiet_torch_logs():
                return as_structure(run_isolated(self.module, args, kwargs))
        except Exception:
            return None

    def _float64_output(self, index: int) -> Any:
        """The reference's output on case ``index`` computed in float64, cast to the reference output's dtypes;
        None where the model does not run in float64 (or is not a module)."""
        if index in self._exact:
            return self._exact[index]
        exact = None
        expected = pytree.tree_leaves(as_structure(self.expected[index]))
        if (
            isinstance(self.module, nn.Module)
            and any(_low_precision(t) for t in expected)
            and _fits_float64(self.module)
        ):
            try:
                if self._double is None:
                    self._double = copy.deepcopy(self.module).double()
                case = self.cases[index]
                args, kwargs = pytree.tree_map(_to_float64, (case.args, case.kwargs))
                with quiet_torch_logs():
                    output = as_structure(run_isolated(self._double, args, kwargs))
                leaves, spec = pytree.tree_flatten(output)
                if len(leaves) == len(expected):
                    exact = pytree.tree_unflatten([_cast_like(v, e) for v, e in zip(leaves, expected)], spec)
                    self._exact64[index] = output
            except Exception:
                exact = None  # a model that cannot run in float64 (a fixed dtype in its code): the miss stands
        self._exact[index] = exact
        return exact

    def _off_in_float64(self, index: int, candidate: Any, paths: set[str]) -> list[str]:
        """Problems for the outputs among ``paths`` where ``candidate``, run in float64 too, is farther from the
        model's float64 result on case ``index`` than float64's tolerance plus :data:`ILL_CONDITIONED_FACTOR` times
        how far rounding the model's parameters in their own dtype moves that result
        (:meth:`_parameter_rounding_spread`).

        An exact rewrite run in float64 differs from the model in float64 by float64 rounding and by the float32
        rounding of the parameters it computed (a folded BatchNorm's weights): both far below float32's rounding
        of the activations, which is what the float32 allowance must cover on an ill-conditioned case. Nothing is
        said where either side does not run wholly in float64 (a cast to float32 in the code, an ONNX Runtime or
        TorchScript candidate), or where the user chose the tolerance (an approximation may be meant)."""
        if self.rtol is not None or self.atol is not None or not paths:
            return []
        if not _runs_in_torch(candidate):
            return []
        spreads = self._parameter_rounding_spread(index)
        exact = self._exact64.get(index)
        if exact is None or not spreads:
            return []
        if self._candidate64 is None or self._candidate64[0] is not candidate:
            double = None
            if _fits_float64(candidate):
                try:
                    double = copy.deepcopy(candidate).double()
                except Exception:
                    double = None
            self._candidate64 = (candidate, double)
        output = self._run_in_float64(self._candidate64[1], index)
        pairs = paired_leaves(exact, output) if output is not None else None
        if any(_low_precision(leaf) for _, _, leaf in pairs or []):
            return []  # computed out of torch's sight (a runtime behind a wrapper) and handed back in float32
        problems = []
        rtol64, atol64 = tolerance_for(torch.float64)
        # the parameters' own precision, which the allowance is measured in (a bf16 model's was said to be float32)
        precision = "/".join(sorted({str(p.dtype).removeprefix("torch.") for p in _floating_tensors(self.module)}))
        for path, exact_leaf, candidate_leaf in pairs or []:
            if path not in paths or path not in spreads:
                continue
            allowance = ILL_CONDITIONED_FACTOR * spreads[path]
            off = compare_outputs(exact_leaf, candidate_leaf, rtol64, atol64 + allowance, path, allow_nonfinite=True)
            if not off.ok:
                limit = atol64 + allowance + rtol64 * off.reference_scale
                problems.append(
                    f"{path}: run in float64 as well, the candidate is {off.max_abs_err:.3g} from the model's float64 "
                    f"result, outside the limit {limit:.3g} (float64's tolerance + {ILL_CONDITIONED_FACTOR:g}x how "
                    f"far rounding the model's parameters to {precision} moves that result, {spreads[path]:.3g}): a "
                    "difference rounding does not explain"
                )
        return problems

    def _parameter_rounding_spread(self, index: int) -> dict[str, float]:
        """How far the model's float64 output on case ``index`` moves, per output path, when every floating-point
        parameter and buffer is multiplied by ``1 + u``, ``|u|`` up to the unit roundoff of its own dtype (as
        computing it and rounding it again would): the largest of :data:`PERTURBED_RUNS` draws. Empty where the
        model does not run wholly in float64."""
        if index in self._parameter_spread:
            return self._parameter_spread[index]
        spreads: dict[str, float] = {}
        exact = self._exact64.get(index)
        if exact is not None and self._double is not None:
            units = _unit_roundoffs(self.module)
            if self._shaken_double is None:  # once per Verifier: a second float64 copy, its values drawn per run
                self._shaken_double = copy.deepcopy(self._double)
            shaken = self._shaken_double
            generator = torch.Generator().manual_seed(self.cases[index].seed)
            for _ in range(PERTURBED_RUNS if units else 1):  # with no parameters, one run: is it all float64?
                _rerounded(shaken, self._double, units, generator)
                output = self._run_in_float64(shaken, index)
                pairs = paired_leaves(exact, output) if output is not None else None
                if pairs is None:
                    return self._parameter_spread.setdefault(index, {})
                for path, exact_leaf, shaken_leaf in pairs:
                    if isinstance(exact_leaf, torch.Tensor) and exact_leaf.dtype == torch.float64:
                        distance = compare_outputs(exact_leaf, shaken_leaf, allow_nonfinite=True).max_abs_err
                        if math.isfinite(distance):
                            spreads[path] = max(spreads.get(path, 0.0), distance)
        self._parameter_spread[index] = spreads
        return spreads

    def _run_in_float64(self, module: nn.Module | None, index: int) -> Any:
        """``module`` (a float64 copy) on case ``index`` in float64; None if it fails or computes anything in a
        lower precision (a float32 result anywhere makes its distances float32's, not float64's)."""
        if module is None:
            return None
        case = self.cases[index]
        args, kwargs = pytree.tree_map(_to_float64, (case.args, case.kwargs))
        try:
            with quiet_torch_logs(), _PrecisionWatch() as watch:
                output = as_structure(run_isolated(module, args, kwargs))
        except Exception:
            return None
        return None if watch.lowered else output

    def _blame_capture(self, case: Case, result: VerifyResult) -> None:
        """When the captured graph itself differs from the model on ``case``, the candidate is not to blame."""
        assert self.captured is not None
        index = self.cases.index(case)
        try:
            with quiet_torch_logs():
                graph_output = run_isolated(self.captured.graph_module, case.args, case.kwargs, self.module)
        except Exception as exc:
            result.capture_differs = True
            result.problems.append(f"the captured graph itself fails on {case.label}: {one_line_reason(exc)}")
            return
        comparison = compare_outputs(self.expected[index], graph_output, self.rtol, self.atol, allow_nonfinite=True)
        if not comparison.ok:
            result.capture_differs = True
            result.problems.append(
                f"the captured graph itself differs from the model on {case.label} (a capture problem, not the "
                f"candidate's): {comparison.problems[0]}"
            )


# The float64 copy of a model for an ill-conditioned case is made only up to this size (a 7B model's would be 56 GB).
FLOAT64_COPY_LIMIT = 4 << 30


def _updates_buffers(module: nn.Module, case: Case) -> bool:
    """Whether one call of ``module`` on ``case`` changes a buffer's values (undone afterwards)."""
    # batch norms in eval mode read their statistics only: a model with no other buffer needs no extra run
    if not any(
        m._buffers and (m.training or not isinstance(m, nn.modules.batchnorm._NormBase)) for m in module.modules()
    ):
        return False
    before = buffers_snapshot(module)
    with preserved_state(module), torch.no_grad(), quiet_torch_logs():
        module(*cloned(case.args), **cloned(case.kwargs))
        return bool(changed_buffers(module, before))


def _shaken(value: Any, generator: torch.Generator) -> Any:
    """``value`` times ``1 + u``, ``u`` uniform in +-epsilon of its dtype, where it is a floating-point tensor."""
    if not (isinstance(value, torch.Tensor) and _low_precision(value) and value.layout == torch.strided):
        return value
    noise = (torch.rand(value.shape, generator=generator) * 2 - 1) * torch.finfo(value.dtype).eps
    return value * (1 + noise.to(value.dtype).to(value.device))


def _every_op_shaken(module: Any, generator: torch.Generator) -> Any:
    """``module`` as a function whose calls run under :class:`_RoundingShake`."""

    def call(*args: Any, **kwargs: Any) -> Any:
        with _RoundingShake(generator):
            return module(*args, **kwargs)

    return call


# Operations whose floating-point result is exact (no rounding: a selection, a copy, a comparison-based choice, an
# integer-valued result), which every backend computes bit for bit. Their results are not perturbed: a floor
# perturbed to 2.9999998 truncates to 2 as an index, which no backend does.
_EXACT_OPS = frozenset(
    "floor ceil round trunc sign abs neg relu hardtanh threshold clamp clamp_min clamp_max max min amax amin maximum "
    "minimum where gather index_select index cat stack constant_pad_nd clone copy masked_fill sort topk flip roll "
    "repeat embedding max_pool1d max_pool2d max_pool3d max_pool2d_with_indices max_pool3d_with_indices zeros_like "
    "ones_like full_like fill scalar_tensor lift_fresh_copy expand_copy permute_copy slice_copy select_copy view_copy "
    "unsqueeze_copy squeeze_copy transpose_copy t_copy _unsafe_view unfold_copy narrow_copy scatter index_put "
    "masked_scatter select_scatter slice_scatter diagonal_scatter".split()
)


class _RoundingShake(TorchDispatchMode):
    """Perturbs every operation's floating-point result at the rounding level, as a backend that rounds each
    layer its own way would. Only computations that round are touched: an in-place or ``out=`` operation, and one
    whose result is a view of an input, keep their result as it is (a new tensor there would cut the aliasing the
    code relies on), and so do factories (``empty``'s memory is not a value), the exact operations of
    :data:`_EXACT_OPS` and a dtype conversion that loses no precision."""

    # a higher-order op (torch.cond in an exported graph) runs as it is: its branches' operations are not perturbed
    supports_higher_order_operators = True

    def __init__(self, generator: torch.Generator) -> None:
        super().__init__()
        self.generator = generator

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        if isinstance(func, HigherOrderOperator):
            return result
        schema = func._schema
        if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
            return result
        tensors = [v for v in pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]
        if not any(_low_precision(v) for v in tensors) or func.overloadpacket.__name__ in _EXACT_OPS:
            return result
        if func.overloadpacket.__name__ == "_to_copy" and not _rounds_to(tensors[0], result):
            return result
        return pytree.tree_map(lambda value: _rounded_again(value, self.generator), result)


class _PrecisionWatch(TorchDispatchMode):
    """Notes whether any operation returns a floating-point tensor below float64."""

    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.lowered = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        if not self.lowered and not isinstance(func, HigherOrderOperator):
            self.lowered = any(_low_precision(value) for value in pytree.tree_leaves(result))
        return result


def _rounded_again(value: Any, generator: torch.Generator) -> Any:
    """A floating-point result rounded as another implementation might: ``value * (1 + u)`` computed in float64,
    ``|u|`` up to half the dtype's epsilon (the unit roundoff: a full epsilon, rounded once more in the dtype, moved
    results up to 1.9 epsilons where float32 rounding moves them 0.5: QA), then rounded to the dtype. A result of whole
    numbers only is left as it is: integer arithmetic in floats is exact in every backend, and 11.0 perturbed to
    10.999999 indexes row 10 (QA: ``(floor(x) + 8).long()``)."""
    if not (isinstance(value, torch.Tensor) and _low_precision(value) and value.layout == torch.strided):
        return value
    if value.numel() and bool((value == value.round()).all()):
        return value
    unit = torch.finfo(value.dtype).eps / 2
    noise = (torch.rand(value.shape, generator=generator, dtype=torch.float64) * 2 - 1) * unit
    return (value.double() * (1 + noise.to(value.device))).to(value.dtype)


def _rounds_to(source: torch.Tensor, result: Any) -> bool:
    """Whether converting floating-point ``source`` to ``result``'s dtype rounds (float32 to bfloat16 does; a move
    does not). An integer source never gets here: no floating-point input, no perturbation."""
    if not (isinstance(result, torch.Tensor) and result.is_floating_point()):
        return False
    return torch.finfo(result.dtype).eps > torch.finfo(source.dtype).eps


def _second_call(module: Any, case: Case) -> Any:
    """``module``'s output on its second call on ``case``, its state restored afterwards."""
    with preserved_state(*([module] if isinstance(module, nn.Module) else [])), torch.no_grad(), quiet_torch_logs():
        module(*cloned(case.args), **cloned(case.kwargs))
        return module(*cloned(case.args), **cloned(case.kwargs))


def _floating_tensors(module: nn.Module) -> list[torch.Tensor]:
    return [value for value in [*module.parameters(), *module.buffers()] if value.is_floating_point()]


def _unit_roundoffs(module: nn.Module) -> dict[str, float]:
    """Half the epsilon of each floating-point parameter's and buffer's own dtype, by name."""
    named = [*module.named_parameters(), *module.named_buffers()]
    return {name: torch.finfo(value.dtype).eps / 2 for name, value in named if value.is_floating_point()}


def _rerounded(shaken: nn.Module, original: nn.Module, units: Mapping[str, float], generator: torch.Generator) -> None:
    """Set each parameter and buffer of ``shaken`` (a copy of float64 ``original``) named in ``units`` to the
    original's value times ``1 + u``, ``|u|`` up to its unit roundoff: the parameters as computing them again and
    rounding them to their own dtype could leave them."""
    originals = dict([*original.named_parameters(), *original.named_buffers()])
    with torch.no_grad():
        for name, value in [*shaken.named_parameters(), *shaken.named_buffers()]:
            if name in units and name in originals and value.layout == torch.strided:
                noise = torch.rand(value.shape, generator=generator, dtype=torch.float64) * 2 - 1
                value.copy_(originals[name] * (1 + noise * units[name]))


def _runs_in_torch(module: Any) -> bool:
    """Whether ``module`` computes with torch operations that a float64 copy of it would run in float64: not an
    ONNX Runtime session, a TorchScript or AOTInductor program, oneDNN's fused kernels or a compiled forward (which a
    float64 call would compile again)."""
    elsewhere = (OnnxRuntimeModule, OnednnFusion, AotiModule, AutocastModule, CompiledModule, torch.jit.ScriptModule)
    return isinstance(module, nn.Module) and not any(
        isinstance(part, elsewhere) or hasattr(part, "_orig_mod") for part in module.modules()
    )


def _fits_float64(module: nn.Module) -> bool:
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * 8 for t in tensors if t.is_floating_point()) <= FLOAT64_COPY_LIMIT


def _low_precision(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64


def _to_float64(value: Any) -> Any:
    return value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def _cast_like(value: Any, like: Any) -> Any:
    if isinstance(value, torch.Tensor) and isinstance(like, torch.Tensor) and like.is_floating_point():
        return value.to(like.dtype)
    return value


@keeps_rng_state
def verify(
    reference: Any,
    candidate: Any,
    inputs: Sequence[Any] | None = None,
    *,
    candidate_may_fix_batch: bool = False,
    input_specs: Sequence[Any] | None = None,
    example: tuple[Sequence[Any], Mapping[str, Any]] | None = None,
    cases: int = DEFAULT_CASES,
    seed: int = 0,
    seeds: Sequence[int] | None = None,
    batch_sizes: Sequence[int | None] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    bisect: bool = True,
    allow_dtype_change: bool = False,
    allow_nonfinite: bool = False,
    trust_pickle: bool | None = None,
) -> VerifyResult:
    """Check that ``candidate`` computes what ``reference`` computes (see the module docstring).

    ``reference``/``candidate`` are modules, GraphModules or :class:`~fxforge.capture.Captured`; ``candidate`` may
    also be a model spec or a written file (an output directory, ``.onnx``, ``.pt2``...), loaded as
    ``fxforge verify`` loads it (a file fixed to the example's batch is compared at that batch). With
    ``inputs`` exactly those inputs are compared; otherwise at least ``cases`` varied cases shaped like
    ``example``, ``input_specs`` or the Captured's example inputs. ``seeds`` (older API) sets the first
    seed and raises the case count to its length. Tolerances default to the per-dtype values of
    :data:`TOLERANCES`. On a mismatch between two graphs, ``bisect`` reruns both node by node and names
    the first candidate node that diverges from the reference node it was derived from (provenance).
    ``trust_pickle`` lets a candidate given as a file load from a pickle (``model.pt``; ``--trust-pickle``;
    default: the ``FXFORGE_TRUST_PICKLE`` environment variable).
    """
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not (isinstance(value, (int, float)) and 0 <= value < math.inf):
            # NaN: no value would ever be within it; infinity: every value would, and "OK" would prove nothing
            raise FxforgeError(f"{option('--' + name)} must be a finite number >= 0, got {value!r}")
    if not (hasattr(seed, "__index__") and 0 <= seed < 2**63):  # torch.manual_seed's range (it overflowed in C++)
        raise FxforgeError(f"{option('--seed')} must be an integer from 0 to 2**63 - 1, got {seed!r}")
    if isinstance(input_specs, (str, InputSpec)):  # one spec alone: its characters are no specs
        input_specs = [input_specs]
    if inputs is not None and batch_sizes is not None:  # exactly those inputs are compared: the sizes went unused
        raise FxforgeError("batch_sizes applies to drawn cases, and inputs are compared exactly as given")
    if isinstance(candidate, Captured):  # another capture's graph (Verifier.check takes one too)
        # an exported graph may take the example's batch size alone, as a .pt2 file given by name may
        candidate_may_fix_batch = candidate_may_fix_batch or candidate.dialect == ATEN
        candidate = candidate.graph_module
    if not (callable(candidate) or isinstance(candidate, (str, Path))):
        raise FxforgeError(
            f"the candidate must be a model, a spec or a file, not a {type(candidate).__name__}",
            hint="e.g. verify(captured, result.graph_module)",
        )
    if seeds is not None:
        seeds = list(seeds)
        seed, cases = (seeds[0] if seeds else seed), max(cases, len(seeds))
    left_out, keep_batches_the_graph_rejects = None, False
    if isinstance(candidate, (str, Path)):
        # a spec or a written file, as the CLI takes it: loaded, and it may be fixed to the example's batch
        candidate, candidate_may_fix_batch = load_model(str(candidate), trust_pickle=trust_pickle).module, True
    captured = reference if isinstance(reference, Captured) else None
    if inputs is None and batch_sizes is None and (candidate_may_fix_batch or captured is not None):
        args, _ = _template(captured, example, input_specs, seed, reference)
        taken, why_not = batches_a_candidate_takes(candidate, args, seed)
        if taken is None:
            # it takes another batch size: compare it there with the model, even where the reference's captured
            # graph (a static torch.export, only rerun to bisect) does not take it
            keep_batches_the_graph_rejects = True
        elif candidate_may_fix_batch:
            batch_sizes, left_out = taken, why_not
            model = reference.original if isinstance(reference, Captured) else reference
            if batches_a_candidate_takes(model, args, seed)[0] is not None:  # the model rejects it as well
                left_out = why_not.replace("the candidate rejects it", "the model rejects it", 1)
    verifier = Verifier(
        reference,
        inputs,
        example=example,
        input_specs=input_specs,
        cases=cases,
        seed=seed,
        batch_sizes=batch_sizes,
        rtol=rtol,
        atol=atol,
        allow_dtype_change=allow_dtype_change,
        allow_nonfinite=allow_nonfinite,
        keep_batches_the_graph_rejects=keep_batches_the_graph_rejects,
    )
    unstructured = isinstance(candidate, OnnxRuntimeModule) and candidate.output_structure is None
    if unstructured and candidate.output_like is None and verifier.expected:
        # a file without fxforge's record of the output structure returns a flat list: put it into the model's (a
        # file with the record is compared as it loads, which is what its users get)
        candidate.output_like = verifier.expected[0]
    result = verifier.check(candidate, bisect=bisect, candidate_may_fix_batch=candidate_may_fix_batch)
    if left_out:
        result.skipped.insert(0, left_out)
    return result


# --------------------------------------------------------------------------------------------------
# bisection


def _record_values(gm: fx.GraphModule, flat_inputs: Sequence[Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}

    class Recorder(GraphRunner):
        def run_node(self, n: fx.Node) -> Any:
            out = super().run_node(n)
            # clone: a later in-place op (relu_) would otherwise change what we recorded
            values[n.name] = out.detach().clone() if isinstance(out, torch.Tensor) else out
            return out

    # preserved_state: a training-mode BatchNorm in the graph would update the user's running statistics
    with torch.no_grad(), quiet_torch_logs(), preserved_state(gm):
        Recorder(gm, garbage_collect_values=True).run(*cloned(list(flat_inputs)))
    return values


def bisect_graphs(
    reference: fx.GraphModule,
    candidate: fx.GraphModule,
    reference_inputs: Sequence[Any],
    candidate_inputs: Sequence[Any],
    rtol: float | None = None,
    atol: float | None = None,
) -> Divergence | None:
    """Run both graphs node by node; return the first candidate node that differs from its origin."""
    return _first_divergence(reference, candidate, reference_inputs, candidate_inputs, rtol, atol)[0]


def _absorbed_successors(reference: fx.GraphModule, candidate: fx.GraphModule) -> dict[str, list[str]]:
    """For each reference node, the chain of nodes after it (each its only reader) that the candidate has no node
    of: a fusion kept the first node's name and computes the last's value (FX int8 fuses conv -> batch norm ->
    ReLU into one module named after the conv). Bisecting compared that node with the conv alone and blamed a
    conv that was never quantized (QA, timm's levit_128s)."""
    present = {node.name for node in candidate.graph.nodes}
    chains: dict[str, list[str]] = {}
    for node in reference.graph.nodes:
        chain, current = [], node
        while len(current.users) == 1 and len(chain) < 4:  # fusions are short; a bound keeps this linear
            (user,) = current.users
            if user.op == "output" or user.name in present:
                break
            chain.append(user.name)
            current = user
        if chain and node.name in present:
            chains[node.name] = chain
    return chains


def _first_divergence(
    reference: fx.GraphModule,
    candidate: fx.GraphModule,
    reference_inputs: Sequence[Any],
    candidate_inputs: Sequence[Any],
    rtol: float | None,
    atol: float | None,
    allowance: Mapping[str, float] | None = None,
) -> tuple[Divergence | None, int, str | None]:
    """:func:`bisect_graphs`; how many candidate nodes had a reference node to be compared with; and, when no node
    can be blamed, the first node that differs after a node no reference node corresponds to.

    A differing node is blamed only when every value it reads is known to agree (a placeholder, a weight, or a
    node compared and found equal) or was made by the same pass (a replacement's inner nodes: the pass is certain
    either way). One that reads a tensor with no reference counterpart from elsewhere (ReLU6's ``hardtanh`` in an
    ATen re-export of a torch graph whose ``relu`` module it replaced) differs perhaps only because that tensor
    does: blaming it named an exact pass for another pass's change. ``allowance``: per reference node, an absolute
    error added to ``atol`` (the float64 bisection's, see :meth:`Verifier._bisect_in_float64`)."""
    ref_values = _record_values(reference, reference_inputs)
    cand_values = _record_values(candidate, candidate_inputs)
    compared = 0
    # a tensor no reference value corresponds to, and what reads it unchecked: each mapped to the first such tensor
    unchecked: dict[fx.Node, fx.Node] = {}
    suspect = None
    # A node with no recorded origin is taken to compute the reference node of its name -- within one dialect:
    # across dialects equal names (relu, linear) are a coincidence.
    same_dialect = dialect_of(reference) == dialect_of(candidate)
    absorbed = _absorbed_successors(reference, candidate)
    for node in candidate.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        reads_unchecked = next((unchecked[i] for i in node.all_input_nodes if i in unchecked), None)
        origin = node.meta.get(ORIGIN, node.name if same_dialect else None)
        expected, actual = ref_values.get(origin), cand_values.get(node.name)
        if not isinstance(expected, torch.Tensor) or not isinstance(actual, torch.Tensor):
            if reads_unchecked is not None or isinstance(actual, torch.Tensor):
                unchecked[node] = reads_unchecked or node
            continue
        compared += 1
        node_atol = atol if allowance is None else (atol or 0.0) + allowance.get(origin, 0.0)
        if not diverges(expected, actual, rtol, node_atol):
            continue  # agreed: what reads it is checked from here on
        fused = [ref_values.get(name) for name in absorbed.get(origin, ())]
        if any(isinstance(v, torch.Tensor) and not diverges(v, actual, rtol, node_atol) for v in fused):
            continue  # it computes a later reference node it absorbed (a conv fused with its batch norm)
        # an unchecked value the same pass produced (a replacement's inner nodes) leaves no doubt about the pass
        pass_name = node.meta.get(PASS)
        unchecked_pass = reads_unchecked.meta.get(PASS) if reads_unchecked is not None else None
        same_pass = pass_name is not None and unchecked_pass == pass_name
        if reads_unchecked is None or same_pass:
            error = compare_outputs(expected, actual, rtol, node_atol, allow_nonfinite=True).max_abs_err
            return Divergence(node.name, origin, target_name(node), node.meta.get(PASS), error), compared, None
        unchecked[node] = reads_unchecked
        suspect = suspect or (
            # "the first node that differs" named a late node where the stem conv already differed, unmatched (QA):
            # only the nodes with a counterpart were compared, and the gap before it was not
            f"the first node matched to a reference node that differs is {node.name} ({target_name(node)}); it "
            f"reads {reads_unchecked.name} ({target_name(reads_unchecked)}), which no reference node corresponds to, "
            "so the difference may begin there or at any unmatched node before it"
        )
    return None, compared, suspect
