"""Quantization: int8 static and dynamic post-training quantization and QAT preparation of a captured
model, with the int8 model's accuracy measured against the float model and a per-layer sensitivity
ranking.

This module owns the fxforge interface (:func:`quantize`, :class:`QuantizeResult`), the calibration
data formats (:func:`load_calibration`), the accuracy and sensitivity measurements, the
"keep the most sensitive layers in float until a target is met" search, the output directory (and
the work-arounds that let torch 2.14.1 pickle and reload FX-quantized and QAT models, see
:func:`write_output`), the :func:`int8_backend` hook that ``fxforge.bench`` uses for its int8 row,
and what a node of a quantized graph is (:func:`quant_kind`, :func:`int8_weights`,
:func:`int8_flops`), which inspect and lint rule FX013 read.

Machinery: PyTorch's **FX graph-mode quantization**, ``torch.ao.quantization.quantize_fx``
(``prepare_fx`` / ``prepare_qat_fx`` -> calibrate -> ``convert_fx``), run on the torch-dialect
GraphModule fxforge captured (so capture's leaves carry over as float black boxes). Chosen over
torchao's PT2E flow (``prepare_pt2e``/``convert_pt2e`` with ``X86InductorQuantizer``) because,
measured with torch 2.14.1 and torchao 0.18.0 on this project's CPU machine:

* PT2E fails on torchvision resnet18 captured with ``torch.export``: ``ValueError: Input partition
  has more than one output node``. ResNet's ``BasicBlock`` calls its one ``self.relu`` twice; the
  exported graph attributes both ``aten.relu`` nodes to that module, so the quantizer's source
  partition for it has two outputs, and the conv-add-relu annotation gives up. (mobilenet_v2, whose
  ReLU6 modules are called once each, goes through.)
* A PT2E model is a float graph with quantize/dequantize ops around float kernels: run eagerly it
  was 3x *slower* than float (mobilenet_v2, 64x64: 36.6 ms vs 12.0 ms). It is fast only after
  ``torch.compile`` lowers it with Inductor (6.5 ms vs 9.4 ms float, after a 69 s compile that needs
  a C++ compiler). ``convert_fx`` instead swaps in real int8 modules (fbgemm/oneDNN or QNNPACK
  kernels) that are fast eagerly, pickle with ``torch.save`` and need no compiler.
* torchao is one more dependency (and transformers imports it when present, with warnings).

FX graph mode is deprecated in torch (every call warns "torch.ao.quantization is deprecated and will
be removed in 2.10", yet it is still there in 2.14.1). We chose it deliberately, so our calls
suppress exactly that warning (and the observers' ``reduce_range`` notice); docs/commands/quantize.md
records the decision and the migration path (PT2E once the x86 quantizer handles shared modules).

Static and QAT quantization need a torch-dialect graph (``symbolic_trace``): FX's patterns match
``nn.Conv2d`` modules and ``torch``-level calls, not ATen ops. Dynamic quantization only swaps
``nn.Linear``/``nn.LSTM``-like modules, so for models that only ``torch.export`` can capture
(transformers) it falls back to eager ``torch.ao.quantization.quantize_dynamic`` on the original
module; the result says which machinery ran.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
import math
import pickle
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn

from fxforge import references
from fxforge.artifacts import MODEL_FILE, atomic_directory
from fxforge.capture import Captured, capture, require_real_weights
from fxforge.errors import DialectError, FxforgeError, InputSpecError, first_line
from fxforge.graphs import ATEN

MODES = ("static", "dynamic", "qat-prepare")
BACKENDS = ("x86", "qnnpack")

FX_MACHINERY = "torch.ao.quantization.quantize_fx (FX graph mode)"
EAGER_DYNAMIC_MACHINERY = "torch.ao.quantization.quantize_dynamic (eager module swap)"

# Layers a sensitivity run quantizes one at a time. Fused neighbours (BatchNorm, ReLU) go with their
# conv/linear, so the conv's name stands for the fused block.
STATIC_LAYER_TYPES: tuple[type[nn.Module], ...] = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.Linear,
)
DYNAMIC_LAYER_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell, nn.RNNCell)

# Random calibration data is split into this many batches; files holding one tensor are split into
# batches of this many samples.
DEFAULT_RANDOM_BATCHES = 8
DEFAULT_SPLIT = 32


class RandomCalibrationWarning(UserWarning):
    """Calibrated or evaluated on random data: the int8 model's accuracy on real data is unknown."""


RANDOM_WARNING = (
    "calibrated on random inputs: the int8 value ranges (and so its accuracy on real data) are unknown; "
    "pass calibration data (--calib FILE.pt or file.py:function) for a model you mean to use"
)
RANDOM_EVAL_WARNING = (
    "accuracy measured on random inputs: the int8 model's accuracy on real data is unknown; "
    "pass evaluation data (--eval FILE.pt or file.py:function) to measure it"
)


# --------------------------------------------------------------------------------------------------
# calibration data


@dataclass
class CalibrationData:
    """Input batches (each a tuple of positional inputs), where they came from, and the class labels
    of each batch when the data had them (``(inputs, labels)`` pairs; ``None`` for a batch without)."""

    batches: list[tuple[Any, ...]]
    source: str
    random: bool = False
    labels: list[torch.Tensor | None] = field(default_factory=list)

    @property
    def labelled(self) -> bool:
        return bool(self.labels) and len(self.labels) == len(self.batches) and all(y is not None for y in self.labels)

    @property
    def samples(self) -> int:
        total = 0
        for batch in self.batches:
            first = next((t for t in batch if isinstance(t, torch.Tensor)), None)
            total += int(first.shape[0]) if first is not None and first.dim() > 0 else 1
        return total

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "batches": len(self.batches),
            "samples": self.samples,
            "random": self.random,
            "labels": self.labelled,
        }


def _class_labels(value: Any, batch: tuple[Any, ...]) -> torch.Tensor | None:
    """``value`` when it looks like one integer class label per sample of ``batch``, else None."""
    first = next((t for t in batch if isinstance(t, torch.Tensor)), None)
    if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.is_floating_point() or value.is_complex():
        return None
    return value if first is not None and first.dim() > 0 and value.shape[0] == first.shape[0] else None


def _as_batch(item: Any, arity: int | None, source: str) -> tuple[tuple[Any, ...], torch.Tensor | None]:
    if isinstance(item, torch.Tensor):
        batch: tuple[Any, ...] = (item,)
    elif isinstance(item, (tuple, list)):
        batch = tuple(item)
    else:
        raise InputSpecError(
            f"calibration data from {source} holds a {type(item).__name__}; expected tensors or tuples of tensors",
            hint="each item is one batch: a tensor, or a tuple with one tensor per model input",
        )
    # (inputs, labels) pairs from a DataLoader: the model takes the leading items; the next one, when
    # it holds an integer class per sample, lets the accuracy report measure real top-1 accuracy.
    labels = None
    if arity is not None and len(batch) > arity:
        labels = _class_labels(batch[arity], batch[:arity])
        batch = batch[:arity]
    return batch, labels


def _dataset_with_labels(obj: Any, arity: int | None) -> bool:
    """``(inputs..., labels)`` as whole tensors (samples along dim 0), e.g. ``torch.save((x, y), f)``."""
    if arity is None or not isinstance(obj, (tuple, list)) or len(obj) != arity + 1:
        return False
    if not all(isinstance(t, torch.Tensor) and t.dim() > 0 for t in obj):
        return False
    return _class_labels(obj[arity], tuple(obj[:arity])) is not None and obj[0].shape[0] > 0


def _batches_of(obj: Any, arity: int | None, source: str, split: int, kind: str) -> CalibrationData:
    if isinstance(obj, torch.Tensor):
        # One tensor holds samples along dim 0 (a dataset), not one giant batch.
        chunks = [(chunk,) for chunk in obj.split(split)] if obj.dim() > 0 else [(obj,)]
        return CalibrationData(chunks, source, labels=[None] * len(chunks))
    if _dataset_with_labels(obj, arity):
        columns = [t.split(split) for t in obj]
        batches = [tuple(column[i] for column in columns[:-1]) for i in range(len(columns[0]))]
        return CalibrationData(batches, source, labels=list(columns[-1]))
    if isinstance(obj, Mapping) or not isinstance(obj, Iterable):
        raise InputSpecError(
            f"{kind} data from {source} is a {type(obj).__name__}",
            hint="give a tensor (samples along dim 0), (inputs, labels) tensors, or a list of batches",
        )
    pairs = [_as_batch(item, arity, source) for item in obj]
    if not pairs:
        raise InputSpecError(f"{kind} data from {source} is empty")
    return CalibrationData([batch for batch, _ in pairs], source, labels=[labels for _, labels in pairs])


def _load_callable(spec: str, kind: str) -> Callable[..., Any]:
    function = references.import_reference(spec, what=f"{kind} data function", error=InputSpecError)
    if not callable(function):
        raise InputSpecError(f"{kind} data function {spec!r} is a {type(function).__name__}, not callable")
    return function


def _call_user(function: Callable[..., Any], name: str, kind: str) -> Any:
    try:
        return function()
    except Exception as exc:
        raise InputSpecError(
            f"the {kind} data function {name} failed: {type(exc).__name__}: {first_line(exc)}"
        ) from None


def _is_random_spec(spec: Any) -> bool:
    return spec is None or (isinstance(spec, str) and (spec == "random" or spec.startswith("random:")))


def load_calibration(
    spec: Any,
    example_inputs: Sequence[Any],
    *,
    batches: int = DEFAULT_RANDOM_BATCHES,
    seed: int = 0,
    split: int = DEFAULT_SPLIT,
    kind: str = "calibration",
) -> CalibrationData:
    """Turn the user's calibration (or evaluation, ``kind="eval"``) data into a list of input batches.

    ``spec`` is one of:

    * ``None``, ``"random"`` or ``"random:N"``: ``N`` (default ``batches``) random batches shaped like
      ``example_inputs`` -- for a quick look only (:data:`RANDOM_WARNING`);
    * a callable (or ``"file.py:function"``) returning an iterable of batches;
    * a path to a file written by ``torch.save``, or the object itself: a tensor (samples along dim 0,
      split into batches of ``split``); a tuple ``(inputs..., labels)`` of whole tensors (samples along
      dim 0, labels one integer class per sample), split the same way; or a list/tuple whose items
      are batches (a tensor, or a tuple with one tensor per model input).

    Items with more entries than the model has inputs (``(images, labels)`` from a DataLoader) keep
    only the leading inputs; an item right after them that holds one integer class per sample is kept
    as that batch's labels, so the accuracy report can measure real top-1 accuracy.
    """
    arity = len(example_inputs) if example_inputs else None
    if _is_random_spec(spec):
        count = batches
        if isinstance(spec, str) and spec.startswith("random:"):
            try:
                count = int(spec.split(":", 1)[1])
            except ValueError:
                raise InputSpecError(f"cannot read {spec!r}", hint="random or random:N (N batches)") from None
        if count < 1:
            # zero batches would calibrate (or judge) nothing: a vacuous check, not a quick one
            raise InputSpecError(f"{spec!r} asks for {count} batches", hint="random:N needs N >= 1")
        from fxforge.inputs import make_inputs, specs_of

        specs = specs_of(example_inputs)
        data = [make_inputs(specs, seed=seed + 1 + i) for i in range(count)]
        source = f"random ({count} batches shaped like the example inputs)"
        return CalibrationData(data, source, random=True, labels=[None] * len(data))
    if isinstance(spec, CalibrationData):
        return spec
    if isinstance(spec, (str, Path)):
        text = str(spec)
        if ".py:" in text and not Path(text).exists():
            obj = _call_user(_load_callable(text, kind), text, kind)
            return _described(_batches_of(obj, arity, text, split, kind), f"function {text}")
        path = Path(text)
        if not path.exists():
            raise InputSpecError(
                f"{kind} file not found: {path}",
                hint="give a file written by torch.save, file.py:function, or random[:N]",
            )
        try:
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as exc:
            raise InputSpecError(
                f"cannot read {kind} file {path}: {first_line(exc)}",
                hint="save a tensor, (inputs, labels) tensors, or a list of batches with torch.save",
            ) from None
        return _described(_batches_of(obj, arity, str(path), split, kind), f"file {path}")
    if callable(spec) and not isinstance(spec, (torch.Tensor, nn.Module)):
        name = getattr(spec, "__qualname__", type(spec).__name__)
        obj = _call_user(spec, f"{name}()", kind)
        return _described(_batches_of(obj, arity, f"{name}()", split, kind), f"callable {name}")
    return _described(_batches_of(spec, arity, "the given data", split, kind), f"{type(spec).__name__} in memory")


def _described(data: CalibrationData, source: str) -> CalibrationData:
    data.source = source
    return data


# --------------------------------------------------------------------------------------------------
# accuracy


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
    from fxforge.verify import as_structure

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
    """The model's output tensors (flattened, dequantized) for each batch, without gradients."""
    with torch.no_grad(), _quiet():
        return [_leaves(model(*batch)) for batch in batches]


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
    count = 0
    for index, (ref_batch, cand_batch) in enumerate(zip(reference, candidate)):
        if len(ref_batch) != len(cand_batch):
            raise FxforgeError("the quantized model returns a different number of outputs than the float model")
        for i, (ref, cand) in enumerate(zip(ref_batch, cand_batch)):
            if not ref.is_floating_point():
                continue
            if ref.shape != cand.shape:
                raise FxforgeError(f"quantized output {i} has shape {tuple(cand.shape)}, not {tuple(ref.shape)}")
            diff = (ref.double() - cand.double()).abs()
            finite = torch.isfinite(diff)
            max_abs = max(max_abs, float(diff.max()) if diff.numel() else 0.0)
            total_abs += float(diff[finite].sum())
            magnitude += float(ref.double().abs()[finite].sum())
            count += int(finite.sum())
            if i == 0 and classifier:
                agree += int((ref.argmax(1) == cand.argmax(1)).sum())
                samples += ref.shape[0]
                if labelled:
                    float_correct += int((ref.argmax(1) == labels[index]).sum())
                    int8_correct += int((cand.argmax(1) == labels[index]).sum())
        if not classifier:
            first = ref_batch[0] if ref_batch else None
            samples += int(first.shape[0]) if first is not None and first.dim() > 0 else 1
    mean_abs = total_abs / count if count else 0.0
    rel = mean_abs / (magnitude / count) if count and magnitude > 0 else (0.0 if mean_abs == 0 else math.inf)
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


# --------------------------------------------------------------------------------------------------
# the quantization flow


@dataclass
class LayerSensitivity:
    """The error one layer causes when it is the only layer quantized."""

    layer: str
    type: str
    top1_agreement: float | None
    max_abs_err: float
    mean_abs_err: float
    rel_err: float
    top1_drop: float | None = None  # on labelled evaluation data


@dataclass
class QuantizeResult:
    """A quantized (or QAT-prepared) model and how good it is.

    ``model`` is a GraphModule from ``convert_fx`` (static, dynamic) or ``prepare_qat_fx``
    (qat-prepare), or a module with swapped layers when dynamic quantization fell back to eager mode.
    Run an int8 model with ``torch.backends.quantized.engine`` set to ``engine``.
    """

    model: nn.Module
    mode: str
    backend: str
    machinery: str
    calibration: dict[str, Any] | None
    accuracy: AccuracyReport | None
    sensitivity: list[LayerSensitivity] = field(default_factory=list)
    quantized_layers: list[str] = field(default_factory=list)
    float_layers: list[str] = field(default_factory=list)
    target: str | None = None
    target_met: bool | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    evaluation: dict[str, Any] | None = None  # the data ``accuracy`` was measured on
    output_dir: Path | None = None
    files: list[str] = field(default_factory=list)

    @property
    def engine(self) -> str:
        return _ENGINES[self.backend]

    @property
    def accuracy_known(self) -> bool:
        """True when ``accuracy`` was measured on the user's data rather than on random inputs."""
        return self.accuracy is not None and self.evaluation is not None and not self.evaluation["random"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "backend": self.backend,
            "engine": self.engine,
            "machinery": self.machinery,
            "calibration": self.calibration,
            "evaluation": self.evaluation,
            "accuracy": asdict(self.accuracy) if self.accuracy else None,
            "accuracy_known": self.accuracy_known,
            "sensitivity": [asdict(s) for s in self.sensitivity],
            "quantized_layers": self.quantized_layers,
            "float_layers": self.float_layers,
            "target": self.target,
            "target_met": self.target_met,
            "warnings": self.warnings,
            "notes": self.notes,
            "output_dir": str(self.output_dir) if self.output_dir else None,
            "files": self.files,
        }


_ENGINES = {"x86": "x86", "qnnpack": "qnnpack"}


@contextlib.contextmanager
def quantized_engine(backend: str) -> Iterator[None]:
    """Run with ``torch.backends.quantized.engine`` set for ``backend``: weights are packed for, and
    kernels picked from, the engine that is current, and it is a process-wide setting."""
    engine = _ENGINES[backend]
    if engine not in torch.backends.quantized.supported_engines:
        supported = ", ".join(e for e in torch.backends.quantized.supported_engines if e != "none")
        raise FxforgeError(f"this torch build has no {engine} quantized engine", hint=f"available: {supported}")
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        yield
    finally:
        torch.backends.quantized.engine = previous


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # FX graph mode is deprecated but chosen deliberately (module docstring): hide exactly its notices.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.ao\.quantization is deprecated", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=r"Please use quant_min and quant_max", category=UserWarning)
        warnings.filterwarnings("ignore", message=r"torch\.quantize_per_tensor, torch\.quantize_per_channel and other")
        warnings.filterwarnings("ignore", message=r"TypedStorage is deprecated")  # torch.load of int8 tensors
        warnings.filterwarnings("ignore", message=r".*must run observer before calling calculate_qparams")
        # convert_fx copies LSTM weights with torch.tensor(tensor) inside torch itself
        warnings.filterwarnings("ignore", message=r"To copy construct", module=r"torch\.ao\.nn\.quantized\.reference")
        yield


def _check_options(mode: str, backend: str) -> None:
    if mode not in MODES:
        raise FxforgeError(f"unknown quantization mode {mode!r}", hint=f"one of {', '.join(MODES)}")
    if backend not in BACKENDS:
        raise FxforgeError(f"unknown quantization backend {backend!r}", hint=f"one of {', '.join(BACKENDS)}")


def _layer_types(mode: str) -> tuple[type[nn.Module], ...]:
    return DYNAMIC_LAYER_TYPES if mode == "dynamic" else STATIC_LAYER_TYPES


def quantizable_layers(module: nn.Module, mode: str = "static") -> list[tuple[str, str]]:
    """(name, type) of the layers ``mode`` quantizes: called modules of a GraphModule, in graph order,
    else every submodule of those types."""
    types = _layer_types(mode)
    found: dict[str, str] = {}
    if isinstance(module, fx.GraphModule):
        for node in module.graph.nodes:
            if node.op == "call_module":
                sub = module.get_submodule(str(node.target))
                if type(sub) in types:
                    found.setdefault(str(node.target), type(sub).__name__)
    else:
        for name, sub in module.named_modules():
            if name and type(sub) in types:
                found.setdefault(name, type(sub).__name__)
    return list(found.items())


def _is_quantized_module(module: nn.Module) -> bool:
    name = type(module).__module__
    return name.startswith(("torch.ao.nn.quantized", "torch.ao.nn.intrinsic.quantized"))


def _non_traceable(gm: fx.GraphModule) -> list[str]:
    # Capture's leaves (user modules, containers) stay black boxes: FX's tracer would trace into them.
    names = []
    for node in gm.graph.nodes:
        if node.op != "call_module":
            continue
        module = gm.get_submodule(str(node.target))
        from_torch = type(module).__module__.startswith(("torch.nn.", "torch.ao.nn."))
        if not from_torch or isinstance(module, (nn.Sequential, nn.ModuleList, nn.ModuleDict)):
            names.append(str(node.target))
    return sorted(set(names))


@dataclass
class _Plan:
    """What to quantize: the float module, how, and with which example inputs."""

    source: nn.Module
    mode: str
    backend: str
    example_inputs: tuple[Any, ...]
    eager: bool  # dynamic quantization by module swap (no torch-dialect graph)

    @property
    def machinery(self) -> str:
        return EAGER_DYNAMIC_MACHINERY if self.eager else FX_MACHINERY


def _qconfig_mapping(plan: _Plan, only: str | None, float_layers: Sequence[str]):
    from torch.ao.quantization import QConfigMapping, default_dynamic_qconfig
    from torch.ao.quantization.qconfig_mapping import get_default_qat_qconfig_mapping, get_default_qconfig_mapping

    with _quiet():
        if plan.mode == "dynamic":
            mapping = QConfigMapping()
            for layer_type in DYNAMIC_LAYER_TYPES:
                mapping.set_object_type(layer_type, default_dynamic_qconfig)
            qconfig = default_dynamic_qconfig
        elif plan.mode == "qat-prepare":
            mapping = get_default_qat_qconfig_mapping(plan.backend)
            qconfig = mapping.global_qconfig
        else:
            mapping = get_default_qconfig_mapping(plan.backend)
            qconfig = mapping.global_qconfig
    if only is not None:
        mapping = QConfigMapping().set_global(None).set_module_name(only, qconfig)
    for name in float_layers:
        mapping.set_module_name(name, None)
    return mapping


def _quantize_once(
    plan: _Plan,
    calibration: Sequence[tuple[Any, ...]],
    *,
    only: str | None = None,
    float_layers: Sequence[str] = (),
) -> nn.Module:
    """Prepare, calibrate and convert a fresh copy of ``plan.source`` (prepare only for QAT)."""
    model = copy.deepcopy(plan.source)  # prepare_fx and the module swap change the module they are given
    if plan.eager:
        from torch.ao.quantization import default_dynamic_qconfig, quantize_dynamic

        names = [only] if only is not None else [n for n, _ in quantizable_layers(model, "dynamic")]
        spec = {name: default_dynamic_qconfig for name in names if name not in set(float_layers)}
        with _quiet(), quantized_engine(plan.backend):
            return quantize_dynamic(model.eval(), spec, dtype=torch.qint8) if spec else model.eval()

    from torch.ao.quantization.fx.custom_config import PrepareCustomConfig
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx, prepare_qat_fx

    mapping = _qconfig_mapping(plan, only, float_layers)
    custom = PrepareCustomConfig()
    if isinstance(model, fx.GraphModule):
        custom.set_non_traceable_module_names(_non_traceable(model))
    try:
        with _quiet(), quantized_engine(plan.backend):
            if plan.mode == "qat-prepare":
                prepared = prepare_qat_fx(model.train(), mapping, plan.example_inputs, prepare_custom_config=custom)
                return _presize_per_channel_fake_quant(prepared)
            prepared = prepare_fx(model.eval(), mapping, plan.example_inputs, prepare_custom_config=custom)
            if plan.mode == "static":
                with torch.no_grad():
                    for batch in calibration:
                        prepared(*batch)
            return convert_fx(prepared)
    except FxforgeError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FxforgeError(
            f"FX graph-mode quantization failed: {type(exc).__name__}: {first}",
            hint="keep the offending submodule in float with --leaf NAME, or try --mode dynamic",
        ) from exc


def _presize_per_channel_fake_quant(model: nn.Module) -> nn.Module:
    """Give each per-channel weight fake-quant of a fresh QAT model its statistics at full size.

    ``FusedMovingAvgObsFakeQuantize`` starts per-channel with empty min/max and a 1-element scale and
    resizes them on its first forward. Tensors loaded by ``torch.load`` cannot be resized, so a saved
    QAT model would fail on its first training step; and fxforge's capture check would see buffers
    change shape. Sized ``C`` and holding +inf/-inf (min/max) and 1/0 (scale/zero point), they give
    bitwise the same statistics and outputs from the first step on: the fused kernel takes an infinite
    running min/max as "nothing observed yet".
    """
    from torch.ao.quantization.fake_quantize import FusedMovingAvgObsFakeQuantize

    for module in model.modules():
        fake_quant = module.__dict__.get("_modules", {}).get("weight_fake_quant")
        weight = getattr(module, "weight", None)
        if not isinstance(fake_quant, FusedMovingAvgObsFakeQuantize) or not isinstance(weight, torch.Tensor):
            continue
        observer = fake_quant.activation_post_process
        if fake_quant.ch_axis < 0 or observer.min_val.numel() != 0:
            continue
        channels = weight.shape[fake_quant.ch_axis]
        observer.min_val = torch.full((channels,), math.inf)
        observer.max_val = torch.full((channels,), -math.inf)
        fake_quant.scale = torch.ones(channels, dtype=fake_quant.scale.dtype)
        fake_quant.zero_point = torch.zeros(channels, dtype=fake_quant.zero_point.dtype)
    return model


def convert(prepared: nn.Module, backend: str = "x86") -> nn.Module:
    """Convert a QAT-prepared model (after training) into an int8 model, in eval mode."""
    from torch.ao.quantization.quantize_fx import convert_fx

    _check_options("static", backend)
    with _quiet(), quantized_engine(backend):
        return convert_fx(prepared.eval())


def _plan(captured: Captured, mode: str, backend: str) -> _Plan:
    if captured.dialect != ATEN:
        return _Plan(captured.graph_module, mode, backend, tuple(captured.flat_inputs()), eager=False)
    if mode != "dynamic":
        raise DialectError(
            f"{mode} quantization needs a torch-dialect graph (symbolic_trace); this model was captured "
            "with torch.export (ATen dialect), whose ops FX graph-mode quantization does not match",
            hint="make the untraceable submodule a leaf (--leaf NAME) so symbolic tracing succeeds, "
            "or use --mode dynamic (Linear/LSTM layers only, works on any model)",
        )
    return _Plan(captured.original, mode, backend, tuple(captured.example_inputs), eager=True)


def _as_captured(target: Captured | nn.Module, example_inputs: Sequence[Any] | None, calibration: Any) -> Captured:
    if isinstance(target, Captured):
        return target
    if not isinstance(target, nn.Module):
        raise FxforgeError(f"quantize takes a Captured or an nn.Module, not a {type(target).__name__}")
    if example_inputs is None:
        if calibration is None or (isinstance(calibration, str) and calibration.startswith("random")):
            raise InputSpecError(
                "quantize needs example inputs for a module",
                hint="pass example_inputs=..., calibration data, or a model captured with fxforge.prepare",
            )
        example_inputs = load_calibration(calibration, ()).batches[0]
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    return capture(target, tuple(example_inputs))


def quantize(
    target: Captured | nn.Module,
    mode: str = "static",
    backend: str = "x86",
    calibration: Any = None,
    *,
    eval_data: Any = None,
    example_inputs: Sequence[Any] | None = None,
    sensitivity: bool = False,
    keep_float_until: float | str | Target | None = None,
    float_layers: Sequence[str] = (),
    random_batches: int = DEFAULT_RANDOM_BATCHES,
    seed: int = 0,
    output_dir: str | Path | None = None,
    force: bool = False,
    spec: str | None = None,
) -> QuantizeResult:
    """Quantize a captured model (or a module, captured here) to int8, or prepare it for QAT.

    Args:
        target: a :class:`~fxforge.capture.Captured` (from :func:`fxforge.prepare`) or an ``nn.Module``
            (then ``example_inputs`` or the first calibration batch is used to capture it).
        mode: ``"static"`` (int8 weights and activations; observers calibrated on ``calibration``),
            ``"dynamic"`` (int8 weights, activations quantized per batch at run time: Linear/LSTM) or
            ``"qat-prepare"`` (fake-quant model in training mode; train it, then :func:`convert`).
        backend: ``"x86"`` (fbgemm/oneDNN) or ``"qnnpack"`` (ARM); sets the qconfigs and the engine.
        calibration: see :func:`load_calibration`; ``None`` calibrates on random inputs and warns
            (:class:`RandomCalibrationWarning`) that accuracy is unknown.
        eval_data: batches the float and int8 models are compared on (default: the calibration data).
        sensitivity: also quantize one layer at a time and rank layers by the error each causes.
        keep_float_until: a :func:`parse_target` target; keep the most sensitive layers in float,
            one more at a time, until the target is met (implies ``sensitivity``).
        float_layers: module names to keep in float from the start.
        output_dir: write ``model.pt``, ``inputs.txt`` and ``report.json`` there (atomically).
    """
    _check_options(mode, backend)
    if mode == "qat-prepare" and (sensitivity or keep_float_until is not None):
        raise FxforgeError("sensitivity and keep-float need a quantized model", hint="use --mode static or dynamic")
    goal = parse_target(keep_float_until) if keep_float_until is not None else None
    captured = _as_captured(target, example_inputs, calibration)
    require_real_weights(captured, "quantize")
    if random_batches < 1:
        raise InputSpecError(f"--random-batches must be at least 1, got {random_batches}")
    plan = _plan(captured, mode, backend)
    float_layers = _checked_float_layers(plan, float_layers)
    result_warnings: list[str] = []
    notes: list[str] = []
    if plan.eager:
        notes.append(
            "the model was captured with torch.export (ATen dialect), which FX graph mode cannot quantize: "
            "Linear/LSTM layers were swapped for dynamic int8 ones in the original module (eager mode)"
        )

    calib = None
    if mode == "static":
        calib = load_calibration(calibration, plan.example_inputs, batches=random_batches, seed=seed)
    model = _quantize_once(plan, calib.batches if calib else [], float_layers=float_layers)
    if mode == "qat-prepare":
        notes.append(
            "fake-quant model in training mode: train it, then fxforge.quantize's convert(model) makes it int8"
        )
        result = QuantizeResult(model, mode, backend, plan.machinery, None, None, float_layers=float_layers)
        result.quantized_layers = _quantized_layers(model, plan.source, mode)
        result.notes = notes
        return _finish(result, captured, output_dir, force, spec)

    if mode == "dynamic":
        notes.append("dynamic quantization needs no calibration: activation ranges are measured on every batch")
    evaluation, label = _evaluation_data(plan, calib, calibration, eval_data, random_batches, seed)
    warning = _random_data_warning(calib, evaluation)
    if warning:
        result_warnings.append(warning)
        warnings.warn(warning, RandomCalibrationWarning, stacklevel=2)

    reference = run_batches(copy.deepcopy(plan.source).eval(), evaluation.batches)
    with quantized_engine(backend):
        accuracy = compare_batches(reference, run_batches(model, evaluation.batches), label, evaluation.labels)
    if goal is not None and goal.metric != "rel_err" and not accuracy.classifier:
        raise FxforgeError(
            f"a top-1 target ({goal}) needs a classifier (first output: 2-D logits)", hint="use rel-err=X"
        )
    ranking: list[LayerSensitivity] = []
    if sensitivity or goal is not None:
        ranking = _sensitivity(plan, calib.batches if calib else [], reference, evaluation, label)
    target_met = None
    if goal is not None:
        model, accuracy = _keep_float_until(
            plan, calib, goal, ranking, float_layers, model, accuracy, reference, evaluation
        )
        target_met = goal.met(accuracy)
        if not target_met:
            result_warnings.append(f"target {goal} not met even with every ranked layer in float")

    result = QuantizeResult(
        model=model,
        mode=mode,
        backend=backend,
        machinery=plan.machinery,
        calibration=calib.describe() if calib else None,
        accuracy=accuracy,
        sensitivity=ranking,
        quantized_layers=_quantized_layers(model, plan.source, mode),
        float_layers=float_layers,
        target=str(goal) if goal is not None else None,
        target_met=target_met,
        warnings=result_warnings,
        notes=notes,
        evaluation=evaluation.describe(),
    )
    if not result.quantized_layers:
        why = "every quantizable layer is kept in float" if float_layers else f"the model has no {_layer_kinds(mode)}"
        result.warnings.append(f"no layer was quantized: {why}")
    return _finish(result, captured, output_dir, force, spec)


def _finish(
    result: QuantizeResult, captured: Captured, output_dir: str | Path | None, force: bool, spec: str | None
) -> QuantizeResult:
    if output_dir is not None:
        write_output(result, captured, output_dir, force=force, spec=spec)
    return result


def _layer_kinds(mode: str) -> str:
    return "/".join(sorted({t.__name__ for t in _layer_types(mode)})) + " layer"


def _checked_float_layers(plan: _Plan, float_layers: Sequence[str]) -> list[str]:
    known = {name for name, _ in quantizable_layers(plan.source, plan.mode)}
    unknown = [name for name in float_layers if name not in known]
    if unknown:
        layers = ", ".join(sorted(known)) or "none"
        raise FxforgeError(f"no quantizable layer named {unknown[0]!r}", hint=f"layers: {layers}")
    return list(float_layers)


def _evaluation_data(
    plan: _Plan, calib: CalibrationData | None, calibration: Any, eval_data: Any, random_batches: int, seed: int
) -> tuple[CalibrationData, str]:
    """The batches float and int8 are compared on: ``eval_data``, else the calibration data (for dynamic
    quantization, which calibrates nothing, the ``calibration`` argument is only this)."""
    if eval_data is not None:
        data = load_calibration(eval_data, plan.example_inputs, batches=random_batches, seed=seed + 1000, kind="eval")
        return data, "eval data"
    if calib is not None:
        return calib, "calibration data"
    data = load_calibration(calibration, plan.example_inputs, batches=random_batches, seed=seed)
    return data, "random inputs" if data.random else "the given data"


def _random_data_warning(calib: CalibrationData | None, evaluation: CalibrationData) -> str | None:
    if calib is not None and calib.random:
        if evaluation.random:
            return RANDOM_WARNING
        return (
            "calibrated on random inputs: the accuracy below is measured on the eval data, but calibrating "
            "on real data (--calib) usually gives a more accurate int8 model"
        )
    if evaluation.random:
        return RANDOM_EVAL_WARNING
    return None


def _keep_float_until(
    plan: _Plan,
    calib: CalibrationData | None,
    goal: Target,
    ranking: Sequence[LayerSensitivity],
    float_layers: list[str],
    model: nn.Module,
    accuracy: AccuracyReport,
    reference: list[list[torch.Tensor]],
    evaluation: CalibrationData,
) -> tuple[nn.Module, AccuracyReport]:
    """Put the most sensitive layers back in float, one more at a time, until ``goal`` is met.

    Greedy in ranking order: each step re-quantizes the model with one more float layer and measures
    it again (so interactions between layers count), and stops at the first model that meets the goal.
    ``float_layers`` is extended in place with the layers kept in float.
    """
    batches = calib.batches if calib else []
    for layer in (entry.layer for entry in ranking):
        if goal.met(accuracy):
            break
        if layer in float_layers:
            continue
        float_layers.append(layer)
        model = _quantize_once(plan, batches, float_layers=float_layers)
        with quantized_engine(plan.backend):
            accuracy = compare_batches(
                reference, run_batches(model, evaluation.batches), accuracy.data, evaluation.labels
            )
    return model, accuracy


def _quantized_layers(model: nn.Module, source: nn.Module, mode: str) -> list[str]:
    names = []
    for name, _ in quantizable_layers(source, mode):
        try:
            sub = model.get_submodule(name)
        except AttributeError:
            continue
        if _is_quantized_module(sub) or hasattr(sub, "weight_fake_quant"):
            names.append(name)
    return names


def _sensitivity(
    plan: _Plan,
    calibration: Sequence[tuple[Any, ...]],
    reference: list[list[torch.Tensor]],
    evaluation: CalibrationData,
    label: str,
) -> list[LayerSensitivity]:
    """Quantize each layer alone and rank layers by the error they cause, largest first.

    One-at-a-time (rather than leave-one-out) isolates each layer's own error; ranked by mean abs
    error, which is continuous where top-1 agreement on a small set ties.
    """
    entries = []
    with quantized_engine(plan.backend):
        for name, type_name in quantizable_layers(plan.source, plan.mode):
            model = _quantize_once(plan, calibration, only=name)
            report = compare_batches(reference, run_batches(model, evaluation.batches), label, evaluation.labels)
            entries.append(
                LayerSensitivity(
                    name,
                    type_name,
                    report.top1_agreement,
                    report.max_abs_err,
                    report.mean_abs_err,
                    report.rel_err,
                    report.top1_drop,
                )
            )
    entries.sort(key=lambda e: (-e.mean_abs_err, e.top1_agreement if e.top1_agreement is not None else 1.0))
    return entries


# --------------------------------------------------------------------------------------------------
# output and hooks


def write_output(
    result: QuantizeResult,
    captured: Captured,
    output_dir: str | Path,
    *,
    force: bool = False,
    spec: str | None = None,
) -> list[str]:
    """Write ``model.pt`` (``torch.save`` of the quantized module), ``inputs.txt`` and ``report.json``
    into ``output_dir``, atomically (nothing is left behind when a step fails).

    ``model.pt`` loads with ``torch.load(path, weights_only=False)`` and torch alone; before the
    directory is moved into place the file is loaded back and must give the same outputs as
    ``result.model`` on the example inputs.
    """
    from fxforge.inputs import specs_of

    output_dir = Path(output_dir)
    files = [MODEL_FILE, "inputs.txt", "report.json"]
    inputs = tuple(captured.flat_inputs()) if isinstance(result.model, fx.GraphModule) else captured.example_inputs
    with atomic_directory(output_dir, force=force) as staging:
        with picklable_quantized_modules(result.model):
            torch.save(result.model, staging / MODEL_FILE)
        _check_reload(result, staging / MODEL_FILE, inputs)
        tensors = [t for t in captured.example_inputs if isinstance(t, torch.Tensor)]
        (staging / "inputs.txt").write_text("\n".join(str(s) for s in specs_of(tensors)) + "\n")
        result.output_dir, result.files = output_dir, files
        report = {"model": spec, "capture": captured.record.to_dict(), **result.to_dict()}
        (staging / "report.json").write_text(json.dumps(report, indent=2, default=str))
    return files


def _breaks_pickling(module: nn.Module) -> bool:
    """torch's quantized conv modules (``torch.ao.nn.quantized`` ``_ConvNd`` and the fused conv-relu
    ones built on it) define a ``__setstate__`` written for TorchScript that never runs
    ``nn.Module.__init__``: unpickled, such a module has no ``_modules``, and a pickled GraphModule
    holding one fails to load (torch 2.14.1). Their ``__copy__`` does build a whole module."""
    cls = type(module)
    return (
        cls.__module__.startswith("torch.ao.nn.")
        and getattr(cls, "__setstate__", None) not in (None, nn.Module.__setstate__)
        and getattr(cls, "__copy__", None) is not None
    )


@contextlib.contextmanager
def picklable_quantized_modules(model: nn.Module) -> Iterator[None]:
    """While in the block, ``model`` pickles (torch 2.14.1 cannot pickle FX-quantized models as they are):

    * each module that :func:`_breaks_pickling` pickles as ``copy.copy(bare)``: ``bare`` (a copy of
      the module) loads the broken way but keeps every field its class's ``__copy__`` needs, and
      ``copy.copy`` then rebuilds the whole module;
    * the qconfigs a prepared (QAT) model keeps on its modules and in its graph's metadata, which
      ``convert_fx`` reads, lose the device-check closure ``prepare`` adds to their observer
      factories (a local function, so unpicklable; it only picks the device for new observers,
      and the model is on the CPU).

    Loading needs only torch and the standard library. Everything is put back on the way out.
    """
    undo: list[Callable[[], None]] = []
    try:
        for module in model.modules():
            if _breaks_pickling(module):
                bare = copy.copy(module)
                object.__setattr__(module, "__reduce_ex__", lambda protocol, bare=bare: (copy.copy, (bare,)))
                undo.append(lambda module=module: object.__delattr__(module, "__reduce_ex__"))
            qconfig = module.__dict__.get("qconfig")
            if qconfig is not None and not _pickles(qconfig):
                module.__dict__["qconfig"] = _without_device_check(qconfig)
                undo.append(lambda module=module, qconfig=qconfig: module.__dict__.__setitem__("qconfig", qconfig))
        attrs = getattr(model, "meta", {}).get("_observed_graph_module_attrs")
        qconfigs = getattr(attrs, "node_name_to_qconfig", None)
        if qconfigs is not None and not _pickles(qconfigs):
            attrs.node_name_to_qconfig = {name: _without_device_check(q) for name, q in qconfigs.items()}
            undo.append(lambda: setattr(attrs, "node_name_to_qconfig", qconfigs))
        if attrs is not None and isinstance(model, fx.GraphModule):
            state = {"meta": _meta_for_reloaded_graph(model)}
            object.__setattr__(model, "__reduce_ex__", lambda protocol: (*_reduce_graph_module(model), state))
            undo.append(lambda: object.__delattr__(model, "__reduce_ex__"))
        yield
    finally:
        for step in reversed(undo):
            step()


def _reduce_graph_module(gm: fx.GraphModule) -> tuple[Any, tuple[Any, ...]]:
    function, (body, import_block) = fx.GraphModule.__reduce__(gm)
    return function, ({key: value for key, value in body.items() if key != "__reduce_ex__"}, import_block)


def _meta_for_reloaded_graph(gm: fx.GraphModule) -> dict[str, Any]:
    """``gm.meta`` as the model will need it once reloaded, so that ``convert_fx`` accepts it.

    A pickled GraphModule keeps its code, not its graph or ``meta``: loading re-traces the code, which
    renames some nodes, and leaves ``meta`` empty; ``convert_fx`` then refuses the model ("must be
    produced by prepare_fx") and its per-node qconfigs would name nodes that no longer exist. The
    metadata saved as pickle state (restored by ``nn.Module.__setstate__``) has its node names mapped
    to the re-traced graph's, found by loading a copy here: the re-trace keeps the node order.
    """
    buffer = io.BytesIO()
    torch.save(gm, buffer)
    buffer.seek(0)
    with _quiet():
        reloaded = torch.load(buffer, weights_only=False)
    before, after = list(gm.graph.nodes), list(reloaded.graph.nodes)
    if len(before) != len(after) or any(a.op != b.op for a, b in zip(before, after)):
        raise FxforgeError("cannot save the prepared model: its graph changes when torch reloads it")
    names = {a.name: b.name for a, b in zip(before, after)}

    def renamed(mapping: dict[str, Any]) -> dict[str, Any]:
        return {names.get(name, name): value for name, value in mapping.items()}

    attrs = gm.meta["_observed_graph_module_attrs"]
    attrs = dataclasses.replace(
        attrs,
        node_name_to_qconfig=renamed(attrs.node_name_to_qconfig),
        node_name_to_scope=renamed(attrs.node_name_to_scope),
        equalization_node_name_to_qconfig=renamed(attrs.equalization_node_name_to_qconfig),
        observed_node_names={names.get(name, name) for name in attrs.observed_node_names},
    )
    return {**gm.meta, "_observed_graph_module_attrs": attrs}


def _pickles(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except Exception:
        return False
    return True


def _without_device_check(qconfig: Any) -> Any:
    """``qconfig`` (a QConfig named tuple, or None) with its factories' ``callable_args`` dropped."""
    if qconfig is None or not hasattr(qconfig, "_replace"):
        return qconfig

    def strip(factory: Any) -> Any:
        if getattr(factory, "callable_args", None):
            factory = copy.copy(factory)
            factory.callable_args = {}
        return factory

    return qconfig._replace(**{name: strip(value) for name, value in qconfig._asdict().items()})


def _check_reload(result: QuantizeResult, path: Path, inputs: Sequence[Any]) -> None:
    """Load ``path`` back and require bitwise-equal outputs: same int8 kernels on the same inputs."""
    try:
        with _quiet():
            loaded = torch.load(str(path), map_location="cpu", weights_only=False)
    except Exception as exc:
        raise FxforgeError(
            f"the saved {result.mode} model does not load back: {type(exc).__name__}: {first_line(exc)}",
            hint="please report it; meanwhile save result.model's state_dict yourself",
        ) from exc
    # Copies, as a QAT model's fake-quant observers update their statistics on every forward; in eval
    # mode, as a QAT model in training mode has active dropout.
    expected, actual = copy.deepcopy(result.model).eval(), loaded.eval()
    with quantized_engine(result.backend):
        (want,), (got,) = run_batches(expected, [tuple(inputs)]), run_batches(actual, [tuple(inputs)])
    if len(want) != len(got) or not all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(want, got)):
        raise FxforgeError(
            f"the saved {result.mode} model computes something else after loading", hint="please report it"
        )


def int8_backend(
    captured: Captured, calibration: Any = None, *, mode: str | None = None, backend: str = "x86"
) -> nn.Module:
    """The int8 model ``fxforge.bench`` times in its "int8" row, in eval mode.

    ``mode`` ``None`` picks static int8 for torch-dialect graphs and dynamic int8 for models only
    ``torch.export`` could capture (static needs a symbolically traced graph). ``calibration`` as in
    :func:`quantize`; an ``int`` is read as a batch size and gives random calibration batches of that
    size (speed does not depend on the calibration data, accuracy does -- the bench does not measure
    accuracy, so the random-data warning is not raised). Run the model with
    ``torch.backends.quantized.engine`` set for ``backend`` (:func:`quantized_engine`; ``x86`` is
    torch's default on x86 machines).

    Raises:
        FxforgeError: when nothing in the model could be quantized (timing it would time the float
            model under an int8 label).
    """
    if isinstance(calibration, int) and not isinstance(calibration, bool):
        from fxforge.inputs import make_inputs, specs_of

        specs = specs_of(captured.example_inputs)
        calibration = [make_inputs(specs, seed=i, batch=calibration) for i in range(DEFAULT_RANDOM_BATCHES)]
    if mode is None:
        mode = "dynamic" if captured.dialect == ATEN else "static"
    if mode == "qat-prepare":
        raise FxforgeError("the int8 backend needs a quantized model", hint="mode static or dynamic")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RandomCalibrationWarning)
        result = quantize(captured, mode, backend, calibration)
    if not result.quantized_layers:
        raise FxforgeError(
            f"{mode} int8 quantization found no layer to quantize in this model",
            hint="dynamic int8 quantizes Linear/LSTM/GRU only; static needs a torch-dialect graph (symbolic_trace)",
        )
    return result.model.eval()


# --------------------------------------------------------------------------------------------------
# reading quantized graphs (inspect and lint use these)

# What a node of a quantized graph does, for inspect's "quant" column and the lint rules:
#   observer    an observer module collecting value ranges (a prepared, not yet converted, model)
#   fake_quant  a fake-quantize module or op (QAT: rounds to int8 steps, computes in float)
#   qat         a QAT layer (float weights fake-quantized on every forward)
#   quantize    float -> int8 (torch.quantize_per_tensor, aten/quantized_decomposed quantize ops)
#   dequantize  int8 -> float (Tensor.dequantize, torch.dequantize, the dequantize ops)
#   int8        a layer or op computing on int8 data (torch.ao.nn.quantized modules, quantized:: ops)
QUANT_KINDS = ("observer", "fake_quant", "qat", "quantize", "dequantize", "int8")

_INT8_MODULE_PREFIXES = ("torch.ao.nn.quantized.", "torch.ao.nn.intrinsic.quantized.", "torch.ao.nn.sparse.quantized.")
_QAT_MODULE_PREFIXES = ("torch.ao.nn.qat.", "torch.ao.nn.intrinsic.qat.")


def module_quant_kind(module: nn.Module) -> str | None:
    """The :data:`QUANT_KINDS` entry for a module, or None for a plain float module."""
    from torch.ao.quantization import FakeQuantizeBase, ObserverBase

    if isinstance(module, FakeQuantizeBase):
        return "fake_quant"
    if isinstance(module, ObserverBase):
        return "observer"
    name = type(module).__module__ + "."
    if name.startswith(_QAT_MODULE_PREFIXES):
        return "qat"
    # reference modules are float modules carrying weight qparams, not int8 kernels
    if name.startswith(_INT8_MODULE_PREFIXES) and ".reference." not in name:
        kind = type(module).__name__
        return {"Quantize": "quantize", "DeQuantize": "dequantize"}.get(kind, "int8")
    return None


def op_quant_kind(qualified_name: str) -> str | None:
    """The :data:`QUANT_KINDS` entry for an operator's schema name (``namespace::name``), or None."""
    namespace, _, name = qualified_name.partition("::")
    if namespace == "quantized":
        return "int8"
    if namespace not in ("aten", "quantized_decomposed"):
        return None
    if name.startswith("quantize_per_"):
        return "quantize"
    if name.startswith("dequantize"):
        return "dequantize"
    if name.startswith(("fake_quantize_", "fused_moving_avg_obs_fake_quant", "_fake_quantize")):
        return "fake_quant"
    return None


def quant_kind(gm: nn.Module, node: fx.Node) -> str | None:
    """The :data:`QUANT_KINDS` entry for ``node`` of ``gm`` (either dialect), or None."""
    if node.op == "call_module":
        return module_quant_kind(gm.get_submodule(str(node.target)))
    if node.op == "call_method":
        return "dequantize" if node.target == "dequantize" else None
    if node.op != "call_function":
        return None
    target = node.target
    if target in (torch.quantize_per_tensor, torch.quantize_per_channel, torch.quantize_per_tensor_dynamic):
        return "quantize"
    if target is torch.dequantize:
        return "dequantize"
    schema = getattr(target, "_schema", None)
    return op_quant_kind(schema.name) if schema is not None else None


def int8_weights(module: nn.Module) -> list[torch.Tensor]:
    """The weight and bias an int8 layer keeps packed for its kernel (they are not ``parameters()``)."""
    if module_quant_kind(module) != "int8":
        return []
    tensors = []
    for name in ("weight", "bias"):
        getter = getattr(type(module), name, None)
        if callable(getter):  # a method on the quantized classes; an attribute on float modules
            with _quiet():
                value = getter(module)
            if isinstance(value, torch.Tensor):
                tensors.append(value)
    return tensors


def int8_flops(module: nn.Module, inputs: Sequence[Any], output: Any) -> int:
    """FLOPs (2 per multiply-add, as ``torch.utils.flop_counter`` counts float layers) of an int8
    conv or linear layer, whose ops torch's FLOP counter has no formula for; 0 for anything else."""
    if module_quant_kind(module) != "int8" or not isinstance(output, torch.Tensor):
        return 0
    if hasattr(module, "in_channels") and hasattr(module, "kernel_size"):
        kernel = math.prod(module.kernel_size)
        if getattr(module, "transposed", False):
            source = inputs[0] if inputs and isinstance(inputs[0], torch.Tensor) else None
            return 2 * source.numel() * (module.out_channels // module.groups) * kernel if source is not None else 0
        return 2 * output.numel() * (module.in_channels // module.groups) * kernel
    if hasattr(module, "in_features"):
        return 2 * output.numel() * module.in_features
    return 0
