"""Pass speed on synthetic graphs of about 1k, 10k and 100k nodes, side by side with the peers.

For each size, one run times:

* every registered fxforge pass that needs no options (`apply_pass`, which includes the copy of the
  graph that keeps the caller's model untouched), in microseconds per node;
* `fold_bn` against `torch.fx.experimental.optimization.fuse` (conv-BN fusion on the same model);
* fxforge `replace_pattern` against `torch.fx.subgraph_rewriter.replace_pattern` (same pattern, same
  graph), when the fxforge pass is registered.

Ratios are peer time / fxforge time (>1 means fxforge is faster). Linear scaling shows as a flat
microseconds-per-node column across sizes.

    .venv/bin/python benchmarks/passes_scaling.py [--sizes 1000,10000,100000] [--json]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from collections.abc import Callable

import torch
import torch.fx as fx
from torch import nn

from fxforge.machine import describe
from fxforge.passes import PASSES, PassError, PassSpec, all_passes, apply_pass, parse_options

NODES_PER_BLOCK = 7  # conv, bn, relu (functional), add, dropout, identity, mul-by-one


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 1)
        self.bn = nn.BatchNorm2d(2)
        self.dropout = nn.Dropout(0.1)
        self.identity = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)) + x)
        return self.identity(self.dropout(y)) * 1


def synthetic(nodes: int) -> nn.Module:
    return nn.Sequential(*[Block() for _ in range(max(1, nodes // NODES_PER_BLOCK))]).eval()


def _runs_without_options(spec: PassSpec) -> bool:
    """False for a pass whose options have required fields or defaults it rejects (a mapping, a pattern)."""
    try:
        parse_options(spec, {})
    except PassError:
        return False
    return True


def timed(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def pattern(x, y):
    return torch.relu(x + y)


def replacement(x, y):
    return torch.clamp(x + y, min=0)


def run(sizes: list[int]) -> list[dict]:
    from torch.fx.experimental.optimization import fuse
    from torch.fx.subgraph_rewriter import replace_pattern as fx_replace_pattern

    all_passes()
    rows: list[dict] = []
    for size in sizes:
        rows += _run_size(size, fuse, fx_replace_pattern)
    return rows


def _run_size(size: int, fuse: Callable, fx_replace_pattern: Callable) -> list[dict]:
    rows: list[dict] = []
    model = synthetic(size)
    gm = fx.symbolic_trace(model)
    n = len(gm.graph.nodes)
    repeats = 3 if n <= 20_000 else 1
    for spec in sorted(PASSES.values(), key=lambda p: p.name):
        if spec.options is not None and not _runs_without_options(spec):
            continue
        try:
            seconds = timed(lambda spec=spec: apply_pass(gm, spec.name), repeats)
        except Exception as exc:  # a pass that needs options we do not give: report, do not stop
            rows.append({"nodes": n, "pass": spec.name, "error": f"{type(exc).__name__}: {exc}"[:120]})
            continue
        row = {"nodes": n, "pass": spec.name, "seconds": seconds, "us_per_node": seconds / n * 1e6}
        if spec.name == "fold_bn":
            # fuse() traces and deep-copies the model itself: compare with trace + our pass.
            ours = timed(lambda: apply_pass(fx.symbolic_trace(model), "fold_bn", inplace=True), repeats)
            peer = timed(lambda: fuse(model), repeats)
            row.update(
                {
                    "peer": "fx.experimental.optimization.fuse",
                    "peer_seconds": peer,
                    "trace_plus_pass_seconds": ours,
                    "peer_over_fxforge": peer / ours,
                }
            )
        rows.append(row)
    if "replace_pattern" in PASSES:
        options = {"pattern": pattern, "replacement": replacement}
        ours = timed(lambda: apply_pass(gm, "replace_pattern", options), repeats)

        def peer_run() -> None:
            fx_replace_pattern(copy.deepcopy(gm), pattern, replacement)

        peer = timed(peer_run, repeats)
        rows.append(
            {
                "nodes": n,
                "pass": "replace_pattern (relu(x+y) -> clamp)",
                "seconds": ours,
                "us_per_node": ours / n * 1e6,
                "peer": "fx.subgraph_rewriter.replace_pattern",
                "peer_seconds": peer,
                "peer_over_fxforge": peer / ours,
            }
        )
    print(f"done {n} nodes", file=sys.stderr)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = run([int(s) for s in args.sizes.split(",")])
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="fxforge passes on synthetic graphs")
    for column in ("nodes", "pass", "seconds", "us/node", "peer", "peer s", "peer/fxforge"):
        table.add_column(column, justify="left" if column in ("pass", "peer") else "right")
    for r in rows:
        if "error" in r:
            table.add_row(str(r["nodes"]), r["pass"], "error", r["error"], "", "", "")
            continue
        table.add_row(
            f"{r['nodes']:,}",
            r["pass"],
            f"{r['seconds']:.3f}",
            f"{r['us_per_node']:.1f}",
            r.get("peer", ""),
            f"{r['peer_seconds']:.3f}" if "peer_seconds" in r else "",
            f"{r['peer_over_fxforge']:.2f}x" if "peer_over_fxforge" in r else "",
        )
    console = Console(width=140)
    console.print(table)
    console.print(f"machine: {describe()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
