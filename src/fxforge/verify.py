"""Numerical comparison of models and graphs: the proof that a capture or a rewrite changed nothing.

Owns the dtype-aware tolerances, the nested-output comparison (tensors, tuples, lists, dicts,
dataclass-like model outputs) and :func:`verify`, which compares two models on the same inputs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

# Tolerances per dtype: (rtol, atol). fp32 rewrites such as BatchNorm folding reorder floating
# point sums, so they are exact only up to a few ulps amplified by depth; 1e-4 relative covers a
# 50-layer network while still catching any real change (a wrong bias is off by O(1)).
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 1e-2),
}


def tolerance_for(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing tensors of ``dtype``; integer and bool tensors must match exactly."""
    return TOLERANCES.get(dtype, (0.0, 0.0))


@dataclass
class Comparison:
    """How two (possibly nested) outputs differ."""

    ok: bool
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    problems: list[str] = field(default_factory=list)

    def merge(self, other: Comparison) -> None:
        self.ok = self.ok and other.ok
        self.max_abs_err = max(self.max_abs_err, other.max_abs_err)
        self.max_rel_err = max(self.max_rel_err, other.max_rel_err)
        self.problems.extend(other.problems)


def as_structure(value: Any) -> Any:
    """Turn model outputs with attributes (transformers ModelOutput, namedtuples) into dicts/tuples."""
    if isinstance(value, Mapping):
        return dict(value)
    if hasattr(value, "to_tuple") and callable(value.to_tuple):
        return value.to_tuple()
    return value


def compare_outputs(
    reference: Any,
    candidate: Any,
    rtol: float | None = None,
    atol: float | None = None,
    path: str = "output",
) -> Comparison:
    """Compare nested outputs leaf by leaf; tolerances default to :data:`TOLERANCES` per dtype."""
    reference, candidate = as_structure(reference), as_structure(candidate)
    if isinstance(reference, torch.Tensor):
        if not isinstance(candidate, torch.Tensor):
            return Comparison(False, math.inf, math.inf, [f"{path}: expected a tensor, got {type(candidate).__name__}"])
        return _compare_tensors(reference, candidate, rtol, atol, path)
    if isinstance(reference, Mapping):
        if not isinstance(candidate, Mapping) or set(reference) != set(candidate):
            return Comparison(False, math.inf, math.inf, [f"{path}: keys differ"])
        result = Comparison(True)
        for key in reference:
            result.merge(compare_outputs(reference[key], candidate[key], rtol, atol, f"{path}[{key!r}]"))
        return result
    if isinstance(reference, Sequence) and not isinstance(reference, str):
        if not isinstance(candidate, Sequence) or len(reference) != len(candidate):
            return Comparison(False, math.inf, math.inf, [f"{path}: lengths differ"])
        result = Comparison(True)
        for i, (ref, cand) in enumerate(zip(reference, candidate)):
            result.merge(compare_outputs(ref, cand, rtol, atol, f"{path}[{i}]"))
        return result
    if reference == candidate or (isinstance(reference, float) and math.isclose(reference, candidate)):
        return Comparison(True)
    return Comparison(False, math.inf, math.inf, [f"{path}: {reference!r} != {candidate!r}"])


def _compare_tensors(
    reference: torch.Tensor, candidate: torch.Tensor, rtol: float | None, atol: float | None, path: str
) -> Comparison:
    if reference.shape != candidate.shape:
        return Comparison(
            False, math.inf, math.inf, [f"{path}: shape {tuple(candidate.shape)} != {tuple(reference.shape)}"]
        )
    if reference.numel() == 0:
        return Comparison(True)
    rtol, atol = _tolerances(reference.dtype, rtol, atol)
    max_abs, scale = _error_and_scale(reference, candidate)
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    ok = max_abs <= atol + rtol * scale
    problems = (
        []
        if ok
        else [
            f"{path}: max abs error {max_abs:.3g} exceeds atol={atol:g} + rtol={rtol:g} * max|reference| ({scale:.3g})"
        ]
    )
    return Comparison(ok, max_abs, max_rel, problems)


def _tolerances(dtype: torch.dtype, rtol: float | None, atol: float | None) -> tuple[float, float]:
    default_rtol, default_atol = tolerance_for(dtype)
    return (default_rtol if rtol is None else rtol), (default_atol if atol is None else atol)


def _error_and_scale(reference: torch.Tensor, candidate: torch.Tensor) -> tuple[float, float]:
    """(max abs error, max |reference|) over the tensor, comparing in float64.

    The tolerance is normwise -- ``max|a - b| <= atol + rtol * max|a|`` -- not elementwise (``allclose``):
    a float32 sum of many terms is accurate relative to the size of its terms, not of its result, so an
    output element that cancels to near zero carries the round-off of the whole tensor's scale. Seen on
    resnet34 with random BatchNorm statistics: eager fp32 itself is 1e-4 away from fp64 on logits of
    magnitude 250, and an exact BN fold lands just as close, yet fails an elementwise 1e-4 check at
    the near-zero logits. A real rewrite bug (a wrong bias or scale) is off by a fraction of the scale.
    NaN matches NaN, +-inf matches the same inf; NaN or inf against a number is an infinite error.
    """
    if reference.is_quantized:
        reference = reference.dequantize()
    if candidate.is_quantized:
        candidate = candidate.dequantize()
    ref = reference.detach().to(torch.float64)
    cand = candidate.detach().to(torch.float64)
    if not ref.is_floating_point() and not ref.is_complex():
        ref, cand = ref.double(), cand.double()
    both_nan = torch.isnan(ref) & torch.isnan(cand)
    same_inf = torch.isinf(ref) & (ref == cand)
    diff = (ref - cand).abs().masked_fill(both_nan | same_inf, 0.0)
    diff = diff.masked_fill(torch.isnan(diff), math.inf)
    finite = torch.isfinite(ref)
    scale = float(ref[finite].abs().max()) if finite.any() else 0.0
    return float(diff.max()), scale


# --------------------------------------------------------------------------------------------------
# verify: two models on the same inputs, and bisection to the first diverging node


@dataclass
class Divergence:
    """The first candidate node whose value differs from the reference node it claims to compute."""

    node: str
    reference_node: str
    target: str
    pass_name: str | None
    max_abs_err: float

    def describe(self) -> str:
        by = f", produced by pass {self.pass_name!r}" if self.pass_name else ""
        return (
            f"first divergence at node {self.node} ({self.target}), which should equal reference node "
            f"{self.reference_node}: max abs error {self.max_abs_err:.3g}{by}"
        )


@dataclass
class VerifyResult:
    ok: bool
    max_abs_err: float
    max_rel_err: float
    trials: int
    problems: list[str] = field(default_factory=list)
    divergence: Divergence | None = None

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def _graph_of(model: Any):
    from torch import fx

    from fxforge.capture import Captured

    if isinstance(model, Captured):
        return model.graph_module
    return model if isinstance(model, fx.GraphModule) else None


def _module_of(model: Any):
    from fxforge.capture import Captured

    return model.graph_module if isinstance(model, Captured) else model


def verify(
    reference: Any,
    candidate: Any,
    inputs: Sequence[Any] | None = None,
    *,
    input_specs: Sequence[Any] | None = None,
    seeds: Sequence[int] = (0, 1, 2),
    rtol: float | None = None,
    atol: float | None = None,
    bisect: bool = True,
) -> VerifyResult:
    """Check that ``candidate`` computes what ``reference`` computes.

    ``reference``/``candidate`` are modules, GraphModules or :class:`~fxforge.capture.Captured`.
    Inputs: ``inputs`` (one tuple of example inputs) if given, else random inputs for each seed in
    ``seeds`` with the shapes of ``input_specs`` or of the reference's captured example inputs.
    Tolerances default to the per-dtype values in :data:`TOLERANCES`. On a mismatch between two
    graphs, ``bisect`` reruns both node by node and names the first candidate node that diverges
    from the reference node it was derived from (see ``fxforge.passes`` provenance).
    """
    from fxforge.capture import Captured, placeholder_values, run_reference
    from fxforge.errors import InputSpecError
    from fxforge.inputs import make_inputs, specs_of

    trials: list[tuple[Any, ...]]
    if inputs is not None:
        trials = [tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)]
    else:
        specs = list(input_specs) if input_specs is not None else None
        if specs is None and isinstance(reference, Captured):
            specs = specs_of(reference.example_inputs)
        if specs is None and isinstance(candidate, Captured):
            specs = specs_of(candidate.example_inputs)
        if not specs:
            raise InputSpecError("verify needs inputs or input shapes", hint="pass --input, e.g. --input 1x3x224x224")
        trials = [make_inputs(specs, seed=seed) for seed in seeds]

    ref_module, cand_module = _module_of(reference), _module_of(candidate)
    result = VerifyResult(True, 0.0, 0.0, len(trials))
    failing: tuple[Any, ...] | None = None
    for args in trials:
        expected = run_reference(ref_module, args, {})
        try:
            actual = run_reference(cand_module, args, {})
        except InputSpecError as exc:
            result.ok = False
            result.problems.append(f"candidate failed to run: {exc.message}")
            return result
        comparison = compare_outputs(expected, actual, rtol, atol)
        result.max_abs_err = max(result.max_abs_err, comparison.max_abs_err)
        result.max_rel_err = max(result.max_rel_err, comparison.max_rel_err)
        if not comparison.ok:
            result.ok = False
            result.problems.extend(comparison.problems)
            failing = failing or args
    ref_graph, cand_graph = _graph_of(reference), _graph_of(candidate)
    if not result.ok and bisect and failing is not None and ref_graph is not None and cand_graph is not None:
        result.divergence = bisect_graphs(
            ref_graph,
            cand_graph,
            placeholder_values(ref_graph, failing, {}),
            placeholder_values(cand_graph, failing, {}),
            rtol,
            atol,
        )
    return result


def _record_values(gm: Any, flat_inputs: Sequence[Any]) -> dict[str, Any]:
    from torch import fx

    values: dict[str, Any] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            out = super().run_node(n)
            # clone: a later in-place op (relu_) would otherwise change what we recorded
            values[n.name] = out.detach().clone() if isinstance(out, torch.Tensor) else out
            return out

    with torch.no_grad():
        Recorder(gm, garbage_collect_values=True).run(*flat_inputs)
    return values


def bisect_graphs(
    reference: Any,
    candidate: Any,
    reference_inputs: Sequence[Any],
    candidate_inputs: Sequence[Any],
    rtol: float | None = None,
    atol: float | None = None,
) -> Divergence | None:
    """Run both graphs node by node; return the first candidate node that differs from its origin."""
    from fxforge.graphs import target_name
    from fxforge.passes import ORIGIN, PASS

    ref_values = _record_values(reference, reference_inputs)
    cand_values = _record_values(candidate, candidate_inputs)
    for node in candidate.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        origin = node.meta.get(ORIGIN, node.name)
        expected, actual = ref_values.get(origin), cand_values.get(node.name)
        if not isinstance(expected, torch.Tensor) or not isinstance(actual, torch.Tensor):
            continue
        if _diverges(expected, actual, rtol, atol):
            error = compare_outputs(expected, actual, rtol, atol).max_abs_err
            return Divergence(node.name, origin, target_name(node), node.meta.get(PASS), error)
    return None


def _diverges(expected: torch.Tensor, actual: torch.Tensor, rtol: float | None, atol: float | None) -> bool:
    """Whether an intermediate value differs beyond tolerance: the same normwise rule as the outputs."""
    if expected.shape != actual.shape:
        return True
    if expected.numel() == 0:
        return False
    rtol, atol = _tolerances(expected.dtype, rtol, atol)
    error, scale = _error_and_scale(expected, actual)
    return error > atol + rtol * scale
