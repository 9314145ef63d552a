"""fxforge ``optimize --auto`` against each peer used alone, in one interleaved run, as speedups over eager.

For each model and batch size, one :func:`fxforge.bench.bench` call times side by side (interleaved
rounds, same inputs, same threads):

* ``eager`` -- the model as built (the baseline: every number is eager's median / that median);
* ``fx-fuse`` -- ``torch.fx.experimental.optimization.fuse`` (conv-BN folding by symbolic tracing);
* ``jit`` -- ``torch.jit.trace``, ``torch.jit.freeze``, ``torch.jit.optimize_for_inference``, in memory;
* ``compile`` -- ``torch.compile`` (Inductor, static shapes, freezing on: fxforge's compile backend);
* ``ort`` -- ``torch.onnx.export`` (dynamo) as a user would call it, run by ONNX Runtime with the
  same thread count and non-spinning pool threads as fxforge's (spinning threads would slow down
  whatever the interleaved rounds run next);
* ``fxforge-auto`` -- what ``fxforge optimize --auto`` chose (every exact backend tried, verified
  within 1e-4, timed; its own selection run is separate from this measurement).

A peer that fails (``fx-fuse`` cannot trace transformers models) is reported with its reason. Every
row also states its max abs error against eager on the benchmark inputs.

Models: torchvision resnet18, mobilenet_v2, efficientnet_b0 (1x3x224x224 per sample) and a small
BERT built from a transformers config (2 layers, hidden 128, 2 heads; 64 token ids per sample).
Batch sizes 1 and 8. Random weights; randomised BatchNorm statistics (default ones make BN the
identity). Expect ~20-40 minutes on 2 cores (torch.compile dominates; ``--no-compile`` skips it).

    .venv/bin/python benchmarks/peers.py [--models resnet18,mobilenet_v2,efficientnet_b0,bert]
        [--batches 1,8] [--repeats 30] [--threads N] [--no-compile] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import fxforge
from fxforge.auto import Budget, auto_optimize
from fxforge.bench import Backend, bench, get_backend
from fxforge.capture import Captured
from fxforge.runtime import quiet_torch_logs

MODELS: dict[str, tuple[str, list[str], dict[str, Any]]] = {
    "resnet18": ("torchvision:resnet18", ["{b}x3x224x224"], {}),
    "mobilenet_v2": ("torchvision:mobilenet_v2", ["{b}x3x224x224"], {}),
    "efficientnet_b0": ("torchvision:efficientnet_b0", ["{b}x3x224x224"], {}),
    "bert": (
        "transformers:BertModel",
        ["{b}x64:int64"],
        {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "intermediate_size": 512},
    ),
}
PEERS = ["fx-fuse", "jit", "compile", "ort"]


def _randomize_batchnorm(model: nn.Module) -> None:
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.running_mean is not None:
                n = module.num_features
                module.running_mean.copy_(torch.randn(n, generator=generator) * 0.5)
                module.running_var.copy_(torch.rand(n, generator=generator) + 0.5)


def _fx_fuse(captured: Captured, settings: Any):
    from torch.fx.experimental.optimization import fuse

    return fuse(captured.original, inplace=False)


def _jit(captured: Captured, settings: Any):
    with torch.no_grad(), quiet_torch_logs():
        traced = torch.jit.trace(captured.original, captured.example_inputs, strict=False, check_trace=False)
        return torch.jit.optimize_for_inference(torch.jit.freeze(traced.eval()))


def _ort(captured: Captured, settings: Any):
    from fxforge.export import OnnxRuntimeModule

    path = settings.workdir / "peer.onnx"
    with quiet_torch_logs():
        program = torch.onnx.export(captured.original, captured.example_inputs, dynamo=True, verbose=False)
        program.save(str(path))
    return OnnxRuntimeModule(path, output_like=settings.output_like, threads=settings.threads)


PEER_BUILDERS = {"fx-fuse": _fx_fuse, "jit": _jit, "ort": _ort}


def run_one(name: str, batch: int, repeats: int, threads: int, with_compile: bool) -> dict[str, Any]:
    spec, inputs, kwargs = MODELS[name]
    captured = fxforge.prepare(spec, [s.format(b=batch) for s in inputs], model_kwargs=kwargs)
    _randomize_batchnorm(captured.original)
    candidates = ["eager", "fx", "torchscript", "onnxruntime"] + (["compile"] if with_compile else [])
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir:
        auto = auto_optimize(captured, Path(workdir) / "auto", budget=Budget(), backends=candidates, threads=threads)
    auto_seconds = time.perf_counter() - start
    chosen = auto.runner
    backends = [get_backend("eager")]
    for peer in PEERS:
        if peer == "compile":
            if with_compile:
                backends.append(Backend("compile", "torch.compile", get_backend("compile").build))
            continue
        backends.append(Backend(peer, peer, PEER_BUILDERS[peer]))
    backends.append(Backend("fxforge-auto", f"fxforge --auto ({auto.chosen})", lambda c, s: chosen))
    report = bench(captured, backends, repeats=repeats, threads=threads)
    rows = {row.backend: row for row in report.rows}
    return {
        "model": name,
        "batch": batch,
        "auto_choice": auto.chosen,
        "auto_passes": auto.passes,
        "auto_seconds": round(auto_seconds, 1),
        "eager_ms": rows["eager"].median_ms,
        "speedup": {b: rows[b].speedup for b in rows if b != "eager"},
        "max_abs_err": {b: rows[b].max_abs_err for b in rows if b != "eager"},
        "errors": {b: rows[b].error for b in rows if rows[b].error},
        "rows": [row.to_dict() for row in report.rows],
    }


def _render(results: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    columns = [p for p in PEERS if any(p in r["speedup"] for r in results)] + ["fxforge-auto"]
    table = Table(title="speedup over eager (eager median / median; >1 is faster)")
    for column in ("model", "batch", "eager ms", *columns, "auto chose"):
        table.add_column(column, justify="left" if column in ("model", "auto chose") else "right")
    for result in results:
        cells = []
        for column in columns:
            if column in result["errors"]:
                cells.append("failed")
            else:
                value = result["speedup"].get(column)
                cells.append("-" if value is None else f"{value:.2f}x")
        table.add_row(result["model"], str(result["batch"]), f"{result['eager_ms']:.2f}", *cells, result["auto_choice"])
    console = Console(width=140)
    console.print(table)
    for result in results:
        for backend, error in result["errors"].items():
            console.print(f"[dim]{result['model']} batch {result['batch']} {backend}: {error}[/]")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (slow to compile)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = []
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            print(f"{name} batch {batch} ...", file=sys.stderr, flush=True)
            results.append(run_one(name, batch, args.repeats, args.threads, not args.no_compile))
    if args.json:
        print(json.dumps(results, indent=2, default=str))
    else:
        _render(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
