"""Example inputs: parsing ``--input`` specs such as ``1x3x224x224`` or ``2x16:int64`` and making the
random tensors a model is captured, inspected and verified with."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fxforge.errors import InputSpecError, first_line, said
from fxforge.runtime import batch_of, is_integer_dtype

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

# Larger dimensions cannot be real inputs (and overflow torch's int64 sizes once multiplied).
MAX_DIMENSION = 2**31 - 1

# "scalar" is how str(InputSpec) writes a 0-d shape (e.g. in an output directory's inputs.txt); ":max=N" bounds the
# integers drawn for an integer input (ids of an Embedding(N + 1)), written without "<" so that no shell reads it.
_SPEC_RE = re.compile(
    r"^\s*(scalar|\d+(?:\s*[xX,]\s*\d+)*)?\s*(?::\s*([A-Za-z0-9_]+))?\s*(?::\s*max\s*=\s*(\d+))?\s*$",
    re.ASCII,  # digits are 0-9: int() would read other scripts' digits too
)


@dataclass(frozen=True)
class InputSpec:
    """Shape and dtype of one positional example input."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    # integers are drawn from [0, high): a user's example tensor of ids in [0, 4) for an Embedding(4) gives 4;
    # None: INT_HIGH. Written as ":max=3" by text(with_range=True), as in an output directory's inputs.txt.
    high: int | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return self.text()

    def text(self, with_range: bool = False) -> str:
        """``1x3x224x224``, ``2x16:int64``; with ``with_range``, an integer range other than the default too
        (``2x16:int64:max=3``), which :func:`parse_input_spec` reads back."""
        dims = "x".join(str(d) for d in self.shape) or "scalar"
        suffix = "" if self.dtype == torch.float32 else f":{str(self.dtype).removeprefix('torch.')}"
        if with_range and self.high is not None and self.high != INT_HIGH and is_integer_dtype(self.dtype):
            suffix += f":max={self.high - 1}"
        return dims + suffix

    def with_batch(self, batch: int) -> InputSpec:
        if not self.shape:
            return self
        return InputSpec((batch, *self.shape[1:]), self.dtype, self.high)

    @classmethod
    def of(cls, example: torch.Tensor) -> InputSpec:
        """The spec of an example tensor; integer ids keep its range when it starts at 0 or above."""
        integer = is_integer_dtype(example.dtype)
        readable = integer and example.numel() and example.device.type != "meta"  # a meta tensor has no values
        high = int(example.max()) + 1 if readable and int(example.min()) >= 0 else None
        if high is not None:  # torch.randint draws below its bound, which must fit the dtype
            high = min(high, torch.iinfo(example.dtype).max)
        return cls(tuple(example.shape), example.dtype, high)

    def make(self, generator: torch.Generator | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
        """A random tensor of this spec: N(0, 1) for floats, integers in [0, high or INT_HIGH) otherwise.

        Drawn on the CPU and then moved to ``device``, so that a seed gives the same values on every device.
        """
        device = torch.device(device)
        if device.type == "meta":
            return torch.empty(self.shape, dtype=self.dtype, device=device)
        if self.dtype.is_floating_point:
            drawn = torch.randn(self.shape, generator=generator).to(self.dtype)
        elif self.dtype == torch.bool:
            drawn = torch.randint(0, 2, self.shape, generator=generator).bool()
        else:
            high = self.high or INT_HIGH
            drawn = torch.randint(0, high, self.shape, generator=generator).to(self.dtype)
            if drawn.numel() > 1:
                # the top of the range is always drawn once, so that the range read back from the tensor
                # (InputSpec.of: an output directory's inputs.txt) is the one drawn from, not the largest id that
                # happened to come up (max=60 of a max=99)
                drawn.view(-1)[int(torch.randint(0, drawn.numel(), (), generator=generator))] = high - 1
        return drawn.to(device)


def parse_input_spec(text: str) -> InputSpec:
    """Parse ``1x3x224x224``, ``2x16:int64`` or ``:int64``/``scalar:int64`` (a scalar) into an :class:`InputSpec`;
    ``2x16:int64:max=30521`` draws the integers from [0, 30521] (a vocabulary's ids) instead of [0, 9]."""
    match = _SPEC_RE.match(text)
    if not match or (match.group(1) is None and match.group(2) is None):
        raise InputSpecError(
            f"cannot parse input spec {text!r}",
            hint="write dimensions joined by 'x' with an optional dtype, e.g. 1x3x224x224 or 2x16:int64 "
            "(2x16:int64:max=999 for ids up to 999)",
        )
    dims_text, dtype_text, max_text = match.groups()
    shape = tuple(int(d) for d in re.split(r"\s*[xX,]\s*", dims_text)) if dims_text not in (None, "scalar") else ()
    if any(d > MAX_DIMENSION for d in shape):
        raise InputSpecError(f"input spec {text!r} has a dimension over {MAX_DIMENSION:,}", hint="is it a typo?")
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
    if max_text is None:
        return InputSpec(shape, dtype)
    if not is_integer_dtype(dtype):
        raise InputSpecError(
            f"input spec {text!r} bounds a {str(dtype).removeprefix('torch.')} input: max= is for integer inputs",
            hint=f"e.g. {dims_text or 'scalar'}:int64:{max_text and 'max=' + max_text}",
        )
    most = torch.iinfo(dtype).max - 1  # the draw's exclusive bound, max + 1, must fit the dtype too
    if int(max_text) > most:
        raise InputSpecError(f"input spec {text!r}: max={max_text} does not fit {dtype_text}", hint=f"at most {most}")
    return InputSpec(shape, dtype, int(max_text) + 1)


def make_inputs(
    specs: Sequence[InputSpec | str], seed: int = 0, device: torch.device | str = "cpu", batch: int | None = None
) -> tuple[torch.Tensor, ...]:
    """Random example inputs for ``specs`` (InputSpecs or strings such as ``"1x3x224x224"``); the same seed always
    gives the same tensors. One spec may be given alone (``"1x3x224x224"``: its characters are no specs)."""
    if isinstance(specs, (str, InputSpec)):
        specs = [specs]
    specs = [parse_input_spec(s) if isinstance(s, str) else s for s in specs]
    if batch is not None and batch < 1:
        raise InputSpecError(f"a batch size must be at least 1, got {batch}")
    generator = torch.Generator().manual_seed(seed)
    if batch is not None:
        # the batch is the first input's first dimension; an input whose first dimension is another size (a weight
        # matrix passed to forward) is no batched input and keeps its shape (QA: 4x16 and 16x8 became 4x16 and 4x8)
        example_batch = specs[0].shape[0] if specs and specs[0].shape else None
        specs = [s.with_batch(batch) if s.shape and s.shape[0] == example_batch else s for s in specs]
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InputSpecError(f"unknown device {device!r}: {first_line(exc)}") from None
    if device.type != "meta":
        check_fits_in_memory(specs, batch=batch)
    try:
        return tuple(spec.make(generator, device) for spec in specs)
    except (RuntimeError, AssertionError) as exc:  # no such device here (torch's CUDA error is a paragraph)
        raise InputSpecError(f"cannot make inputs on {device}: {first_line(exc)}") from None


def physical_memory() -> int | None:
    """This machine's memory in bytes, or None where the system does not say (not POSIX)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_fits_in_memory(specs: Sequence[InputSpec], *, batch: int | None = None) -> None:
    """Refuse inputs larger than this machine's memory with one line, not an allocator error. ``batch``: the batch
    size the caller asked the inputs at (``bench --batch``), which the hint then names rather than ``--input``."""
    needed = sum(math.prod(spec.shape) * torch.empty((), dtype=spec.dtype).element_size() for spec in specs)
    physical = physical_memory()
    if physical is None:  # not POSIX: let the allocator decide
        return
    if needed > physical:
        shapes = " ".join(str(spec) for spec in specs)
        raise InputSpecError(
            f"example inputs {shapes} need {needed / 2**30:,.1f} GiB, more than this machine's "
            f"{physical / 2**30:,.1f} GiB",
            hint=said(
                "use a smaller --input (or --device meta to inspect shapes without data)",
                "use smaller inputs (or device='meta' to inspect shapes without data)",
            )
            if batch is None
            else said(f"use a smaller --batch than {batch}", f"use a smaller batch size than {batch}"),
        )


def refuse_containers(inputs: Sequence[object], step: str = "") -> None:
    """Refuse a positional argument that is a dict, list or tuple (of tensors), naming it: the steps that take
    one tensor per argument (QA: split wrote stages with a dict's tensors baked in as constants, and bench raised
    AttributeError)."""
    for index, value in enumerate(inputs):
        if isinstance(value, (dict, list, tuple)):
            kind = type(value).__name__
            raise InputSpecError(
                f"{step or 'this step'} needs one tensor per forward argument; argument {index} is a {kind}",
                hint=f"wrap the model in a module whose forward takes each tensor as an argument of its own (the "
                f"other arguments as they are) and rebuilds the {kind} before calling the model",
            )


def specs_of(inputs: Sequence[object], step: str = "") -> list[InputSpec]:
    """The specs of concrete example tensors (non-tensor inputs are not representable and are rejected, naming the
    argument and what to do; ``step`` names what needs them, e.g. ``"split"``)."""
    refuse_containers(inputs, step)
    specs = []
    for index, value in enumerate(inputs):
        if not isinstance(value, torch.Tensor):
            raise InputSpecError(
                f"{step or 'this step'} needs tensor inputs; argument {index} is of type {type(value).__name__} "
                f"({value!r:.40})",
                hint=said(
                    "fix it with --concrete NAME=VALUE", "fix it with concrete_args={NAME: VALUE} when capturing"
                ),
            )
        specs.append(InputSpec.of(value))
    return specs


# --------------------------------------------------------------------------------------------------
# verification cases: varied inputs shaped like the example


# What verification draws for floating-point inputs. Different signs, scales and sparsity exercise
# different branches (``if x.mean() > 0``), saturations and rounding; none is large enough to overflow
# a float32 model that handles N(0, 1) inputs.
FLOAT_DISTRIBUTIONS: dict[str, str] = {
    "normal": "N(0, 1)",
    "positive": "U[0, 1)",
    "negative": "-U[0, 1)",
    "wide": "N(0, 1) x 8",
    "narrow": "N(0, 1) x 0.01",
    "sparse": "N(0, 1), 70% zeros",
}
DISTRIBUTIONS = tuple(FLOAT_DISTRIBUTIONS)


@dataclass(frozen=True)
class Case:
    """One set of inputs a verification runs both models on."""

    batch: int | None  # None: the example's batch size (or the inputs have none)
    distribution: str  # a key of FLOAT_DISTRIBUTIONS, or "given" for inputs the caller passed
    seed: int
    args: tuple
    kwargs: dict

    @property
    def label(self) -> str:
        batch = f"batch {self.batch}, " if self.batch is not None else ""
        return f"{batch}{self.distribution}, seed {self.seed}"


def _float_like(shape: tuple[int, ...], dtype: torch.dtype, distribution: str, g: torch.Generator) -> torch.Tensor:
    if distribution == "positive":
        value = torch.rand(shape, generator=g)
    elif distribution == "negative":
        value = -torch.rand(shape, generator=g)
    elif distribution == "wide":
        value = torch.randn(shape, generator=g) * 8
    elif distribution == "narrow":
        value = torch.randn(shape, generator=g) * 0.01
    elif distribution == "sparse":
        value = torch.randn(shape, generator=g) * (torch.rand(shape, generator=g) > 0.7)
    else:
        value = torch.randn(shape, generator=g)
    return value.to(dtype)


def _integers_like(
    example: torch.Tensor, shape: tuple[int, ...], distribution: str, g: torch.Generator
) -> torch.Tensor:
    """Integers within the example's own range (token ids stay valid ids): uniform, or at one end -- all but the
    first of each row (last dimension), which is at the other end. A row all at one end is an attention mask
    that masks every position: what the model computes there is undefined, ONNX Runtime and torch differ on it
    (0.08 on BERT), and no ONNX export of a transformer could pass verification."""
    low, high = (int(example.min()), int(example.max())) if example.numel() else (0, INT_HIGH - 1)
    if distribution in ("negative", "wide"):
        value = torch.full(shape, low if distribution == "negative" else high)
        if value.dim():
            value[..., 0] = high if distribution == "negative" else low
    else:
        value = torch.randint(low, high + 1, shape, generator=g)
    return value.to(example.dtype)


def draw_like(example: Any, distribution: str, seed: int, batch: int | None) -> Any:
    """A pytree shaped like ``example`` (args or kwargs), every tensor redrawn from ``distribution``.

    Tensors of one or more dimensions whose first dimension is the example's batch (the first such tensor's) get
    ``batch`` rows when it is given; non-tensor leaves are kept.
    Booleans are random; integers stay within the example tensor's range. Each tensor is drawn on the CPU (the
    same values for a seed on every device) and lands on its example's device.
    """
    generator = torch.Generator().manual_seed(seed)
    example_batch = batch_of(example)  # a tensor of another first dimension keeps its shape

    def redraw(value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or value.device.type == "meta":
            return value
        return drawn(value).to(value.device)

    def drawn(value: torch.Tensor) -> torch.Tensor:
        shape = tuple(value.shape)
        if batch is not None and shape and shape[0] == example_batch:
            shape = (batch, *shape[1:])
        if value.dtype == torch.bool:
            density = 0.9 if distribution in ("positive", "wide") else 0.5
            return torch.rand(shape, generator=generator) < density
        if value.is_floating_point():
            return _float_like(shape, value.dtype, distribution, generator)
        if value.is_complex():
            return torch.randn(shape, dtype=value.dtype, generator=generator)
        return _integers_like(value, shape, distribution, generator)

    return pytree.tree_map(redraw, example)


def case_plan(
    batches: Sequence[int | None], count: int, seed: int = 0, seed_step: int = 1
) -> list[tuple[int | None, str, int]]:
    """(batch, distribution, seed) for at least ``count`` cases: every batch size with every distribution,
    then again with new seeds until ``count`` is reached. Case ``i`` has seed ``seed + i * seed_step``."""
    batches = list(batches) or [None]
    combos = [(batch, distribution) for distribution in DISTRIBUTIONS for batch in batches]
    total = max(count, len(combos))
    return [(*combos[i % len(combos)], seed + i * seed_step) for i in range(total)]
