"""Doctor: what this installation and this machine can do -- versions, CPU features, torch's kernel backends,
GPUs, which fxforge features are available (and, for those that are not, why), and the measured peak.

``fxforge doctor`` prints it for bug reports; benchmark pages quote it for the machine they ran on. Feature
statuses are ``available``, ``missing-extra`` (a package or tool to install; the reason says which) and
``unsupported-hardware`` (this CPU/GPU cannot run it fast, so fxforge does not offer it).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import platform
import re
import shutil
from dataclasses import dataclass, field
from typing import Any

import torch

from fxforge import display
from fxforge.errors import FxforgeError, option
from fxforge.machine import (
    CpuInfo,
    Load,
    Peak,
    bf16_unavailable,
    cpu_info,
    current_load,
    gpus,
    measure_peak,
    native_int8_dot,
    peak_dict,
    torch_backends,
)

# The lowest torch the whole suite has been run on; pyproject.toml requires it (a test keeps the two equal). pip
# enforces it on install, but an environment can still hold an older torch (``pip install --no-deps``, a conda torch).
LOWEST_TESTED_TORCH = (2, 11)

AVAILABLE = "available"
MISSING_EXTRA = "missing-extra"
UNSUPPORTED_HARDWARE = "unsupported-hardware"

# distribution name -> the name the report uses
_PACKAGES = {
    "torch": "torch",
    "torchvision": "torchvision",
    "onnx": "onnx",
    "onnxruntime": "onnxruntime",
    "onnxscript": "onnxscript",
    "timm": "timm",
    "transformers": "transformers",
    "numpy": "numpy",
    "fxforge": "fxforge",
}


@dataclass
class DoctorReport:
    versions: dict[str, str | None]
    cpu: CpuInfo
    threads: int
    backends: dict[str, Any]
    gpus: list[dict[str, Any]]
    features: dict[str, str]
    reasons: dict[str, str] = field(default_factory=dict)  # why a feature is not available
    peak: Peak | None = None
    load: Load | None = None  # the load average when the peak measurement ended (None: not measured)

    @property
    def busy(self) -> bool:
        """Other work competed for the cores while the peak was measured (bench's test of a busy machine)."""
        return self.peak is not None and self.load is not None and self.load.busy(self.peak.threads)

    @property
    def noise_warning(self) -> str | None:
        """One line saying the peak was measured on a busy machine, or None when it was not."""
        if not self.busy:
            return None
        assert self.load is not None and self.peak is not None
        return (
            f"a busy machine: {self.load.describe(self.peak.threads)}: the peak figures are a sample of the load "
            "more than of the machine, and doctor draws no conclusion from them; rerun with nothing else running"
        )

    @property
    def version_warning(self) -> str | None:
        """One line when the installed torch is older than the lowest fxforge is tested on, else None."""
        installed = self.versions.get("torch")
        if installed is None or _release(installed) >= LOWEST_TESTED_TORCH:
            return None
        lowest = ".".join(map(str, LOWEST_TESTED_TORCH))
        return (
            f"torch {installed} is older than {lowest}, the lowest torch fxforge is tested on: capture and export "
            f"may fail in ways fxforge cannot explain; pip install 'torch>={lowest}'"
        )

    def __repr__(self) -> str:  # the dataclass's would print every version, CPU flag and feature reason
        return display.doctor_repr(self)

    def _repr_html_(self) -> str:  # Jupyter shows this for the last value of a cell
        return display.doctor_html(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "versions": self.versions,
            "cpu": {
                "model": self.cpu.model,
                "features": self.cpu.features,
                "cores": self.cpu.cores,
                "torch_capability": self.cpu.torch_capability,
            },
            "threads": self.threads,
            "backends": self.backends,
            "gpus": self.gpus,
            "peak_gflops": dict(self.peak.gflops) if self.peak else None,  # None: not measured (--no-peak)
            "memory_bandwidth_gbs": self.peak.bandwidth_gbs if self.peak else None,
            "peak": peak_dict(self.peak) if self.peak else None,
            "load": dataclasses.asdict(self.load) if self.load else None,
            "noise_warning": self.noise_warning,
            "version_warning": self.version_warning,
            "features": self.features,
            "reasons": self.reasons,
        }


def versions() -> dict[str, str | None]:
    """Python and the installed version of every package fxforge uses (None when it is not installed)."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for distribution, name in _PACKAGES.items():
        try:
            found[name] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def _release(version: str) -> tuple[int, ...]:
    """(2, 14) from "2.14.1+cu130" or "2.11.0a0": the major and minor release, which decide what torch offers."""
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


def _compiler() -> str | None:
    return next((tool for tool in ("g++", "c++", "clang++") if shutil.which(tool)), None)


def features(found: dict[str, str | None], cpu: CpuInfo, gpu_list: list[dict[str, Any]]) -> tuple[dict, dict]:
    """(status per feature, reason per feature that is not available)."""
    status: dict[str, str] = {}
    reasons: dict[str, str] = {}

    def need(feature: str, ok: bool, kind: str, reason: str) -> None:
        status[feature] = AVAILABLE if ok else kind
        if not ok:
            reasons[feature] = reason

    for feature in ("capture", "inspect", "lint", "optimize", "verify", "profile", "debug", "quantize int8 (fx)"):
        status[feature] = AVAILABLE
    need("torchvision models", bool(found["torchvision"]), MISSING_EXTRA, "pip install 'fxforge[vision]'")
    need("timm models", bool(found["timm"]), MISSING_EXTRA, "pip install 'fxforge[timm]'")
    need("transformers models", bool(found["transformers"]), MISSING_EXTRA, "pip install 'fxforge[transformers]'")
    onnx_ok = all(found[name] for name in ("onnx", "onnxruntime", "onnxscript"))
    need("export onnx", onnx_ok, MISSING_EXTRA, "pip install 'fxforge[onnx]'")
    need("bench onnxruntime", onnx_ok, MISSING_EXTRA, "pip install 'fxforge[onnx]'")
    compiler = _compiler()
    need("bench compile (Inductor)", compiler is not None, MISSING_EXTRA, "needs a C++ compiler (g++) on PATH")
    engines = torch.backends.quantized.supported_engines
    need(
        "int8 kernels (x86/fbgemm)",
        "x86" in engines or "fbgemm" in engines,
        UNSUPPORTED_HARDWARE,
        "this torch build has no x86/fbgemm quantized engine",
    )
    need(
        "int8 fast dot products (VNNI/AMX)",
        native_int8_dot(cpu),
        UNSUPPORTED_HARDWARE,
        "no AVX512-VNNI, AVX-VNNI or AMX: int8 gains far less here",
    )
    # bench and --auto run models on the CPU: a GPU's bf16 does not make the CPU's fast
    bf16_reason = bf16_unavailable(cpu)
    need(
        "bf16 (cast and autocast)",
        bf16_reason is None,
        UNSUPPORTED_HARDWARE,
        f"{bf16_reason} (bench and --auto run on the CPU)",
    )
    nccl = torch.distributed.is_available() and torch.distributed.is_nccl_available()
    need(
        "run-pipeline on GPUs (nccl)",
        bool(gpu_list) and nccl,
        UNSUPPORTED_HARDWARE,
        "this torch build has no NCCL" if gpu_list else "no CUDA GPU",
    )
    distributed = torch.distributed.is_available() and torch.distributed.is_gloo_available()
    need("split / run-pipeline (gloo)", distributed, UNSUPPORTED_HARDWARE, "this torch build has no gloo backend")
    return status, reasons


DEFAULT_PEAK_SECONDS = 2.0


def doctor(*, peak: bool = True, seconds: float | None = None) -> DoctorReport:
    """Everything :mod:`fxforge.doctor` reports; ``peak=False`` skips the (about ``seconds``, 0.2 to 60, default
    2) measurement, and is refused with ``seconds``, which would time nothing."""
    if seconds is not None and not peak:
        # here, not in the CLI alone: doctor(peak=False, seconds=5) ignored seconds without a word
        raise FxforgeError(
            f"{option('--seconds')} applies to the peak measurement, which {option('--no-peak', python='peak=False')} "
            "skips",
            hint="pass one",
        )
    seconds = DEFAULT_PEAK_SECONDS if seconds is None else seconds
    if not 0.2 <= seconds <= 60:  # written so that NaN fails it too (click's FloatRange lets NaN through)
        raise FxforgeError(f"{option('--seconds')} must be a number from 0.2 to 60, got {seconds}")
    found = versions()
    cpu = cpu_info()
    gpu_list = gpus()
    status, reasons = features(found, cpu, gpu_list)
    report = DoctorReport(found, cpu, torch.get_num_threads(), torch_backends(), gpu_list, status, reasons)
    if peak:
        report.peak = measure_peak(seconds)
        report.load = current_load()
        if report.busy:
            # QA: fp32 at 4 GFLOP/s on a loaded 2-core machine came with "fp32 Linear layers run through MKL at
            # the lower rate": a gap between two kernels timed under load says nothing about the kernels
            report.peak.notes.clear()
    return report
