"""Float vs int8 latency, side by side in one run: fxforge's int8 models against the float models and
against the same int8 models built by calling PyTorch's quantization API directly.

Models (random weights, batch 1):

* torchvision resnet18 and mobilenet_v2, static int8 (x86 backend): ``fxforge.quantize`` against
  ``torch.ao.quantization.quantize_fx.prepare_fx`` -> calibrate -> ``convert_fx`` called directly with
  the same qconfig mapping and the same calibration batches;
* a small BERT (transformers ``BertModel``: hidden 256, 4 layers, 4 heads, intermediate 1024), dynamic
  int8: ``fxforge.quantize(mode="dynamic")`` against ``torch.ao.quantization.quantize_dynamic``.

For each model the variants (float eager, fxforge int8, direct-API int8, and a second direct-API int8 build as
a noise control) are timed interleaved: every repeat times one call of each variant in a shuffled order, so
machine noise hits all alike, and the table reports medians. Speed-ups are float median / int8 median;
"fxforge / direct" is fxforge's int8 median over the direct API's (1.00 = no overhead: both are the same kind
of module, and the script checks that they compute the same outputs). Build times are reported too; fxforge's
includes its accuracy report (the float and int8 models run on the calibration batches).

    .venv/bin/python benchmarks/quantize_speed.py [--quick] [--threads N] [--repeats N] [--json]

``--quick`` uses smaller inputs (112x112 images, 32 tokens) and fewer repeats: it checks that the
script works, the ratios are only indicative.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

import fxforge
from fxforge.inputs import make_inputs, specs_of
from fxforge.machine import describe
from fxforge.quantize import RandomCalibrationWarning, quantize, quantized_engine
from fxforge.vocabulary import int8_weights

BERT_CONFIG = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024}
CALIBRATION_BATCHES = 8


@dataclass
class Case:
    name: str
    spec: str
    mode: str  # static or dynamic
    inputs: list[str]
    model_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Row:
    model: str
    mode: str
    input: str
    float_ms: float
    fxforge_ms: float
    direct_ms: float
    fxforge_speedup: float
    direct_speedup: float
    fxforge_over_direct: float
    fxforge_over_direct_best: float  # the same ratio of the fastest calls: steadier on a busy machine
    direct_again_over_direct: float  # a second direct build of the same model: the noise floor of the ratio
    same_outputs: bool
    fxforge_build_s: float
    direct_build_s: float
    int8_weight_mib: float
    float_weight_mib: float
    samples: int


def cases(quick: bool) -> list[Case]:
    image = "1x3x112x112" if quick else "1x3x224x224"
    tokens = "1x32:int64" if quick else "1x128:int64"
    return [
        Case("resnet18", "torchvision:resnet18", "static", [image]),
        Case("mobilenet_v2", "torchvision:mobilenet_v2", "static", [image]),
        Case("bert-small", "transformers:BertModel", "dynamic", [tokens], BERT_CONFIG),
    ]


def direct_static(model: nn.Module, example: tuple[Any, ...], calibration: list[tuple[Any, ...]]) -> nn.Module:
    """The same static int8 model, from PyTorch's FX graph-mode API called directly."""
    from torch.ao.quantization.qconfig_mapping import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    prepared = prepare_fx(copy.deepcopy(model).eval(), get_default_qconfig_mapping("x86"), example)
    with torch.no_grad():
        for batch in calibration:
            prepared(*batch)
    return convert_fx(prepared)


def direct_dynamic(model: nn.Module) -> nn.Module:
    """The same dynamic int8 model, from ``torch.ao.quantization.quantize_dynamic`` called directly."""
    from torch.ao.quantization import quantize_dynamic

    return quantize_dynamic(copy.deepcopy(model).eval(), {nn.Linear}, dtype=torch.qint8)


def _first_tensor(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output.dequantize() if output.is_quantized else output
    if hasattr(output, "to_tuple"):
        output = output.to_tuple()
    return _first_tensor(output[0])


def _timed(build: Callable[[], nn.Module]) -> tuple[nn.Module, float]:
    start = time.perf_counter()
    model = build()
    return model, time.perf_counter() - start


def _weight_mib(model: nn.Module) -> float:
    tensors = {id(p): p for p in model.parameters()}
    tensors.update({id(t): t for m in model.modules() for t in int8_weights(m)})
    return sum(t.numel() * t.element_size() for t in tensors.values()) / 2**20


def interleaved_samples(runners: dict[str, Callable[[], Any]], repeats: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per call of each runner; each repeat calls every runner once, in a freshly shuffled order.

    Shuffled, not rotated: a rotation keeps the cyclic order, so the int8 model placed after the float
    one always ran right after it and paid for the float weights having evicted the caches (10% on
    resnet18, while two identical direct builds timed equal). Seeded, so runs repeat.
    """
    for run in runners.values():
        for _ in range(warmup):
            run()
    names = list(runners)
    shuffler = random.Random(0)
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        shuffler.shuffle(names)
        for name in names:
            start = time.perf_counter()
            runners[name]()
            samples[name].append(time.perf_counter() - start)
    return samples


def measure(case: Case, repeats: int, warmup: int) -> Row:
    captured = fxforge.prepare(case.spec, case.inputs, model_kwargs=case.model_kwargs)
    example = tuple(captured.example_inputs)
    calibration = [make_inputs(specs_of(example), seed=1 + i) for i in range(CALIBRATION_BATCHES)]
    float_model = copy.deepcopy(captured.original).eval()

    ours, ours_build = _timed(lambda: quantize(captured, case.mode, "x86", calibration).model.eval())
    if case.mode == "static":
        theirs, theirs_build = _timed(lambda: direct_static(captured.original, example, calibration))
        again = direct_static(captured.original, example, calibration)
    else:
        theirs, theirs_build = _timed(lambda: direct_dynamic(captured.original))
        again = direct_dynamic(captured.original)

    inputs = make_inputs(specs_of(example), seed=1000)
    with torch.no_grad(), quantized_engine("x86"):
        same = torch.equal(_first_tensor(ours(*inputs)), _first_tensor(theirs(*inputs)))

        def call(model: nn.Module) -> Callable[[], Any]:
            return lambda: model(*inputs)

        samples = interleaved_samples(
            {"float": call(float_model), "fxforge": call(ours), "direct": call(theirs), "again": call(again)},
            repeats,
            warmup,
        )
    ms = {name: statistics.median(times) * 1e3 for name, times in samples.items()}
    best = {name: min(times) * 1e3 for name, times in samples.items()}
    return Row(
        model=case.name,
        mode=case.mode,
        input=",".join(case.inputs),
        float_ms=ms["float"],
        fxforge_ms=ms["fxforge"],
        direct_ms=ms["direct"],
        fxforge_speedup=ms["float"] / ms["fxforge"],
        direct_speedup=ms["float"] / ms["direct"],
        fxforge_over_direct=ms["fxforge"] / ms["direct"],
        fxforge_over_direct_best=best["fxforge"] / best["direct"],
        direct_again_over_direct=ms["again"] / ms["direct"],
        same_outputs=same,
        fxforge_build_s=ours_build,
        direct_build_s=theirs_build,
        int8_weight_mib=_weight_mib(ours),
        float_weight_mib=_weight_mib(float_model),
        samples=repeats,
    )


def render(rows: list[Row], threads: int) -> str:
    header = (
        "| model | int8 mode | input | float ms | fxforge int8 ms | direct int8 ms | speed-up fxforge | "
        "speed-up direct | fxforge / direct (median, best) | direct again / direct | same outputs | "
        "build s fxforge / direct | weights MiB |"
    )
    lines = [header, "|" + "---|" * 13]
    for r in rows:
        lines.append(
            f"| {r.model} | {r.mode} | {r.input} | {r.float_ms:.2f} | {r.fxforge_ms:.2f} | {r.direct_ms:.2f} | "
            f"{r.fxforge_speedup:.2f}x | {r.direct_speedup:.2f}x | "
            f"{r.fxforge_over_direct:.2f}, {r.fxforge_over_direct_best:.2f} | {r.direct_again_over_direct:.2f} | "
            f"{'yes' if r.same_outputs else 'NO'} | {r.fxforge_build_s:.1f} / {r.direct_build_s:.1f} | "
            f"{r.float_weight_mib:.1f} -> {r.int8_weight_mib:.1f} |"
        )
    lines.append("")
    lines.append(
        f"medians of {rows[0].samples if rows else 0} interleaved calls, batch 1, {threads} threads, engine x86; "
        f"machine: {describe()}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Small inputs, few repeats: checks the script works.")
    parser.add_argument("--repeats", type=int, default=None, help="Timed calls per variant (default 50; quick 10).")
    parser.add_argument("--warmup", type=int, default=3, help="Untimed calls per variant first.")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="Intra-op threads.")
    parser.add_argument("--models", default="", help="Comma-separated subset: resnet18,mobilenet_v2,bert-small.")
    parser.add_argument("--json", action="store_true", help="Print JSON rows instead of a markdown table.")
    args = parser.parse_args(argv)
    repeats = args.repeats or (10 if args.quick else 50)
    torch.set_num_threads(args.threads)
    chosen = [c for c in cases(args.quick) if not args.models or c.name in args.models.split(",")]
    rows = []
    with warnings.catch_warnings():
        # FX graph mode's deprecation notices and the random-calibration warning: expected here
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", RandomCalibrationWarning)
        warnings.filterwarnings("ignore", message=r".*(quant_min|quantize_per_tensor|TypedStorage).*")
        for case in chosen:
            print(f"measuring {case.name} ...", file=sys.stderr, flush=True)
            rows.append(measure(case, repeats, args.warmup))
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
    else:
        print(render(rows, args.threads))
    return 0 if all(r.same_outputs for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
