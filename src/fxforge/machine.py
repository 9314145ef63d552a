"""The machine fxforge runs on: CPU model and the features that change what is fast, threads, torch's kernel
backends, GPUs, and the measured peak throughput (matmul GFLOP/s per dtype, memory bandwidth).

Benchmarks print :func:`describe` with every table, ``fxforge doctor`` reports all of it, ``profile`` compares each
node with the measured peak, and ``optimize --auto`` tries bf16 only where :func:`native_bf16` says the CPU runs it
natively: on a CPU without AVX512-BF16 or AMX (or with oneDNN limited to an older ISA) bf16 is emulated and several
times slower than fp32. Nothing here is hard-coded for one CPU: features are read from the machine, and what they
promise is measured on it.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.ao.nn.quantized as nnq

from fxforge.runtime import onednn_linear_op, quiet_quantization_notices, torch_threads

# CPU flags (as /proc/cpuinfo spells them) that change which kernels are fast.
RELEVANT_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "neon",
    "asimd",
    "sve",
)


@dataclass
class CpuInfo:
    model: str
    features: list[str]  # the RELEVANT_FLAGS this CPU has
    cores: int  # logical CPUs the OS reports
    torch_capability: str  # torch's own view of the vector ISA (AVX2, AVX512, ...)


@dataclass
class Peak:
    """Measured throughput of this process on this machine: matmul GFLOP/s per dtype, copy bandwidth GB/s."""

    gflops: dict[str, float] = field(default_factory=dict)
    bandwidth_gbs: float = 0.0
    threads: int = 0
    seconds: float = 0.0  # how long the measurement took
    # what the peak figures alone do not say, e.g. that torch's own fp32 matmul reaches only part of the peak here
    notes: list[str] = field(default_factory=list)
    mm_fp32: float | None = None  # torch.mm's fp32 GFLOP/s, where oneDNN's matmul set the fp32 peak well above it


def cpu_info() -> CpuInfo:
    """The CPU's model name and the features of :data:`RELEVANT_FLAGS` it has (Linux: /proc/cpuinfo)."""
    model, flags = platform.processor() or platform.machine(), set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "Model") and model in ("", platform.processor(), platform.machine()):
                model = value.strip()
            elif key in ("flags", "Features"):
                flags.update(value.split())
    capability = ""
    with contextlib.suppress(Exception):
        capability = torch.backends.cpu.get_cpu_capability()
    return CpuInfo(model, [f for f in RELEVANT_FLAGS if f in flags], os.cpu_count() or 1, capability)


def native_bf16(cpu: CpuInfo | None = None) -> bool:
    """Whether this process computes bf16 in hardware: see :func:`bf16_unavailable`."""
    return bf16_unavailable(cpu) is None


def bf16_unavailable(cpu: CpuInfo | None = None) -> str | None:
    """Why bf16 is slow in this process, or None where it runs natively: the CPU has AVX512-BF16 or AMX *and* a
    bf16 matmul measured here is faster than fp32 (:func:`bf16_matmul_speedup`).

    The flags alone are not enough: with oneDNN limited to an older ISA (``ONEDNN_MAX_CPU_ISA=AVX2``, as some
    containers set it) the same AMX Xeon ran torch's bf16 matmul at 0.01x fp32, and at 0.2x with
    ``AVX512_CORE`` -- emulated, like a CPU without the instructions. The measurement runs only where the flags
    say yes.
    """
    features = set((cpu or cpu_info()).features)
    if not features & {"avx512_bf16", "amx_bf16"}:
        return "no AVX512-BF16 or AMX: bf16 is emulated on this CPU, slower than fp32"
    speedup = bf16_matmul_speedup()
    if speedup >= 1.0:
        return None
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    why = f" (ONEDNN_MAX_CPU_ISA={limit} limits oneDNN)" if limit else ""
    return (
        f"the CPU has AVX512-BF16/AMX, but a bf16 matmul ran at {speedup:.2f}x fp32 in this process{why}: "
        "bf16 is emulated here, slower than fp32"
    )


@functools.lru_cache(maxsize=1)
def bf16_matmul_speedup(size: int = 256) -> float:
    """How much faster a ``size`` x ``size`` bf16 matmul runs than fp32 in this process, on one thread (best of
    5 calls each; 0.0 where bf16 fails). One thread, because two threads sharing a core with another process
    stall at OpenMP barriers and the ratio says nothing; the question -- native bf16 or emulated -- is the same
    per core. Measured on an AMX Xeon: 4x natively, 0.2x and 0.01x with oneDNN limited to AVX-512 and AVX2;
    at most ~0.1 s even when emulated."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator)
    b = torch.randn(size, size, generator=generator)

    def best_of_5(x: torch.Tensor, y: torch.Tensor) -> float:
        torch.mm(x, y)  # first call: kernel selection, packing
        times = []
        for _ in range(5):
            start = time.perf_counter()
            torch.mm(x, y)
            times.append(time.perf_counter() - start)
        return min(times)

    with torch_threads(1), torch.no_grad():
        fp32 = best_of_5(a, b)
        try:
            bf16 = best_of_5(a.to(torch.bfloat16), b.to(torch.bfloat16))
        except RuntimeError:  # a build without bf16 matmul kernels
            return 0.0
    return fp32 / bf16


def native_int8_dot(cpu: CpuInfo | None = None) -> bool:
    """Whether the CPU has int8 dot-product instructions (VNNI or AMX), where int8 kernels pay off most."""
    features = set((cpu or cpu_info()).features)
    return bool(features & {"avx512_vnni", "avx_vnni", "amx_int8"})


def gpus() -> list[dict[str, Any]]:
    """CUDA devices torch sees: name, memory and compute capability (empty on CPU-only machines)."""
    if not torch.cuda.is_available():
        return []
    found = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        found.append(
            {
                "index": index,
                "name": props.name,
                "memory_gib": round(props.total_memory / 2**30, 1),
                "capability": f"{props.major}.{props.minor}",
                "bf16": bool(torch.cuda.is_bf16_supported()),
            }
        )
    return found


def torch_backends() -> dict[str, Any]:
    """The kernel libraries torch was built with and uses: oneDNN (mkldnn), the quantized engines, threads."""
    return {
        "mkldnn": torch.backends.mkldnn.is_available(),
        "openmp": torch.backends.openmp.is_available(),
        "quantized_engines": [e for e in torch.backends.quantized.supported_engines if e != "none"],
        "quantized_engine": torch.backends.quantized.engine,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
    }


def _fitting_rate(make: Callable[[int], Callable[[], Any]], size: int, budget: float) -> float:
    """Multiply-add rate (FLOP/s, 2 per multiply-add) of ``make(n)``'s ``n``x``n`` matmul at ``size``, or at the
    largest of ``size / 2``, ``size / 4`` whose calls fit ``budget``: without bf16 in hardware (AVX2 only), a bf16
    matmul of 1024 took seconds a call, and ``doctor --seconds 0.2`` took 14 s (QA). Where the hardware computes
    it, a 1024 matmul takes milliseconds and is what is measured."""
    small = size // 4
    probe = make(small)
    probe()  # first-call costs
    seconds = math.inf
    for _ in range(2):  # the faster of two: a busy moment must not shrink a matmul the hardware runs fast
        start = time.perf_counter()
        probe()
        seconds = min(seconds, time.perf_counter() - start)
    while size > small and seconds * (size / small) ** 3 > budget:
        size //= 2
    return _rate(2.0 * size**3, make(size), budget)


def _rate(work: float, run: Any, budget: float) -> float:
    """``work`` units per second of ``run()``: the best of as many timed calls as fit in ``budget`` seconds, and
    at least one (the best, not the mean: a peak is what the machine can do when nothing else runs)."""
    run()  # warm-up: first-call allocations and kernel selection
    best, spent = float("inf"), 0.0
    while best == float("inf") or spent < budget:
        start = time.perf_counter()
        run()
        elapsed = time.perf_counter() - start
        best, spent = min(best, elapsed), spent + elapsed
    return work / best


def measure_peak(seconds: float = 2.0, threads: int | None = None, size: int = 1024) -> Peak:
    """Measure matmul throughput in fp32, bf16 and int8 and copy bandwidth, about ``seconds`` in all -- or, where
    ``seconds`` is shorter, the fixed cost of the bandwidth measurement (filling and first copying a buffer larger
    than any cache: 0.9 s on a quiet 2-core Xeon, 1.5 s under load); ``Peak.seconds`` says how long it took.

    GFLOP/s counts 2 FLOPs per multiply-add (int8: 2 integer ops), the convention of ``inspect``. int8 is an int8
    ``Linear`` layer (quantized weights and activations), the kernel fxforge's int8 models run. fp32 is the faster
    of ``torch.mm`` (MKL in torch's x86 builds) and oneDNN's matmul (what convolutions, Inductor and ONNX Runtime-like
    runtimes reach): on an AMD EPYC with AVX-512, MKL's sgemm ran at 210 GFLOP/s and oneDNN's at 455, so a
    peak from ``torch.mm`` alone put ONNX Runtime's resnet18 at 200% of it. ``Peak.notes`` says when they differ.
    """
    started = time.perf_counter()
    peak = Peak(threads=threads or torch.get_num_threads())
    generator = torch.Generator().manual_seed(0)
    with torch_threads(threads), torch.no_grad():
        # First, because its fixed cost is most of the time: the matmuls then share what is left of ``seconds``
        # (with ``seconds / 4`` each and the copy last, the 2 s default took 2.7 s).
        peak.bandwidth_gbs = _copy_bandwidth(seconds / 4)
        # at least a quarter of ``seconds`` for the three matmuls, however long the copy took
        share = max(seconds / 4, seconds - (time.perf_counter() - started)) / 4
        a = torch.randn(size, size, generator=generator)
        b = torch.randn(size, size, generator=generator)

        def matmul(dtype: torch.dtype) -> Callable[[int], Callable[[], Any]]:
            def make(n: int) -> Callable[[], Any]:
                left, right = a[:n, :n].to(dtype).contiguous(), b[:n, :n].to(dtype).contiguous()
                return lambda: torch.mm(left, right)

            return make

        peak.gflops["fp32"] = _fitting_rate(matmul(torch.float32), size, share) / 1e9
        onednn = _onednn_fp32_rate(a, b, size, share) / 1e9
        if onednn > _NOTED_KERNEL_GAP * peak.gflops["fp32"]:
            peak.mm_fp32 = peak.gflops["fp32"]
            peak.notes.append(
                f"fp32: torch.mm reached {peak.mm_fp32:.0f} GFLOP/s, oneDNN's matmul {onednn:.0f}: on this CPU, "
                "fp32 Linear layers and matmuls run through MKL at the lower rate (eager, TorchScript, Inductor), "
                "convolutions (oneDNN) and ONNX Runtime can reach the higher; the onednn_linear pass moves Linear "
                "layers to oneDNN (optimize --auto times it as fx+onednn_linear)"
            )
        peak.gflops["fp32"] = max(peak.gflops["fp32"], onednn)
        peak.gflops["bf16"] = _fitting_rate(matmul(torch.bfloat16), size, share) / 1e9
        with contextlib.suppress(RuntimeError):  # a torch build without an x86/fbgemm quantized engine
            int8 = _fitting_rate(lambda n: _int8_linear(a[:n, :n].contiguous(), n), size, share)
            peak.gflops["int8"] = int8 / 1e9
    peak.seconds = time.perf_counter() - started
    return peak


# oneDNN's fp32 matmul this much faster than torch.mm's is worth a note (two kernels of one machine agree within
# ~10% where both use its widest vectors)
_NOTED_KERNEL_GAP = 1.2


def _onednn_fp32_rate(a: torch.Tensor, b: torch.Tensor, size: int, budget: float) -> float:
    """FLOP/s of oneDNN's fp32 matmul (``torch.ops.mkldnn._linear_pointwise``, the kernel Inductor's packed
    linear layers call), or 0 where this torch build has no oneDNN."""
    onednn = onednn_linear_op()
    if not torch.backends.mkldnn.is_available() or onednn is None:
        return 0.0

    def make(n: int) -> Callable[[], Any]:
        left, right = a[:n, :n].contiguous(), b[:n, :n].contiguous()
        return lambda: onednn(left, right, None, "none", [], "")

    try:
        return _fitting_rate(make, size, budget)
    except (RuntimeError, TypeError):  # another signature in another torch version: torch.mm's figure stands
        return 0.0


def _copy_bandwidth(budget: float) -> float:
    """GB/s read and written by copying a buffer bigger than any last-level cache (server L3s reach hundreds of
    MiB), so that this measures memory, not cache; the 1.5 GiB are freed on return."""
    source = torch.ones(768 * 2**20 // 4)
    target = torch.empty_like(source)
    moved = 2.0 * source.numel() * source.element_size()  # read and write
    return _rate(moved, lambda: target.copy_(source), budget) / 1e9


def _int8_linear(values: torch.Tensor, size: int) -> Any:
    """A call of an int8 ``Linear`` (per-channel qint8 weights, quint8 activations) on a ``size`` x ``size`` batch:
    the kernel fxforge's int8 models run, with the engine torch picks for this CPU (x86/fbgemm/onednn)."""
    with quiet_quantization_notices():
        layer = nnq.Linear(size, size)
        scales = torch.full((size,), 0.02)
        weight = torch.quantize_per_channel(values, scales, torch.zeros(size, dtype=torch.long), 0, torch.qint8)
        layer.set_weight_bias(weight, torch.zeros(size))
        layer.scale, layer.zero_point = 0.1, 64
    activations = torch.quantize_per_tensor(values, 0.05, 64, torch.quint8)
    return lambda: layer(activations)


@dataclass
class Load:
    """How busy the CPUs were: the 1-minute load average (runnable threads, this process's included) and the
    machine's logical CPUs."""

    average: float
    cpus: int

    def others(self, own_threads: int) -> float:
        """Runnable threads beyond this run's own, on average: other work competing for the cores."""
        return self.average - min(own_threads, self.cpus)

    def busy(self, own_threads: int) -> bool:
        # one other runnable thread on average takes a core from a run that uses them all
        return self.others(own_threads) >= 1.0

    def describe(self, own_threads: int) -> str:
        """What :meth:`busy` found, for a warning line (bench's and doctor's say it alike)."""
        return (
            f"other work held the cores (load average {self.average:.1f} on {self.cpus} CPUs, "
            f"{own_threads} of it this run's at most)"
        )


def current_load() -> Load | None:
    """The load now (None where the OS has no load average)."""
    try:
        average = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    return Load(average, os.cpu_count() or 1)  # the load average counts the whole system's CPUs, as cpu_info does


@functools.lru_cache(maxsize=4)
def cached_peak(threads: int | None = None, seconds: float = 2.0) -> Peak:
    """:func:`measure_peak`, once per process and thread count."""
    return measure_peak(seconds, threads)


def describe(peak: Peak | None = None) -> str:
    """One line for the top of a benchmark table: CPU model, the features that matter, threads, torch."""
    cpu = cpu_info()
    features = " ".join(cpu.features) or "none of " + "/".join(RELEVANT_FLAGS[:4])
    line = (
        f"{cpu.model}; {cpu.cores} CPU{'' if cpu.cores == 1 else 's'}, torch threads {torch.get_num_threads()}; "
        f"features: {features}; "
        f"torch {torch.__version__} ({cpu.torch_capability or 'unknown ISA'})"
    )
    if peak is not None:
        mm = f" (torch.mm {peak.mm_fp32:.0f})" if peak.mm_fp32 is not None else ""  # MKL's rate, where far below
        gflops = ", ".join(f"{dtype} {rate:.0f}{mm if dtype == 'fp32' else ''}" for dtype, rate in peak.gflops.items())
        line += f"; peak GFLOP/s: {gflops}; copy {peak.bandwidth_gbs:.1f} GB/s"
    return line


def peak_dict(peak: Peak) -> dict[str, Any]:
    return asdict(peak)
