"""Capture and inspect a Llama-7B-shaped transformers model on the meta device: time and peak memory.

The model is ``transformers:LlamaForCausalLM`` built through :func:`fxforge.models.load_model` with
``device="meta"`` (no weight memory is allocated) from a Llama-2-7B-shaped config::

    hidden_size=4096 intermediate_size=11008 num_hidden_layers=32 num_attention_heads=32
    num_key_value_heads=32 vocab_size=32000

and captured + inspected on a 1x128 int64 ``input_ids`` tensor on meta. Each configuration runs in a
fresh subprocess, so that its peak RSS (``ru_maxrss`` of that process, read with ``os.wait4``) is its
own; the worker also reports its RSS right after importing torch/transformers/fxforge, so the part
of the peak that capture and inspect add can be read off.

**Workaround:** the config gets ``use_cache=False``. With the transformers default
(``use_cache=True``) the model returns a ``DynamicCache`` object, which ``torch.export`` cannot
flatten, and capture fails (symbolic tracing fails earlier for every transformers model); pass
``--use-cache`` to reproduce that.

Also runs the same thing through the CLI (``fxforge inspect ... --device meta``) and prints the tail
of its output. Not part of the test suite::

    .venv/bin/python benchmarks/inspect_meta_llama.py                 # layers 2, 8, 32 + the CLI
    .venv/bin/python benchmarks/inspect_meta_llama.py --layers 32 --no-cli --json
    .venv/bin/python benchmarks/inspect_meta_llama.py --layers 32 --use-cache   # shows the failure
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONFIG: dict[str, Any] = {
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
}
SEQ = 128
_FXFORGE = Path(sys.executable).with_name("fxforge")


def expected(config: dict[str, Any], seq: int) -> dict[str, int]:
    """Analytic parameter count and forward FLOPs (2 per multiply-add, matmuls only) of Llama."""
    h, i, layers, vocab = (config[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size"))
    per_layer_matmul = 4 * h * h + 3 * h * i  # q, k, v, o (n_kv == n_heads) and gate, up, down
    params = 2 * vocab * h + layers * (per_layer_matmul + 2 * h) + h  # untied embeddings, RMSNorm weights
    flops = 2 * seq * (layers * per_layer_matmul + vocab * h)  # projections and lm_head
    flops += layers * 2 * (2 * seq * seq * h)  # q @ k^T and attn @ v
    return {"params": params, "flops": flops}


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


def worker(layers: int, use_cache: bool) -> dict[str, Any]:
    """Runs in its own process: load on meta, capture, inspect; times and memory after each step."""
    start = time.perf_counter()
    import torch

    # Imported here so that their time and memory count as the baseline, not as part of "load".
    import transformers.models.llama.modeling_llama  # noqa: F401

    from fxforge.capture import capture
    from fxforge.errors import CaptureError
    from fxforge.inspect import inspect_graph
    from fxforge.models import load_model

    result: dict[str, Any] = {
        "layers": layers,
        "use_cache": use_cache,
        "import_s": time.perf_counter() - start,
        "rss_after_import_mib": _rss_mib(),
    }
    config = {**CONFIG, "num_hidden_layers": layers}
    if not use_cache:
        config["use_cache"] = False

    start = time.perf_counter()
    loaded = load_model("transformers:LlamaForCausalLM", device="meta", model_kwargs=config)
    result["load_s"] = time.perf_counter() - start
    result["maxrss_after_load_mib"] = _maxrss_mib()

    input_ids = torch.zeros(1, SEQ, dtype=torch.int64, device="meta")
    start = time.perf_counter()
    try:
        captured = capture(loaded, (input_ids,))
    except CaptureError as exc:
        result["capture_s"] = time.perf_counter() - start
        result["error"] = str(exc)
        result["attempts"] = [f"{a.strategy}: {a.error}" for a in exc.attempts]
        result["maxrss_mib"] = _maxrss_mib()
        return result
    result["capture_s"] = time.perf_counter() - start
    result["method"] = captured.record.method
    result["attempts"] = [f"{a.strategy}: {a.error}" for a in captured.record.attempts]
    result["maxrss_after_capture_mib"] = _maxrss_mib()

    start = time.perf_counter()
    report = inspect_graph(captured, include_code=False)
    result["inspect_s"] = time.perf_counter() - start
    result["totals"] = report.totals
    result["expected"] = expected(config, SEQ)
    result["maxrss_mib"] = _maxrss_mib()
    return result


def _run_child(cmd: list[str]) -> tuple[int, str, str, float, float]:
    """Run ``cmd``: (exit code, stdout, stderr, wall seconds, the child's own peak RSS in MiB).

    The child is reaped with ``os.wait4`` so that the rusage is that one process's, not the maximum
    over every child this process has waited for.
    """
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err_file:  # a file, not a pipe: no deadlock on a chatty stderr
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err_file, text=True)
        out = proc.stdout.read() if proc.stdout else ""
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err_file.seek(0)
        err = err_file.read()
    return proc.returncode, out, err, time.perf_counter() - start, usage.ru_maxrss / 1024


def cli_command(use_cache: bool) -> list[str]:
    cmd = [str(_FXFORGE), "inspect", "transformers:LlamaForCausalLM", "--device", "meta"]
    for key, value in CONFIG.items():
        cmd += ["--model-arg", f"{key}={value}"]
    if not use_cache:
        cmd += ["--model-arg", "use_cache=false"]
    return [*cmd, "--input", f"1x{SEQ}:int64"]


def machine() -> dict[str, Any]:
    import torch
    import transformers

    from fxforge.machine import cpu_info, describe

    cpu = cpu_info()
    return {
        "cpu": cpu.model,
        "features": cpu.features,
        "description": describe(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def _fmt_count(value: float, digits: int = 3) -> str:
    for threshold, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= threshold:
            return f"{value / threshold:.{digits}f}{suffix}"
    return f"{value:g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 8, 32], help="num_hidden_layers to run")
    parser.add_argument("--use-cache", action="store_true", help="keep transformers' use_cache=True (fails)")
    parser.add_argument("--no-cli", action="store_true", help="skip the fxforge inspect CLI run")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        print(json.dumps(worker(args.layers[0], args.use_cache)))
        return 0

    results = []
    for layers in args.layers:
        cmd = [sys.executable, __file__, "--worker", "--layers", str(layers)]
        if args.use_cache:
            cmd.append("--use-cache")
        code, out, err, wall, maxrss = _run_child(cmd)
        if code != 0:
            print(err, file=sys.stderr)
            raise SystemExit(f"worker for {layers} layers exited with {code}")
        result = json.loads(out.strip().splitlines()[-1])
        result["process_wall_s"] = wall
        result["process_maxrss_mib"] = maxrss
        results.append(result)

    cli: dict[str, Any] | None = None
    if not args.no_cli:
        cmd = cli_command(args.use_cache)
        code, out, err, wall, maxrss = _run_child(cmd)
        cli = {"command": cmd, "exit_code": code, "wall_s": wall, "maxrss_mib": maxrss, "output": out + err}

    info = machine()
    if args.json:
        print(json.dumps({"machine": info, "seq": SEQ, "results": results, "cli": cli}, indent=2))
        return 0

    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 140)
    console.print(
        f"Llama-7B-shaped LlamaForCausalLM on meta, input 1x{SEQ} int64; "
        f"transformers {info['transformers']}, Python {info['python']}"
    )
    console.print(f"machine: {info['description']}")
    console.print(f"config: {CONFIG}, use_cache={args.use_cache}")
    table = Table(title="Time (s) and peak RSS (MiB); every row is a fresh process")
    columns = ["layers", "nodes", "params", "FLOPs", "load s", "capture s", "inspect s", "process s"]
    columns += ["RSS MiB: imports / load / capture / inspect / exit", "inspect - imports"]
    for column in columns:
        table.add_column(column, justify="right")
    for r in results:
        totals = r.get("totals") or {}
        baseline = r["rss_after_import_mib"]
        table.add_row(
            str(r["layers"]),
            f"{totals['nodes']:,}" if totals else "FAILED",
            _fmt_count(totals["params"], 2) if totals else "-",
            _fmt_count(totals["flops"], 2) if totals else "-",
            f"{r['load_s']:.2f}",
            f"{r['capture_s']:.2f}",
            f"{r['inspect_s']:.2f}" if "inspect_s" in r else "-",
            f"{r['process_wall_s']:.2f}",
            " / ".join(
                f"{r[key]:.0f}" if key in r else "-"
                for key in (
                    "rss_after_import_mib",
                    "maxrss_after_load_mib",
                    "maxrss_after_capture_mib",
                    "maxrss_mib",
                    "process_maxrss_mib",
                )
            ),
            f"{r['maxrss_mib'] - baseline:.0f}",
        )
    console.print(table)
    console.print(
        "load/capture/inspect s: each step; process s: the whole subprocess, imports included. RSS: current RSS after "
        "imports (torch, transformers' Llama, fxforge), then peak RSS (ru_maxrss) after each step, then the process's "
        "peak read with os.wait4 after it exited (includes interpreter shutdown)"
    )
    for r in results:
        how = f"captured by {r['method']}" if "method" in r else "[red]capture failed[/]"
        console.print(f"{r['layers']} layers: {how}; earlier attempts: {'; '.join(r['attempts']) or 'none'}")
        if "error" in r:
            console.print(f"  error: {r['error']}", markup=False)
        if "totals" in r:
            exp, tot = r["expected"], r["totals"]
            console.print(
                f"  params {tot['params']:,} (analytic {exp['params']:,}), "
                f"FLOPs {tot['flops']:,} (analytic {exp['flops']:,}), "
                f"weights if materialised {tot['param_bytes'] / 2**30:.1f} GiB"
            )
    if cli is not None:
        console.print(
            f"\nCLI: exit {cli['exit_code']}, {cli['wall_s']:.2f} s wall, peak RSS {cli['maxrss_mib']:.0f} MiB\n$ "
            + " ".join(["fxforge", *cli["command"][1:]])
        )
        tail = "\n".join(cli["output"].rstrip().splitlines()[-14:])
        console.print(tail, markup=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
