"""The one-call path every CLI command starts with: model spec -> loaded model -> example inputs ->
captured graph. Kept here so that the Python API does exactly what the CLI does."""

from __future__ import annotations

import contextlib
import inspect as pyinspect
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fxforge.artifacts import PLAN_FILE, REPORT_FILE, OnnxRuntimeModule, StructuredOutputs, read_inputs
from fxforge.capture import Captured, capture, model_args_text, refuse_compiled_forms
from fxforge.errors import CaptureError, FxforgeError, InputSpecError, option, said
from fxforge.graphs import ATEN
from fxforge.inputs import InputSpec, make_inputs, parse_input_spec
from fxforge.models import LoadedModel, load_model
from fxforge.references import import_function
from fxforge.runtime import run_reference, unprovided_defaults, with_constant_kwargs
from fxforge.split import load_stages_in_order
from fxforge.verify import DEFAULT_CASES, VerifyResult, verify


def resolve_inputs(loaded: LoadedModel, inputs: str | InputSpec | Sequence[str | InputSpec] | None) -> list[InputSpec]:
    """The user's input specs (one, or one per input), else the model's defaults; a clear error when neither exists."""
    if isinstance(inputs, (str, InputSpec)):
        inputs = [inputs]  # one spec, not a sequence of characters
    if inputs:
        for spec in inputs:
            if not isinstance(spec, (str, InputSpec)):  # a tensor reached parse_input_spec's regex: a TypeError
                raise InputSpecError(
                    f"inputs are shape specs such as '1x3x224x224' (got a value of type {type(spec).__name__})",
                    hint="pass example tensors to fxforge.prepare(model, (x,)) or fxforge.capture(model, (x,))",
                )
        return [s if isinstance(s, InputSpec) else parse_input_spec(s) for s in inputs]
    if loaded.default_inputs:
        return list(loaded.default_inputs)
    if loaded.default_inputs_error is not None:
        raise loaded.default_inputs_error
    raise InputSpecError(
        f"no example input shape is known for {loaded.spec}",
        hint=said(
            "pass --input, e.g. --input 1x3x224x224 (repeat it for several inputs; add :int64 for token ids)",
            "pass inputs, e.g. fxforge.prepare(model, '1x3x224x224') (a list for several inputs; '1x16:int64' for "
            "token ids)",
        ),
    )


def example_inputs_for(
    loaded: LoadedModel, inputs: str | Sequence[str | InputSpec] | None, *, seed: int = 0, device: str | None = None
) -> tuple[Any, ...]:
    """Seeded example inputs for ``loaded``: the given specs, else the model's defaults."""
    return make_inputs(resolve_inputs(loaded, inputs), seed=seed, device=device or "cpu")


def prepare(
    model: str | nn.Module,
    inputs: str | torch.Tensor | Sequence[str | InputSpec | torch.Tensor] | None = None,
    *,
    seed: int = 0,
    device: str | None = None,
    model_kwargs: Mapping[str, Any] | None = None,
    leaf_modules: Iterable[str | type] = (),
    method: str = "auto",
    check: bool = True,
    check_batch: int | None = None,
    trust_pickle: bool | None = None,
    wrap: Iterable[str | Callable[..., Any]] = (),
    concrete_args: Mapping[str, Any] | None = None,
) -> Captured:
    """Load ``model`` (a spec string or module), make seeded example inputs and capture it.

    ``inputs``: shape specs (``"1x3x224x224"``, one or a list), or example tensors, used as they are.

    ``trust_pickle``: allow loading a pickled module (a ``.pt`` file), which runs code from the file; default:
    the ``FXFORGE_TRUST_PICKLE`` environment variable. A module passed in is captured as it is (its training
    mode included) and never changed. ``wrap``: functions to keep as one opaque call (callables, or
    ``module.function`` / ``file.py:function`` strings); ``concrete_args``: ``forward`` arguments fixed to a value
    (see :func:`fxforge.capture.capture`).
    """
    if check_batch is not None and check_batch < 1:
        hint = f"e.g. {option('--check-batch', 2)}"
        raise InputSpecError(f"{option('--check-batch')} must be at least 1, got {check_batch}", hint=hint)
    loaded = load_model(model, seed=seed, device=device, model_kwargs=model_kwargs, trust_pickle=trust_pickle)
    # before asking for input shapes: a TorchScript file without them was told to pass --input, then refused (QA)
    refuse_compiled_forms(loaded.module, loaded.pickle_passed_over)
    if concrete_args:  # a misspelt name would otherwise read as "the model rejected the example inputs"
        _refuse_unknown_arguments(loaded.module, concrete_args, loaded.spec)
    tensors = _example_tensors(inputs)
    if tensors is not None:
        example: tuple[Any, ...] = tensors  # the caller's own tensors (capture copies them before any run)
        specs: list[InputSpec] = []
    else:
        specs = resolve_inputs(loaded, inputs)  # type: ignore[arg-type]
        example = make_inputs(specs, seed=seed, device=device or "cpu")
    if concrete_args:
        _refuse_arguments_the_inputs_fill(loaded.module, concrete_args, len(example), loaded.spec)
    functions = _wrapped_functions(wrap)
    try:
        captured = capture(
            loaded,
            example,
            method=method,
            leaf_modules=leaf_modules,
            autowrap_functions=functions,
            concrete_args=dict(concrete_args) if concrete_args else None,
            check=check,
            check_batch=check_batch,
        )
        captured.record.model_args = model_args_text(model_kwargs)
        return captured
    except InputSpecError as exc:
        if inputs and loaded.default_inputs and specs != loaded.default_inputs and _runs_on(loaded, seed, device):
            # Better than a generic example: the shape this model is known to take.
            defaults = said(
                " ".join(f"--input {spec}" for spec in loaded.default_inputs),
                f"inputs={[str(spec) for spec in loaded.default_inputs]!r}",
            )
            leave_out = option("--input", python="inputs")
            exc.hint = f"{loaded.spec} takes {defaults} by default (leave out {leave_out} to use it)"
        raise


def _runs_on(loaded: LoadedModel, seed: int, device: str | None) -> bool:
    """Whether the model runs on its own default inputs: only then are they worth suggesting (QA: the hint named
    defaults that failed the same way)."""
    try:
        with torch.no_grad():
            run_reference(loaded.module, make_inputs(loaded.default_inputs, seed=seed, device=device or "cpu"), {})
    except Exception:
        return False
    return True


def _example_tensors(inputs: Any) -> tuple[torch.Tensor, ...] | None:
    """``prepare``'s inputs as example tensors, or None where they are shape specs (or not given); anything else is
    one error naming what was passed (QA: a numpy array, an int or a dict gave Python's own errors)."""
    if inputs is None or isinstance(inputs, (str, InputSpec)):
        return None
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    hint = said(
        "pass --input specs",
        "for other positional values, or keyword inputs, use fxforge.capture(model, (x, 3), example_kwargs={...})",
    )
    if isinstance(inputs, Mapping) or not isinstance(inputs, Sequence):
        raise InputSpecError(
            "inputs are shape specs ('1x3x224x224', or a list of them) or example tensors (a tensor, or a tuple of "
            f"them), got a value of type {type(inputs).__name__}",
            hint=hint,
        )
    kinds = {isinstance(value, torch.Tensor) for value in inputs}
    if kinds == {True}:
        return tuple(inputs)
    if kinds == {True, False}:
        others = sorted({type(value).__name__ for value in inputs if not isinstance(value, torch.Tensor)})
        raise InputSpecError(
            f"inputs mix example tensors with {', '.join(others)} values: give all as tensors, or all as shape specs",
            hint=hint,
        )
    return None


def _is_split_directory(spec: Any) -> bool:
    if not isinstance(spec, (str, Path)):
        return False
    try:
        return (Path(spec) / PLAN_FILE).is_file()
    except OSError:  # a name longer than the file system takes (its own one-line error comes from load_model)
        return False


def verify_specs(
    reference: str | nn.Module,
    candidate: str | nn.Module,
    inputs: str | Sequence[str | InputSpec] | None = None,
    *,
    seed: int = 0,
    cases: int = DEFAULT_CASES,
    seeds: int | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    model_kwargs: Mapping[str, Any] | None = None,
    trust_pickle: bool | None = None,
    allow_dtype_change: bool = False,
    leaf_modules: Iterable[str | type] = (),
    wrap: Iterable[str | Callable[..., Any]] = (),
    concrete_args: Mapping[str, Any] | None = None,
) -> VerifyResult:
    """``fxforge verify A B``: load both specs and compare them on at least ``cases`` varied inputs.

    The reference is captured when it can be (with ``leaf_modules`` and ``wrap`` as in :func:`prepare`), so that
    a mismatch can be bisected to the first diverging node; a reference that cannot be captured is still
    compared, without bisection. ``seeds`` (older API) raises the case count to at least that many.
    ``concrete_args``: ``forward`` arguments fixed to a value, as ``--concrete`` fixed them when the candidate was
    written: the reference is called with them, and so is a candidate whose ``forward`` names them (a file written
    with them has them built in).
    """
    if cases < 1 or (seeds is not None and seeds < 1):
        raise InputSpecError("verify needs at least one case", hint=f"e.g. {option('--cases', 16)}")
    ref_loaded = load_model(reference, seed=seed, model_kwargs=model_kwargs, trust_pickle=trust_pickle)
    # both sides built from code get the arguments (a saved candidate is as it was written, and ignores them)
    if _is_split_directory(candidate):
        # a split directory: what runs is its stages, not the unsplit model.pt2 kept beside them (which a verdict
        # on the directory used to be about, and without which it was "holds no model: is it an fxforge output?")
        stages, label = load_stages_in_order(candidate, trust_pickle=trust_pickle)
        cand_loaded = LoadedModel(stages, str(candidate), read_inputs(Path(candidate)) or [], file=label)
    else:
        cand_loaded = load_model(candidate, seed=seed, model_kwargs=model_kwargs, trust_pickle=trust_pickle)
    unfixed_reference = ref_loaded.module
    if concrete_args:
        fixed = dict(concrete_args)
        _refuse_unknown_arguments(ref_loaded.module, fixed, ref_loaded.spec)
        ref_loaded.module = with_constant_kwargs(ref_loaded.module, fixed)
        if set(fixed) <= set(_forward_parameters(cand_loaded.module)):
            cand_loaded.module = with_constant_kwargs(cand_loaded.module, fixed)
    # The shapes a written file records first, the candidate's, else the reference's: a saved program or an output
    # directory records what it was built (and possibly specialised) for; then the defaults of a spec. (QA: verify
    # FILE MODEL drew the torchvision spec's 224x224 default for a file exported at 64x64.)
    if inputs or _records_its_inputs(cand_loaded):
        specs_source = cand_loaded
    elif _records_its_inputs(ref_loaded):
        specs_source = ref_loaded
    else:
        specs_source = cand_loaded if cand_loaded.default_inputs else ref_loaded
    specs = resolve_inputs(specs_source, inputs)
    example = make_inputs(specs, seed=seed)
    if concrete_args:
        _refuse_arguments_the_inputs_fill(unfixed_reference, concrete_args, len(example), ref_loaded.spec)
    if specs_source is ref_loaded and not inputs and _records_its_inputs(ref_loaded):
        # a candidate that cannot take the shapes the reference file records is no mismatch but a question of
        # inputs, said as the other order says it (QA: verify FILE SPEC read MISMATCH, verify SPEC FILE this)
        try:
            run_reference(cand_loaded.module, example, {})
        except InputSpecError as exc:
            raise _drawn_as_recorded(exc, ref_loaded, specs) from None
    # an ONNX candidate gets the model's output structure from verify's own reference outputs; an ONNX reference
    # needs one call of the candidate for it
    _give_onnx_the_structure_of(ref_loaded.module, cand_loaded.module, example)
    ref: Any = ref_loaded.module
    functions = _wrapped_functions(wrap)
    with contextlib.suppress(CaptureError):  # compared all the same; only the bisection to a node needs the graph
        # the bound reference traces as forward(*args), which symbolic_trace cannot unpack; a split directory's
        # model.pt2 captures with its flat outputs, not the structure it is loaded with (QA: MISMATCH against itself)
        if not concrete_args and not isinstance(ref_loaded.module, StructuredOutputs):
            # an output written from an ATen graph (captured with --method export) is bisected against the model
            # captured the same way: a torch-dialect reference has no node of its names
            method = "export" if _written_from_aten(candidate) and not leaf_modules else "auto"
            ref = capture(
                ref_loaded, example, leaf_modules=leaf_modules, autowrap_functions=functions, check=False, method=method
            )
    # a saved program or ONNX file may be fixed to the example's batch size: verify then runs every case at that
    # batch (not half of them skipped), and the result says which batch was left out and why
    try:
        result = verify(
            ref,
            cand_loaded.module,
            input_specs=specs,
            cases=max(cases, seeds or 0),
            seed=seed,
            rtol=rtol,
            atol=atol,
            allow_dtype_change=allow_dtype_change,
            candidate_may_fix_batch=True,
        )
    except InputSpecError as exc:
        recorded = specs_source is cand_loaded or _records_its_inputs(specs_source)
        if inputs or not recorded or not exc.message.startswith("the model rejected"):
            raise
        # the inputs came from one side's recorded example: "the model rejected" alone blamed them on no one
        # (QA: a float64 reference given a float16 file's example read "Half and double should be the same")
        raise _drawn_as_recorded(exc, specs_source, specs) from None
    # an output directory holds several forms: the verdict is about one (verify OK while model.pt was damaged
    # read as if the whole directory were checked)
    result.files = {side: m.file for side, m in (("reference", ref_loaded), ("candidate", cand_loaded)) if m.file}
    if not result.ok and not result.unverifiable and isinstance(candidate, (str, Path)) and Path(candidate).exists():
        result.hint = _defaults_hint(ref_loaded.module, example, concrete_args or {})
        if any(": shape (" in problem for problem in result.problems) and isinstance(reference, str):
            # outputs of other shapes: another build of the model, not a forward default (QA: a BertModel file
            # exported with a small hidden size was hinted --concrete attention_mask)
            result.hint = (
                "the outputs' shapes differ: was the file written from the model built with other arguments? pass "
                + said("the same --model-arg values", "the same model_kwargs")
            )
    return result


def _drawn_as_recorded(exc: InputSpecError, source: LoadedModel, specs: Sequence[InputSpec]) -> InputSpecError:
    """``exc`` (a side rejected the verification inputs), saying they were drawn as ``source`` records them."""
    shown = ", ".join(str(spec) for spec in specs)
    return InputSpecError(
        f"{exc.message}; the inputs were drawn as {source.spec} records them ({shown})",
        hint=f"pass {option('--input', python='inputs')} with what both take, if they take the same",
    )


def _records_its_inputs(loaded: LoadedModel) -> bool:
    """Whether ``loaded`` came from a written file or directory that records its example inputs (not a spec's
    defaults)."""
    return loaded.written and bool(loaded.default_inputs)


def _defaults_hint(reference: Any, example: Sequence[Any], fixed: Mapping[str, Any]) -> str | None:
    """On a failure against a written file: the reference ran with its forward's defaults where the file may have
    been written with other values (QA: a .pt2 exported with --concrete scale=true gave a bare MISMATCH)."""
    defaults = unprovided_defaults(reference, example, fixed)
    if not defaults:
        return None
    shown = ", ".join(f"{name}={value!r}" for name, value in list(defaults.items())[:3])
    name = next(iter(defaults))
    again = said(f"--concrete {name}=VALUE", f"concrete_args={{{name!r}: value}}")
    return (
        f"the reference ran with its forward's defaults ({shown}); if the candidate was written with other values "
        f"({said('--concrete', 'concrete_args')}), pass the same here, e.g. {again}"
    )


def _written_from_aten(spec: Any) -> bool:
    """Whether ``spec`` is an output directory whose report says its graph was captured in the ATen dialect."""
    try:
        report = json.loads((Path(spec) / REPORT_FILE).read_text())
        return report.get("capture", {}).get("dialect") == ATEN
    except (OSError, ValueError, TypeError, AttributeError):
        return False


def _wrapped_functions(wrap: Iterable[str | Callable[..., Any]]) -> list[Callable[..., Any]]:
    """The functions to keep as one call; a name that imports nothing is the caller's mistake (exit 2), as an
    unknown leaf is, not a model that cannot be captured."""
    what = option("--wrap", python="wrap")
    return [f if callable(f) else import_function(f, what=what, error=FxforgeError) for f in wrap]


def _forward_parameters(module: Any) -> list[str]:
    """The names ``module``'s forward takes as keywords, in its signature's order (none for ``forward(*args)``, an
    ONNX or exported file)."""
    try:
        parameters = pyinspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError, AttributeError):
        return []
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _refuse_unknown_arguments(module: Any, fixed: Mapping[str, Any], spec: str) -> None:
    with contextlib.suppress(TypeError, ValueError, AttributeError):
        if any(p.kind == p.VAR_KEYWORD for p in pyinspect.signature(module.forward).parameters.values()):
            return  # forward(**kwargs) takes any name
    unknown = sorted(set(fixed) - set(_forward_parameters(module)))
    if unknown:
        raise InputSpecError(
            f"{said('--concrete ' + unknown[0], f'concrete_args {unknown[0]!r}')}: {spec}'s forward has no "
            f"argument {unknown[0]!r}",
            hint=f"its forward takes {', '.join(_forward_parameters(module)) or 'no named arguments'}",
        )


def _refuse_arguments_the_inputs_fill(module: Any, fixed: Mapping[str, Any], count: int, spec: str) -> None:
    """A fixed argument that an example input also fills by position (``--concrete x=1`` where x is the input) made
    the model raise "got multiple values for argument 'x'", reported as the model rejecting its inputs with a hint
    about --input shapes (QA): said as what it is, naming the argument."""
    try:
        parameters = list(pyinspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError, AttributeError):
        return
    positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    filled = positional[:count]
    taken = [name for name in filled if name in fixed]
    if not taken:
        return
    name = taken[0]
    free = [p.name for p in parameters if p.name not in filled and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    raise InputSpecError(
        f"{said('--concrete ' + name, f'concrete_args {name!r}')}: {spec}'s forward gets {name} from example input "
        f"{filled.index(name) + 1} of {count}, so it cannot also be fixed",
        hint=f"the example inputs fill {', '.join(filled)} by position; {said('--concrete', 'concrete_args')} fixes "
        f"the others ({', '.join(free) or 'this forward has none'})",
    )


def _give_onnx_the_structure_of(onnx_side: Any, other: nn.Module, example: Sequence[Any]) -> None:
    """An ONNX file returns a flat list of tensors where the model returned a structure (a transformers
    ``ModelOutput``, a dict, nested tuples): one call of the other side gives the structure to put them back
    into, so that the two compare leaf by leaf (a file whose outputs do not fill it stays flat, and differs).
    A file that records its own structure (fxforge's export) keeps it: lent the other side's, a file of
    ``{"a": ..., "b": ...}`` compared equal to a model returning the same tensors under swapped keys."""
    if not isinstance(onnx_side, OnnxRuntimeModule) or onnx_side.output_like is not None:
        return
    if onnx_side.output_structure is not None:
        return
    if isinstance(other, OnnxRuntimeModule):
        return
    try:
        with torch.no_grad():
            onnx_side.output_like = other(*example)
    except Exception:  # inputs the model rejects: verify runs it again and reports that in one line
        return
