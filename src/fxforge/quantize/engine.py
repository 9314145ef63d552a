"""The int8 kernel engine (``torch.backends.quantized.engine``) a quantized model is built and run with."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from fxforge.errors import FxforgeError

ENGINES = {"x86": "x86", "qnnpack": "qnnpack"}


@contextlib.contextmanager
def quantized_engine(backend: str) -> Iterator[None]:
    """Run with ``torch.backends.quantized.engine`` set for ``backend``: weights are packed for, and
    kernels picked from, the engine that is current, and it is a process-wide setting."""
    engine = ENGINES[backend]
    if engine not in torch.backends.quantized.supported_engines:
        supported = ", ".join(e for e in torch.backends.quantized.supported_engines if e != "none")
        raise FxforgeError(f"this torch build has no {engine} quantized engine", hint=f"available: {supported}")
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        yield
    finally:
        torch.backends.quantized.engine = previous
