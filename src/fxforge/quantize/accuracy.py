"""Accuracy: a quantized model against the float model on the same batches, and the targets it must meet."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fxforge.compare import as_structure
from fxforge.errors import FxforgeError
from fxforge.runtime import cloned, preserved_state, quiet_quantization_notices


@dataclass
class AccuracyReport:
    """The quantized model against the float model on the same batches.

    ``top1_agreement``: fraction of samples where both models' top-1 class agree (classifiers: the
    first output is 2-D logits); it bounds the top-1 accuracy drop on those samples (drop <= 1 -
    agreement). When the data has labels, ``float_top1``/``int8_top1`` are the two models' top-1
    accuracies and ``top1_drop`` their difference. ``rel_err`` is ``mean_abs_err`` divided by the float
    output's mean magnitude.
    """

    samples: int
    classifier: bool
    top1_agreement: float | None
    max_abs_err: float
    mean_abs_err: float
    rel_err: float
    data: str = ""
    float_top1: float | None = None
    int8_top1: float | None = None
    top1_drop: float | None = None


def _leaves(output: Any) -> list[torch.Tensor]:
    output = as_structure(output)
    leaves = torch.utils._pytree.tree_leaves(output, is_leaf=lambda v: hasattr(v, "to_tuple"))
    tensors = []
    for value in leaves:
        if hasattr(value, "to_tuple"):
            tensors.extend(_leaves(value.to_tuple()))
        elif isinstance(value, torch.Tensor):
            value = value.dequantize() if value.is_quantized else value
            tensors.append(value.detach().float() if value.is_floating_point() else value.detach())
    return tensors


def run_batches(model: nn.Module, batches: Sequence[tuple[Any, ...]]) -> list[list[torch.Tensor]]:
    """The model's output tensors (flattened, dequantized) for each batch, without gradients; the model is given
    copies of the batch's tensors (QA: a model writing its input in place, ``x.mul_(2)``, doubled the caller's data
    on every run, and the accuracy measured the float and int8 models on different inputs). Each batch runs on the
    model's state as it was (QA: a model updating a buffer in forward, a step counter, carried it from batch to batch,
    and the int8 model, a step ahead after calibration, read 79% error that was no int8 rounding at all; the saved
    int8 model kept the evaluation's counts)."""
    outputs = []
    with torch.no_grad(), quiet_quantization_notices():
        for batch in batches:
            with preserved_state(model):
                outputs.append(_leaves(model(*cloned(tuple(batch)))))
    return outputs


def _is_classifier(outputs: list[list[torch.Tensor]]) -> bool:
    first = outputs[0][0] if outputs and outputs[0] else None
    return first is not None and first.is_floating_point() and first.dim() == 2 and first.shape[1] >= 2


def compare_batches(
    reference: list[list[torch.Tensor]],
    candidate: list[list[torch.Tensor]],
    data: str,
    labels: Sequence[torch.Tensor | None] = (),
) -> AccuracyReport:
    """Float (``reference``) vs quantized (``candidate``) outputs of the same batches; ``labels`` (one per
    batch, all present) add both models' real top-1 accuracies for classifiers."""
    classifier = _is_classifier(reference)
    labelled = classifier and len(labels) == len(reference) and all(y is not None for y in labels)
    agree = samples = float_correct = int8_correct = 0
    max_abs = total_abs = magnitude = 0.0
    count = unmatched = 0
    kinds: set[str] = set()  # the dtypes of the outputs that are not floating point
    floating = any(t.is_floating_point() for batch in reference for t in batch)
    for index, (ref_batch, cand_batch) in enumerate(zip(reference, candidate)):
        if len(ref_batch) != len(cand_batch):
            raise FxforgeError("the quantized model returns a different number of outputs than the float model")
        for i, (ref, cand) in enumerate(zip(ref_batch, cand_batch)):
            if not ref.is_floating_point():
                kinds.add(str(ref.dtype).removeprefix("torch."))
                continue
            if ref.shape != cand.shape:
                raise FxforgeError(f"quantized output {i} has shape {tuple(cand.shape)}, not {tuple(ref.shape)}")
            diff = (ref.double() - cand.double()).abs()
            finite = torch.isfinite(diff)
            # NaN matches only NaN, inf only the same inf (as verify compares): a NaN where the other model gives a
            # number is an infinite error, not a value left out (QA: NaN data reported "max abs error 0")
            same = (ref.isnan() & cand.isnan()) | (torch.isinf(ref) & (ref == cand))
            if bool((~finite & ~same).any()):
                unmatched += int((~finite & ~same).sum())
            max_abs = max(max_abs, float(diff[finite].max()) if bool(finite.any()) else 0.0)
            total_abs += float(diff[finite].sum())
            magnitude += float(ref.double().abs()[finite].sum())
            count += int(finite.sum())
            if i == 0 and classifier:
                # a row with a NaN has no top-1 class: it agrees only where the other row is NaN in the same places
                finite_rows = torch.isfinite(ref).all(1) & torch.isfinite(cand).all(1)
                same_rows = (same | finite).all(1) & ~finite_rows
                agree += int(((ref.argmax(1) == cand.argmax(1)) & finite_rows).sum() + same_rows.sum())
                samples += ref.shape[0]
                if labelled:
                    float_correct += int((ref.argmax(1) == labels[index]).sum())
                    int8_correct += int((cand.argmax(1) == labels[index]).sum())
        if not classifier:
            first = ref_batch[0] if ref_batch else None
            samples += int(first.shape[0]) if first is not None and first.dim() > 0 else 1
    if not count and not unmatched and kinds and not floating:
        # QA: an argmax model read "outputs ... not finite (NaN or inf) anywhere", advising to check the data
        raise FxforgeError(
            f"the model's outputs are {' and '.join(sorted(kinds))} only: int8's error is measured on floating-point "
            "outputs, and this model has none",
            hint="quantize the model that returns the scores (logits), and take the argmax or comparison outside it",
        )
    if not count and not unmatched and not any(t.numel() for batch in reference for t in batch):
        # QA: a forward returning None read "not finite (NaN or inf) anywhere", advising to check the data
        raise FxforgeError(
            "the model's outputs hold no values (it returns None, or only empty tensors): int8's error is measured on "
            "the values it returns",
            hint="quantize a model whose forward returns its result",
        )
    if not count and not unmatched:
        raise FxforgeError(
            f"the float model's outputs on {data or 'the data'} are not finite (NaN or inf) anywhere: float and int8 "
            "compared on nothing would agree with 0% error",
            hint="check the data for NaN or inf values",
        )
    mean_abs = total_abs / count if count else 0.0
    rel = mean_abs / (magnitude / count) if count and magnitude > 0 else (0.0 if mean_abs == 0 else math.inf)
    if unmatched:
        max_abs = mean_abs = rel = math.inf
    agreement = agree / samples if classifier and samples else None
    report = AccuracyReport(samples, classifier, agreement, max_abs, mean_abs, rel, data)
    if labelled and samples:
        report.float_top1, report.int8_top1 = float_correct / samples, int8_correct / samples
        report.top1_drop = report.float_top1 - report.int8_top1
    return report


# --------------------------------------------------------------------------------------------------
# targets for keep_float_until


@dataclass(frozen=True)
class Target:
    """What ``keep_float_until`` asks for: ``top1_agreement >= value`` (``agreement``), a top-1 accuracy
    drop of at most ``value`` (``drop``) or ``rel_err <= value`` (``rel_err``).

    A ``drop`` target is measured on labels when the evaluation data has them; without labels it falls
    back to the bound ``drop <= 1 - top1_agreement`` (never optimistic).
    """

    metric: str
    value: float

    def met(self, accuracy: AccuracyReport) -> bool:
        if self.metric == "rel_err":
            return accuracy.rel_err <= self.value
        if self.metric == "drop" and accuracy.top1_drop is not None:
            return accuracy.top1_drop <= self.value + 1e-12
        if accuracy.top1_agreement is None:
            return False
        floor = 1.0 - self.value if self.metric == "drop" else self.value
        return accuracy.top1_agreement >= floor - 1e-12

    def __str__(self) -> str:
        if self.metric == "agreement":
            return f"top-1 agreement >= {self.value:g}"
        return f"top-1 drop <= {self.value:g}" if self.metric == "drop" else f"rel_err <= {self.value:g}"


def parse_target(value: float | str | Target) -> Target:
    """``0.99`` or ``agreement=0.99`` (top-1 agreement with float), ``drop=0.01`` (top-1 accuracy may drop
    by at most 0.01: measured on labelled evaluation data, else bounded by 1 - agreement),
    ``rel-err=0.05`` (mean abs error relative to the float output's magnitude; for models that are not
    classifiers)."""
    if isinstance(value, Target):
        return value
    key, number = "agreement", value
    if isinstance(value, str):
        key, sep, raw = value.partition("=")
        if not sep:
            key, raw = "agreement", value
        key = key.strip().lower().replace("_", "-")
        try:
            number = float(raw)
        except ValueError:
            number = math.nan
    try:
        number = float(number)
    except (TypeError, ValueError):
        number = math.nan
    if key not in ("agreement", "drop", "rel-err") or not math.isfinite(number) or number < 0:
        raise FxforgeError(
            f"cannot read keep-float target {value!r}", hint="e.g. 0.99, agreement=0.99, drop=0.01 or rel-err=0.05"
        )
    if key in ("agreement", "drop") and number > 1:
        raise FxforgeError(f"top-1 {key} target {number:g} is above 1", hint="e.g. agreement=0.99 or drop=0.01")
    return Target("rel_err" if key == "rel-err" else key, number)
