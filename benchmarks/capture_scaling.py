"""How capture, inspect and lint scale with graph size.

Builds synthetic models whose captured graphs have about 1k, 10k and 100k nodes and times each
fxforge stage on them, next to the plain torch baseline on the same model:

* ``blocks``: ``nn.Sequential`` of tiny residual blocks (``x + relu(linear(x))`` on 2x4 tensors), so
  the number of submodules grows with the number of nodes (``call_module`` nodes, module summaries);
* ``chain``: one ``forward`` running a long loop of elementwise ops (add, mul, relu), no submodules.

Stages, each timed on its own (best of ``--repeat`` runs):

* ``plain``: ``torch.fx.symbolic_trace(model)`` -- or, with ``--method export``,
  ``torch.export.export(model, strict=False).module()``, the baseline fxforge's capture wraps;
* ``capture``: ``fxforge.capture.capture(model, inputs, check=False, method=...)``;
* ``capture+check``: the same with ``check=True`` (also runs model and graph once and compares);
* ``inspect``: ``fxforge.inspect.inspect_graph`` (one run under an Interpreter with a FLOP counter);
* ``lint``: ``fxforge.lint.lint`` with every rule.

Reports seconds, microseconds per node, fxforge/plain ratios, and per-node-time ratios between the
largest and the smaller sizes (1.0 means linear scaling). Not part of the test suite::

    .venv/bin/python benchmarks/capture_scaling.py                  # symbolic_trace, 1k/10k/100k
    .venv/bin/python benchmarks/capture_scaling.py --method export  # torch.export, 1k/3k/10k, blocks
    .venv/bin/python benchmarks/capture_scaling.py --sizes 1000 10000 --models chain --json
    .venv/bin/python benchmarks/capture_scaling.py --no-gc  # without cyclic-GC pauses in the timings
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from torch import fx, nn

from fxforge.capture import capture
from fxforge.inspect import inspect_graph
from fxforge.lint import lint
from fxforge.machine import cpu_info, describe

# Nodes each repeated unit adds to the captured graph, by capture method.
#   blocks/symbolic_trace: call_module fc, call_module act, add
#   blocks/export:         get_attr weight, get_attr bias, aten.linear, aten.relu, aten.add
#   chain:                 one node per elementwise op in both dialects
_NODES_PER_UNIT = {
    ("blocks", "symbolic_trace"): 3,
    ("blocks", "export"): 5,
    ("chain", "symbolic_trace"): 1,
    ("chain", "export"): 1,
}
_FIXED_NODES = 2  # placeholder + output


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.ReLU()
        # small weights: default ones grow x + relu(fc(x)) past float32's range within ~1000 blocks, and an output
        # that is all Inf is a failed capture check (nothing to compare), which stopped the 10k-node row
        with torch.no_grad():
            self.fc.weight.mul_(1e-3)
            self.fc.bias.mul_(1e-3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.fc(x))


class Chain(nn.Module):
    """``length`` elementwise ops in one forward; values stay bounded (no overflow on long chains)."""

    def __init__(self, length: int) -> None:
        super().__init__()
        self.length = length

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.length):
            kind = i % 3
            if kind == 0:
                x = x + 0.5
            elif kind == 1:
                x = x * 0.5
            else:
                x = torch.relu(x)
        return x


def build(model: str, method: str, nodes: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    units = max(1, (nodes - _FIXED_NODES) // _NODES_PER_UNIT[(model, method)])
    width = 4
    if model == "blocks":
        module: nn.Module = nn.Sequential(*[Block(width) for _ in range(units)])
    else:
        module = Chain(units)
    return module.eval(), (torch.randn(2, width),)


def _plain(method: str, model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> fx.GraphModule:
    if method == "export":
        with torch.no_grad():
            return torch.export.export(model, inputs, strict=False).module()
    return fx.symbolic_trace(model)


_GC_DURING_TIMING = True


def _best_of(repeat: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    best = float("inf")
    result = None
    for _ in range(repeat):
        result = None
        gc.collect()
        if not _GC_DURING_TIMING:
            gc.disable()
        try:
            start = time.perf_counter()
            result = fn()
            best = min(best, time.perf_counter() - start)
        finally:
            gc.enable()
    return best, result


@dataclass
class Row:
    model: str
    method: str
    target_nodes: int
    nodes: int
    stage: str
    seconds: float
    us_per_node: float
    vs_plain: float | None  # stage time / plain baseline time, for the capture stages


def run_size(model_name: str, method: str, target: int, repeat: int, stages: list[str]) -> list[Row]:
    model, inputs = build(model_name, method, target)
    fx_method = "symbolic_trace" if method == "symbolic_trace" else "export"
    times: dict[str, float] = {}
    captured = None
    for stage in stages:
        if stage == "plain":
            times[stage], _ = _best_of(repeat, partial(_plain, method, model, inputs))
        elif stage in ("capture", "capture+check"):
            check = stage == "capture+check"
            times[stage], captured = _best_of(repeat, partial(capture, model, inputs, method=fx_method, check=check))
            assert captured.record.ok, captured.record.checks
        else:
            if captured is None:
                captured = capture(model, inputs, method=fx_method, check=False)
            times[stage], _ = _best_of(repeat, partial(inspect_graph if stage == "inspect" else lint, captured))
    assert captured is not None, "no stage captured the model"
    assert captured.record.method == ("symbolic_trace" if method == "symbolic_trace" else "torch.export")
    nodes = len(captured.graph_module.graph.nodes)
    rows = []
    for stage, seconds in times.items():
        ratio = seconds / times["plain"] if stage.startswith("capture") and "plain" in times else None
        rows.append(Row(model_name, method, target, nodes, stage, seconds, seconds / nodes * 1e6, ratio))
    return rows


def warm_up(method: str) -> float:
    """First use of the FLOP counter (and of torch.export) imports torch._dynamo and friends: ~1-2 s, once."""
    start = time.perf_counter()
    model, inputs = build("blocks", method, 20)
    captured = capture(model, inputs, method="symbolic_trace" if method == "symbolic_trace" else "export")
    inspect_graph(captured)
    lint(captured)
    return time.perf_counter() - start


def scaling(rows: list[Row]) -> list[dict[str, Any]]:
    """Per-node time of the largest size divided by each smaller size's, per model and stage."""
    out = []
    for key in sorted({(r.model, r.stage) for r in rows}, key=lambda k: (k[0], _STAGE_ORDER.index(k[1]))):
        series = sorted((r for r in rows if (r.model, r.stage) == key), key=lambda r: r.nodes)
        if len(series) < 2:
            continue
        largest = series[-1]
        for smaller in series[:-1]:
            out.append(
                {
                    "model": key[0],
                    "stage": key[1],
                    "from_nodes": smaller.nodes,
                    "to_nodes": largest.nodes,
                    "size_ratio": largest.nodes / smaller.nodes,
                    "time_ratio": largest.seconds / smaller.seconds,
                    "per_node_ratio": largest.us_per_node / smaller.us_per_node,
                }
            )
    return out


_STAGE_ORDER = ["plain", "capture", "capture+check", "inspect", "lint"]


def machine() -> dict[str, Any]:
    cpu = cpu_info()
    return {
        "cpu": cpu.model,
        "features": cpu.features,
        "description": describe(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", choices=["symbolic_trace", "export"], default="symbolic_trace")
    parser.add_argument(
        "--sizes", type=int, nargs="+", help="target node counts (default: 1k 10k 100k; export: 1k 3k 10k)"
    )
    parser.add_argument("--models", nargs="+", choices=["blocks", "chain"], help="default: both (export: blocks)")
    parser.add_argument("--repeat", type=int, default=3, help="best of N for sizes up to 10k nodes (default 3)")
    parser.add_argument("--repeat-large", type=int, default=1, help="best of N above 10k nodes (default 1)")
    parser.add_argument("--no-gc", action="store_true", help="disable Python's cyclic GC inside timed calls")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args(argv)
    global _GC_DURING_TIMING
    _GC_DURING_TIMING = not args.no_gc

    export = args.method == "export"
    sizes = args.sizes or ([1_000, 3_000, 10_000] if export else [1_000, 10_000, 100_000])
    models = args.models or (["blocks"] if export else ["blocks", "chain"])
    # torch.export runs twice for capture+check; at these sizes that alone takes minutes, so skip it.
    stages = ["plain", "capture", "inspect", "lint"] if export else _STAGE_ORDER
    console = Console(stderr=True, highlight=False)

    warm = warm_up(args.method)
    rows: list[Row] = []
    for model_name in models:
        for size in sizes:
            if not args.json:
                console.print(f"[dim]{model_name} ~{size} nodes ...[/]")
            repeat = args.repeat if size <= 10_000 else args.repeat_large
            rows.extend(run_size(model_name, args.method, size, repeat, stages))
    ratios = scaling(rows)

    if args.json:
        payload = {
            "machine": machine(),
            "method": args.method,
            "gc_during_timing": _GC_DURING_TIMING,
            "warm_up_seconds": warm,
            "rows": [asdict(r) for r in rows],
            "scaling": ratios,
        }
        print(json.dumps(payload, indent=2))
        return 0

    out = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    info = machine()
    out.print(
        f"capture scaling, method={args.method}, gc {'on' if _GC_DURING_TIMING else 'off'} while timing; "
        f"Python {info['python']}"
    )
    out.print(f"machine: {info['description']}")
    out.print(f"one-time warm-up (lazy torch imports on first inspect/export): {warm:.2f} s")
    table = Table(title="Time per stage")
    for column, justify in (
        ("model", "left"),
        ("nodes", "right"),
        ("stage", "left"),
        ("seconds", "right"),
        ("µs/node", "right"),
        ("fxforge/plain", "right"),
    ):
        table.add_column(column, justify=justify)
    for row in rows:
        ratio = f"{row.vs_plain:.2f}x" if row.vs_plain is not None else ""
        table.add_row(row.model, f"{row.nodes:,}", row.stage, f"{row.seconds:.3f}", f"{row.us_per_node:.1f}", ratio)
    out.print(table)
    table = Table(title="Scaling: per-node time, largest / smaller (1.0 = linear)")
    for column in ("model", "stage", "nodes", "size x", "time x", "per-node x"):
        table.add_column(column, justify="left" if column in ("model", "stage") else "right")
    for item in ratios:
        table.add_row(
            item["model"],
            item["stage"],
            f"{item['from_nodes']:,} → {item['to_nodes']:,}",
            f"{item['size_ratio']:.1f}",
            f"{item['time_ratio']:.1f}",
            f"{item['per_node_ratio']:.2f}",
        )
    out.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
