"""Saving a quantized model: the output directory, and the work-arounds that let torch pickle FX-quantized and QAT
models and load them back with torch alone (checked bit for bit before the directory is put in place)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import pickle
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn

from fxforge.artifacts import (
    INPUTS_FILE,
    MODEL_FILE,
    REPORT_FILE,
    SOURCE_DIR,
    TORCHSCRIPT_FILE,
    atomic_directory,
    disk_full_said,
    rebuilt_with_opaque_calls,
    with_sources_on_path,
    write_inputs,
    write_report,
    write_user_sources,
)
from fxforge.capture import Captured
from fxforge.errors import FxforgeError, first_line, one_line_reason
from fxforge.quantize.accuracy import run_batches
from fxforge.quantize.engine import quantized_engine
from fxforge.quantize.result import QuantizeResult
from fxforge.quantize.scripted import write_frozen
from fxforge.runtime import fx_wraps_kept_loadable, quiet_quantization_notices
from fxforge.visual.report_page import REPORT_HTML, page_or_note, quantize_report_html
from fxforge.vocabulary import quant_kind


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

    output_dir = Path(output_dir)
    files = [MODEL_FILE, INPUTS_FILE, REPORT_FILE]
    inputs = tuple(captured.flat_inputs()) if isinstance(result.model, fx.GraphModule) else captured.example_inputs
    with atomic_directory(output_dir, force=force) as staging:
        # a graph calling a function capture kept whole names fxforge's rebuild tracer: torch's traced into it
        rebuilt = (
            rebuilt_with_opaque_calls(result.model)
            if isinstance(result.model, fx.GraphModule)
            else contextlib.nullcontext()
        )
        try:
            with picklable_quantized_modules(result.model), rebuilt, disk_full_said(staging):
                torch.save(result.model, staging / MODEL_FILE)
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            if "pickle" not in str(exc):
                raise
            # a layer kept float for its hook keeps a lambda hook, which pickle cannot save (QA: an internal error)
            raise FxforgeError(
                f"cannot save the int8 model: {one_line_reason(exc)}",
                hint="a forward hook that is a lambda or a nested function cannot be pickled: make it a module-level "
                "function, or keep the quantized model in memory (fxforge.quantize without output_dir)",
            ) from None
        if write_user_sources(staging / MODEL_FILE, staging):
            files.append(f"{SOURCE_DIR}/")
        # the documented torch.load alone failed where model.pt refers to the model's classes copied to source/
        # (QA: ModuleNotFoundError, and nothing said so)
        result.load = with_sources_on_path(f"torch.load({MODEL_FILE!r}, weights_only=False)", staging)
        _check_reload(result, staging / MODEL_FILE, inputs)
        if _write_torchscript(result, captured, staging):
            files.insert(1, TORCHSCRIPT_FILE)
        write_inputs(staging, captured.example_inputs)
        result.output_dir, result.files = output_dir, files
        page = page_or_note(quantize_report_html, result.notes, captured, result, spec)  # report.html, for people
        if page is not None:
            (staging / REPORT_HTML).write_text(page, encoding="utf-8")
            files.append(REPORT_HTML)
        report = {"model": spec, "capture": captured.record.to_dict(), **result.to_dict()}
        write_report(staging, report)
    return files


def _write_torchscript(result: QuantizeResult, captured: Captured, staging: Path) -> bool:
    """``model.torchscript.pt`` beside ``model.pt``: the int8 GraphModule traced and frozen, which runs faster (no
    Python between the int8 kernels) and loads with ``torch.jit.load``, no unpickling. Written only where
    :func:`~fxforge.quantize.scripted.frozen_torchscript` kept it and the saved file computes the same bits again;
    a note says why not otherwise. Not for a QAT-prepared model, which is trained further, nor for eager dynamic
    int8 (a trace would run the user's own ``forward``)."""
    if result.mode == "qat-prepare" or not isinstance(result.model, fx.GraphModule):
        return False
    with quantized_engine(result.backend):
        written, how = write_frozen(
            result.model, staging / TORCHSCRIPT_FILE, captured.example_inputs, captured.example_kwargs
        )
    # QA: a model with nothing to quantize comes back in float, and its TorchScript was called "the int8 model"
    int8 = computes_int8(result.model)
    model = "the int8 model" if int8 else "the float model (nothing was quantized)"
    if not written:
        result.notes.append(f"no {TORCHSCRIPT_FILE}: {how} (model.pt is {model})")
        return False
    result.notes.append(
        f"{TORCHSCRIPT_FILE}: {model} as {how}; torch.jit.load('{TORCHSCRIPT_FILE}') runs it without Python "
        f"between {'the int8' if int8 else 'its'} kernels, and without unpickling"
    )
    return True


def computes_int8(model: nn.Module) -> bool:
    """Whether ``model`` computes anything in int8: not where nothing was quantized (the float model came back)."""
    if not isinstance(model, fx.GraphModule):  # eager dynamic int8: the model's own layers swapped for int8 ones
        return True
    return any(quant_kind(model, node) in ("quantize", "int8") for node in model.graph.nodes)


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


def _reachable_modules(model: nn.Module) -> list[nn.Module]:
    """``model.modules()`` and the modules held as plain attributes (a MethodCall's owner and the float layers its
    shell keeps: prepare gave them qconfigs too, QA), each once: everything pickling ``model`` reaches."""
    found: dict[int, nn.Module] = {}
    stack = [model]
    while stack:
        module = stack.pop()
        if id(module) in found:
            continue
        found[id(module)] = module
        stack.extend(module.children())
        stack.extend(value for value in vars(module).values() if isinstance(value, nn.Module))
    return list(found.values())


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
        for module in _reachable_modules(model):
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
    with quiet_quantization_notices():
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
        with quiet_quantization_notices(), fx_wraps_kept_loadable():  # torch's _assert_is_none wrap (timm ViT)
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
