"""The quantize flow: prepare, calibrate and convert with FX graph mode (or eager dynamic quantization), measure the
result against the float model, rank the fallback units (:mod:`.units`: every quantized layer and op in static
mode, the quantized layers otherwise) by sensitivity and keep the worst in float until a target is met."""

from __future__ import annotations

import contextlib
import copy
import math
import platform
import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch.nn import functional as F

from fxforge.artifacts import check_output_directory
from fxforge.capture import LOADED, Captured, capture, require_real_weights, wrapped_calls_kept
from fxforge.display import counted
from fxforge.effects import written_args
from fxforge.errors import (
    DialectError,
    FxforgeError,
    InputSpecError,
    installed_package,
    offered,
    one_line_reason,
    option,
    outside_stacklevel,
    said,
)
from fxforge.graphs import ATEN, WEIGHTED_LAYER_TYPES, get_attr_value, reads_metadata_only, runs_hooks, submodule
from fxforge.inputs import make_inputs, specs_of
from fxforge.passes import apply_pass
from fxforge.quantize.accuracy import AccuracyReport, Target, compare_batches, parse_target, run_batches
from fxforge.quantize.data import (
    DEFAULT_RANDOM_BATCHES,
    RANDOM_EVAL_WARNING,
    RANDOM_WARNING,
    CalibrationData,
    RandomCalibrationWarning,
    batch_samples,
    check_data_file,
    leading_batches,
    load_calibration,
)
from fxforge.quantize.engine import quantized_engine
from fxforge.quantize.fx_safety import calls_unshared, in_place_results_used, shared_layers_fusion_would_change
from fxforge.quantize.result import IN_SAMPLE, LayerSensitivity, QuantizeResult
from fxforge.quantize.saving import write_output
from fxforge.quantize.units import MODULE, Unit, find_units, keep_in_float, stay_float
from fxforge.references import as_names
from fxforge.runtime import (
    cloned,
    describe_inputs,
    device_of,
    preserved_state,
    quiet_quantization_notices,
    restore_buffers,
    rng_preserved,
)
from fxforge.vocabulary import quant_kind

MODES = ("static", "dynamic", "qat-prepare")
BACKENDS = ("x86", "qnnpack")

FX_MACHINERY = "torch.ao.quantization.quantize_fx (FX graph mode)"
EAGER_DYNAMIC_MACHINERY = "torch.ao.quantization.quantize_dynamic (eager module swap)"

# The sensitivity ranking quantizes the model once per unit, each calibrated and evaluated: on 450 images at 224x224
# that was 12 s a unit and 13 minutes for mobilenet_v2's 64 units, 8 s of each in calibration. A unit's error is
# ranked on a prefix of the data holding this many samples (whole batches); the keep-float search that follows
# checks its target on all of it, so only the order in which units go back to float can change.
SENSITIVITY_SAMPLES = 128

# Static int8 fits its value ranges to the calibration data: compared on that same data, the error is in-sample
# and can be smaller than on data the model has not seen.
IN_SAMPLE_WARNING = (
    "accuracy measured on the calibration data itself: the int8 value ranges were fitted to it, so the error on "
    "new data can be larger; pass held-out data (--eval on the command line, eval_data= in Python) to measure it"
)

# Layers a sensitivity run quantizes one at a time. Fused neighbours (BatchNorm, ReLU) go with their
# conv/linear, so the conv's name stands for the fused block.
STATIC_LAYER_TYPES: tuple[type[nn.Module], ...] = WEIGHTED_LAYER_TYPES
DYNAMIC_LAYER_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell, nn.RNNCell)
_RELU_FUSION_PARTNERS = (nn.ReLU, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def _label_problem(labels: Sequence[Any], reference: list[list[torch.Tensor]]) -> str | None:
    """Why the labels the data carries do not give real top-1 accuracies, where they do not: some batches without
    them (then none is used), or classes the model does not have (QA: both passed silently)."""
    present = [y for y in labels if y is not None]
    if present and len(present) < len(labels):
        return (
            f"labels in {len(present)} of {len(labels)} evaluation batches: top-1 accuracy was not measured (every "
            "batch needs its labels)"
        )
    classes = reference[0][0].shape[1] if reference and reference[0] else None
    outside = [int(v) for y in present for v in (y.min(), y.max()) if not 0 <= int(v) < (classes or 0)]
    if classes and outside:
        return (
            f"labels outside the model's {classes} classes (e.g. {outside[0]}): both models' top-1 accuracy counts "
            "those samples as wrong"
        )
    return None


def _check_options(mode: str, backend: str) -> None:
    if mode not in MODES:
        raise FxforgeError(f"unknown quantization mode {mode!r}", hint=f"one of {', '.join(MODES)}")
    if backend not in BACKENDS:
        raise FxforgeError(f"unknown quantization backend {backend!r}", hint=f"one of {', '.join(BACKENDS)}")


def check_arguments(
    mode: str,
    backend: str = "x86",
    *,
    calibration: Any = None,
    eval_data: Any = None,
    sensitivity: bool = False,
    keep_float_until: float | str | Target | None = None,
    random_batches: int | None = None,
    output_dir: str | Path | None = None,
    force: bool = False,
) -> Target | None:
    """Refuse what :func:`quantize` would refuse without looking at the model, and return the parsed target.

    Called before the model is captured (by the CLI) and by :func:`quantize` before any work: a refusal after
    capture, calibration and a sensitivity search (minutes on big models) would waste all of it.
    """
    _check_options(mode, backend)
    if mode == "qat-prepare" and (sensitivity or keep_float_until is not None):
        raise FxforgeError(
            "sensitivity and keep-float need a quantized model",
            hint=f"use {option('--mode', 'static')} or dynamic",
        )
    # Data the mode never reads would be accepted unread, even a missing or corrupt file, and the user would
    # believe it had been used (docs/commands/quantize.md, "data it needs").
    if mode == "qat-prepare" and (calibration is not None or eval_data is not None):
        given = " and ".join(
            option(flag, python=name)
            for flag, name, value in (("--calib", "calibration", calibration), ("--eval", "eval_data", eval_data))
            if value is not None
        )
        raise InputSpecError(
            f"{option('--mode', 'qat-prepare')} uses no data, but {given} {'were' if ' and ' in given else 'was'} "
            "given: it only inserts fake-quant nodes, whose ranges your training loop sets",
            hint=f"drop {given}; measure the model after training and convert, or quantize with "
            f"{option('--mode', 'static')}",
        )
    if mode == "dynamic" and calibration is not None and eval_data is not None:
        calib, evaluated = option("--calib", python="calibration"), option("--eval", python="eval_data")
        raise InputSpecError(
            f"{option('--mode', 'dynamic')} does not use {calib} when {evaluated} is given: dynamic quantization "
            f"calibrates nothing, and {calib} data only stands in for {evaluated} in the accuracy comparison",
            hint=f"drop {calib} (or drop {evaluated} to compare the models on the {calib} data)",
        )
    check_data_file(calibration, "calibration")
    check_data_file(eval_data, "eval")
    goal = parse_target(keep_float_until) if keep_float_until is not None else None
    if random_batches is not None:
        if random_batches < 1:
            raise InputSpecError(f"{option('--random-batches')} must be at least 1, got {random_batches}")
        _refuse_unread_random_batches(mode, calibration, eval_data)
    if output_dir is not None:
        check_output_directory(output_dir, force=force)
    return goal


def _refuse_unread_random_batches(mode: str, calibration: Any, eval_data: Any) -> None:
    """``random_batches`` counts the random batches drawn where no data is given (or plain ``random``); with every
    batch read from data or ``random:N`` it was ignored without a word (QA), by the CLI and the API alike."""

    def drawn_at_the_count(spec: Any) -> bool:
        return spec is None or (isinstance(spec, str) and spec == "random")

    if mode == "qat-prepare":
        why = f"{option('--mode', 'qat-prepare')} reads no data"
    else:
        # dynamic mode reads eval_data alone where it is given; static reads calibration, and eval_data too
        read = eval_data if mode == "dynamic" and eval_data is not None else calibration
        if drawn_at_the_count(read) or (isinstance(eval_data, str) and eval_data == "random"):
            return
        sources = [
            option(flag, python=name) + (f" {spec}" if isinstance(spec, (str, Path)) else "")
            for flag, name, spec in (("--calib", "calibration", calibration), ("--eval", "eval_data", eval_data))
            if spec is not None
        ]
        why = "every batch comes from " + " and ".join(sources)
    raise InputSpecError(
        f"{option('--random-batches')} sets how many random batches stand in for missing data, and here none is "
        f"drawn: {why}",
        hint=f"drop {option('--random-batches')} (random:N sets the count of one random spec)",
    )


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
            elif (functional := _functional_layer(node, mode)) is not None:
                found.setdefault(*functional)
    else:
        for name, sub in module.named_modules():
            if name and type(sub) in types:
                found.setdefault(name, type(sub).__name__)
    return list(found.items())


_FUNCTIONAL_LAYERS = {F.linear: "Linear", F.conv1d: "Conv1d", F.conv2d: "Conv2d", F.conv3d: "Conv3d"}


def _functional_layer(node: fx.Node, mode: str) -> tuple[str, str] | None:
    """``(name, type)`` of a layer traced into a functional call on a stored weight (a subclass of ``nn.Linear``
    from a library, timm's: its forward calls ``F.linear``), named after the weight's owner; else None."""
    kind = _FUNCTIONAL_LAYERS.get(node.target) if node.op == "call_function" else None
    weight = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
    if kind is None or not isinstance(weight, fx.Node) or weight.op != "get_attr":
        return None
    if mode == "dynamic" and kind != "Linear":
        return None
    return str(weight.target).removesuffix(".weight"), kind


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
    units: list[Unit] | None = None  # the fallback units, found on first use (fallback_units)
    prepared: dict[str, int] = field(default_factory=dict)  # rewrites made by exact passes first (_ready_for_int8)
    # the float model int8 is measured against: the caller's, before those passes (source: None)
    reference: nn.Module | None = None

    @property
    def machinery(self) -> str:
        return EAGER_DYNAMIC_MACHINERY if self.eager else FX_MACHINERY


def _qconfig_mapping(plan: _Plan, float_units: Sequence[Unit] = ()):
    """The backend's default qconfigs (Linear/LSTM-like layers only in dynamic mode), ``float_units`` in float."""
    from torch.ao.quantization import QConfigMapping, default_dynamic_qconfig
    from torch.ao.quantization.qconfig_mapping import get_default_qat_qconfig_mapping, get_default_qconfig_mapping

    with quiet_quantization_notices():
        if plan.mode == "dynamic":
            mapping = QConfigMapping()
            for layer_type in (*DYNAMIC_LAYER_TYPES, F.linear):  # F.linear: a library's Linear traced into
                mapping.set_object_type(layer_type, default_dynamic_qconfig)
            # FX fusion joins an nn.ReLU with the Linear, conv or batch norm before it and wants one qconfig
            # (looked up by type) for both: with the Linear's alone, every Linear -> nn.ReLU model (an MLP) failed
            # to quantize (QA). Dynamic int8 has no conv or ReLU kernels, so those stay float (fused, same math).
            for partner in _RELU_FUSION_PARTNERS:
                mapping.set_object_type(partner, default_dynamic_qconfig)
        elif plan.mode == "qat-prepare":
            mapping = get_default_qat_qconfig_mapping(plan.backend)
        else:
            mapping = get_default_qconfig_mapping(plan.backend)
    return keep_in_float(mapping, float_units)


def _quantize_once(
    plan: _Plan,
    calibration: Sequence[tuple[Any, ...]],
    *,
    float_units: Sequence[Unit] = (),
    source: str = "",
    statistics: Statistics | None = None,
) -> nn.Module:
    """Prepare, calibrate and convert a fresh copy of ``plan.source`` with ``float_units`` kept in float (prepare
    only for QAT). ``source``: where the calibration data came from, for the error when it does not fit the model.
    ``statistics``: observers already calibrated on ``calibration`` (:func:`_calibrated_statistics`), taken instead
    of calibrating again where every observer of this preparation has its twin there."""
    if plan.eager:
        from torch.ao.quantization import default_dynamic_qconfig, quantize_dynamic

        model = copy.deepcopy(plan.source)  # the module swap changes the module it is given
        floats = {unit.name for unit in float_units}
        names = [n for n, _ in quantizable_layers(model, "dynamic") if n not in floats]
        spec = {name: default_dynamic_qconfig for name in names}
        with quiet_quantization_notices(), quantized_engine(plan.backend):
            return quantize_dynamic(model.eval(), spec, dtype=torch.qint8) if spec else model.eval()

    from torch.ao.quantization.quantize_fx import convert_fx

    with _fx_errors(plan.mode), quiet_quantization_notices(), quantized_engine(plan.backend):
        prepared = stay_float(_prepare(plan, _qconfig_mapping(plan, float_units)), float_units)
        if plan.mode == "qat-prepare":
            return _presize_per_channel_fake_quant(prepared, plan.example_inputs)
        if plan.mode == "static" and not (statistics is not None and _take_statistics(prepared, statistics)):
            _calibrate(plan, prepared, calibration, source)
        return _views_as_reshapes(_shape_reads_without_dequantize(convert_fx(prepared)))


def _calibrate(plan: _Plan, prepared: nn.Module, calibration: Sequence[tuple[Any, ...]], source: str = "") -> None:
    # the model's own buffers are put back after calibrating, the observers' statistics kept: a buffer forward updates
    # (a step counter) came out of calibration advanced, and the int8 model computed what the float one computes
    # after as many calls (QA)
    own = _own_buffers(prepared)
    with torch.no_grad():
        for index, batch in enumerate(calibration):
            try:
                prepared(*cloned(tuple(batch)))  # the caller's data as it is: a model may write its inputs in place
            except Exception as exc:
                data = f"calibration data from {source}" if source else "calibration data"
                _check_batch_fits(plan, batch, index, data, exc)
                raise
    restore_buffers(prepared, own)


def _own_buffers(prepared: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the buffers of ``prepared`` that are the model's, not its observers' or fake quantizers'."""
    from torch.ao.quantization import FakeQuantizeBase, ObserverBase

    watchers = [name + "." for name, m in prepared.named_modules() if isinstance(m, (ObserverBase, FakeQuantizeBase))]
    return {
        name: buf.detach().clone()
        for name, buf in prepared.named_buffers()
        if buf.device.type != "meta" and not any(name.startswith(prefix) for prefix in watchers)
    }


# An observer's identity across preparations: the node it observes (name, op, module type or function) and its own
# type and dtype. Calibration runs the float model with observers that only watch, so the values reaching an
# observer of this identity are the same whichever units a preparation keeps in float.
ObserverKey = tuple[str, str, str, str, str]
# calibrated observers by the set of nodes each watched (one observer object can watch two: a max pooling shares
# its input's)
Statistics = dict[frozenset[ObserverKey], nn.Module]


def _observer_nodes(model: fx.GraphModule) -> Iterator[tuple[fx.Node, ObserverKey]]:
    from torch.ao.quantization.observer import ObserverBase

    for node in model.graph.nodes:
        if node.op != "call_module":
            continue
        observer = model.get_submodule(str(node.target))
        if not isinstance(observer, ObserverBase):
            continue
        observed = node.args[0] if node.args else None
        if not isinstance(observed, fx.Node):
            continue
        what = (
            type(model.get_submodule(str(observed.target))).__name__
            if observed.op == "call_module"
            else str(observed.target)
        )
        yield node, (observed.name, observed.op, what, type(observer).__name__, str(getattr(observer, "dtype", "")))


def _observed_by_target(model: fx.GraphModule) -> dict[str, frozenset[ObserverKey]]:
    """Each observer attribute and the identities of every node its module watches: ``prepare_fx`` shares one
    observer object between attributes (a max pooling's output and its input), so they are grouped by object."""
    by_object: dict[int, set[ObserverKey]] = {}
    targets: dict[str, int] = {}
    for node, key in _observer_nodes(model):
        identity = id(model.get_submodule(str(node.target)))
        by_object.setdefault(identity, set()).add(key)
        targets[str(node.target)] = identity
    return {target: frozenset(by_object[identity]) for target, identity in targets.items()}


def _calibrated_statistics(plan: _Plan, calibration: Sequence[tuple[Any, ...]]) -> Statistics:
    """Every observer of the fully quantized preparation, calibrated once on ``calibration``, and for each node
    that a shared observer watches, an observer of that node alone, calibrated alongside.

    ``--sensitivity`` quantizes the model once per unit, and calibration was nearly all of each (regnetx_002 at
    224x224: 73 s of calibration against 1.5 s of preparing and converting, for each of its units): each unit's
    preparation takes its observers from here instead (:func:`_take_statistics`). The observers of one node
    alone are needed because a preparation with other units in float shares less: mobilenet_v2's ReLU6 shares its
    conv's observer when the conv is int8, and has one of its own when the conv is float.
    """
    with _fx_errors(plan.mode), quiet_quantization_notices(), quantized_engine(plan.backend):
        prepared = _prepare(plan, _qconfig_mapping(plan))
        groups = _observed_by_target(prepared)
        statistics: Statistics = {}
        for index, (node, key) in enumerate(list(_observer_nodes(prepared))):
            observer = prepared.get_submodule(str(node.target))
            statistics[groups[str(node.target)]] = observer
            if len(groups[str(node.target)]) > 1:
                alone = copy.deepcopy(observer)  # not calibrated yet: a fresh twin that sees this node only
                name = f"fxforge_node_observer_{index}"
                prepared.add_submodule(name, alone)
                with prepared.graph.inserting_after(node):
                    prepared.graph.call_module(name, (node.args[0],))
                statistics[frozenset({key})] = alone
        prepared.recompile()
        _calibrate(plan, prepared, calibration)
    return statistics


def _take_statistics(prepared: fx.GraphModule, statistics: Statistics) -> bool:
    """Put a calibrated copy of each observer's twin in ``statistics`` in place of it; False (and nothing changed)
    when one has none: then calibrate.

    A twin must have watched exactly the nodes this observer watches: the master's max pooling shares its input's
    observer, whose histogram then holds both the conv's and the pooling's outputs, while a preparation with that
    conv in float gives the pooling an observer of its own (same range, another histogram, other int8 scales).
    """
    chosen: dict[str, nn.Module] = {}
    for target, keys in _observed_by_target(prepared).items():
        twin = statistics.get(keys)
        if twin is None:
            return False
        chosen[target] = twin
    copies: dict[int, nn.Module] = {}  # attributes that shared one observer share its copy
    for target, twin in chosen.items():
        setattr(prepared, target, copies.setdefault(id(twin), copy.deepcopy(twin)))
    return True


# What a quantized tensor answers as its float form would: not dtype (quint8), and not is_floating_point.
_QUANTIZED_KEEPS = frozenset({"ndim", "shape", "device", "is_cuda", "layout", "dim", "ndimension", "size", "numel",
                              "nelement", "get_device"})  # fmt: skip


def _shape_reads_without_dequantize(model: nn.Module) -> nn.Module:
    """Let reads of an int8 activation's shape read it directly, and drop the dequantize they alone needed.

    ``convert_fx`` puts a dequantize before every op it leaves in float, a shape check too: timm's
    ``BatchNormAct2d`` asserts ``x.ndim == 4``, so the int8 regnetx_002 dequantized every conv's output (44 full
    tensors per call) to read its rank. A quantized tensor has the same shape, rank, size and device.
    """
    if not isinstance(model, fx.GraphModule):
        return model
    changed = False
    for node in list(model.graph.nodes):
        if node.op != "call_method" or node.target != "dequantize" or not node.users:
            continue
        readers = list(node.users)
        if all(reads_metadata_only(user, node) and _metadata_name(user) in _QUANTIZED_KEEPS for user in readers):
            for user in readers:
                user.replace_input_with(node, node.args[0])
            model.graph.erase_node(node)
            changed = True
    if changed:
        model.recompile()
    return model


def _views_as_reshapes(model: nn.Module) -> nn.Module:
    """``.view`` as ``.reshape`` in the int8 graph, where no in-place op could tell them apart.

    An int8 conv's output is laid out channels-last, so ``x.view(x.size(0), -1)`` after it -- the flatten of many
    user models -- failed in the int8 model ("view size is not compatible with input tensor's size and stride")
    although it ran in float. ``reshape`` gives the same values (copying where a view cannot be made); the two
    differ only in whether an in-place write through one reaches the other, so a view whose tensor, or whose base,
    is written in place stays a view.
    """
    if not isinstance(model, fx.GraphModule):
        return model
    changed = False
    for node in list(model.graph.nodes):
        if node.op != "call_method" or node.target != "view" or not node.args:
            continue
        base = node.args[0]
        if any(isinstance(arg, torch.dtype) for arg in (*node.args, *node.kwargs.values())):
            continue  # a view as another dtype, which reshape does not do
        if not isinstance(base, fx.Node) or any(_writes_in_place(model, user) for user in (*node.users, *base.users)):
            continue
        node.target = "reshape"
        changed = True
    if changed:
        model.recompile()
    return model


def _writes_in_place(model: fx.GraphModule, node: fx.Node) -> bool:
    """Whether ``node`` may write an input in place: :func:`fxforge.effects.written_args` for calls, and for a
    module its ``inplace`` flag (effects counts every module outside ``torch.nn.modules`` as a possible writer, and
    the int8 graph's layers are ``torch.ao`` modules that write nothing)."""
    if node.op != "call_module":
        return bool(written_args(model, node))
    try:
        return bool(getattr(model.get_submodule(str(node.target)), "inplace", False))
    except AttributeError:
        return True


def _metadata_name(user: fx.Node) -> str:
    if user.op == "call_function" and user.target is getattr:
        return str(user.args[1])
    return str(user.target) if user.op == "call_method" else ""


def _data_error(plan: _Plan, batch: tuple[Any, ...], index: int, data: str, exc: Exception) -> InputSpecError:
    return InputSpecError(
        f"the model cannot run on batch {index} of the {data} (inputs {describe_inputs(batch) or 'none'}; the "
        f"example inputs are {describe_inputs(plan.example_inputs)}): {one_line_reason(exc)}",
        hint="give data shaped like the model's inputs, with samples along dim 0",
    )


def _check_batch_fits(plan: _Plan, batch: tuple[Any, ...], index: int, data: str, exc: Exception) -> None:
    """Raise an input error when the float model, too, fails on the batch a prepared model failed on: the data
    does not fit the model, and FX's observers were only where it showed."""
    try:
        run_batches(copy.deepcopy(plan.source).eval(), [batch])
    except Exception:
        raise _data_error(plan, batch, index, data, exc) from None


def _float_outputs(plan: _Plan, data: CalibrationData, kind: str) -> list[list[torch.Tensor]]:
    """The float model's outputs on every batch of ``data``. It ran on the example inputs when it was captured, so
    a batch it cannot run is the data's fault: an input error naming the batch's shapes."""
    model = copy.deepcopy(plan.reference if plan.reference is not None else plan.source).eval()
    outputs = []
    for index, batch in enumerate(data.batches):
        try:
            outputs.extend(run_batches(model, [batch]))
        except Exception as exc:
            raise _data_error(plan, batch, index, f"{kind} data from {data.source}", exc) from None
    return outputs


def _stored_shapes_as_constants(gm: fx.GraphModule) -> None:
    """Replace reads of a stored tensor's shape (``weight.shape``, ``weight.size(0)``) with the shape itself.

    Conversion folds a conv's weight into the int8 conv and deletes its node; a second reader of that node broke it
    (QA: timm's "same" padding reads ``weight.shape``: KeyError 'conv_stem_weight' for every such model). A stored
    tensor's shape cannot change between calls, so the constant computes the same."""
    changed = False
    for node in list(gm.graph.nodes):
        source = node.args[0] if node.args else None
        if not isinstance(source, fx.Node) or source.op != "get_attr":
            continue
        shape = None
        if node.op == "call_function" and node.target is getattr and node.args[1:] == ("shape",):
            shape = tuple(get_attr_value(gm, str(source.target)).shape)
        elif node.op == "call_method" and node.target == "size" and not node.kwargs:
            value = get_attr_value(gm, str(source.target)).shape
            if len(node.args) == 1:
                shape = tuple(value)
            elif isinstance(node.args[1], int):
                shape = value[node.args[1]]
        if shape is None:
            continue
        node.replace_all_uses_with(shape)  # type: ignore[arg-type]
        gm.graph.erase_node(node)
        changed = True
    if changed:
        gm.recompile()


_CONV_DEFAULTS = (1, 0, 1, 1)  # stride, padding, dilation, groups
_CONVS = (F.conv1d, F.conv2d, F.conv3d)


def _conv_defaults_spelled_out(gm: fx.GraphModule) -> None:
    """Give each functional convolution every argument, sizes as lists: torch's lowering to int8 reads them by
    position, and ``F.conv2d(x, w, b, stride)`` failed ("conv2d_prepack() is missing value for argument
    'padding'"; an int stride: "Expected a value of type 'List[int]'")."""
    changed = False
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in _CONVS or not 2 <= len(node.args) < 7:
            continue  # (input and weight by keyword: left as they are)
        args = list(node.args) + [None] * (3 - len(node.args)) if len(node.args) < 3 else list(node.args)
        names = ("stride", "padding", "dilation", "groups")
        kwargs = dict(node.kwargs)
        args[2] = kwargs.pop("bias", args[2])
        for index, name in enumerate(names):
            if len(args) <= 3 + index:
                args.append(kwargs.pop(name, _CONV_DEFAULTS[index]))
        dims = _CONVS.index(node.target) + 1
        for index in (3, 4, 5):  # and sizes as lists: the int8 op takes no single int for them
            if isinstance(args[index], int):
                args[index] = [args[index]] * dims
        node.args, node.kwargs = tuple(args), kwargs
        changed = True
    if changed:
        gm.recompile()


def _prepare(plan: _Plan, mapping: Any) -> fx.GraphModule:
    """``prepare_fx`` (``prepare_qat_fx`` for QAT) on a fresh copy of ``plan.source``, capture's leaves untraced."""
    from torch.ao.quantization.fx.custom_config import PrepareCustomConfig
    from torch.ao.quantization.quantize_fx import prepare_fx, prepare_qat_fx

    model = copy.deepcopy(plan.source)  # prepare_fx changes the module it is given
    custom = PrepareCustomConfig()
    if isinstance(model, fx.GraphModule):
        _stored_shapes_as_constants(model)
        _conv_defaults_spelled_out(model)
        custom.set_non_traceable_module_names(_non_traceable(model))
    kept = wrapped_calls_kept(model) if isinstance(model, fx.GraphModule) else contextlib.nullcontext()
    with kept:  # prepare_fx traces the captured graph again: capture's wrapped functions stay single calls
        if plan.mode == "qat-prepare":
            return prepare_qat_fx(model.train(), mapping, plan.example_inputs, prepare_custom_config=custom)
        return prepare_fx(model.eval(), mapping, plan.example_inputs, prepare_custom_config=custom)


@contextlib.contextmanager
def _fx_errors(mode: str) -> Iterator[None]:
    """FX graph mode's exceptions as one-line fxforge errors, with a hint that fits ``mode`` (QA: "or try --mode
    dynamic" was said in dynamic mode)."""
    try:
        yield
    except FxforgeError:
        raise
    except Exception as exc:
        hint = "keep the offending submodule in float: " + said("--leaf NAME", "capture with leaf_modules=['NAME']")
        if mode != "dynamic":
            hint += f", or try {_mode('dynamic')}"
        if "Float Tensor" in str(exc):  # a float64 or bfloat16 model: torch's int8 starts from float32
            hint = "torch's int8 quantizes float32 models: convert it first (model.float()) and quantize that"
        if re.search(r"not implemented for '(Bool|Long|Int|Byte|Char|Short)'", str(exc)):
            # an observer on a mask or index tensor (QA: a bool mask input, and the hint blamed a submodule)
            hint = (
                "an observer was put on a bool or integer tensor (a mask or index input): static int8 observes float "
                f"tensors; try {_mode('dynamic')}, or keep the op that takes it in float (" + _float_layer() + ")"
            )
        if re.search(r"'(float|int)' object has no attribute 'numel'", str(exc)):
            # QA: `scores * q.size(-1) ** -0.5`, `x * t.item()`; the hint blamed a submodule and, from optimize,
            # named a --mode it does not have
            hint = (
                "the graph combines a tensor with a Python number computed in forward (from a shape or .item()), "
                "which FX quantization cannot observe: make it a constant set in __init__, or keep that op in float ("
                + _float_layer()
                + ")"
            )
        if "Unhandled type for returned node" in str(exc):  # QA: blamed a submodule for `return x, 7`
            hint = (
                "the model returns a Python number beside its tensors, which FX quantization cannot place: return "
                "tensors only (add the number outside the model, or return it as a tensor)"
            )
        raise FxforgeError(f"FX graph-mode quantization failed: {one_line_reason(exc)}", hint=hint) from exc


def _float_layer() -> str:
    """Keeping one op in float, as the running command takes it (report and optimize --auto have no --float-layer:
    the quantize command does)."""
    return said(
        offered("--float-layer NAME", "--float-layer") or "fxforge quantize --float-layer NAME", "float_layers=['NAME']"
    )


def _mode(mode: str) -> str:
    """Another quantization mode as the running command takes it: report says it with --quantize, quantize with
    --mode (QA: report was told to try --mode dynamic, which it has not)."""
    return (
        offered(option("--mode", mode), "--mode")
        or offered(f"--quantize {mode}", "--quantize")
        or f"fxforge quantize --mode {mode}"
    )


def _layer_unit(name: str, type_name: str) -> Unit:
    return Unit(name, "module", type_name, [name], [(MODULE, name)])


def _units(plan: _Plan) -> list[Unit]:
    """The plan's fallback units: for static FX quantization every quantized layer and op, found by a probe
    ``prepare_fx`` (see :mod:`.units`); otherwise (dynamic, QAT) the quantizable layers."""
    if plan.units is None:
        if plan.eager or plan.mode != "static":
            plan.units = [_layer_unit(name, kind) for name, kind in quantizable_layers(plan.source, plan.mode)]
        else:
            with _fx_errors(plan.mode), quiet_quantization_notices(), quantized_engine(plan.backend):
                plan.units = find_units(_prepare(plan, _qconfig_mapping(plan)), plan.source)
    return plan.units


def fallback_units(captured: Captured, mode: str = "static", backend: str = "x86") -> list[Unit]:
    """The units ``keep_float_until`` and ``float_layers`` can keep in float, in graph order.

    Static mode: every layer and op FX graph mode quantizes (a conv with its fused BatchNorm/ReLU, an add
    with its ReLU, a pooling layer, the calls of a method...), so that every unit in float is the float
    model. Dynamic mode: the Linear/LSTM/GRU layers.
    """
    _check_options(mode, backend)
    return list(_units(_plan(captured, mode, backend)))


def _presize_per_channel_fake_quant(model: nn.Module, example_inputs: Sequence[Any]) -> nn.Module:
    """Give each per-channel fake-quant of a fresh QAT model its statistics at full size.

    ``FusedMovingAvgObsFakeQuantize`` starts per-channel with empty min/max and a 1-element scale and
    resizes them on its first forward. Tensors loaded by ``torch.load`` cannot be resized, so a saved
    QAT model would fail on its first training step; and fxforge's capture check would see buffers
    change shape. Sized ``C`` and holding +inf/-inf (min/max) and 1/0 (scale/zero point), they give
    bitwise the same statistics and outputs from the first step on: the fused kernel takes an infinite
    running min/max as "nothing observed yet".

    Not only a QAT layer's ``weight_fake_quant``: the weight of a functional ``F.linear``/``F.conv2d`` (timm's
    ``Linear``, ghostnet's classifier) is fake-quantized by a graph-level ``activation_post_process_N``, and a
    saved ghostnet failed to run after loading (QA: "Trying to resize storage that is not resizable").
    """
    from torch.ao.quantization.fake_quantize import FusedMovingAvgObsFakeQuantize

    # Only the fused kind: a plain FakeQuantize's moving-average observer would compute inf - inf from these
    # starting values, and a resize-free start for it would change what it computes.
    unsized = {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, FusedMovingAvgObsFakeQuantize)
        and module.ch_axis >= 0
        and module.activation_post_process.min_val.numel() == 0
    }
    if not unsized:
        return model
    channels = _observed_channels_known(model, unsized)
    if len(channels) < len(unsized):
        channels.update(_observed_channels_measured(model, [n for n in unsized if n not in channels], example_inputs))
    for name, count in channels.items():
        fake_quant = unsized[name]
        observer = fake_quant.activation_post_process
        device = observer.min_val.device
        observer.min_val = torch.full((count,), math.inf, device=device)
        observer.max_val = torch.full((count,), -math.inf, device=device)
        fake_quant.scale = torch.ones(count, dtype=fake_quant.scale.dtype, device=device)
        fake_quant.zero_point = torch.zeros(count, dtype=fake_quant.zero_point.dtype, device=device)
    return model


def _observed_channels_known(model: nn.Module, unsized: dict[str, nn.Module]) -> dict[str, int]:
    """The channel counts read off the weights themselves: a QAT layer's ``weight_fake_quant`` observes its
    ``weight``, a graph's fake-quant called on a ``get_attr`` observes that attribute."""
    channels = {}
    for name, fake_quant in unsized.items():
        owner_name, _, attr = name.rpartition(".")
        weight = getattr(model.get_submodule(owner_name), "weight", None) if attr == "weight_fake_quant" else None
        if isinstance(weight, torch.Tensor):
            channels[name] = weight.shape[fake_quant.ch_axis]
    if isinstance(model, fx.GraphModule):
        for node in model.graph.nodes:
            if node.op != "call_module" or node.target not in unsized or node.target in channels or not node.args:
                continue
            source = node.args[0]
            if isinstance(source, fx.Node) and source.op == "get_attr":
                value = get_attr_value(model, str(source.target))
                if isinstance(value, torch.Tensor):
                    channels[node.target] = value.shape[unsized[node.target].ch_axis]
    return channels


def _observed_channels_measured(
    model: nn.Module, names: Sequence[str], example_inputs: Sequence[Any]
) -> dict[str, int]:
    """The channel counts of fake-quants whose input is computed (a standardized conv weight): seen on one run of a
    copy on the example inputs, in eval mode and on a fork of the random state, so nothing of the caller's moves."""
    copied = copy.deepcopy(model).eval()
    seen: dict[str, int] = {}
    for name in names:
        fake_quant = copied.get_submodule(name)

        def record(module: nn.Module, args: tuple[Any, ...], name: str = name) -> None:
            if args and isinstance(args[0], torch.Tensor):
                seen[name] = args[0].shape[module.ch_axis]

        fake_quant.register_forward_pre_hook(record)
    with torch.no_grad(), rng_preserved():
        copied(*cloned(tuple(example_inputs)))
    # a fake-quant this run never reached (a branch not taken) stays unsized: torch resizes it on its first call,
    # which works in this process and not after torch.load
    return seen


def convert(prepared: nn.Module, backend: str = "x86") -> nn.Module:
    """Convert a QAT-prepared model (after training) into an int8 model, in eval mode."""
    from torch.ao.quantization.quantize_fx import convert_fx

    _check_options("static", backend)
    with quiet_quantization_notices(), quantized_engine(backend):
        return convert_fx(prepared.eval())


def _without_default_tail(gm: fx.GraphModule, values: Sequence[Any]) -> tuple[Any, ...]:
    """The graph's inputs without the trailing ones that are no tensors and have a default (timm's ViT traces
    ``attn_mask=None, is_causal=False`` as inputs): calibration and evaluation data hold the model's tensors only,
    and "example input of type NoneType cannot be described by a spec" stopped every timm ViT (QA)."""
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    kept = list(values)
    while kept and len(kept) <= len(placeholders):
        node = placeholders[len(kept) - 1]
        if isinstance(kept[-1], torch.Tensor) or not node.args:  # node.args holds the default, where there is one
            break
        kept.pop()
    return tuple(kept)


def _plan(captured: Captured, mode: str, backend: str) -> _Plan:
    if captured.dialect != ATEN:
        inputs = _without_default_tail(captured.graph_module, captured.flat_inputs())
        source, prepared = _ready_for_int8(captured.graph_module, mode)
        return _Plan(source, mode, backend, inputs, eager=False, prepared=prepared, reference=captured.graph_module)
    if mode != "dynamic" and captured.record.method == LOADED:
        # no leaf reaches a saved program's ops, and dynamic mode refuses it too (QA: the hint advised both)
        raise DialectError(
            f"{mode} quantization needs a torch-dialect graph (symbolic_trace), and this model is a saved "
            "torch.export program (ATen dialect), whose ops FX graph-mode quantization does not match",
            hint="quantize the model the program was exported from (its spec: file.py:factory, transformers:NAME...)",
        )
    if mode != "dynamic":
        # where symbolic_trace stopped with no submodule to keep whole: the model's own forward (or a function it
        # calls), which no --leaf reaches (QA: the hint named --leaf for `if x.shape[1] > 3:` in forward itself)
        stopped = next(
            (a for a in captured.record.attempts if a.strategy == "symbolic_trace" and a.location and not a.action),
            None,
        )
        leaf = said("--leaf NAME", "capture with leaf_modules=[NAME]")
        stopped_file = stopped.location.split(" ", 1)[0].rsplit(":", 1)[0] if stopped else ""
        package = installed_package(stopped_file) if stopped else None
        if package:  # QA (transformers' ConvNext): "rewrite .../site-packages/transformers/...py" is no advice
            owner = f"{package}'" if package.endswith("s") else f"{package}'s"
            fix = f"symbolic tracing stops in {owner} own code around the model's forward, which no --leaf reaches"
        elif stopped:
            fix = (
                f"rewrite {stopped.location.split(' ', 1)[0]} so that symbolic tracing passes it, or move it into a "
                f"submodule kept whole ({leaf}; it stays float)"
            )
        elif captured.record.trace_failure is None:
            # symbolic tracing was never tried (--method export): nothing is untraceable that a leaf would fix (QA)
            fix = f"capture with {option('--method', 'symbolic_trace')} (or auto)"
        else:
            fix = f"make the untraceable submodule a leaf ({leaf}) so symbolic tracing succeeds"
        where = f"; symbolic_trace stopped at {stopped.location}: {stopped.error}" if stopped else ""
        raise DialectError(
            f"{mode} quantization needs a torch-dialect graph (symbolic_trace); this model was captured "
            f"with torch.export (ATen dialect), whose ops FX graph-mode quantization does not match{where}",
            hint=f"{fix}, or quantize in dynamic mode (Linear/LSTM layers only, works on any model: "
            + said("quantize --mode dynamic, report --quantize dynamic)", "mode='dynamic')"),
        )
    if captured.record.method == LOADED and not any(
        isinstance(m, DYNAMIC_LAYER_TYPES) for m in captured.original.modules()
    ):
        # a program read from a file: its Linear layers are ATen ops, not modules to swap (QA: "quantized (0)",
        # then "Linear layers were swapped", then an internal error pickling the program with -o)
        raise DialectError(
            "dynamic int8 swaps a model's nn.Linear/LSTM modules for int8 ones, and this model is a saved "
            "torch.export program, whose layers are ATen ops, not modules",
            hint="quantize the model the program was exported from (its spec: file.py:factory, transformers:NAME...)",
        )
    return _Plan(captured.original, mode, backend, tuple(captured.example_inputs), eager=True)


def _int8_spellings(gm: fx.GraphModule) -> tuple[fx.GraphModule, int]:
    """``gm`` (a copy, where anything changes) with two ops spelled the way torch's backend configs know them:
    ``torch.relu(x)`` as ``F.relu(x)`` and ``x.flatten(...)`` as ``torch.flatten(x, ...)``, the same ops.

    Spelled otherwise they were left in float between a dequantize and a quantize: a ``torch.relu`` after a conv
    neither fused into an int8 ConvReLU nor ran on int8 values (lint's FX013 named both round trips in fxforge's
    own quantized demo)."""

    def respelled(node: fx.Node) -> bool:
        return (node.op == "call_function" and node.target is torch.relu) or (
            node.op == "call_method" and node.target == "flatten"
        )

    found = {n.name for n in gm.graph.nodes if respelled(n)}
    if not found:
        return gm, 0
    gm = copy.deepcopy(gm)
    for node in gm.graph.nodes:
        if node.name not in found:
            continue
        if node.op == "call_method":
            node.op, node.target = "call_function", torch.flatten
        else:
            node.target = F.relu
    gm.recompile()
    return gm, len(found)


def _ready_for_int8(graph_module: fx.GraphModule, mode: str) -> tuple[fx.GraphModule, dict[str, int]]:
    """The graph made ready for int8 by exact passes, on a copy, and how many rewrites each made; for
    static and dynamic int8, never for QAT (training runs dropout and updates batch norm statistics).

    * ``remove_dropout``, ``remove_identity``: ``prepare_fx`` gave an ``nn.Dropout`` or ``nn.Identity`` its own
      output observer: each became an int8 quantization point (quantize, requantize) and a fallback unit named
      after a module that computes nothing, which ``--sensitivity`` ranked and quantized like a layer (QA: timm's
      regnetx_002, whose blocks hold 99 of them).
    * first, :mod:`.fx_safety`'s rewrites (in-place results given readers, for QAT too; one copy of a layer per
      call), without which FX quantization changes what the model computes;
    * ``torch.relu`` and ``Tensor.flatten`` spelled as the backends know them (:func:`_int8_spellings`), so that
      they fuse or run in int8;
    * ``fold_bn``: ``prepare_fx`` fuses a conv with an ``nn.BatchNorm2d`` *module* only. timm's ``BatchNormAct2d``
      is traced into ``F.batch_norm``, which has no int8 kernel: every batch norm of regnetx_002 (44) stayed
      float between a dequantize and a quantize. Folded into the conv first, it is part of the int8 conv.
    """
    done: dict[str, int] = {}
    graph_module, given = in_place_results_used(graph_module, quantizes_activations=mode == "static")
    if given:
        done["in_place_results_used"] = given
    graph_module, respelled = _int8_spellings(graph_module)
    if respelled:
        done["int8_spellings"] = respelled
    if mode == "qat-prepare":
        fused = shared_layers_fusion_would_change(graph_module)
        if fused:  # QA: the prepared model ran a conv's batch norm at its other call too (116% off in eval)
            raise FxforgeError(
                f"QAT cannot prepare {', '.join(fused)}: called from more than one place, and FX fusion would join "
                "the batch norm or ReLU after one call to the layer itself, which then runs it at every call",
                hint="give each call its own layer (copies train apart, so that is a change to the model), or "
                "quantize post-training: static int8 gives each call its own copy of the layer",
            )
        return graph_module, done
    graph_module, unshared = calls_unshared(graph_module)
    if unshared:
        done["calls_unshared"] = len(unshared)
    for name in ("remove_dropout", "remove_identity", "fold_bn"):
        result = apply_pass(graph_module, name)
        if result.changed:
            graph_module = result.graph_module
            done[name] = len(result.log)  # one line per rewrite
    return graph_module, done


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


@rng_preserved()  # calibration runs the model: its random ops (dropout in training mode) draw from a fork
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
    random_batches: int | None = None,
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
        sensitivity: also quantize one fallback unit at a time (:func:`fallback_units`: in static mode every
            quantized layer and op, else the quantized layers) and rank the units by the error each causes.
        keep_float_until: a :func:`parse_target` target; keep the most sensitive units in float, one more
            at a time, until the target is met (implies ``sensitivity``). With every unit in float the
            model is the float model, so any target the float model meets is reachable.
        float_layers: units to keep in float from the start: layer (module) names, or the names
            :func:`fallback_units` gives ops (graph node names such as ``add_3``).
        random_batches: how many random batches stand in for data not given (or ``"random"``); default 8.
            Refused where no batch is drawn at that count (data given for every use, ``random:N``, or
            ``qat-prepare``), where it would be ignored.
        output_dir: write ``model.pt``, ``inputs.txt`` and ``report.json`` there (atomically); a non-empty
            directory is refused (without ``force``) before any work.

    Raises:
        InputSpecError: data ``mode`` does not read (any data for ``qat-prepare``; ``calibration`` together with
            ``eval_data`` for ``dynamic``), data that does not fit the model, or a model that is already quantized.
    """
    # a module without example inputs is captured on the first calibration batch: then that data is used
    captures_on_calibration = not isinstance(target, Captured) and example_inputs is None
    goal = check_arguments(
        mode,
        backend,
        calibration=None if captures_on_calibration else calibration,
        eval_data=eval_data,
        sensitivity=sensitivity,
        keep_float_until=keep_float_until,
        random_batches=random_batches,
        output_dir=output_dir,
        force=force,
    )
    random_batches = DEFAULT_RANDOM_BATCHES if random_batches is None else random_batches
    captured = _as_captured(target, example_inputs, calibration)
    require_real_weights(captured, "quantize")
    _refuse_quantized(captured)
    _refuse_off_cpu(captured, mode)
    keywords = [name for name, value in captured.example_kwargs.items() if isinstance(value, torch.Tensor)]
    if keywords:  # batches are fed by position; a keyword-only None was read as an input (QA: "NoneType ... spec")
        raise InputSpecError(
            f"quantize feeds the model its data batches by position, and this model takes {', '.join(keywords)} by "
            "keyword",
            hint="quantize a wrapper whose forward takes them by position and passes them on by keyword",
        )
    plan = _plan(captured, mode, backend)
    float_layers = as_names(float_layers)
    if plan.prepared.get("calls_unshared"):
        # a layer named to stay float stays float at every call, its copies too (QA: only the first call did)
        layers = [name for name, _ in quantizable_layers(plan.source, mode)]
        float_layers = [
            expanded
            for name in float_layers
            for expanded in [name, *(layer for layer in layers if re.fullmatch(re.escape(name) + r"_call\d+_*", layer))]
        ]
    float_units = _checked_float_units(plan, float_layers)
    # an int8 layer is a new module without the user's hooks (QA: a forward hook on fc, dropped, read as 91%
    # int8 error): a layer that runs hooks stays the float module it is
    hooked = [name for name, _ in quantizable_layers(plan.source, mode) if _runs_hooks(plan.source, name)]
    float_units += [u for u in _checked_float_units(plan, hooked) if u.name not in {f.name for f in float_units}]
    # an op that combines a tensor with a Python number computed in forward (`x.size(-1) ** -0.5`, `.item()`) or
    # computes on integer tensors fails FX quantization (QA); it stays float, with a note
    numbered, on_integers = _ops_fx_cannot_observe(plan) if mode == "static" else ([], [])
    on_float_inputs = _fixed_range_inputs(plan)[0] if mode == "static" else []
    float_units += [u for u in numbered + on_integers + on_float_inputs if u.name not in {f.name for f in float_units}]
    gated = _fixed_range_closure(plan, float_units)
    nothing_to_quantize = mode == "static" and not quantizable_layers(plan.source, mode)
    if nothing_to_quantize:
        # Without a conv or linear layer, static int8 would only quantize ops (tanh, mul, add...): quantize and
        # dequantize steps around float-sized work, slower and less accurate than float. Every unit in float is
        # the float model (see fallback_units), so that is what comes back, and the report says so.
        float_units += [unit for unit in _units(plan) if unit not in float_units]
    result_warnings: list[str] = []
    notes: list[str] = []
    if captured.record.random:
        # its agreement with itself is below 100% already (QA: "top-1 agreement 81%", put down to int8)
        result_warnings.append(
            "the model is random (two calls on one input differ): the accuracy measured here counts its own "
            "randomness as int8's error"
        )
    if backend == "qnnpack" and platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
        result_warnings.append(
            "qnnpack is ARM's int8 engine: on this x86 CPU torch's QNNPACK kernels gave far larger errors than the "
            "same int8 model on the x86 engine (QA, mobilenet_v2: 93% against 2.5% relative error), so the "
            "accuracy measured here may not be what an ARM device gets; judge it there"
        )
    if plan.prepared:
        removed = plan.prepared.get("remove_dropout", 0) + plan.prepared.get("remove_identity", 0)
        folded = plan.prepared.get("fold_bn", 0)
        returns = "returns its" if removed == 1 else "return their"
        done = [f"{counted(removed, 'call')} that {returns} input in eval mode (inactive dropout, Identity) "
                "taken out"] if removed else []  # fmt: skip
        done += [f"{counted(folded, 'batch norm')} folded into the layers before them"] if folded else []
        if done:
            notes.append(
                f"before quantizing, by exact passes: {' and '.join(done)}, so that none is left as a float op or "
                "an int8 quantization point of its own"
            )
        if plan.prepared.get("in_place_results_used"):
            notes.append(
                f"{counted(plan.prepared['in_place_results_used'], 'in-place op')} given the later readers of the "
                "tensor it writes, as FX quantization deletes an in-place op whose result is unused and, in int8, "
                "writes a float copy"
            )
        if plan.prepared.get("int8_spellings"):
            notes.append(
                f"{counted(plan.prepared['int8_spellings'], 'call')} of torch.relu or Tensor.flatten spelled F.relu or "
                "torch.flatten (the same ops), which FX quantization fuses or runs in int8 instead of dequantizing "
                "around them"
            )
        if plan.prepared.get("calls_unshared"):
            notes.append(
                f"{counted(plan.prepared['calls_unshared'], 'call')} of a layer called from more than one place given "
                "a copy of the layer each (same weights), as FX quantization fuses a layer with what follows one "
                "call of it and the fused layer would run at the others"
            )
    if on_float_inputs:
        notes.append(
            f"kept in float: {', '.join(u.name for u in on_float_inputs)} (a sigmoid, tanh or softmax whose input is "
            "not int8 -- a piece of a split, a model input, an op with no int8 kernel -- which FX quantization would "
            "clip to the op's output range)"
        )
    if gated:
        notes.append(
            f"kept in float: {', '.join(u.name for u in gated)} (a sigmoid, tanh or softmax whose input is computed "
            "in float, which FX quantization would clip to the op's output range)"
        )
    if on_integers:
        notes.append(
            f"kept in float: {', '.join(u.name for u in on_integers)} "
            f"{'computes' if len(on_integers) == 1 else 'compute'} on integer or bool tensors, whose values an "
            "int8 observer cannot measure"
        )
    if numbered:
        notes.append(
            f"kept in float: {', '.join(u.name for u in numbered)} "
            f"{'combines' if len(numbered) == 1 else 'combine'} a tensor with a Python number computed in forward "
            "(from a shape or .item()), which FX quantization cannot observe; a constant set in __init__ would let "
            "it be quantized"
        )
    if hooked:
        notes.append(
            f"kept in float: {', '.join(hooked)} {'runs' if len(hooked) == 1 else 'run'} hooks (a forward hook or "
            "pre-hook), which an int8 layer would not run"
        )

    calib = None
    if mode == "static":
        calib = load_calibration(calibration, plan.example_inputs, batches=random_batches, seed=seed)
    model = _quantize_once(
        plan, calib.batches if calib else [], float_units=float_units, source=calib.source if calib else ""
    )
    if plan.eager and _quantized_layers(model, plan.source, mode):  # (QA: said where none was, beside "(0): none")
        notes.append(
            "the model was captured with torch.export (ATen dialect), which FX graph mode cannot quantize: "
            "Linear/LSTM layers were swapped for dynamic int8 ones in the original module (eager mode)"
        )
    if mode == "qat-prepare":
        notes.append(
            "fake-quant model in training mode: train it, then fxforge.quantize's convert(model) makes it int8"
        )
        float_names = [unit.name for unit in float_units]
        result = QuantizeResult(
            model, mode, backend, plan.machinery, None, None, float_layers=float_names, units=plan.units
        )
        result.quantized_layers = _quantized_layers(model, plan.source, mode)
        result.notes = notes
        return _finish(result, captured, output_dir, force, spec)

    if mode == "dynamic":
        notes.append("dynamic quantization needs no calibration: activation ranges are measured on every batch")
    evaluation, label = _evaluation_data(plan, calib, calibration, eval_data, random_batches, seed)
    # a model left in float has no int8 ranges for random data to get wrong
    warning = None if nothing_to_quantize else _random_data_warning(calib, evaluation, label)
    if warning:
        result_warnings.append(warning)
        warnings.warn(warning, RandomCalibrationWarning, stacklevel=outside_stacklevel())

    reference = _float_outputs(plan, evaluation, "eval" if eval_data is not None else "calibration")
    with quantized_engine(backend):
        accuracy = compare_batches(reference, run_batches(model, evaluation.batches), label, evaluation.labels)
    label_warning = _label_problem(evaluation.labels, reference) if accuracy.classifier else None
    if label_warning:
        result_warnings.append(label_warning)
    if goal is not None and goal.metric != "rel_err" and not accuracy.classifier:
        raise FxforgeError(
            f"a top-1 target ({goal}) needs a classifier (first output: 2-D logits)", hint="use rel-err=X"
        )
    ranking: list[LayerSensitivity] = []
    if sensitivity or goal is not None:
        ranking, ranked_on = _sensitivity(plan, calib.batches if calib else [], reference, evaluation, label)
        if ranked_on < evaluation.samples:
            notes.append(
                f"units ranked on the first {ranked_on} of {evaluation.samples} evaluation samples (calibrated on "
                "as many); every other measurement uses them all"
            )
    target_met = None
    if goal is not None:
        model, accuracy = _keep_float_until(
            plan, calib, goal, ranking, float_units, model, accuracy, reference, evaluation
        )
        target_met = goal.met(accuracy)
        if not target_met:
            result_warnings.append(f"target {goal} not met even with every ranked layer and op in float")

    result = QuantizeResult(
        model=model,
        mode=mode,
        backend=backend,
        machinery=plan.machinery,
        calibration=calib.describe() if calib else None,
        accuracy=accuracy,
        sensitivity=ranking,
        quantized_layers=_quantized_layers(model, plan.source, mode),
        float_layers=[unit.name for unit in float_units],
        units=list(plan.units) if plan.units is not None else None,  # None: nothing needed them, not computed
        target=str(goal) if goal is not None else None,
        target_met=target_met,
        warnings=result_warnings,
        notes=notes,
        evaluation=evaluation.describe(),
    )
    lost = _hooks_lost(plan.source, model)
    if lost:
        result.warnings.append(
            f"the hooks of {', '.join(lost)} are not in the int8 model (quantization fuses a batch norm or activation "
            "into the layer before it): the accuracy measured counts their loss"
        )
    if nothing_to_quantize:
        result.warnings.append(
            f"nothing was quantized: the model has no {_layer_kinds(mode)}, and int8 ops alone would only add "
            "quantize/dequantize steps and error; the model is returned in float"
        )
    elif not result.quantized_layers:
        why = "every quantizable layer is kept in float" if float_units else f"the model has no {_layer_kinds(mode)}"
        floats = {unit.name for unit in float_units}
        int8_ops = [unit.name for unit in plan.units or [] if unit.name not in floats] if mode == "static" else []
        if int8_ops:  # the units that are not layers: ResNet's add, a mean... still computed in int8
            why += f"; these ops are still int8: {', '.join(int8_ops)} (--float-layer NAME keeps one in float)"
        result.warnings.append(f"no layer was quantized: {why}")
    return _finish(result, captured, output_dir, force, spec)


def _refuse_off_cpu(captured: Captured, mode: str) -> None:
    """int8 models run on CPU kernels only (fbgemm/oneDNN, QNNPACK): quantizing a GPU model would calibrate it
    there and hand back a model that cannot run where it came from. QAT preparation trains on any device."""
    device = device_of(captured.example_inputs, captured.original)
    if mode != "qat-prepare" and device.type != "cpu":
        raise FxforgeError(
            f"int8 models run on the CPU, and this model is on {device}",
            hint="quantize a CPU copy of it (model.cpu(), inputs too); --mode qat-prepare trains on any device",
        )


def _refuse_quantized(captured: Captured) -> None:
    """An int8, QAT-prepared or observed model cannot be quantized again: torch fails deep in its kernels
    (``aten::aminmax.out`` on quantized tensors). Judged by the graph's nodes, not by every submodule: a float
    model may hold modules from torch's quantized namespace that compute in float (``FloatFunctional``)."""
    gm = captured.graph_module
    kinds = {quant_kind(gm, node) for node in gm.graph.nodes}
    kinds.discard(None)
    if kinds:
        qat = bool(kinds & {"qat", "fake_quant"})
        raise InputSpecError(
            "this model is already quantized (its graph has "
            + ", ".join(kind.replace("_", "-") for kind in sorted(kinds))
            + " nodes)",
            hint="convert a QAT-prepared model with fxforge.quantize's convert(model)"
            if qat
            else "quantize the float model it was made from",
        )


def _finish(
    result: QuantizeResult, captured: Captured, output_dir: str | Path | None, force: bool, spec: str | None
) -> QuantizeResult:
    if output_dir is not None:
        write_output(result, captured, output_dir, force=force, spec=spec)
    return result


def _layer_kinds(mode: str) -> str:
    return "/".join(sorted({t.__name__ for t in _layer_types(mode)})) + " layer"


def _runs_hooks(source: nn.Module, name: str) -> bool:
    with contextlib.suppress(AttributeError):
        return runs_hooks(source.get_submodule(name))
    return False


def _hooks_lost(source: nn.Module, quantized: nn.Module) -> list[str]:
    """The modules of ``source`` whose hooks no module of ``quantized`` runs any more (a hooked batch norm fused
    into the conv before it)."""
    kept = {
        id(hook)
        for module in quantized.modules()
        for hook in [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]
    }
    return [
        name
        for name, module in source.named_modules()
        if runs_hooks(module)
        and not {id(h) for h in [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]} <= kept
    ]


def _ops_fx_cannot_observe(plan: _Plan) -> tuple[list[Unit], list[Unit]]:
    """The fallback units FX quantization fails on, found by running the graph once on the example inputs:
    those whose ops take, beside a tensor, a Python number the graph computes (``x.size(-1) ** -0.5``, ``.item()``)
    and those with an op that computes on integer tensors (``mask.sum(1).clamp(min=1)`` on an int64 mask: "histogram
    not implemented for 'Long'", QA). Neither has values an int8 observer can measure. Empty where the graph reads
    no shape or value and takes no integer input, or the example does not run."""
    if not isinstance(plan.source, fx.GraphModule):
        return [], []
    graph = plan.source.graph
    reads = any(n.op == "call_method" and n.target in ("size", "item", "dim", "numel") for n in graph.nodes) or any(
        n.op == "call_function" and n.target is getattr for n in graph.nodes
    )
    integer_inputs = any(isinstance(v, torch.Tensor) and not v.is_floating_point() for v in plan.example_inputs)
    if not (reads or integer_inputs):
        return [], []  # nothing to find (and no example run needed)
    numbers: set[str] = set()
    integers: set[str] = set()

    class _Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            value = super().run_node(n)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                numbers.add(n.name)
            elif isinstance(value, torch.Tensor) and not value.is_floating_point() and n.op != "placeholder":
                integers.add(n.name)
            elif n.op in ("call_function", "call_method") and any(
                isinstance(self.env.get(a), torch.Tensor) and not self.env[a].is_floating_point()
                for a in n.all_input_nodes
            ):
                integers.add(n.name)  # float out of an integer operand: `h * mask.unsqueeze(-1)` on an int mask
            return value

    try:
        with torch.no_grad(), preserved_state(plan.source):
            _Recorder(plan.source).run(*plan.example_inputs)
    except Exception:
        return [], []  # the quantization's own run says what fails
    combining = {
        node.name
        for node in graph.nodes
        if _is_arithmetic(node)
        and any(isinstance(a, fx.Node) and a.name in numbers for a in node.all_input_nodes)
        and any(isinstance(a, fx.Node) and a.name not in numbers for a in node.all_input_nodes)
    }
    if not (combining or integers):
        return [], []
    units = _units(plan)
    with_numbers = [unit for unit in units if combining & set(unit.nodes)]
    on_integers = [unit for unit in units if integers & set(unit.nodes) and unit not in with_numbers]
    return with_numbers, on_integers


# Ops whose int8 output has fixed quantization parameters (torch.ao's fixed-qparams ops).
_FIXED_RANGE_OPS = {"sigmoid", "tanh", "hardsigmoid", "softmax", "sigmoid_", "tanh_"}


def _op_name(plan: _Plan, node: fx.Node) -> str:
    """``sigmoid`` for ``x.sigmoid()``, ``torch.sigmoid(x)`` and an ``nn.Sigmoid`` layer alike."""
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_module":
        return type(submodule(plan.source, node)).__name__.lower()
    return getattr(node.target, "__name__", "")


# ops that give a view or a copy of their input's int8 values, sharing its scale: looked through to find the op that
# makes a sigmoid's input. torch's x86 config shares the scale for these *methods* and *functions* (torch.permute and
# torch.reshape are not among the functions: after them the sigmoid's input is clipped, QA); an op not listed is taken
# as float, the safe side. A ReLU fused into the conv or linear before it is in no unit's nodes: it passes on int8 too.
_INT8_PASS_THROUGH_METHODS = {
    "view",
    "reshape",
    "permute",
    "transpose",
    "squeeze",
    "unsqueeze",
    "contiguous",
    "detach",
    "repeat",
    "repeat_interleave",
    "squeeze_",
    "unsqueeze_",
    "relu",
    "relu_",
}
_INT8_PASS_THROUGH_FUNCTIONS = {"transpose", "squeeze", "unsqueeze", "narrow", "repeat_interleave", "relu", "relu6"}
_INT8_PASS_THROUGH_MODULES = {"relu", "relu6"}


def _fixed_range_inputs(plan: _Plan) -> tuple[list[Unit], dict[str, list[Unit]]]:
    """The units of a sigmoid, tanh, hardsigmoid or softmax, by where their input comes from: those whose input is
    never int8, and for the others the unit that makes their input.

    ``prepare_fx`` (torch 2.14.1) quantizes such an op's input with the op's fixed *output* range (scale 1/256 from
    0 for a sigmoid) wherever the op making that input is not int8: the input is clipped to [0, 1]. Never int8: a
    piece of a ``split``/``chunk`` or a slice (QA: ``b.sigmoid()`` after ``y.split(4, dim=1)`` off by 0.4), a model
    input (``x * torch.sigmoid(x)``: 11x the error), the output of an op with no int8 kernel (``F.gelu``, a
    subtraction of a number); those units stay float. The others are int8 only with their producer: measured with it
    by :func:`_sensitivity` (alone, timm's SE gates ranked most harmful), kept float with it
    (:func:`_fixed_range_closure`). The input is followed back through ops that pass int8 values on (views)."""
    if not isinstance(plan.source, fx.GraphModule) or plan.eager or plan.mode != "static":
        return [], {}
    if not any(_op_name(plan, node) in _FIXED_RANGE_OPS for node in plan.source.graph.nodes):
        return [], {}  # the units (a probe prepare_fx) are not looked for
    units = _units(plan)
    unit_of = {name: unit for unit in units for name in unit.nodes}
    never_int8: list[Unit] = []
    producers: dict[str, list[Unit]] = {}
    for node in plan.source.graph.nodes:
        unit = unit_of.get(node.name)
        if unit is None or _op_name(plan, node) not in _FIXED_RANGE_OPS or not node.args:
            continue
        source = node.args[0]
        while isinstance(source, fx.Node) and source.name not in unit_of and _passes_int8_on(plan, source):
            source = source.args[0] if source.args else None
        made_by = unit_of.get(source.name) if isinstance(source, fx.Node) else None
        if made_by is None:
            if unit not in never_int8:
                never_int8.append(unit)
        elif made_by is not unit and made_by not in producers.setdefault(unit.name, []):
            producers[unit.name].append(made_by)
    return never_int8, producers


def _passes_int8_on(plan: _Plan, node: fx.Node) -> bool:
    if node.op == "call_method":
        return str(node.target) in _INT8_PASS_THROUGH_METHODS
    if node.op == "call_module":
        return _op_name(plan, node) in _INT8_PASS_THROUGH_MODULES
    return node.op == "call_function" and _op_name(plan, node) in _INT8_PASS_THROUGH_FUNCTIONS


def _fixed_range_closure(plan: _Plan, float_units: list[Unit]) -> list[Unit]:
    """The units of fixed-range ops (sigmoid...) added to ``float_units`` (in place) because a unit making their
    input is in float: int8 with a float input, their input would be clipped to their output range."""
    added: list[Unit] = []
    if not float_units:  # nothing in float, nothing to add: the units are not even looked for
        return added
    floats = {unit.name for unit in float_units}
    by_name = {unit.name: unit for unit in _units(plan)}
    for name, producers in _fixed_range_inputs(plan)[1].items():
        if name not in floats and any(p.name in floats for p in producers):
            float_units.append(by_name[name])
            floats.add(name)
            added.append(by_name[name])
    return added


_ARITHMETIC = {"add", "sub", "mul", "div", "true_divide", "floor_divide", "pow", "truediv", "floordiv", "rsub"}


def _is_arithmetic(node: fx.Node) -> bool:
    """``x * n``, ``torch.add(x, n)``, ``x.mul(n)``...: an op that takes a number as an operand (not as a shape, as
    ``x.view(n, -1)`` does)."""
    if node.op == "call_method":
        return str(node.target) in _ARITHMETIC
    return node.op == "call_function" and getattr(node.target, "__name__", "") in _ARITHMETIC


def _checked_float_units(plan: _Plan, names: Sequence[str]) -> list[Unit]:
    """The units named by ``float_layers``. Static mode: the fallback unit of that name (a layer's unit also
    covers the ops that follow it on its scale, such as a max pooling), else the layer alone; other modes: the
    quantizable layer of that name."""
    if not names:
        return []
    layers = dict(quantizable_layers(plan.source, plan.mode))
    by_name = {unit.name: unit for unit in _units(plan)}
    units: list[Unit] = []
    for name in dict.fromkeys(names):
        if name in by_name:
            units.append(by_name[name])
        elif name in layers:
            units.append(_layer_unit(name, layers[name]))
        else:
            known = ", ".join(sorted(layers)) or "none"
            ops = "; ops: see the sensitivity ranking (--sensitivity)" if plan.mode == "static" else ""
            raise FxforgeError(f"no quantizable layer named {name!r}", hint=f"layers: {known}{ops}")
    return units


def _evaluation_data(
    plan: _Plan, calib: CalibrationData | None, calibration: Any, eval_data: Any, random_batches: int, seed: int
) -> tuple[CalibrationData, str]:
    """The batches float and int8 are compared on: ``eval_data``, else the calibration data (for dynamic
    quantization, which calibrates nothing, the ``calibration`` argument is only this)."""
    if eval_data is not None:
        data = load_calibration(eval_data, plan.example_inputs, batches=random_batches, seed=seed + 1000, kind="eval")
        return data, "eval data"
    if calib is not None:
        return calib, IN_SAMPLE
    data = load_calibration(calibration, plan.example_inputs, batches=random_batches, seed=seed)
    return data, "random inputs" if data.random else "the given data"


def _random_data_warning(calib: CalibrationData | None, evaluation: CalibrationData, label: str) -> str | None:
    if calib is not None and calib.random:
        if evaluation.random:
            return RANDOM_WARNING
        return (
            "calibrated on random inputs: the accuracy below is measured on the eval data, but calibrating "
            "on real data (--calib) usually gives a more accurate int8 model"
        )
    if evaluation.random:
        return RANDOM_EVAL_WARNING
    if label == IN_SAMPLE:
        return IN_SAMPLE_WARNING
    return None


def _keep_float_until(
    plan: _Plan,
    calib: CalibrationData | None,
    goal: Target,
    ranking: Sequence[LayerSensitivity],
    float_units: list[Unit],
    model: nn.Module,
    accuracy: AccuracyReport,
    reference: list[list[torch.Tensor]],
    evaluation: CalibrationData,
) -> tuple[nn.Module, AccuracyReport]:
    """Put the most sensitive units back in float, one more at a time, until ``goal`` is met.

    Greedy in ranking order: each step re-quantizes the model with one more float unit and measures
    it again (so interactions between units count), and stops at the first model that meets the goal:
    the one with the fewest float units on this path, so the most int8 and the fastest.
    ``float_units`` is extended in place with the units kept in float.
    """
    batches = calib.batches if calib else []
    by_name = {unit.name: unit for unit in _units(plan)}
    statistics: Statistics | None = None
    for entry in ranking:
        if goal.met(accuracy):
            break
        if any(unit.name == entry.layer for unit in float_units):
            continue
        float_units.append(by_name[entry.layer])
        _fixed_range_closure(plan, float_units)
        if statistics is None and plan.mode == "static" and not plan.eager:
            statistics = _calibrated_statistics(plan, batches)  # once, for every step (see there)
        model = _quantize_once(plan, batches, float_units=float_units, statistics=statistics)
        with quantized_engine(plan.backend):
            accuracy = compare_batches(
                reference, run_batches(model, evaluation.batches), accuracy.data, evaluation.labels
            )
    return model, accuracy


def _quantized_layers(model: nn.Module, source: nn.Module, mode: str) -> list[str]:
    names = []
    functional = {}  # a functional layer's name -> its weight's target
    for node in source.graph.nodes if isinstance(source, fx.GraphModule) else ():
        if (found := _functional_layer(node, mode)) is not None:
            functional[found[0]] = str(node.args[1].target if len(node.args) > 1 else node.kwargs["weight"].target)
    for name, _ in quantizable_layers(source, mode):
        if name in functional:
            # packed into an int8 op, the float weight is gone from the converted graph (QA: ghostnet's classifier
            # was quantized and left out of the list)
            if not _holds(model, functional[name]) or _weight_fake_quantized(model, functional[name]):
                names.append(name)
            continue
        try:
            sub = model.get_submodule(name)
        except AttributeError:
            continue
        if _is_quantized_module(sub) or hasattr(sub, "weight_fake_quant"):
            names.append(name)
    return names


def _weight_fake_quantized(model: nn.Module, target: str) -> bool:
    """Whether ``target`` (a functional layer's weight) feeds a fake-quant in a QAT-prepared graph: there the float
    weight stays, and ghostnet's fake-quantized classifier was left out of the list (QA)."""
    from torch.ao.quantization import FakeQuantizeBase

    if not isinstance(model, fx.GraphModule):
        return False
    return any(
        user.op == "call_module" and isinstance(model.get_submodule(str(user.target)), FakeQuantizeBase)
        for node in model.graph.nodes
        if node.op == "get_attr" and node.target == target
        for user in node.users
    )


def _holds(model: nn.Module, target: str) -> bool:
    try:
        get_attr_value(model, target)
    except AttributeError:
        return False
    return True


def _sensitivity(
    plan: _Plan,
    calibration: Sequence[tuple[Any, ...]],
    reference: list[list[torch.Tensor]],
    evaluation: CalibrationData,
    label: str,
) -> tuple[list[LayerSensitivity], int]:
    """Quantize each fallback unit alone (every other unit in float) and rank the units by the error they
    cause, largest first; and the number of evaluation samples the ranking used.

    One-at-a-time (rather than leave-one-out) isolates each unit's own error; ranked by mean abs
    error, which is continuous where top-1 agreement on a small set ties. Each unit is calibrated and evaluated
    on the first :data:`SENSITIVITY_SAMPLES` samples only: the ranking quantizes the model once per unit. A
    sigmoid, tanh or softmax is quantized with the unit making its input (:func:`_fixed_range_inputs`): alone,
    its input would be clipped to its output range, an error the int8 model does not have.
    """
    entries = []
    units = _units(plan)
    calibration = calibration[: leading_batches(calibration, SENSITIVITY_SAMPLES)]
    used = leading_batches(evaluation.batches, SENSITIVITY_SAMPLES)
    reference, batches = reference[:used], evaluation.batches[:used]
    labels = evaluation.labels[:used] if evaluation.labels else evaluation.labels
    statistics = _calibrated_statistics(plan, calibration) if plan.mode == "static" and not plan.eager else None
    never_int8, producers = _fixed_range_inputs(plan)
    with quantized_engine(plan.backend):
        for unit in units:
            if unit in never_int8:  # float in every configuration: alone, its clipped input would be ranked (QA)
                continue
            int8 = [unit, *producers.get(unit.name, ())]  # a sigmoid's input is int8 only when its producer is
            others = [other for other in units if other not in int8]
            model = _quantize_once(plan, calibration, float_units=others, statistics=statistics)
            report = compare_batches(reference, run_batches(model, batches), label, labels)
            entries.append(
                LayerSensitivity(
                    unit.name,
                    unit.type,
                    report.top1_agreement,
                    report.max_abs_err,
                    report.mean_abs_err,
                    report.rel_err,
                    report.top1_drop,
                    kind=unit.kind,
                    nodes=list(unit.nodes),
                )
            )
    entries.sort(key=lambda e: (-e.mean_abs_err, e.top1_agreement if e.top1_agreement is not None else 1.0))
    return entries, sum(batch_samples(batch) for batch in batches)


def int8_backend(
    captured: Captured,
    calibration: Any = None,
    *,
    mode: str | None = None,
    backend: str = "x86",
    keep_float_until: float | str | Target | None = None,
    eval_data: Any = None,
    notes: list[str] | None = None,
) -> nn.Module:
    """The int8 model ``fxforge.bench`` times in its "int8" row, in eval mode.

    ``mode`` ``None`` picks static int8 for torch-dialect graphs and dynamic int8 for models only
    ``torch.export`` could capture (static needs a symbolically traced graph). ``calibration`` as in
    :func:`quantize`; an ``int`` is read as a batch size and gives random calibration batches of that
    size (speed does not depend on the calibration data, accuracy does -- the bench does not measure
    accuracy, so the random-data warning is not raised). Run the model with
    ``torch.backends.quantized.engine`` set for ``backend`` (:func:`quantized_engine`; ``x86`` is
    torch's default on x86 machines). ``keep_float_until``: the sensitivity fallback of :func:`quantize`,
    judged on ``eval_data`` (default: the calibration data); which units stayed in float is added to ``notes``.

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
        result = quantize(captured, mode, backend, calibration, eval_data=eval_data, keep_float_until=keep_float_until)
    if keep_float_until is not None and notes is not None:
        kept = result.float_layers
        listed = ", ".join(kept[:6]) + (f" and {len(kept) - 6} more" if len(kept) > 6 else "")
        notes.append(
            f"fallback to {result.target}: {len(kept)} of {len(result.units)} units kept in float"
            + (f" ({listed})" if kept else "")
            + ("" if result.target_met else "; the target was not met")
        )
    if not result.quantized_layers and keep_float_until is not None and result.float_layers:
        # not "found no layer to quantize": the model has them, and the fallback kept every one in float
        missed = "" if result.target_met else ", and still missed it"
        raise FxforgeError(
            f"the fallback kept all {len(result.units)} units in float to reach {result.target}{missed}: no int8 "
            "layer is left",
            hint="int8 cannot meet this budget on this model; a looser budget may let some layers stay in int8",
        )
    if not result.quantized_layers:
        raise FxforgeError(
            f"{mode} int8 quantization found no layer to quantize in this model",
            hint="dynamic int8 quantizes Linear/LSTM/GRU only; static needs a torch-dialect graph (symbolic_trace)",
        )
    return result.model.eval()
