"""fxforge: read, change and prove PyTorch models as torch.fx programs.

Public API (everything the CLI does is reachable from here)::

    import fxforge
    loaded = fxforge.load_model("torchvision:resnet18")
    captured = fxforge.capture(loaded, fxforge.make_inputs(loaded.default_inputs))
    report = fxforge.inspect_graph(captured)
    findings = fxforge.lint(captured)
"""

from fxforge.capture import Captured, CaptureRecord, capture
from fxforge.errors import CaptureError, FxforgeError, InputSpecError, MissingExtraError, ModelSpecError
from fxforge.inputs import InputSpec, make_inputs, parse_input_spec
from fxforge.models import LoadedModel, load_model
from fxforge.verify import compare_outputs

__version__ = "0.1.0"

__all__ = [
    "CaptureError",
    "CaptureRecord",
    "Captured",
    "FxforgeError",
    "InputSpec",
    "InputSpecError",
    "LoadedModel",
    "MissingExtraError",
    "ModelSpecError",
    "__version__",
    "capture",
    "compare_outputs",
    "load_model",
    "make_inputs",
    "parse_input_spec",
]
