"""Example inputs: parsing ``--input`` specs such as ``1x3x224x224`` or ``2x16:int64`` and making the
random tensors a model is captured, inspected and verified with."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fxforge.errors import InputSpecError

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float64": torch.float64,
    "double": torch.float64,
    "int64": torch.int64,
    "long": torch.int64,
    "int32": torch.int32,
    "int": torch.int32,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}

# Integer inputs are drawn from [0, INT_HIGH): small enough to be valid indices for any embedding
# table or class count of 10 or more, which covers token ids for every model we know.
INT_HIGH = 10

# "scalar" is how str(InputSpec) writes a 0-d shape (e.g. in an output directory's inputs.txt).
_SPEC_RE = re.compile(r"^\s*(scalar|\d+(?:\s*[xX,]\s*\d+)*)?\s*(?::\s*([A-Za-z0-9_]+))?\s*$")


@dataclass(frozen=True)
class InputSpec:
    """Shape and dtype of one positional example input."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32

    def __str__(self) -> str:
        dims = "x".join(str(d) for d in self.shape) or "scalar"
        suffix = "" if self.dtype == torch.float32 else f":{str(self.dtype).removeprefix('torch.')}"
        return dims + suffix

    def with_batch(self, batch: int) -> InputSpec:
        if not self.shape:
            return self
        return InputSpec((batch, *self.shape[1:]), self.dtype)

    def make(self, generator: torch.Generator | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
        """A random tensor of this spec: N(0, 1) for floats, integers in [0, INT_HIGH) otherwise."""
        device = torch.device(device)
        if device.type == "meta":
            return torch.empty(self.shape, dtype=self.dtype, device=device)
        if self.dtype.is_floating_point:
            return torch.randn(self.shape, generator=generator).to(self.dtype)
        if self.dtype == torch.bool:
            return torch.randint(0, 2, self.shape, generator=generator).bool()
        return torch.randint(0, INT_HIGH, self.shape, generator=generator).to(self.dtype)


def parse_input_spec(text: str) -> InputSpec:
    """Parse ``1x3x224x224``, ``2x16:int64`` or ``:int64``/``scalar:int64`` (a scalar) into an :class:`InputSpec`."""
    match = _SPEC_RE.match(text)
    if not match or (match.group(1) is None and match.group(2) is None):
        raise InputSpecError(
            f"cannot parse input spec {text!r}",
            hint="write dimensions joined by 'x' with an optional dtype, e.g. 1x3x224x224 or 2x16:int64",
        )
    dims_text, dtype_text = match.groups()
    shape = tuple(int(d) for d in re.split(r"\s*[xX,]\s*", dims_text)) if dims_text not in (None, "scalar") else ()
    if any(d <= 0 for d in shape):
        raise InputSpecError(f"input spec {text!r} has a dimension of size 0", hint="every dimension must be >= 1")
    dtype = torch.float32
    if dtype_text:
        try:
            dtype = _DTYPES[dtype_text.lower()]
        except KeyError:
            known = ", ".join(sorted(set(_DTYPES)))
            raise InputSpecError(
                f"unknown dtype {dtype_text!r} in input spec {text!r}", hint=f"one of {known}"
            ) from None
    return InputSpec(shape, dtype)


def make_inputs(
    specs: Sequence[InputSpec], seed: int = 0, device: torch.device | str = "cpu", batch: int | None = None
) -> tuple[torch.Tensor, ...]:
    """Random example inputs for ``specs``; the same seed always gives the same tensors."""
    generator = torch.Generator().manual_seed(seed)
    if batch is not None:
        specs = [s.with_batch(batch) for s in specs]
    return tuple(spec.make(generator, device) for spec in specs)


def specs_of(inputs: Sequence[object]) -> list[InputSpec]:
    """The specs of concrete example tensors (non-tensor inputs are not representable and are rejected)."""
    specs = []
    for value in inputs:
        if not isinstance(value, torch.Tensor):
            raise InputSpecError(f"example input of type {type(value).__name__} cannot be described by a spec")
        specs.append(InputSpec(tuple(value.shape), value.dtype))
    return specs
