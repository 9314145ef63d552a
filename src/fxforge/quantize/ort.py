"""ONNX Runtime's own int8: static quantization of an ONNX file (the one fxforge exports) into QDQ format.

:func:`quantize_onnx` runs ``onnxruntime.quantization.quantize_static`` with

* ``QuantFormat.QDQ``: QuantizeLinear/DequantizeLinear pairs around each op, which ONNX Runtime's graph
  optimizer fuses into its int8 kernels (QLinearConv, MatMulInteger...) when the session is created, so the
  file is still a standard ONNX model that any runtime can read;
* per-channel weights (``per_channel=True``), MinMax calibration;
* on x86, uint8 activations and int8 weights (U8S8, :func:`int8_types`): ONNX Runtime's x86 int8 convolutions
  multiply uint8 by int8 (VNNI's ``vpdpbusd``, AVX2's ``vpmaddubsw``). Its documentation proposes S8S8 as the
  default, but with 1.32 on x86 an S8S8 file leaves a third of resnet18's convolutions in float between
  Transposes and runs slower than float (resnet18 batch 1, Xeon, 2 threads: 11.75 ms S8S8, 10.45 ms float,
  3.97 ms U8S8); elsewhere (ARM), S8S8;
* calibration on the batches given (the same batches fxforge's own int8 calibrates on), read by a
  ``CalibrationDataReader`` that feeds them in the ONNX model's input order.

The float file is first put through ``quant_pre_process`` (shape inference and graph optimisation, which ONNX
Runtime recommends before quantizing); where that fails, the file is quantized as exported, and a note says so.
Nothing here exports: the ``ort_int8`` backend of :mod:`fxforge.bench` exports the ONNX file and calls this.
"""

from __future__ import annotations

import contextlib
import logging
import platform
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fxforge.errors import FxforgeError, one_line_reason, require

FEATURE = "ONNX Runtime int8 (ort_int8)"


def int8_types(machine: str | None = None) -> tuple[str, str]:
    """(activations, weights) for ONNX Runtime's int8 on ``machine`` (default: this one, ``platform.machine()``):
    ``("uint8", "int8")`` on x86, where its int8 kernels take uint8 activations, else ``("int8", "int8")``."""
    arch = (machine or platform.machine()).lower()
    x86 = arch in ("x86_64", "amd64", "i386", "i686", "x86")
    return ("uint8" if x86 else "int8"), "int8"


def quantize_onnx(
    source: str | Path, target: str | Path, batches: Sequence[tuple[Any, ...]], activations: str | None = None
) -> list[str]:
    """Write ``target``: the ONNX model ``source`` quantized to int8 by ONNX Runtime (static, QDQ, per-channel
    weights), calibrated on ``batches`` (each a tuple of positional inputs, as :func:`load_calibration` gives
    them). ``activations``: ``uint8`` or ``int8`` (default: :func:`int8_types` for this machine). Returns notes on
    what was done.

    Raises:
        MissingExtraError: onnx or onnxruntime is not installed (the ``onnx`` extra).
        FxforgeError: no calibration batch, or ONNX Runtime's quantizer failed.
    """
    require("onnx", "onnx", FEATURE)
    require("onnxruntime", "onnx", FEATURE)
    quantization = require("onnxruntime.quantization", "onnx", FEATURE)
    if not batches:
        raise FxforgeError("ONNX Runtime int8 needs at least one calibration batch")
    source, target = Path(source), Path(target)
    activations = activations or int8_types()[0]
    if activations not in ("uint8", "int8"):
        raise FxforgeError(f"ONNX Runtime int8 activations are uint8 or int8, not {activations!r}")
    activation_type = quantization.QuantType.QUInt8 if activations == "uint8" else quantization.QuantType.QInt8
    notes: list[str] = []
    # quant_pre_process's failed graph optimisation is logged, traceback and all, and ONNX Runtime's C++ logger
    # warns from the sessions both steps open (QA: a float64 model's ort_int8 row printed both on stderr): the
    # first is collected into a note, the C++ warnings are off while they run
    with _native_warnings_off(), tempfile.TemporaryDirectory(prefix="fxforge-ort-int8-") as tmp:
        model = source
        prepared = Path(tmp) / "prepared.onnx"
        try:
            with _root_warnings_as_notes(notes, "quant_pre_process"):
                quantization.shape_inference.quant_pre_process(str(source), str(prepared))
            model = prepared
        except Exception as exc:  # quantizing the exported file as it is still works, if less well fused
            notes.append(f"quant_pre_process failed ({one_line_reason(exc, 120)}): quantized the file as exported")
        reader = _Reader(_input_names(model), batches)
        try:
            with _root_warnings_as_notes(notes):
                quantization.quantize_static(
                    str(model),
                    str(target),
                    reader,
                    quant_format=quantization.QuantFormat.QDQ,
                    per_channel=True,
                    activation_type=activation_type,
                    weight_type=quantization.QuantType.QInt8,
                    calibrate_method=quantization.CalibrationMethod.MinMax,
                )
        except FxforgeError:
            raise
        except Exception as exc:
            target.unlink(missing_ok=True)
            raise FxforgeError(f"ONNX Runtime's static quantization failed: {one_line_reason(exc)}") from exc
    notes.append(
        f"ONNX Runtime static int8: QDQ, per-channel weights, {'U8S8' if activations == 'uint8' else 'S8S8'}, "
        f"MinMax calibration on {len(batches)} batches"
    )
    return notes


def _input_names(path: Path) -> list[str]:
    """The ONNX model's graph inputs (initializers listed as inputs by old exporters left out), in order."""
    onnx = require("onnx", "onnx", FEATURE)
    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {init.name for init in graph.initializer}
    return [value.name for value in graph.input if value.name not in initializers]


class _Reader:
    """ONNX Runtime's ``CalibrationDataReader`` protocol over fxforge's calibration batches: ``get_next()`` gives
    one batch as ``{input name: array}``, then ``None``. The tensors of a batch are matched with the ONNX inputs
    in order, the way :class:`~fxforge.artifacts.OnnxRuntimeModule` feeds them."""

    def __init__(self, names: Sequence[str], batches: Sequence[tuple[Any, ...]]) -> None:
        self.names = list(names)
        self.batches = list(batches)
        self.position = 0

    def get_next(self) -> dict[str, Any] | None:
        if self.position >= len(self.batches):
            return None
        batch = self.batches[self.position]
        self.position += 1
        flat = [t for t in pytree.tree_leaves(batch) if isinstance(t, torch.Tensor)]
        if len(flat) != len(self.names):
            raise FxforgeError(
                f"a calibration batch has {len(flat)} tensors, the ONNX model takes {len(self.names)} inputs"
            )
        return {name: t.detach().cpu().contiguous().numpy() for name, t in zip(self.names, flat)}

    def rewind(self) -> None:
        self.position = 0

    def __len__(self) -> int:
        return len(self.batches)


__all__ = ["quantize_onnx"]


@contextlib.contextmanager
def _native_warnings_off() -> Iterator[None]:
    """ONNX Runtime's C++ logger at errors only for the block."""
    onnxruntime = require("onnxruntime", "onnx", FEATURE)
    onnxruntime.set_default_logger_severity(3)
    try:
        yield
    finally:
        onnxruntime.set_default_logger_severity(2)  # ONNX Runtime's default (it has no getter to restore from)


class _Collected(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def _root_warnings_as_notes(notes: list[str], who: str = "ONNX Runtime's quantizer") -> Iterator[None]:
    """ONNX Runtime's quantizer warns through the root logger, one line per tensor (QA: "Axis 1 is out-of-range for
    weight 'blocks.0.norm1.weight'" 25 times for a ViT's LayerNorms): collected into one note instead."""
    collected, root = _Collected(), logging.getLogger()
    saved = root.handlers
    root.handlers = [collected]
    try:
        yield
    finally:
        root.handlers = saved
        if collected.messages:
            distinct = list(dict.fromkeys(message.strip().splitlines()[0] for message in collected.messages))
            notes.append(
                f"{who} warned {len(collected.messages)} times, e.g. {distinct[0]!r}"
                + (f" ({len(distinct)} distinct messages)" if len(distinct) > 1 else "")
            )
