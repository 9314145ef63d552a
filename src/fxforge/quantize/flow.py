"""The quantize flow: prepare, calibrate and convert with FX graph mode (or eager dynamic quantization), measure the
result against the float model, rank layers by sensitivity and keep the worst in float until a target is met."""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn

from fxforge.capture import Captured, capture, require_real_weights
from fxforge.errors import DialectError, FxforgeError, InputSpecError, one_line_reason
from fxforge.graphs import ATEN, WEIGHTED_LAYER_TYPES
from fxforge.inputs import make_inputs, specs_of
from fxforge.quantize.accuracy import AccuracyReport, Target, compare_batches, parse_target, run_batches
from fxforge.quantize.data import (
    DEFAULT_RANDOM_BATCHES,
    RANDOM_EVAL_WARNING,
    RANDOM_WARNING,
    CalibrationData,
    RandomCalibrationWarning,
    load_calibration,
)
from fxforge.quantize.engine import quantized_engine
from fxforge.quantize.result import LayerSensitivity, QuantizeResult
from fxforge.quantize.saving import write_output
from fxforge.runtime import quiet_quantization_notices

MODES = ("static", "dynamic", "qat-prepare")
BACKENDS = ("x86", "qnnpack")

FX_MACHINERY = "torch.ao.quantization.quantize_fx (FX graph mode)"
EAGER_DYNAMIC_MACHINERY = "torch.ao.quantization.quantize_dynamic (eager module swap)"

# Layers a sensitivity run quantizes one at a time. Fused neighbours (BatchNorm, ReLU) go with their
# conv/linear, so the conv's name stands for the fused block.
STATIC_LAYER_TYPES: tuple[type[nn.Module], ...] = WEIGHTED_LAYER_TYPES
DYNAMIC_LAYER_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell, nn.RNNCell)


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

    with quiet_quantization_notices():
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
        with quiet_quantization_notices(), quantized_engine(plan.backend):
            return quantize_dynamic(model.eval(), spec, dtype=torch.qint8) if spec else model.eval()

    from torch.ao.quantization.fx.custom_config import PrepareCustomConfig
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx, prepare_qat_fx

    mapping = _qconfig_mapping(plan, only, float_layers)
    custom = PrepareCustomConfig()
    if isinstance(model, fx.GraphModule):
        custom.set_non_traceable_module_names(_non_traceable(model))
    try:
        with quiet_quantization_notices(), quantized_engine(plan.backend):
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
        raise FxforgeError(
            f"FX graph-mode quantization failed: {one_line_reason(exc)}",
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
    with quiet_quantization_notices(), quantized_engine(backend):
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
