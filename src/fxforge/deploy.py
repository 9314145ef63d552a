"""Deploy: write an ``optimize --auto`` candidate as the files a user ships, and read them back the way the user
will, so that what ``--auto`` times and verifies is the artifact itself, not an object in memory.

Each candidate (a bench backend name with its variants, ``compile+channels_last``) becomes a directory:

=================  =============================================  =========================================
candidate          files                                          loads with plain torch as
=================  =============================================  =========================================
eager              ``model.pt`` (the model, pickled)              ``torch.load('model.pt', weights_only=False)``
fx                 ``model.pt2`` (+ ``model.pt``, provenance)     ``torch.export.load('model.pt2').module()``
torchscript        ``model.torchscript.pt``                       ``torch.jit.load(...)`` (+ optimize_for_inference)
onnxruntime        ``model.onnx``; ``+streams`` (also of          ``onnxruntime.InferenceSession('model.onnx')``
                   ``ort_int8``): dynamic batch + ``recipe.json`` (one call; fxforge's loader: streams)
                   (streams, micro-batch)
compile            ``model.aoti.pt2`` (AOTInductor: compiled      ``torch._inductor.aoti_load_package(...)``
                   code and weights); without a working
                   compiler ``model.pt2`` + ``recipe.json``
int8               ``model.torchscript.pt`` (traced and frozen;   ``torch.jit.load('model.torchscript.pt')``
                   where the trace does not compute the same
                   bits: ``model.pt``, the quantized GraphModule  ``torch.load('model.pt', weights_only=False)``
                   pickled)
ort_int8           ``model.onnx`` (QDQ int8, by ONNX Runtime's    ``onnxruntime.InferenceSession('model.onnx')``
                   static quantization; dynamic batch)
bf16               ``model.pt2`` (bf16 inside, fp32 in and out)   ``torch.export.load('model.pt2').module()``
autocast           ``model.pt2`` + ``recipe.json``                under ``torch.autocast('cpu', torch.bfloat16)``
=================  =============================================  =========================================

``channels_last`` variants bake the layout change into the exported graph (:class:`ChannelsLastModule`), so the
artifact needs nothing at load time. :func:`fxforge.load_model` on the directory runs every one of them as
measured, applying ``recipe.json`` where there is one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from fxforge.artifacts import (
    AOTI_FILE,
    ARGUMENTS_KEY,
    BOUNDS_KEY,
    INPUTS_KEY,
    MODEL_FILE,
    ONNX_FILE,
    PROGRAM_FILE,
    RECIPE_FILE,
    TORCHSCRIPT_FILE,
    AotiModule,
    ChannelsLastModule,
    apply_recipe,
    argument_names,
    check_free_space,
    load_exported,
    load_program,
    program_imports,
    program_module,
    rebuilt_with_opaque_calls,
    save_graph_module,
    save_program,
    signature_imports,
    with_sources_on_path,
    write_inputs,
    write_user_sources,
)
from fxforge.bench import (
    Backend,
    BuildSettings,
    bfloat16_graph,
    inductor_config,
    int8_options,
    ort_streams,
    write_ort_int8,
)
from fxforge.capture import Captured
from fxforge.errors import FxforgeError, first_line, one_line_reason, says_data_dependent, user_location
from fxforge.export import export_model
from fxforge.graphs import ATEN, TORCH, index_bounds
from fxforge.inputs import specs_of
from fxforge.passes import apply_pass
from fxforge.quantize import int8_backend, picklable_quantized_modules, write_frozen
from fxforge.runtime import (
    export_program,
    export_program_any_batch,
    fx_wraps_kept_loadable,
    quiet_torch_logs,
    with_constant_kwargs,
)

# How each kind of artifact loads without fxforge (printed with the result and written into report.json).
PLAIN_TORCH_LOAD = {
    "eager": "torch.load('model.pt', weights_only=False)",
    "fx": "torch.export.load('model.pt2').module()",
    "torchscript": "torch.jit.load('model.torchscript.pt')",
    "torchscript+optimize": "torch.jit.optimize_for_inference(torch.jit.load('model.torchscript.pt'))",
    "onnxruntime": "onnxruntime.InferenceSession('model.onnx')  # the example's input shapes only",
    # one call on all threads: the streams (recipe.json) are fxforge's loader's, as torch.compile is compile's
    "onnxruntime+streams": "onnxruntime.InferenceSession('model.onnx')  # any batch size, as one call: "
    "fxforge.load_model runs it in streams (recipe.json), as timed",
    "ort_int8+streams": "onnxruntime.InferenceSession('model.onnx')  # int8 QDQ, any batch size, as one call: "
    "fxforge.load_model runs it in streams (recipe.json), as timed",
    # QA: called at another shape, the package returned a wrong-shaped result, or aborted the process
    "aoti": "torch._inductor.aoti_load_package('model.aoti.pt2')  # the example's input shapes only (inputs.txt): "
    "others are not checked, and give wrong results or abort",
    # the recipe's Inductor settings are filled in (compile_load_line): torch.compile applies them while compiling
    "compile": "torch.compile(torch.export.load('model.pt2').module(), options={options})",
    "int8": "torch.load('model.pt', weights_only=False)  # with torch.backends.quantized.engine = 'x86'",
    "ort_int8": "onnxruntime.InferenceSession('model.onnx')  # int8 QDQ, any batch size",
    "bf16": "torch.export.load('model.pt2').module()",
    "autocast": "torch.export.load('model.pt2').module()  # call it under torch.autocast('cpu', torch.bfloat16)",
}


@dataclass
class Artifact:
    """One candidate written to ``directory`` and loaded back: ``runner`` is what was read from the files."""

    candidate: str
    directory: Path
    runner: Any = None
    load: str = ""  # how plain torch loads it
    notes: list[str] = field(default_factory=list)
    write_s: float = 0.0  # writing (exporting, compiling) the files
    load_s: float = 0.0  # reading them back, first call included

    @property
    def files(self) -> list[str]:
        return sorted(p.name + ("/" if p.is_dir() else "") for p in self.directory.iterdir())


def write_artifact(backend: Backend, captured: Captured, directory: Path, settings: BuildSettings) -> Artifact:
    """Write ``backend``'s artifact for ``captured`` (its graph rewritten already) into ``directory`` and load it
    back as a user would; the returned artifact's ``runner`` is the reloaded model, run once.

    Raises :class:`FxforgeError` (one line) when the candidate cannot be written or read back.
    """
    directory.mkdir(parents=True, exist_ok=True)
    artifact = Artifact(backend.name, directory)
    variants = set(backend.selected)
    writer = _WRITERS.get(backend.base)
    if writer is None:
        raise FxforgeError(f"backend {backend.base!r} has no artifact fxforge can write (it is timed by bench only)")
    # out of space, torch's archive writer aborts the process: refuse first (the system's refusal, not the backend's)
    check_free_space(directory, captured.graph_module, copies=2)
    start = time.perf_counter()
    try:
        with quiet_torch_logs():
            writer(captured, directory, settings, variants, artifact)
            write_inputs(directory, captured.example_inputs)
    except FxforgeError:
        raise
    except Exception as exc:
        reason = one_line_reason(exc)
        if says_data_dependent(reason):
            # as the other candidates say it, with the user's line (QA: torch's own words, "Could not guard on
            # data-dependent expression Eq(u0, 1)", for compile alone)
            where = user_location(exc)
            reason = "data-dependent control flow" + (f" at {where}" if where else "")
        raise FxforgeError(f"writing the {backend.name} artifact failed: {reason}") from exc
    artifact.write_s = time.perf_counter() - start
    start = time.perf_counter()
    try:
        with quiet_torch_logs(), torch.no_grad():
            artifact.runner = reload_artifact(directory, settings.output_like, settings.threads)
            artifact.runner(*captured.example_inputs)  # the first call: loading lazily-built kernels
    except FxforgeError:
        raise
    except Exception as exc:
        raise FxforgeError(f"the written {backend.name} artifact does not load and run: {first_line(exc)}") from exc
    artifact.load_s = time.perf_counter() - start
    return artifact


def reload_artifact(directory: Path, output_like: Any = None, threads: int | None = None) -> nn.Module:
    """The model in an artifact directory, loaded the way :func:`fxforge.load_model` loads it (pickles too: the
    caller wrote them). ``output_like`` restores an ONNX model's output structure."""
    if (directory / AOTI_FILE).exists():
        module: nn.Module = AotiModule(directory / AOTI_FILE)
    elif (directory / TORCHSCRIPT_FILE).exists():
        module = load_exported(directory / TORCHSCRIPT_FILE, "torchscript")
    elif (directory / ONNX_FILE).exists():
        module = load_exported(directory / ONNX_FILE, "onnx", output_like=output_like, threads=threads)
    elif (directory / PROGRAM_FILE).exists():
        module = program_module(load_program(directory / PROGRAM_FILE))
    elif (directory / MODEL_FILE).exists():
        with fx_wraps_kept_loadable():
            module = torch.load(str(directory / MODEL_FILE), map_location="cpu", weights_only=False)
    else:
        raise FxforgeError(f"{directory} holds no model file")
    recipe = directory / RECIPE_FILE
    if recipe.exists():
        module = apply_recipe(module, json.loads(recipe.read_text()))
    # no .eval(): every artifact was written in inference mode, and an exported program's module refuses it
    return module


# --------------------------------------------------------------------------------------------------
# one writer per kind of candidate


def _source(captured: Captured, variants: set[str]) -> nn.Module:
    """The rewritten graph, with the --concrete values fixed (the ATen dialect's graph still takes them), in
    channels-last layout when asked (the conversion is then part of what is exported)."""
    module = with_constant_kwargs(captured.graph_module, captured.example_kwargs)
    return ChannelsLastModule(module).eval() if "channels_last" in variants else module


def program_load_line(kind: str, directory: Path) -> str:
    """The plain-torch load line of a ``model.pt2`` artifact, after the imports that register its output types
    (``import transformers.modeling_outputs``: torch.export.load refuses the file without it)."""
    return _after_imports(program_imports(directory / PROGRAM_FILE), PLAIN_TORCH_LOAD[kind])


def compile_load_line(recipe: dict[str, Any]) -> str:
    """The plain-torch line that compiles ``model.pt2`` as ``recipe`` says: its Inductor settings and its mode's
    as ``torch.compile``'s options (it takes one or the other), so that the line is code, not a description."""
    options = dict(recipe.get("inductor") or {})
    if recipe.get("mode"):
        from torch._inductor import list_mode_options  # Inductor is slow to import: only for this line

        options.update(list_mode_options(recipe["mode"]))
    return PLAIN_TORCH_LOAD["compile"].format(options=repr(options))


def _after_imports(imports: list[str], line: str) -> str:
    return f"import {', '.join(imports)}; {line}" if imports else line


def _write_eager(captured: Captured, directory: Path, settings: BuildSettings, variants: set[str], a: Artifact) -> None:
    a.load = write_model_itself(captured, directory)
    if (directory / MODEL_FILE).exists():
        a.notes.append("the model itself, pickled: loading it needs its code importable and --trust-pickle")


def write_model_itself(captured: Captured, directory: Path) -> str:
    """The model itself (eager), with its --concrete values as every other artifact holds them (the pickle ran
    without them), written into ``directory``; returns its plain-torch load line. A pickle (``model.pt``, with
    the user's source beside it), or, for a model loaded from a model.pt2 (torch's unlifted program module holds
    local functions that pickle refuses; QA: optimize DIR --auto -b fx crashed), the program it came from."""
    itself = with_constant_kwargs(captured.original, captured.example_kwargs)
    if _picklable(itself):
        try:
            with quiet_torch_logs():
                torch.save(itself, directory / MODEL_FILE)
        except (AttributeError, TypeError, pickle.PicklingError):
            # a hook or attribute pickle refuses: a lambda registered as a forward hook ended --auto in an internal
            # error after all its timing (QA); the program is written instead
            (directory / MODEL_FILE).unlink(missing_ok=True)
        else:
            write_user_sources(directory / MODEL_FILE, directory)
            return with_sources_on_path(PLAIN_TORCH_LOAD["eager"], directory)
    program = export_program_any_batch(itself, captured.example_inputs, {})
    save_program(program, directory / PROGRAM_FILE, itself)
    return program_load_line("fx", directory)


def _picklable(module: nn.Module) -> bool:
    """Whether ``torch.save`` can write the module: no submodule holds a local function as an attribute (what
    torch.export's unlifted module of a model.pt2 holds as ``train``/``eval``), which pickle refuses."""
    return not any(
        callable(value) and "<locals>" in getattr(value, "__qualname__", "")
        for submodule in module.modules()
        for value in vars(submodule).values()
    )


def _save_graph(captured: Captured, directory: Path, a: Artifact) -> None:
    """The captured graph saved as an optimize output is (model.pt2 and the rest), its --concrete values fixed."""
    save_graph_module(
        captured.graph_module,
        directory,
        captured.example_inputs,
        captured.dialect,
        captured.example_kwargs,
        notes=a.notes,
    )


def _write_fx(captured: Captured, directory: Path, settings: BuildSettings, variants: set[str], a: Artifact) -> None:
    if "onednn_linear" in variants:  # the call stays an op of torch's: model.pt2 loads with plain torch
        rewritten = apply_pass(captured.graph_module, "onednn_linear").graph_module
        captured = dataclasses.replace(captured, graph_module=rewritten)
    if "channels_last" in variants:
        source = _source(captured, variants)
        save_program(export_program_any_batch(source, captured.example_inputs, {}), directory / PROGRAM_FILE, source)
    else:
        _save_graph(captured, directory, a)
        if not (directory / PROGRAM_FILE).exists():
            raise FxforgeError("the rewritten graph does not export to model.pt2: " + "; ".join(a.notes))
    a.load = program_load_line("fx", directory)


def _write_torchscript(
    captured: Captured, directory: Path, settings: BuildSettings, variants: set[str], a: Artifact
) -> None:
    # TorchScript traces the torch-dialect graph; an ATen graph's unlifted module does not trace: trace the model,
    # with its --concrete values (it computed the defaults: every ATen torchscript candidate was rejected)
    source = captured.original if captured.dialect == ATEN else captured.graph_module
    source = with_constant_kwargs(source, captured.example_kwargs)
    if "channels_last" in variants:
        source = ChannelsLastModule(source).eval()
    onednn = "onednn" in variants
    result = export_model(
        source,
        "torchscript",
        directory / TORCHSCRIPT_FILE,
        example_inputs=captured.example_inputs,
        verify_export=False,
        onednn_fusion=onednn,
    )
    a.notes.extend(result.notes)
    optimized = any("optimize_for_inference" in note for note in result.notes) and not onednn
    a.load = PLAIN_TORCH_LOAD["torchscript+optimize" if optimized else "torchscript"]
    if onednn:
        a.load += "  # with torch.jit.enable_onednn_fusion(True)"


def _write_onnx(captured: Captured, directory: Path, settings: BuildSettings, variants: set[str], a: Artifact) -> None:
    """model.onnx; with the ``streams`` variant exported with a dynamic batch, and ``recipe.json`` saying how many
    streams and which micro-batch size (timed here) fxforge's loader runs it with."""
    streams = "streams" in variants
    result = export_model(captured, "onnx", directory / ONNX_FILE, verify_export=False, dynamic_batch=streams)
    a.notes.append(f"{result.exporter} exporter, opset {result.opset}{', dynamic batch' if streams else ''}")
    a.load = PLAIN_TORCH_LOAD["onnxruntime"]
    if streams:
        _write_streams_recipe(captured, directory, settings, a)


def _write_streams_recipe(
    captured: Captured, directory: Path, settings: BuildSettings, a: Artifact, kind: str = "onnxruntime"
) -> None:
    """recipe.json for the model.onnx in ``directory`` (dynamic batch): the streams and the micro-batch size timed
    fastest here, which fxforge's loader applies."""
    _, recipe, notes = ort_streams(directory / ONNX_FILE, captured, settings.threads, settings.output_like)
    (directory / RECIPE_FILE).write_text(json.dumps(recipe, indent=1))
    a.notes.extend([*notes, "model.onnx + recipe.json: fxforge's loader runs it in streams as timed"])
    a.load = PLAIN_TORCH_LOAD[f"{kind}+streams"]


def _write_compiled(
    captured: Captured, directory: Path, settings: BuildSettings, variants: set[str], a: Artifact
) -> None:
    """AOTInductor: the compiled code and weights in one package, which loads and runs at the measured speed
    without compiling again. Where AOTInductor fails (no C++ compiler, an op it cannot compile ahead of time),
    or with the ``recipe`` variant, ``model.pt2`` and a recipe that fxforge's loader compiles at load time:
    torch.compile's code can be faster than AOTInductor's for the same program (BERT-base, batch 1, 2 threads:
    70.6 ms against 81.9 ms: with freezing it runs fp32 Linear as MKL's packed GEMM, whose packed weights a package
    cannot hold, so the package uses oneDNN's linear), so --auto times both and keeps the faster."""
    config = inductor_config(sorted(variants - {"recipe"}))
    if "max_autotune" in variants:
        config["max_autotune"] = True
    source = _source(captured, variants)
    program = export_program(source, captured.example_inputs, {}, dynamic_batch=False)
    if "recipe" in variants:
        a.notes.append("model.pt2 + recipe.json: fxforge's loader compiles it when loaded (the recipe variant)")
    else:
        names = argument_names(captured.graph_module, len(captured.example_inputs))
        tensors = [t for t in captured.example_inputs if isinstance(t, torch.Tensor)]
        specs = [spec.text(with_range=True) for spec in specs_of(tensors)]
        positions = len(pytree.tree_leaves(captured.example_inputs))
        bounds = {i: rows for i, rows in index_bounds(captured.graph_module).items() if i < positions}
        _write_aoti(program, directory, config, a, names, specs, bounds)
        if a.load:
            return
    save_program(program, directory / PROGRAM_FILE, source)
    recipe = {"run": "compile", "inductor": config}
    if "max_autotune" in variants:
        recipe["mode"] = "max-autotune-no-cudagraphs"
    (directory / RECIPE_FILE).write_text(json.dumps(recipe, indent=1))
    a.load = _after_imports(program_imports(directory / PROGRAM_FILE), compile_load_line(recipe))


def _write_aoti(
    program: Any,
    directory: Path,
    config: dict[str, Any],
    a: Artifact,
    input_names: list[str] | None,
    input_specs: list[str],
    bounds: dict[int, int],
) -> None:
    """An AOTInductor package of ``program`` (sets ``a.load``), or a note saying why not (``a.load`` unset). The
    package records ``input_names`` (:data:`~fxforge.artifacts.ARGUMENTS_KEY`) and ``input_specs``
    (:data:`~fxforge.artifacts.INPUTS_KEY`): fxforge's loader takes inputs by name, and refuses other shapes."""
    metadata = {INPUTS_KEY: "\n".join(input_specs), BOUNDS_KEY: json.dumps(bounds)}
    if input_names:
        metadata[ARGUMENTS_KEY] = json.dumps(input_names)
    config = {**config, "aot_inductor.metadata": metadata}
    try:
        torch._inductor.aoti_compile_and_package(
            program, package_path=str(directory / AOTI_FILE), inductor_configs=config
        )
        # its call signature names the output's type: plain torch reads it once that type's module is imported
        signature = [pytree.treespec_dumps(spec) for spec in (program.call_spec.in_spec, program.call_spec.out_spec)]
        a.load = _after_imports(signature_imports(signature), PLAIN_TORCH_LOAD["aoti"])
        a.notes.append("AOTInductor package: compiled for this CPU and the example's input shapes (runs those only)")
    except Exception as exc:  # the recipe still delivers the speed, compiling when loaded
        (directory / AOTI_FILE).unlink(missing_ok=True)
        a.notes.append(f"AOTInductor failed ({one_line_reason(exc, 160)}): fxforge's loader compiles at load time")


def _write_int8(captured: Captured, directory: Path, settings: BuildSettings, variants: set[str], a: Artifact) -> None:
    model = int8_backend(captured, settings.calibration, **int8_options(settings, variants, a.notes))
    written, how = write_frozen(model, directory / TORCHSCRIPT_FILE, captured.example_inputs, captured.example_kwargs)
    if written:  # faster (no Python between the int8 kernels), and loaded without unpickling
        a.load = PLAIN_TORCH_LOAD["torchscript"]
        a.notes.append(how)
        return
    a.notes.append(f"the int8 GraphModule is saved as it is: {how}")
    # a graph calling a function capture kept whole names fxforge's rebuild tracer, as quantize's model.pt does:
    # torch's own would trace into the function while loading (QA: int8 with --wrap never built)
    rebuilt = rebuilt_with_opaque_calls(model) if isinstance(model, fx.GraphModule) else contextlib.nullcontext()
    with picklable_quantized_modules(model), rebuilt:
        torch.save(model, directory / MODEL_FILE)
    write_user_sources(directory / MODEL_FILE, directory)
    a.load = with_sources_on_path(PLAIN_TORCH_LOAD["int8"], directory)
    a.notes.append("a pickled quantized GraphModule: loading it needs --trust-pickle")


def _write_ort_int8(
    captured: Captured, directory: Path, settings: BuildSettings, variants: set[str], a: Artifact
) -> None:
    a.notes.extend(write_ort_int8(captured, directory / ONNX_FILE, settings.calibration))
    a.load = PLAIN_TORCH_LOAD["ort_int8"]
    if "streams" in variants:
        _write_streams_recipe(captured, directory, settings, a, "ort_int8")


def _write_bf16(captured: Captured, directory: Path, settings: BuildSettings, variants: set[str], a: Artifact) -> None:
    model = bfloat16_graph(captured.graph_module, captured.example_inputs, settings.output_like)
    save_graph_module(model, directory, captured.example_inputs, TORCH, notes=a.notes)
    a.load = program_load_line("bf16", directory)


def _write_autocast(
    captured: Captured, directory: Path, settings: BuildSettings, variants: set[str], a: Artifact
) -> None:
    _save_graph(captured, directory, a)
    (directory / RECIPE_FILE).write_text(json.dumps({"run": "autocast", "dtype": "bfloat16"}))
    a.load = program_load_line("autocast", directory)


_WRITERS = {
    "eager": _write_eager,
    "fx": _write_fx,
    "torchscript": _write_torchscript,
    "onnxruntime": _write_onnx,
    "compile": _write_compiled,
    "int8": _write_int8,
    "ort_int8": _write_ort_int8,
    "bf16": _write_bf16,
    "autocast": _write_autocast,
}


def deployable(backend: Backend) -> bool:
    """Whether fxforge can write ``backend``'s artifact (the others are timed by ``bench`` only)."""
    return backend.base in _WRITERS


def register_writer(base: str, writer: Any) -> None:
    """Teach :func:`write_artifact` a new kind of candidate (``writer(captured, directory, settings, variants,
    artifact)`` writes the files and sets ``artifact.load``)."""
    _WRITERS[base] = writer


__all__ = ["PLAIN_TORCH_LOAD", "Artifact", "deployable", "register_writer", "reload_artifact", "write_artifact"]
