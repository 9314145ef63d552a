"""fxforge ``optimize --auto`` against each peer used alone, in one interleaved run per model and batch size.

For each model and batch size, one :func:`fxforge.bench.bench` call times every column side by side (shuffled
rounds, same inputs, same threads; median, p10 and p90 of the rounds):

* ``eager`` -- the model as built (every ``vs eager`` ratio is eager's median over the row's);
* ``eager+cl`` -- conv nets only: the model and its input in channels-last layout (``model.to(memory_format=
  torch.channels_last)``, the input converted on each call), what the PyTorch tuning guide suggests;
* ``fx`` -- fxforge's ``fx`` backend: the captured GraphModule rewritten with fxforge's exact passes;
* ``jit`` -- ``torch.jit.trace``, ``torch.jit.freeze``, ``torch.jit.optimize_for_inference``, in memory;
* ``compile`` -- ``torch.compile`` with Inductor's ``freezing=True`` (PyTorch's advice for CPU inference);
* ``ort`` -- fxforge's ONNX export of the captured graph (no fxforge passes), run by ONNX Runtime with its
  *default* session options (threads, graph optimisation level), except that pool threads stop spinning when a
  call returns (``session.force_spinning_stop``): by default they go on spinning after each call and would slow
  whichever column runs next. Alone, this runs as fast as the defaults (mobilenet_v2, batch 1: 2.7 vs 2.9 ms);
  *no* spinning (``allow_spinning=0``, this benchmark's earlier setting) made it 1.9x slower. The intra-op thread
  count is set to torch's (ONNX Runtime's default count on these machines, one per core): left at its default,
  ONNX Runtime also pins its threads to cores, and pinned they collided with torch's threads in the interleaved
  rounds (AMD EPYC, mobilenet_v2, batch 1: 3.1 ms pinned, 2.5 ms not, 2.0 ms for both run alone);
* ``auto`` -- ``fxforge.auto_optimize`` (what ``fxforge optimize --auto -o DIR`` runs: exact candidates only, no
  accuracy budget), its output directory loaded back with ``fxforge.load_model(DIR)``, which is what users get;
* ``auto-budget`` -- the same with an accuracy budget, so reduced precision (int8, and bf16 where the CPU runs it
  natively) may be chosen: ``--min-agreement`` (top-1 agreement with the float model) for classifiers, a normwise
  ``--tolerance`` for models whose output is not a class score. The benchmark has no real data: agreement and
  error are measured **on random inputs**, so this column shows speed under a budget, not accuracy on real data.
  To save time the budget run's candidates are eager, the exact run's choice and the reduced-precision candidates
  ``--auto`` would try on this machine (exactly the choice a full run could make, minus re-timing the losers).

``best peer`` is the fastest of eager, eager+cl, fx, jit, compile and ort on that row; ``auto / best`` is the
best peer's median over auto's, with a 95% bootstrap interval of the per-round ratios (``fxforge.bench.
ratio_interval``: rounds are paired, so machine noise cancels). Each row's ``of peak`` is its GFLOP/s over the
measured matmul peak of its precision (``fxforge.machine``), so the distance to the machine's limit is visible.

Models: torchvision resnet18, resnet50, mobilenet_v2, mobilenet_v3_large, efficientnet_b0 (224x224), a small ViT
(transformers ViTModel: hidden 384, 12 layers, 6 heads, 224x224 images, patch 16), BERT-base (BertModel's default
config, 128 tokens) and GPT-2 small (GPT2Model's default config, 128 tokens). Random weights, eval mode,
BatchNorm statistics measured on random inputs (activations keep a trained network's scale). Batch 1 and 8.

Big models take long: each (model, batch) run's timed rounds are capped by ``--budget-seconds`` (estimated from
eager's latency; never fewer than 5 rounds), and ``--dry-run`` prints the plan with a time estimate.

    .venv/bin/python benchmarks/peers.py [--models resnet18,...] [--batches 1,8] [--repeats 30]
        [--budget-seconds 120] [--quick] [--budget-models M,...] [--results FILE] [--threads N] [--out DIR]
        [--json | --markdown] [--dry-run]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

import fxforge
from fxforge.artifacts import ONNX_FILE, ChannelsLastModule, OnnxRuntimeModule
from fxforge.auto import (
    REDUCED_BACKENDS,
    AutoResult,
    AutoWarning,
    Budget,
    auto_optimize,
    candidate_backends,
)
from fxforge.bench import (
    NOISY_SPREAD,
    SETTLE_CALLS,
    SETTLE_SECONDS,
    Backend,
    artifact_backend,
    bench,
    get_backend,
    ratio_interval,
)
from fxforge.capture import Captured
from fxforge.doctor import versions
from fxforge.errors import one_line_reason
from fxforge.export import export_model
from fxforge.machine import cached_peak, cpu_info, describe, native_bf16, native_int8_dot
from fxforge.runtime import quiet_torch_logs


@dataclass(frozen=True)
class Model:
    spec: str
    input: str  # with {b} for the batch size
    kwargs: dict[str, Any] = field(default_factory=dict)
    conv: bool = False  # a conv net: channels-last is worth trying
    classifier: bool = False  # 2-D class scores: the budget is top-1 agreement
    gflop: float = 0.0  # per sample (2 FLOPs per multiply-add), for the time estimate only
    efficiency: float = 0.5  # eager's rough fraction of the fp32 matmul peak, for the time estimate only
    compile_s: float = 60.0  # rough seconds to compile one Inductor/AOTInductor candidate on 2 cores


VISION = "{b}x3x224x224"
MODELS: dict[str, Model] = {
    "resnet18": Model("torchvision:resnet18", VISION, conv=True, classifier=True, gflop=3.6, efficiency=0.6),
    "resnet50": Model("torchvision:resnet50", VISION, conv=True, classifier=True, gflop=8.2, compile_s=120),
    "mobilenet_v2": Model(
        "torchvision:mobilenet_v2", VISION, conv=True, classifier=True, gflop=0.6, efficiency=0.2, compile_s=60
    ),
    "mobilenet_v3_large": Model(
        "torchvision:mobilenet_v3_large", VISION, conv=True, classifier=True, gflop=0.44, efficiency=0.15
    ),
    "efficientnet_b0": Model(
        "torchvision:efficientnet_b0", VISION, conv=True, classifier=True, gflop=0.8, efficiency=0.15, compile_s=90
    ),
    "vit_small": Model(
        "transformers:ViTModel",
        VISION,
        {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6, "intermediate_size": 1536},
        gflop=9.2,
        compile_s=90,
    ),
    "bert_base": Model("transformers:BertModel", "{b}x128:int64", gflop=22.4, compile_s=90),
    "gpt2_small": Model("transformers:GPT2Model", "{b}x128:int64", gflop=22.0, compile_s=90),
}
PEERS = ("eager", "eager+cl", "fx", "jit", "compile", "ort")
COLUMNS = (*PEERS, "auto", "auto-budget")
MIN_REPEATS = 5
# the budget for reduced precision (on random inputs: see the module docstring)
AGREEMENT = 0.99
TOLERANCE = 0.05


# --------------------------------------------------------------------------------------------------
# the peers, each as a user would run it alone


def _calibrate_batchnorm(model: nn.Module, example: str) -> None:
    """Give every BatchNorm the statistics of the activations it sees on random inputs, as training would.

    Random weights with default statistics (mean 0, var 1) shrink activations layer after layer: random
    mobilenet_v2's logits are ~1e-9, which int8 rounds to 0 (top-1 agreement 0 with float, an artifact of the
    weights). Statistics measured on the model's own activations keep every BN's output at unit scale, like a
    trained network's, so the reduced-precision columns measure what they would on a real model.
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    if not norms:
        return
    from fxforge.inputs import make_inputs, parse_input_spec

    specs = [parse_input_spec(example)]
    # Only the norms train: the rest of the model runs as in eval, so that dropout and stochastic depth (random in
    # training mode: efficientnet_b0's statistics differed from run to run) neither drop blocks nor draw the RNG.
    model.eval()
    for module in norms:
        module.reset_running_stats()
        module.momentum = None  # a cumulative average over the batches below
        module.train()
    with torch.no_grad():
        for seed in range(8):
            model(*make_inputs(specs, seed=1000 + seed))
    for module in norms:
        module.momentum = 0.1
    model.eval()


def _channels_last(captured: Captured, settings: Any) -> nn.Module:
    return ChannelsLastModule(captured.original).eval()


def _jit(captured: Captured, settings: Any):
    with torch.no_grad(), quiet_torch_logs():
        traced = torch.jit.trace(captured.original, captured.example_inputs, strict=False, check_trace=False)
        return torch.jit.optimize_for_inference(torch.jit.freeze(traced.eval()))


class _DefaultOrt(OnnxRuntimeModule):
    """fxforge's ONNX Runtime wrapper (tensors in, the model's output structure out), with a session built from
    ONNX Runtime's default options but for threads that stop spinning when a call returns (module docstring)."""

    def __init__(self, path: Path, output_like: Any) -> None:
        super().__init__(path, output_like)
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.add_session_config_entry("session.force_spinning_stop", "1")
        options.intra_op_num_threads = torch.get_num_threads()  # its default count, without pinning (docstring)
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _ort(captured: Captured, settings: Any):
    path = settings.workdir / ONNX_FILE
    result = export_model(captured, "onnx", path, verify_export=False, force=True)
    settings.notes.append(f"{result.exporter} exporter, opset {result.opset}; ONNX Runtime's default session options")
    return _DefaultOrt(path, settings.output_like)


# --------------------------------------------------------------------------------------------------
# one model at one batch size


def _rounds(eager_s: float, columns: int, budget_s: float, most: int) -> int:
    """Timed rounds that fit ``budget_s`` (a round runs every column once, after untimed settling calls of the
    same column, at least SETTLE_CALLS and SETTLE_SECONDS: see ``fxforge.bench``; assume each call about eager's
    time)."""
    round_s = columns * (max(eager_s * SETTLE_CALLS, SETTLE_SECONDS) + eager_s)
    return max(MIN_REPEATS, min(most, int(budget_s / max(round_s, 1e-6))))


def _eager_seconds(captured: Captured) -> float:
    with torch.no_grad():
        captured.original(*captured.example_inputs)
        start = time.perf_counter()
        captured.original(*captured.example_inputs)
    return time.perf_counter() - start


def _budget(model: Model) -> Budget:
    return Budget(min_agreement=AGREEMENT) if model.classifier else Budget(tolerance=TOLERANCE)


def _with_budget(name: str, args: argparse.Namespace) -> bool:
    """Whether the row of model ``name`` gets the auto-budget column (``--budget-models``; default: every model)."""
    return args.budget_models is None or name in args.budget_models.split(",")


def _budget_candidates(captured: Captured, budget: Budget, exact: str, quick: bool) -> list[str]:
    """eager, the exact run's choice, and the reduced-precision candidates ``--auto`` would try here."""
    tried = candidate_backends(captured, None, budget, quick)
    reduced = [b.name for b in tried if b.base in REDUCED_BACKENDS or b.precision != "fp32"]
    return list(dict.fromkeys(["eager", exact, *reduced]))


@dataclass(frozen=True)
class Trained:
    """A model with trained weights and the labelled data its budget is judged on (``budget_digits.py``)."""

    module: nn.Module
    data: Any  # (inputs, labels), read by fxforge.quantize.load_calibration
    source: str  # what the data is, for the tables
    budget: Budget | None = None  # the auto-budget column's budget (None: the random-weight rows' budget)
    calibration: Any = None  # other samples to calibrate int8 on (--calibration-data); None: calibrated on ``data``


def _calibration(trained: Trained | None, column: str, backends: list[str] | None) -> Any:
    """The budget column's ``calibration_data``: only where an int8 candidate will read it (``--auto`` refuses
    calibration data that no candidate reads)."""
    if trained is None or column != "auto-budget" or trained.calibration is None:
        return None
    if backends is not None and not any(get_backend(b).precision == "int8" for b in backends):
        return None
    return trained.calibration


def run_one(
    name: str, batch: int, args: argparse.Namespace, workdir: Path, trained: Trained | None = None
) -> dict[str, Any]:
    """One row: ``--auto`` (exact, then under the budget) and every peer, timed side by side. Without ``trained``
    the model has random weights (BatchNorm statistics measured) and the budget is judged on random inputs."""
    model = MODELS[name]
    if trained is None:
        module = fxforge.load_model(model.spec, model_kwargs=model.kwargs).module
        _calibrate_batchnorm(module, model.input.format(b=8))
    else:
        module = trained.module
    captured = fxforge.prepare(module, [model.input.format(b=batch)])
    threads = args.threads or torch.get_num_threads()
    columns = len(PEERS) + 2 - (0 if model.conv else 1)
    eager_s = _eager_seconds(captured)
    repeats = _rounds(eager_s, columns, args.budget_seconds, args.repeats)
    auto_repeats = _rounds(eager_s, 10, args.budget_seconds, 10 if args.quick else 30)
    print(f"{name} batch {batch}: eager ~{eager_s * 1e3:.0f} ms, {repeats} rounds", file=sys.stderr, flush=True)

    runs: dict[str, AutoResult] = {}
    auto_s: dict[str, float] = {}
    errors: dict[str, str] = {}
    directory = workdir / f"{name}-b{batch}"
    budget = trained.budget if trained is not None and trained.budget is not None else _budget(model)
    wanted = [("auto", Budget()), ("auto-budget", budget)]
    if not _with_budget(name, args):
        wanted = wanted[:1]  # the budget column is left out of this row ("-" in the tables)
    for column, run_budget in wanted:
        start = time.perf_counter()
        exact = runs["auto"].chosen if "auto" in runs else "eager"
        backends = None if column == "auto" else _budget_candidates(captured, budget, exact, args.quick)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", AutoWarning)  # random inputs: stated in every table's legend
                runs[column] = auto_optimize(
                    captured,
                    directory / column,
                    budget=run_budget,
                    backends=backends,
                    data=trained.data if trained is not None and column == "auto-budget" else None,
                    calibration_data=_calibration(trained, column, backends),
                    repeats=auto_repeats,
                    threads=threads,
                    quick=args.quick,
                    force=True,
                )
        except Exception as exc:  # reported as the column's failure; the peers are still measured
            errors[column] = f"failed: {one_line_reason(exc)}"
            print(f"  {column} {errors[column]}", file=sys.stderr, flush=True)
        auto_s[column] = time.perf_counter() - start
        print(
            f"  {column}: {runs[column].chosen if column in runs else 'failed'} ({auto_s[column]:.0f} s)",
            file=sys.stderr,
            flush=True,
        )

    backends = [get_backend("eager")]
    if model.conv:
        backends.append(Backend("eager+cl", "eager in channels-last layout", _channels_last))
    backends += [
        get_backend("fx"),
        Backend("jit", "torch.jit.trace + freeze + optimize_for_inference", _jit),
        get_backend("compile"),
        Backend("ort", "fxforge's ONNX export, ONNX Runtime default session", _ort),
    ]
    for column, result in runs.items():
        precision = get_backend(result.chosen).precision
        # loaded back with fxforge.load_model, the artifact as users get it (we wrote it ourselves: pickles trusted)
        loaded_back = artifact_backend(directory / column, name=column, trust_pickle=True)
        backends.append(dataclasses.replace(loaded_back, summary=f"{column}: {result.chosen}", precision=precision))
    report = bench(captured, backends, repeats=repeats, threads=threads)
    source = trained.source if trained is not None else "random inputs"
    return _summarise(name, batch, model, report, runs, auto_s, eager_s, budget, errors, source)


def _summarise(name, batch, model, report, runs, auto_s, eager_s, budget, errors, source) -> dict[str, Any]:
    rows = {row.backend: row for row in report.rows}
    peers = [rows[p] for p in PEERS if p in rows and rows[p].median_ms]
    best = min(peers, key=lambda row: row.median_ms) if peers else None
    columns: dict[str, Any] = {}
    for column, row in rows.items():
        entry = {
            "median_ms": row.median_ms,
            "p10_ms": row.p10_ms,
            "p90_ms": row.p90_ms,
            "vs_eager": row.speedup,
            "vs_best_peer": best.median_ms / row.median_ms if best and row.median_ms else None,
            "gflops": row.gflops,
            "peak_fraction": row.peak_fraction,
            "precision": row.precision,
            "max_abs_err": row.max_abs_err,
            "build_s": row.build_s,
            "faults_per_call": row.faults_per_call,  # a slow row with many: see fxforge.callstack
            "error": row.error,
            "notes": row.notes,
        }
        if column in runs and best is not None and row.round_ms:
            # the best peer's time over this column's, round by round: >1 means faster than the best peer
            interval = ratio_interval(best.round_ms, row.round_ms)
            entry["vs_best_peer_ci"] = list(interval) if interval else None
        columns[column] = entry
    auto = {}
    for column, result in runs.items():
        chosen = next(c for c in result.candidates if c.name == result.chosen)
        auto[column] = {
            "chosen": result.chosen,
            "load": result.load,
            "files": result.files,
            "passes": result.passes,
            "seconds": {k: round(v, 1) for k, v in result.seconds.items()},
            "wall_s": round(auto_s[column], 1),
            "top1_agreement": chosen.top1_agreement,
            "verified_on": chosen.verified_on,
            "candidates": {c.name: c.status for c in result.candidates},
            # why a candidate was not chosen where it was not merely slower: a rejection read as "ONNX Runtime lost"
            # in the summary of a run that kept no reason (efficientnet_b0 b8, 2026-11-28)
            "reasons": {c.name: c.reason for c in result.candidates if c.status in ("rejected", "failed")},
        }
    return {
        "model": name,
        "spec": model.spec,
        "input": model.input.format(b=batch),
        "batch": batch,
        "repeats": report.repeats,
        "eager_probe_ms": round(eager_s * 1e3, 2),
        "best_peer": best.backend if best else None,
        "budget": {
            "min_agreement": budget.min_agreement,
            "max_drop": budget.max_drop,
            "tolerance": budget.tolerance,
            "data": source,
        },
        "columns": columns,
        "auto": {**auto, **errors},
    }


# --------------------------------------------------------------------------------------------------
# the time estimate


def estimate(names: list[str], batches: list[int], args: argparse.Namespace, peak_gflops: float) -> float:
    """Rough seconds for the whole run on this machine, in eager calls (``e``) and compilations.

    Each ``--auto`` run verifies its exact passes (~70 e) and every candidate (16 cases, model and candidate: 32 e;
    reduced precision: 8 batches, 16 e), times ``rounds x candidates`` calls, and compiles each ``compile``
    candidate ahead of time; the peers add one torch.compile, an ONNX export, warm-up and the timed rounds.
    """
    total = 0.0
    for name in names:
        model = MODELS[name]
        exact = (4 if args.quick else 6 + (2 if model.conv else 0)) - 1  # besides eager
        compiles = 1 if args.quick else 1 + (1 if model.conv else 0)  # ahead-of-time compiled candidates
        reduced = 1 if args.quick else len(REDUCED_BACKENDS)
        columns = len(PEERS) + 2 - (0 if model.conv else 1)
        for batch in batches:
            e = model.gflop * batch / (peak_gflops * model.efficiency)
            scale = 1.5 if batch > 1 else 1.0  # compiling and exporting for a bigger batch takes a little longer
            repeats = _rounds(e, columns, args.budget_seconds, args.repeats)
            auto_repeats = _rounds(e, 10, args.budget_seconds, 10 if args.quick else 30)
            auto = (compiles * model.compile_s + 15 * exact) * scale + (70 + 32 * exact + auto_repeats * exact) * e
            budget = 30 * scale + (70 + 64 + 16 * reduced + auto_repeats * (2 + reduced)) * e
            peers = (0.5 * model.compile_s + 30) * scale + (3 * columns + repeats * columns) * e
            if not _with_budget(name, args):
                budget = 0.0
            total += auto + budget + peers
    return total


# --------------------------------------------------------------------------------------------------
# output


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _cell(result: dict[str, Any], column: str, key: str = "vs_eager") -> str:
    entry = result["columns"].get(column)
    if entry is None:
        return "failed" if column in result["auto"] else "-"
    if entry["error"]:
        return "failed"
    # a column whose rounds ran at two speeds (ONNX Runtime's pool threads starved, 2026-11-29: p10 4.4 ms, median
    # 20 ms) is marked, so that a ratio against it is not read as a result
    noisy = entry.get("p10_ms") and entry.get("p90_ms") and entry["p90_ms"] / entry["p10_ms"] > NOISY_SPREAD
    return _ratio(entry[key]) + ("~" if noisy else "")


def _auto_cell(result: dict[str, Any], column: str) -> str:
    entry = result["columns"].get(column)
    if entry is None or entry["error"]:
        return "failed"
    interval = entry.get("vs_best_peer_ci")
    if not interval:
        return _ratio(entry["vs_best_peer"])
    # the median of the paired per-round ratios, the estimate the interval is about (a ratio of the two medians
    # can fall outside it when one column has a few slow rounds)
    return f"{_ratio(interval[0])} ({interval[1]:.2f}-{interval[2]:.2f})"


def _chosen(result: dict[str, Any], column: str) -> str:
    if column not in result["auto"]:
        return "-"  # not run (--budget-models)
    run = result["auto"][column]
    return run["chosen"] if isinstance(run, dict) else "failed"


def _best_peak(result: dict[str, Any]) -> str:
    best = result["best_peer"]
    return _percent(result["columns"][best]["peak_fraction"]) if best else "-"


SUMMARY = (
    "model",
    "batch",
    "eager ms",
    *PEERS[1:],
    "best peer",
    "of peak",
    "auto",
    "auto/best (95% CI)",
    "auto chose",
    "of peak ",
    "budget",
    "budget/best",
    "budget chose",
)


def _summary_row(result: dict[str, Any]) -> list[str]:
    eager = result["columns"]["eager"]
    auto = result["columns"].get("auto") or {}
    return [
        result["model"],
        str(result["batch"]),
        "-" if eager["median_ms"] is None else f"{eager['median_ms']:.2f}",
        *[_cell(result, p) for p in PEERS[1:]],
        result["best_peer"] or "-",
        _best_peak(result),
        _cell(result, "auto"),
        _auto_cell(result, "auto"),
        _chosen(result, "auto"),
        _percent(auto.get("peak_fraction")),
        _cell(result, "auto-budget"),
        _cell(result, "auto-budget", "vs_best_peer"),
        _chosen(result, "auto-budget"),
    ]


LEGEND = (
    "eager ms: eager's median; peers, auto and budget: speedup over eager (eager median / median; >1 is faster); "
    "best peer: the fastest of eager, eager+cl, fx, jit, compile, ort; of peak: that peer's (then auto's) GFLOP/s "
    "over the measured matmul peak of its precision; auto/best: the median of the per-round ratios (best peer's "
    "time over auto's in the same round) with its 95% bootstrap interval; budget: --auto with --min-agreement "
    "0.99 (classifiers) or --tolerance 0.05 (others), judged on random inputs, not real data; ~: that column's "
    f"rounds spread wider than {NOISY_SPREAD}x (p90 over p10), so its median, and a ratio to it, is unreliable"
)


def render(results: list[dict[str, Any]], machine: str, header: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    console.print(header)
    console.print(f"machine: {machine}")
    for result in results:
        table = Table(title=f"{result['model']}  {result['input']}  {result['repeats']} interleaved rounds")
        table.add_column("column", no_wrap=True)
        for column in (
            "median ms",
            "p10",
            "p90",
            "vs eager",
            "vs best peer",
            "GFLOP/s",
            "of peak",
            "max abs err",
            "build s",
            "note",
        ):
            table.add_column(column, justify="left" if column == "note" else "right")
        for column, entry in result["columns"].items():
            if entry["error"]:
                table.add_row(column, *["-"] * 9, entry["error"][:80])
                continue
            note = _chosen(result, column) if column in result["auto"] else ""
            if column == result["best_peer"]:
                note = "best peer"
            table.add_row(
                column,
                f"{entry['median_ms']:.2f}",
                f"{entry['p10_ms']:.2f}",
                f"{entry['p90_ms']:.2f}",
                _ratio(entry["vs_eager"]),
                _auto_cell(result, column) if column in result["auto"] else _ratio(entry["vs_best_peer"]),
                "-" if entry["gflops"] is None else f"{entry['gflops']:.0f}",
                _percent(entry["peak_fraction"]) + ("" if entry["precision"] == "fp32" else f" {entry['precision']}"),
                "-" if entry["max_abs_err"] is None else f"{entry['max_abs_err']:.2g}",
                "-" if entry["build_s"] is None else f"{entry['build_s']:.1f}",
                note,
            )
        console.print(table)
        for column, run in result["auto"].items():
            if not isinstance(run, dict):
                console.print(f"[dim]{column}: {run}[/]")
            else:
                agreement = run["top1_agreement"]
                on = f", top-1 agreement {agreement:.4f} on {run['verified_on']}" if agreement is not None else ""
                console.print(
                    f"[dim]{column}: chose {run['chosen']}{on}; --auto took {run['wall_s']:.0f} s "
                    f"({', '.join(f'{k} {v:.0f} s' for k, v in run['seconds'].items() if k != 'total')})[/]"
                )
    table = Table(title="summary: speedup over eager")
    for column in SUMMARY:
        table.add_column(
            column, justify="left" if column in ("model", "best peer", "auto chose", "budget chose") else "right"
        )
    for result in results:
        table.add_row(*_summary_row(result))
    console.print(table)
    console.print(f"[dim]{LEGEND}[/]")


def markdown(results: list[dict[str, Any]], machine: str, header: str) -> str:
    lines = [
        f"Machine: {machine}",
        "",
        header,
        "",
        "| " + " | ".join(c.strip() for c in SUMMARY) + " |",
        "|" + "---|" * len(SUMMARY),
    ]
    lines += ["| " + " | ".join(_summary_row(result)) + " |" for result in results]
    lines += ["", LEGEND + "."]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------


def _load_results(path: str | None, machine: str) -> list[dict[str, Any]]:
    """The rows an earlier run saved in ``path`` (JSON lines); a row from another machine is refused, since ratios
    only compare within one machine."""
    if not path or not Path(path).exists():
        return []
    entries = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    cpu = machine.split(";")[0]
    for entry in entries:
        other = entry["machine"].split(";")[0]
        if other != cpu:
            raise SystemExit(f"{path} holds rows from another machine ({other}); not mixed")
    return entries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--repeats", type=int, default=30, help="most timed rounds per (model, batch)")
    parser.add_argument(
        "--budget-seconds",
        type=float,
        default=120.0,
        help="seconds of timed rounds per (model, batch), fewer rounds for big models (min 5)",
    )
    parser.add_argument("--quick", action="store_true", help="--auto --quick (fewer candidates, 10 rounds)")
    parser.add_argument("--threads", type=int, default=None, help="default: torch's")
    parser.add_argument("--out", default=None, help="keep --auto's output directories here (default: temporary)")
    parser.add_argument(
        "--budget-models",
        default=None,
        help="comma-separated: only these models get the auto-budget column (default: every model)",
    )
    parser.add_argument(
        "--results",
        default=None,
        help="a JSON-lines file: each (model, batch) is appended as soon as it is measured, those already in it "
        "are skipped, and the tables show every row in it (a run cut off resumes where it stopped)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the time estimate, run nothing")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true")
    output.add_argument("--markdown", action="store_true", help="the summary table in Markdown (docs/benchmarks.md)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r}; known: {', '.join(MODELS)}")
    batches = [int(b) for b in args.batches.split(",")]
    threads = args.threads or torch.get_num_threads()

    peak = cached_peak(threads)
    machine = describe(peak)
    cpu = cpu_info()
    found = versions()
    header = (
        f"torch {found.get('torch')}, onnxruntime {found.get('onnxruntime')}, transformers "
        f"{found.get('transformers')}, Python {found.get('python')}; {threads} threads; native bf16: "
        f"{'yes' if native_bf16(cpu) else 'no'}, int8 dot products (VNNI/AMX): "
        f"{'yes' if native_int8_dot(cpu) else 'no'}"
    )
    seconds = estimate(names, batches, args, peak.gflops["fp32"])
    print(f"machine: {machine}\n{header}", file=sys.stderr)
    print(
        f"plan: {', '.join(names)} at batch {', '.join(map(str, batches))}; estimated {seconds / 60:.0f} min "
        "(rough: compilation and big models dominate)",
        file=sys.stderr,
        flush=True,
    )
    if args.dry_run:
        for name in names:
            minutes = estimate([name], batches, args, peak.gflops["fp32"]) / 60
            print(f"  {name}: ~{minutes:.0f} min", file=sys.stderr)
        return 0
    started = time.perf_counter()
    saved = _load_results(args.results, machine)
    results = [entry["result"] for entry in saved]
    done = {(r["model"], r["batch"]) for r in results}
    with tempfile.TemporaryDirectory(prefix="fxforge-peers-") as scratch:
        workdir = Path(args.out) if args.out else Path(scratch)
        for name in names:
            for batch in batches:
                if (name, batch) in done:
                    print(f"{name} batch {batch}: already in {args.results}, skipped", file=sys.stderr)
                    continue
                results.append(run_one(name, batch, args, workdir))
                # Compiled candidates stay referenced from torch.compile's caches: without this the whole
                # 16-row run grew past 24 GB and was killed on its last row.
                torch._dynamo.reset()
                gc.collect()
                if args.results:
                    with open(args.results, "a") as file:
                        entry = {"machine": machine, "header": header, "result": results[-1]}
                        file.write(json.dumps(entry, default=str) + "\n")
    results.sort(key=lambda r: (list(MODELS).index(r["model"]), r["batch"]))  # saved rows first otherwise
    header += f"; this run {(time.perf_counter() - started) / 60:.0f} min"
    if saved:
        header += f" ({len(saved)} row(s) from earlier runs in {args.results})"
    if args.json:
        print(json.dumps({"machine": machine, "header": header, "results": results}, indent=2, default=str))
    elif args.markdown:
        print(markdown(results, machine, header))
    else:
        render(results, machine, header)
    return 0


if __name__ == "__main__":
    sys.exit(main())
