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


def _as_structure(value: Any) -> Any:
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
    reference, candidate = _as_structure(reference), _as_structure(candidate)
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
    if reference.is_quantized:
        reference = reference.dequantize()
    if candidate.is_quantized:
        candidate = candidate.dequantize()
    default_rtol, default_atol = tolerance_for(reference.dtype)
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    if reference.numel() == 0:
        return Comparison(True)
    ref = reference.detach().to(torch.float64)
    cand = candidate.detach().to(torch.float64)
    both_nan = torch.isnan(ref) & torch.isnan(cand)
    diff = (ref - cand).abs().masked_fill(both_nan, 0.0)
    # inf == inf counts as equal; inf vs finite is an infinite error
    same_inf = torch.isinf(ref) & (ref == cand)
    diff = diff.masked_fill(same_inf, 0.0)
    diff = diff.masked_fill(torch.isnan(diff), math.inf)
    max_abs = float(diff.max())
    rel = diff / ref.abs().clamp_min(1e-12)
    max_rel = float(rel.max())
    ok = bool((diff <= atol + rtol * ref.abs()).all())
    problems = [] if ok else [f"{path}: max abs error {max_abs:.3g} exceeds rtol={rtol:g}, atol={atol:g}"]
    return Comparison(ok, max_abs, max_rel, problems)
