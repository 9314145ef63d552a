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
    stages = fxforge.split(captured, stages=4, balance="flops", output_dir="out/split")  # .plan, .stages
    run = fxforge.run_pipeline("out/split", microbatches=8)                     # one process per stage

The names are loaded on first use (PEP 562): ``import fxforge`` does not import torch, so the command line
starts fast and can be interrupted cleanly while torch loads.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "prepare": "fxforge.api",
    "verify_specs": "fxforge.api",
    "AutoResult": "fxforge.auto",
    "Budget": "fxforge.auto",
    "auto_optimize": "fxforge.auto",
    "BenchReport": "fxforge.bench",
    "bench": "fxforge.bench",
    "register_backend": "fxforge.bench",
    "all_backends": "fxforge.bench",
    "Captured": "fxforge.capture",
    "CaptureRecord": "fxforge.capture",
    "capture": "fxforge.capture",
    "CaptureError": "fxforge.errors",
    "FxforgeError": "fxforge.errors",
    "InputSpecError": "fxforge.errors",
    "MissingExtraError": "fxforge.errors",
    "ModelSpecError": "fxforge.errors",
    "ExportError": "fxforge.export",
    "ExportResult": "fxforge.export",
    "export_model": "fxforge.export",
    "load_exported": "fxforge.artifacts",
    "InputSpec": "fxforge.inputs",
    "make_inputs": "fxforge.inputs",
    "parse_input_spec": "fxforge.inputs",
    "InspectReport": "fxforge.inspect",
    "inspect_graph": "fxforge.inspect",
    "lint": "fxforge.lint",
    "all_rules": "fxforge.lint",
    "register_rule": "fxforge.lint",
    "debug_model": "fxforge.debug",
    "doctor": "fxforge.doctor",
    "profile_model": "fxforge.profile",
    "fix": "fxforge.optimize",
    "LoadedModel": "fxforge.models",
    "load_model": "fxforge.models",
    "optimize": "fxforge.optimize",
    "PassResult": "fxforge.passes",
    "apply_pass": "fxforge.passes",
    "register_pass": "fxforge.passes",
    "all_passes": "fxforge.passes",
    "Pipeline": "fxforge.pipeline",
    "QuantizeResult": "fxforge.quantize",
    "quantize": "fxforge.quantize",
    "VerifyResult": "fxforge.verify",
    "GraphView": "fxforge.visual",
    "diff_html": "fxforge.visual",
    "graph_html": "fxforge.visual",
    "graph_svg": "fxforge.visual",
    "show": "fxforge.visual",
    "report": "fxforge.report",
    "Verifier": "fxforge.verify",
    "compare_outputs": "fxforge.compare",
    "verify": "fxforge.verify",
    "SplitPlan": "fxforge.split",
    "SplitResult": "fxforge.split",
    "plan_split": "fxforge.split",
    "split": "fxforge.split",
    "PipelineError": "fxforge.distributed",
    "PipelineRun": "fxforge.distributed",
    "run_pipeline": "fxforge.distributed",
}

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
    "GraphView",
    "InputSpec",
    "InputSpecError",
    "InspectReport",
    "LoadedModel",
    "MissingExtraError",
    "ModelSpecError",
    "PassResult",
    "Pipeline",
    "PipelineError",
    "PipelineRun",
    "QuantizeResult",
    "SplitPlan",
    "SplitResult",
    "Verifier",
    "VerifyResult",
    "__version__",
    "all_backends",
    "all_passes",
    "all_rules",
    "apply_pass",
    "auto_optimize",
    "bench",
    "capture",
    "compare_outputs",
    "debug_model",
    "diff_html",
    "doctor",
    "export_model",
    "fix",
    "graph_html",
    "graph_svg",
    "inspect_graph",
    "lint",
    "load_exported",
    "load_model",
    "make_inputs",
    "optimize",
    "parse_input_spec",
    "plan_split",
    "prepare",
    "profile_model",
    "quantize",
    "register_backend",
    "register_pass",
    "register_rule",
    "report",
    "run_pipeline",
    "show",
    "split",
    "verify",
    "verify_specs",
]


class _Package(types.ModuleType):
    """The package's module type: importing a submodule named like a public function (``fxforge.capture``,
    ``fxforge.verify``) must not replace the function with the module, as the import system's ``setattr`` would."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType) and value.__name__ == f"{__name__}.{name}":
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fxforge' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # static type checkers and IDEs see the names without the lazy loading
    from fxforge.api import prepare, verify_specs
    from fxforge.artifacts import load_exported
    from fxforge.auto import AutoResult, Budget, auto_optimize
    from fxforge.bench import BenchReport, all_backends, bench, register_backend
    from fxforge.capture import Captured, CaptureRecord, capture
    from fxforge.compare import compare_outputs
    from fxforge.debug import debug_model
    from fxforge.distributed import PipelineError, PipelineRun, run_pipeline
    from fxforge.doctor import doctor
    from fxforge.errors import CaptureError, FxforgeError, InputSpecError, MissingExtraError, ModelSpecError
    from fxforge.export import ExportError, ExportResult, export_model
    from fxforge.inputs import InputSpec, make_inputs, parse_input_spec
    from fxforge.inspect import InspectReport, inspect_graph
    from fxforge.lint import all_rules, lint, register_rule
    from fxforge.models import LoadedModel, load_model
    from fxforge.optimize import fix, optimize
    from fxforge.passes import PassResult, all_passes, apply_pass, register_pass
    from fxforge.pipeline import Pipeline
    from fxforge.profile import profile_model
    from fxforge.quantize import QuantizeResult, quantize
    from fxforge.report import report
    from fxforge.split import SplitPlan, SplitResult, plan_split, split
    from fxforge.verify import Verifier, VerifyResult, verify
    from fxforge.visual import GraphView, diff_html, graph_html, graph_svg, show
