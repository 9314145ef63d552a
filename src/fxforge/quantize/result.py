"""What :func:`fxforge.quantize.quantize` returns: the model, its accuracy and how it was made."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from fxforge.artifacts import load_line_from_anywhere
from fxforge.quantize.accuracy import AccuracyReport
from fxforge.quantize.engine import ENGINES
from fxforge.quantize.units import Unit
from fxforge.visual import notebook

# ``AccuracyReport.data`` when static int8 was measured on its own calibration data (no eval data): in-sample
IN_SAMPLE = "calibration data"


@dataclass
class LayerSensitivity:
    """The error one fallback unit (:class:`~fxforge.quantize.units.Unit`: a layer, or in static mode also an op)
    causes when it is the only unit quantized. ``layer`` is the unit's name (a module path for layers)."""

    layer: str
    type: str
    top1_agreement: float | None
    max_abs_err: float
    mean_abs_err: float
    rel_err: float
    top1_drop: float | None = None  # on labelled evaluation data
    kind: str = "module"  # module (a layer), function or method (an op): how the unit is called in the graph
    nodes: list[str] = field(default_factory=list)  # the graph nodes the unit covers


@dataclass
class QuantizeResult:
    """A quantized (or QAT-prepared) model and how good it is.

    ``model`` is a GraphModule from ``convert_fx`` (static, dynamic) or ``prepare_qat_fx``
    (qat-prepare), or a module with swapped layers when dynamic quantization fell back to eager mode.
    Run an int8 model with ``torch.backends.quantized.engine`` set to ``engine``.
    """

    model: nn.Module
    mode: str
    backend: str
    machinery: str
    calibration: dict[str, Any] | None
    accuracy: AccuracyReport | None
    sensitivity: list[LayerSensitivity] = field(default_factory=list)
    quantized_layers: list[str] = field(default_factory=list)
    float_layers: list[str] = field(default_factory=list)  # the units kept in float: layers, and ops by node name
    target: str | None = None
    target_met: bool | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    evaluation: dict[str, Any] | None = None  # the data ``accuracy`` was measured on
    # the fallback units; None when nothing needed them (no sensitivity, keep-float or float layers): not computed
    units: list[Unit] | None = None
    output_dir: Path | None = None
    files: list[str] = field(default_factory=list)
    # model.pt's one-line load with torch alone, run in the output directory (with ``source/`` put on sys.path first
    # where the model's own classes were copied there); None until written
    load: str | None = None

    def __repr__(self) -> str:
        return notebook.quantize_repr(self)

    def _repr_html_(self) -> str:  # Jupyter shows this for the last value of a cell
        return notebook.quantize_html(self)

    @property
    def load_anywhere(self) -> str | None:
        """``load`` as a line that runs pasted anywhere (its imports, absolute paths); None until written."""
        return load_line_from_anywhere(self.load, self.output_dir) if self.load and self.output_dir else None

    @property
    def engine(self) -> str:
        return ENGINES[self.backend]

    @property
    def accuracy_known(self) -> bool:
        """True when ``accuracy`` was measured on the user's data, and not on the data static int8 was calibrated
        on: random inputs say nothing about real data, the calibration data itself gives an in-sample error
        (the int8 ranges were fitted to it), and no sample at all reads as 0% error."""
        if self.accuracy is None or self.evaluation is None or self.accuracy.samples == 0:
            return False
        return not self.evaluation["random"] and self.accuracy.data != IN_SAMPLE

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "backend": self.backend,
            "engine": self.engine,
            "machinery": self.machinery,
            "calibration": self.calibration,
            "evaluation": self.evaluation,
            "accuracy": asdict(self.accuracy) if self.accuracy else None,
            "accuracy_known": self.accuracy_known,
            "sensitivity": [asdict(s) for s in self.sensitivity],
            "quantized_layers": self.quantized_layers,
            "float_layers": self.float_layers,
            "units": [unit.to_dict() for unit in self.units] if self.units is not None else None,
            "target": self.target,
            "target_met": self.target_met,
            "warnings": self.warnings,
            "notes": self.notes,
            "output_dir": str(self.output_dir) if self.output_dir else None,
            "files": self.files,
            "load": self.load,
        }
