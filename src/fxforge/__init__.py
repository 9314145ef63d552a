"""fxforge: read, change and prove PyTorch models as torch.fx programs.

Public API (everything the CLI does is reachable from here)::

    import fxforge

    captured = fxforge.prepare("torchvision:resnet18")        # load, seeded inputs, capture
    report = fxforge.inspect_graph(captured)                   # shapes, params, FLOPs
    findings = fxforge.lint(captured)                          # rule-based findings
    result = fxforge.optimize(captured, ["fold_bn"], verify=True, output_dir="out/")
    check = fxforge.verify(captured, result.pipeline.graph_module)
    exported = fxforge.export_model(captured, to="onnx", path="out/model.onnx")  # reloaded and verified
    timings = fxforge.bench(captured, ["eager", "onnxruntime"])                 # .rows: median_ms, p90_ms, ...
"""

from fxforge.api import prepare, verify_specs
from fxforge.auto import AutoResult, Budget, auto_optimize
from fxforge.bench import BenchReport, bench, register_backend
from fxforge.capture import Captured, CaptureRecord, capture
from fxforge.errors import CaptureError, FxforgeError, InputSpecError, MissingExtraError, ModelSpecError
from fxforge.export import ExportError, ExportResult, export_model, load_exported
from fxforge.inputs import InputSpec, make_inputs, parse_input_spec
from fxforge.inspect import InspectReport, inspect_graph
from fxforge.lint import lint
from fxforge.models import LoadedModel, load_model
from fxforge.optimize import optimize
from fxforge.passes import PassResult, apply_pass, register_pass
from fxforge.passes.pipeline import Pipeline
from fxforge.quantize import QuantizeResult, quantize
from fxforge.verify import VerifyResult, compare_outputs, verify

__version__ = "0.1.0"

__all__ = [
    "AutoResult",
    "BenchReport",
    "Budget",
    "CaptureError",
    "CaptureRecord",
    "Captured",
    "ExportError",
    "ExportResult",
    "FxforgeError",
    "InputSpec",
    "InputSpecError",
    "InspectReport",
    "LoadedModel",
    "MissingExtraError",
    "ModelSpecError",
    "PassResult",
    "Pipeline",
    "QuantizeResult",
    "VerifyResult",
    "__version__",
    "apply_pass",
    "auto_optimize",
    "bench",
    "capture",
    "compare_outputs",
    "export_model",
    "inspect_graph",
    "lint",
    "load_exported",
    "load_model",
    "make_inputs",
    "optimize",
    "parse_input_spec",
    "prepare",
    "quantize",
    "register_backend",
    "register_pass",
    "verify",
    "verify_specs",
]
