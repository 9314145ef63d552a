"""The one-call path every CLI command starts with: model spec -> loaded model -> example inputs ->
captured graph. Kept here so that the Python API does exactly what the CLI does."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from torch import nn

from fxforge.capture import Captured, capture
from fxforge.errors import InputSpecError
from fxforge.inputs import InputSpec, make_inputs, parse_input_spec
from fxforge.models import LoadedModel, load_model


def resolve_inputs(loaded: LoadedModel, inputs: Sequence[str | InputSpec] | None) -> list[InputSpec]:
    """The user's input specs, else the model's defaults; a clear error when neither exists."""
    if inputs:
        return [s if isinstance(s, InputSpec) else parse_input_spec(s) for s in inputs]
    if loaded.default_inputs:
        return list(loaded.default_inputs)
    raise InputSpecError(
        f"no example input shape is known for {loaded.spec}",
        hint="pass --input, e.g. --input 1x3x224x224 (repeat it for several inputs; add :int64 for token ids)",
    )


def prepare(
    model: str | nn.Module,
    inputs: Sequence[str | InputSpec] | None = None,
    *,
    seed: int = 0,
    device: str | None = None,
    model_kwargs: Mapping[str, Any] | None = None,
    leaf_modules: Iterable[str | type] = (),
    method: str = "auto",
    check: bool = True,
    check_batch: int | None = None,
) -> Captured:
    """Load ``model`` (a spec string or module), make seeded example inputs and capture it."""
    loaded = load_model(model, seed=seed, device=device, model_kwargs=model_kwargs)
    specs = resolve_inputs(loaded, inputs)
    example = make_inputs(specs, seed=seed, device=device or "cpu")
    try:
        return capture(
            loaded,
            example,
            method=method,
            leaf_modules=leaf_modules,
            check=check,
            check_batch=check_batch,
        )
    except InputSpecError as exc:
        if inputs and loaded.default_inputs and specs != loaded.default_inputs:
            # Better than a generic example: the shape this model is known to take.
            defaults = " ".join(f"--input {spec}" for spec in loaded.default_inputs)
            exc.hint = f"{loaded.spec} takes {defaults} by default (leave out --input to use it)"
        raise


def verify_specs(
    reference: str | nn.Module,
    candidate: str | nn.Module,
    inputs: Sequence[str | InputSpec] | None = None,
    *,
    seed: int = 0,
    seeds: int = 3,
    rtol: float | None = None,
    atol: float | None = None,
    model_kwargs: Mapping[str, Any] | None = None,
):
    """``fxforge verify A B``: load both specs, capture the reference, and compare on random inputs.

    The reference is captured so that a mismatch can be bisected to the first diverging node.
    """
    from fxforge.verify import verify

    ref_loaded = load_model(reference, seed=seed, model_kwargs=model_kwargs)
    cand_loaded = load_model(candidate, seed=seed)
    specs_source = ref_loaded if (inputs or ref_loaded.default_inputs) else cand_loaded
    specs = resolve_inputs(specs_source, inputs)
    example = make_inputs(specs, seed=seed)
    ref_captured = capture(ref_loaded, example, check=False)
    candidate_model: Any = cand_loaded.module
    return verify(ref_captured, candidate_model, input_specs=specs, seeds=range(seeds), rtol=rtol, atol=atol)
