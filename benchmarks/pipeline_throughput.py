"""Pipeline throughput: a model split into 2 and 4 stages, run as processes on torch.distributed (gloo, CPU) with
GPipe and 1F1B at 1, 4 and 8 microbatches, against the unsplit model in one process.

The model (resnet18 at 1x3x224x224 by default: one image per microbatch) is split once per stage count with
``fxforge.split`` (balanced by FLOPs); every configuration is then one ``fxforge.run_pipeline`` launch, which
starts one process per stage (1 intra-op thread each), times ``--repeats`` batches per schedule after a warm-up
batch, verifies the output against the unsplit model, and times that model in the launching process with 1
thread and with as many threads as the stages use together (capped at the cores) on the same batch.

Rounds are interleaved: each round runs every configuration once, in a new shuffled order, so that drift in the
machine's speed spreads over all of them; the table reports the median over rounds of each launch's median.
Not part of the test suite::

    .venv/bin/python benchmarks/pipeline_throughput.py                       # resnet18, 3 rounds (~5 min)
    .venv/bin/python benchmarks/pipeline_throughput.py --rounds 1 --json
    .venv/bin/python benchmarks/pipeline_throughput.py --stages 2 --microbatches 8
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    """CPU model and the flags that change what is fast, cores, versions."""
    import torch

    from fxforge.machine import cpu_info, describe

    cpu = cpu_info()
    return {
        "cpu": cpu.model,
        "flags": cpu.features,
        "description": describe(),
        "cores": os.cpu_count(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="torchvision:resnet18")
    parser.add_argument("--input", default="1x3x224x224", help="one microbatch's shape")
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--microbatches", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5, help="timed batches per schedule per launch")
    parser.add_argument("--seed", type=int, default=0, help="seed for the order of the rounds")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    import fxforge

    info = machine()
    captured = fxforge.prepare(args.model, [args.input])
    root = Path(tempfile.mkdtemp(prefix="fxforge-pipeline-bench-"))
    splits: dict[int, dict[str, Any]] = {}
    for stages in args.stages:
        result = fxforge.split(captured, stages=stages, balance="flops", output_dir=root / f"stages-{stages}")
        splits[stages] = {"dir": root / f"stages-{stages}", "imbalance": result.plan.imbalance}
    configs = [(s, m) for s in args.stages for m in args.microbatches]
    runs: dict[tuple[int, int], list[Any]] = {c: [] for c in configs}
    rng = random.Random(args.seed)
    started = time.perf_counter()
    for round_index in range(args.rounds):
        order = configs[:]
        rng.shuffle(order)
        for stages, micro in order:
            run = fxforge.run_pipeline(
                splits[stages]["dir"], microbatches=micro, repeats=args.repeats, warmup=1, device="cpu"
            )
            if not run.ok:
                raise SystemExit(f"{stages} stages, {micro} microbatches: output does not match the model")
            runs[(stages, micro)].append(run)
            print(f"round {round_index + 1}: {stages} stages x {micro} microbatches done", file=sys.stderr)

    rows = []
    for (stages, micro), done in runs.items():
        row: dict[str, Any] = {"stages": stages, "microbatches": micro, "batch": done[0].batch}
        row["imbalance"] = splits[stages]["imbalance"]
        for name in ("gpipe", "1f1b"):
            values = [t.samples_per_s for run in done for t in run.schedules if t.schedule == name]
            row[name] = statistics.median(values) if values else None
        for base in done[0].baselines:
            values = [b.samples_per_s for run in done for b in run.baselines if b.threads == base.threads]
            row[f"one_process_{base.threads}t"] = statistics.median(values)
        row["launch_s"] = statistics.median(run.wall_s for run in done)
        rows.append(row)
    total_s = time.perf_counter() - started
    if args.json:
        print(json.dumps({"machine": info, "model": args.model, "input": args.input, "rows": rows}, indent=2))
        return 0

    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 130)
    console.print(f"{args.model}, microbatch {args.input}; Python {info['python']}, GPU: {info['gpu'] or 'none'}")
    console.print(f"machine: {info['description']}")
    threads = sorted({key for row in rows for key in row if key.startswith("one_process_")})
    table = Table(title=f"samples/s, median of {args.rounds} interleaved rounds x {args.repeats} batches")
    for column in ("stages", "imbalance", "microbatches", "batch", "gpipe", "1f1b"):
        table.add_column(column, justify="right")
    for key in threads:
        table.add_column(f"1 process, {key.removeprefix('one_process_').removesuffix('t')} thr", justify="right")
    table.add_column("gpipe / best 1 process", justify="right")
    table.add_column("launch s", justify="right")
    for row in rows:
        best = max(row[key] for key in threads) if threads else None
        cells = [str(row["stages"]), f"{row['imbalance']:.3f}", str(row["microbatches"]), str(row["batch"])]
        cells += [f"{row[name]:.1f}" if row[name] is not None else "-" for name in ("gpipe", "1f1b")]
        cells += [f"{row[key]:.1f}" for key in threads]
        cells.append(f"{row['gpipe'] / best:.2f}x" if best else "-")
        cells.append(f"{row['launch_s']:.1f}")
        table.add_row(*cells)
    console.print(table)
    console.print(
        "Each stage process runs 1 intra-op thread; 1f1b needs microbatches >= stages. launch s: one whole "
        "run_pipeline call (start-up, loading, every timed batch, the one-process baselines, verification). "
        f"Load average at the start: {info['load_average']}; {total_s:.0f} s in all."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
