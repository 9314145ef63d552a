"""Distributed: run a split model's stages as a pipeline on ``torch.distributed`` and check what comes out.

Owns :func:`run_pipeline` (``fxforge run-pipeline``): one process per stage on this machine, each loading only
its own stage from a directory written by ``fxforge split -o``, wired together by PyTorch's own engine --
``torch.distributed`` (gloo on the CPU, NCCL on GPUs) and ``torch.distributed.pipelining``'s
:class:`~torch.distributed.pipelining.PipelineStage` with its :class:`~torch.distributed.pipelining.ScheduleGPipe`
or :class:`~torch.distributed.pipelining.Schedule1F1B`. Rank 0 feeds the microbatches, the last rank gathers
the output, which the parent compares with the unsplit model (``model.pt2``, or a pickled ``model.pt``) and times
against one process.

The same module is the worker every rank runs (``python -m fxforge.distributed DIR ...``), which is also what
``torchrun`` starts across machines: it reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT`` from the environment, as torchrun sets them; there the last rank verifies and prints.

Failures: every rank writes what it is doing (loading, connecting, computing microbatch i, waiting for a
peer, done) to a status file, and its first error line to an error file. The parent watches the processes; when
one exits with an error, dies, or the run passes ``timeout`` seconds, it kills every rank's process group and
raises :class:`PipelineError` naming the stage that failed first (a stage that merely lost its peer is not
blamed) with its first error line, or the stage that hung and what it was doing. Ctrl-C kills them too; a rank
whose parent is gone removes the parent's work directory and exits by itself. Nothing is left running.

``FXFORGE_PIPELINE_FAULT=K:raise|hang|exit`` makes stage ``K`` fail on its first microbatch (raise an error, hang,
or exit at once): a way to check that a deployment's timeouts and clean-up work, used by the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn

from fxforge import display
from fxforge.artifacts import MODEL_FILE, PROGRAM_FILE
from fxforge.capture import random_sources, randomness_hint
from fxforge.compare import compare_outputs
from fxforge.errors import (
    EXIT_FINDINGS,
    EXIT_USAGE,
    FxforgeError,
    InputSpecError,
    ModelSpecError,
    command_line_wording,
    first_line,
    one_line_reason,
    option,
    said,
)
from fxforge.inputs import InputSpec, check_fits_in_memory, make_inputs, parse_input_spec
from fxforge.models import pickle_trusted
from fxforge.runtime import preserved_state, quiet_torch_logs, use_ieee_float32
from fxforge.split import (
    SplitPlan,
    joins_along_batch,
    load_plan,
    load_reference,
    load_stage,
    missing_reference_reason,
    repeatable,
    split_batch,
    tensor_leaves,
)

SCHEDULES = ("gpipe", "1f1b")
FAULT_ENV = "FXFORGE_PIPELINE_FAULT"
FAULT_KINDS = ("raise", "hang", "exit")
_PARENT_ENV = "FXFORGE_PIPELINE_PARENT"
# set by a launcher called from Python: a rank's messages then name run_pipeline's parameters (trust_pickle=True)
_PYTHON_WORDING_ENV = "FXFORGE_PIPELINE_PYTHON_WORDING"
_OUTPUTS_FILE = "outputs.pt"
_WORK_PREFIX = "fxforge-pipeline-"  # the launcher's temporary directory, where the ranks report
DEFAULT_TIMEOUT = 300.0


class PipelineError(FxforgeError):
    """A stage failed, died or hung; every process was stopped. Exit code 1 (the run failed), or 2 where a stage
    refused its input while loading (a corrupt or foreign stage file, one that does not match plan.json)."""

    exit_code = EXIT_FINDINGS

    def __init__(self, message: str, stage: int | None, hint: str | None = None, *, bad_input: bool = False) -> None:
        super().__init__(message, hint)
        self.stage = stage
        if bad_input:
            self.exit_code = EXIT_USAGE


# --------------------------------------------------------------------------------------------------
# results


@dataclass
class ScheduleTiming:
    """One schedule's runs of the whole batch: median seconds per batch and what that is in samples/s."""

    schedule: str
    median_s: float
    samples_per_s: float
    speedup: float | None  # versus the fastest one-process run (None when none was timed)
    times_s: list[float]


@dataclass
class Baseline:
    """The unsplit model in one process on the same batch."""

    threads: int
    median_s: float
    samples_per_s: float
    per_microbatch: bool  # model.pt2 is fixed to one batch size: run once per microbatch


@dataclass
class OutputCheck:
    """The pipeline's output against the unsplit model's on the same batch."""

    ok: bool
    max_abs_err: float
    max_rel_err: float
    problems: list[str]
    reference: str  # what the reference was


@dataclass
class PipelineRun:
    """``fxforge run-pipeline``'s answer."""

    directory: str
    stages: int
    microbatches: int
    batch: int
    inputs: list[str]
    backend: str
    device: str
    threads: int  # per stage process
    schedules: list[ScheduleTiming]
    baselines: list[Baseline]  # one process with 1 thread, and with as many threads as the stages use together
    check: OutputCheck | None
    output_shapes: list[list[int]]
    wall_s: float
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.check is None or self.check.ok

    def __repr__(self) -> str:  # the dataclass's would print every timing list
        return display.pipeline_run_repr(self)

    def _repr_html_(self) -> str:  # Jupyter shows this for the last value of a cell
        return display.pipeline_run_html(self)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


# --------------------------------------------------------------------------------------------------
# shared by the parent and the ranks


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise FxforgeError(f"the plan names an unknown dtype {name!r}")
    return value


def microbatch_size(plan: SplitPlan) -> int:
    """The batch size the stages were split at: every microbatch has it (the stage programs are fixed to it)."""
    batches = {spec.shape[0] for spec in plan.input_specs if spec.shape}
    if len(batches) != 1:
        raise FxforgeError(
            "cannot pipeline this split: its inputs do not share one batch dimension "
            f"({', '.join(plan.inputs) or 'no tensor inputs'})"
        )
    return batches.pop()


def run_inputs(plan: SplitPlan, microbatches: int, inputs: Sequence[str | InputSpec] | None) -> list[InputSpec]:
    """The whole batch's input specs: the split's example shapes with ``microbatches`` times its batch, or the
    user's (which must be exactly that: each microbatch has the shape the stages were split at)."""
    if microbatches < 1:
        raise InputSpecError(f"{option('--microbatches')} must be at least 1, got {microbatches}")
    micro = microbatch_size(plan)
    expected = [spec.with_batch(micro * microbatches) for spec in plan.input_specs]
    if not inputs:
        return expected
    given = [s if isinstance(s, InputSpec) else parse_input_spec(s) for s in inputs]
    if given != expected:
        want = " ".join(f"--input {spec}" for spec in expected)
        raise InputSpecError(
            f"the stages were split at {', '.join(plan.inputs)} (one microbatch); {microbatches} microbatches "
            f"make {', '.join(map(str, expected))}, not {', '.join(map(str, given))}",
            hint=f"pass {want}, or split again at the microbatch shape you want (fxforge split MODEL --input ...)",
        )
    return given


def reference_outputs(
    module: nn.Module, batch_inputs: tuple[torch.Tensor, ...], microbatches: int
) -> tuple[list[torch.Tensor], bool]:
    """The unsplit model's output tensors on the whole batch; when its program is fixed to one batch size, it runs
    once per microbatch and the outputs are concatenated, as the pipeline's are. Also says which it was."""
    with torch.no_grad(), quiet_torch_logs():
        try:
            return tensor_leaves(module(*batch_inputs)), False
        except Exception:  # a program specialised to the split's batch size
            chunks = [tensor_leaves(module(*mb)) for mb in split_batch(batch_inputs, microbatches)]
    return [torch.cat(parts) for parts in zip(*chunks)], True


def check_outputs(
    reference: tuple[nn.Module, str],
    batch_inputs: tuple[torch.Tensor, ...],
    outputs: Sequence[torch.Tensor],
    microbatches: int,
) -> OutputCheck:
    """Compare the pipeline's gathered outputs with the unsplit model's (fxforge.compare's tolerances)."""
    module, name = reference
    expected, per_microbatch = reference_outputs(module, batch_inputs, microbatches)
    comparison = compare_outputs(tuple(expected), tuple(outputs))
    how = f"{name} run once per microbatch (fixed to one batch size)" if per_microbatch else name
    problems = comparison.problems[:5]
    sources = random_sources(module) if not comparison.ok and isinstance(module, fx.GraphModule) else []
    if sources:
        # the graph names what draws (QA: insert_after's noise was said as "a buffer written in forward, or random
        # numbers", and --microbatches 1 cannot help: the stages draw in other processes than the reference)
        problems.append(
            f"{randomness_hint(sources, module)}: the pipeline's stages draw other numbers than {name} does, so "
            "their outputs differ at any --microbatches"
        )
        return OutputCheck(comparison.ok, comparison.max_abs_err, comparison.max_rel_err, problems, how)
    joinable = per_microbatch or microbatches == 1
    if comparison.ok or joinable:
        return OutputCheck(comparison.ok, comparison.max_abs_err, comparison.max_rel_err, problems, how)
    with preserved_state(*[module] if isinstance(module, nn.Module) else []):
        stateful = not repeatable(module, batch_inputs)
    if stateful:
        # QA: a model adding to a buffer in forward was said to mix samples across the batch, which it did not
        problems.append(
            "the model changes its own state when it runs (a buffer written in forward, or random numbers): each "
            "microbatch sees the state the one before it left, where one call on the whole batch does not, so run it "
            "with --microbatches 1 to compare"
        )
    elif not joins_along_batch(module, batch_inputs, microbatches):
        # say why no pipeline can match: QA saw only "shape (64, 2) != (16, 8)" for a model returning q.t()
        problems.append(
            "the model's whole-batch output is not its microbatches' outputs joined along dim 0 (an output whose "
            "first dimension is not the batch, or one computed across samples): a pipeline joins microbatch outputs "
            "along dim 0, so run it with --microbatches 1"
        )
    return OutputCheck(comparison.ok, comparison.max_abs_err, comparison.max_rel_err, problems, how)


def _backend_and_device(device: str, local_rank: int, local_world: int) -> tuple[str, torch.device]:
    """(process-group backend, device) of one rank. ``auto`` takes a GPU per rank only where this machine has one
    for each of its ``local_world`` ranks (NCCL refuses two ranks on one GPU); otherwise the CPU with gloo."""
    if device == "auto":
        enough = torch.cuda.is_available() and torch.cuda.device_count() >= local_world
        device = "cuda" if enough else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise FxforgeError("--device cuda, but torch sees no GPU")
        return "nccl", torch.device("cuda", local_rank % torch.cuda.device_count())
    return "gloo", torch.device("cpu")


def full_fp32_on_gpu() -> None:
    """Make float32 convolutions and matmuls on CUDA compute in float32, not TF32, for this stage process: the
    pipeline's outputs are checked against the model with float32 tolerances, and a TF32 resnet18 stage missed
    them by 100x (max abs error 1.4e-3, measured on an H200)."""
    use_ieee_float32()


def _run_options(
    stages: int,
    microbatches: int | None,
    schedules: Sequence[str] | None,
    repeats: int,
    warmup: int,
    threads: int,
    timeout: float,
    notes: list[str],
) -> tuple[int, list[str]]:
    """The microbatch count and the schedules to run, checked before any stage starts: the same defaults and
    refusals for ``run-pipeline`` and for the worker under torchrun (torch's own error comes late, on every rank)."""
    microbatches = microbatches if microbatches is not None else max(4, stages)
    if microbatches < 1:
        raise InputSpecError(f"{option('--microbatches')} must be at least 1, got {microbatches}")
    chosen = _schedules(schedules, microbatches, stages, notes)
    if repeats < 1 or warmup < 0 or threads < 1:
        raise InputSpecError(
            f"{option('--repeats')} and {option('--threads')} must be at least 1, {option('--warmup')} at least 0"
        )
    if not (timeout > 0):
        raise InputSpecError(f"{option('--timeout')} must be positive, got {timeout}")
    return microbatches, chosen


def _require_reference(directory: Path, plan: SplitPlan) -> None:
    """Verifying needs the unsplit model the split wrote: a directory that lost it is refused up front, unless the
    split said why it could not write one (then the run is not verified, and says so)."""
    if (directory / PROGRAM_FILE).exists() or (directory / MODEL_FILE).exists():
        return
    if missing_reference_reason(plan) is None:
        raise ModelSpecError(
            f"{directory} has no {PROGRAM_FILE}: the unsplit model, which fxforge split wrote to verify the "
            "pipeline's output against, is missing",
            hint=f"copy {PROGRAM_FILE} along with the stages, or pass --no-verify to run without checking the output",
        )


# --------------------------------------------------------------------------------------------------
# the worker (one rank)


class _Status:
    """What this rank is doing, in a small file the parent reads when the run times out."""

    def __init__(self, directory: Path | None, rank: int) -> None:
        self.rank = rank
        self.path = directory / f"status_{rank}" if directory else None

    def __call__(self, text: str) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.write_text(text)


class _Monitored(nn.Module):
    """The stage module, reporting when it computes (so a hang inside it is told from waiting for a peer), and
    failing on purpose when ``FXFORGE_PIPELINE_FAULT`` names this stage."""

    def __init__(self, inner: nn.Module, rank: int, status: _Status, fault: str | None) -> None:
        super().__init__()
        self.inner = inner
        self.rank = rank
        self.status = status
        self.fault = fault
        self.label = ""
        self.calls = 0
        self.computing = False
        self.error: BaseException | None = None  # the stage's own error (the schedule re-raises it wrapped)

    def forward(self, *args: Any) -> Any:
        self.status(f"computing microbatch {self.calls} ({self.label})")
        self.computing = True
        try:
            if self.fault is not None:
                _inject(self.fault)
            result = self.inner(*args)
        except BaseException as exc:
            self.error = exc
            raise
        self.computing = False
        self.calls += 1
        self.status(f"waiting for a peer ({self.label})")
        return result


def _inject(fault: str) -> None:
    if fault == "raise":
        raise RuntimeError(f"injected fault ({FAULT_ENV})")
    if fault == "exit":
        os._exit(3)
    while True:  # "hang"
        time.sleep(3600)


def _requested_fault() -> tuple[int, str] | None:
    """The (stage, kind) ``FXFORGE_PIPELINE_FAULT`` asks for (``1:raise``), or None where it asks for none it can."""
    stage, _, kind = os.environ.get(FAULT_ENV, "").partition(":")
    return (int(stage), kind) if stage.strip().isdigit() and kind in FAULT_KINDS else None


def _check_fault_setting(world: int) -> None:
    """A fault asked for in words the stages do not read ran a healthy pipeline: whoever tests their timeouts
    would believe the fault had been injected."""
    text = os.environ.get(FAULT_ENV, "")
    if not text:
        return
    fault = _requested_fault()
    if fault is None or fault[0] >= world:
        raise FxforgeError(
            f"{FAULT_ENV}={text!r} names no fault this pipeline can inject",
            hint=f"STAGE:KIND with STAGE from 0 to {world - 1} and KIND raise, hang or exit; or unset it",
        )


def _fault_for(rank: int) -> str | None:
    fault = _requested_fault()
    return fault[1] if fault is not None and fault[0] == rank else None


def _watch_parent(result_dir: Path | None) -> None:
    """Exit when the launching fxforge process is gone (killed with SIGKILL, say), instead of waiting forever, and
    remove its work directory: nobody else will (every rank may try; the first one removes it)."""
    parent = os.environ.get(_PARENT_ENV)
    if not parent:
        return

    def watch() -> None:
        while True:
            if os.getppid() != int(parent):
                # only a directory the launcher made: --result-dir is a hidden option, but someone may pass one
                if result_dir is not None and result_dir.name.startswith(_WORK_PREFIX):
                    shutil.rmtree(result_dir, ignore_errors=True)
                os._exit(1)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()


def _example(infos: Sequence[Any], device: torch.device) -> tuple[torch.Tensor, ...]:
    return tuple(torch.empty(info.shape, dtype=_dtype(info.dtype), device=device) for info in infos)


@dataclass
class _Rank:
    """What one rank works with: its place in the pipeline, its stage, and where it reports."""

    rank: int
    world: int
    directory: Path
    plan: SplitPlan
    device: torch.device
    backend: str
    module: _Monitored
    specs: list[InputSpec]
    inputs: tuple[torch.Tensor, ...]  # the whole batch on rank 0, nothing elsewhere
    notes: list[str] = field(default_factory=list)  # printed by the last rank under torchrun


def _load_rank(args: argparse.Namespace, status: _Status) -> _Rank:
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    torch.set_num_threads(args.threads)
    directory = Path(args.directory)
    status("loading")
    plan = load_plan(directory)
    if world != len(plan.stages):
        raise InputSpecError(
            f"{directory} holds {display.counted(len(plan.stages), 'stage')}, but "
            f"{display.counted(world, 'process', 'processes')} {'was' if world == 1 else 'were'} started",
            hint=f"start one process per stage: torchrun --nproc-per-node {len(plan.stages)} (in all)",
        )
    notes: list[str] = []
    # before the stage loads: a bad option should cost nothing (what run-pipeline checks before starting ranks)
    args.microbatches, args.schedule = _run_options(
        world, args.microbatches, args.schedule, args.repeats, args.warmup, args.threads, args.timeout, notes
    )
    if rank == world - 1 and args.verify and args.result_dir is None:
        # under torchrun the last rank verifies (under run-pipeline the launcher does, and checked already): a
        # missing model.pt2 should fail now, not after the whole run
        _require_reference(directory, plan)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    backend, device = _backend_and_device(args.device, local_rank, local_world)
    if device.type == "cuda":
        full_fp32_on_gpu()
    module = load_stage(directory, rank, trust_pickle=args.trust_pickle or None, device=device)
    monitored = _Monitored(module, rank, status, _fault_for(rank))
    specs = run_inputs(plan, args.microbatches, args.input)
    inputs = tuple(t.to(device) for t in make_inputs(specs, seed=args.seed)) if rank == 0 else ()
    return _Rank(rank, world, directory, plan, device, backend, monitored, specs, inputs, notes)


def _run_schedules(args: argparse.Namespace, me: _Rank, status: _Status) -> tuple[dict[str, list[float]], Any]:
    """Each schedule over the whole batch, ``warmup`` + ``repeats`` times; a run is timed between two barriers."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    classes = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
    status("connecting")
    dist.init_process_group(me.backend, timeout=datetime.timedelta(seconds=args.timeout))
    stage_plan = me.plan.stages[me.rank]
    times: dict[str, list[float]] = {}
    output: Any = None
    for name in args.schedule:
        me.module.label = name
        # shapes given up front (static mode): the stages exchange no pickled metadata
        stage = PipelineStage(
            me.module,
            me.rank,
            me.world,
            me.device,
            input_args=_example(stage_plan.inputs, me.device),
            output_args=_example(stage_plan.outputs, me.device),
        )
        schedule = classes[name](stage, args.microbatches)
        times[name] = []
        for run in range(args.warmup + args.repeats):
            dist.barrier()
            start = time.perf_counter()
            with torch.no_grad():
                output = schedule.eval(*me.inputs) if me.rank == 0 else schedule.eval()
            dist.barrier()
            if run >= args.warmup:
                times[name].append(time.perf_counter() - start)
    dist.destroy_process_group()
    return times, output


def _worker(args: argparse.Namespace) -> int:
    result_dir = Path(args.result_dir) if args.result_dir else None
    status = _Status(result_dir, int(os.environ.get("RANK", "0")))
    monitored: _Monitored | None = None
    _watch_parent(result_dir)
    try:
        me = _load_rank(args, status)
        monitored = me.module
        times, output = _run_schedules(args, me, status)
        status("done")
        last = me.rank == me.world - 1
        outputs = [t.cpu() for t in tensor_leaves(output)] if last else []
        if result_dir is None:  # under torchrun: the last rank reports
            return _report(me, args, outputs, times) if last else 0
        (result_dir / f"times_{me.rank}.json").write_text(json.dumps(times))
        if last:
            torch.save(outputs, result_dir / _OUTPUTS_FILE)
        return 0
    except BaseException as exc:
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            raise
        return _failed(exc, monitored, status, result_dir)


def _failed(exc: BaseException, monitored: _Monitored | None, status: _Status, result_dir: Path | None) -> int:
    """Record this rank's failure for the launcher: its first line, and whether it is the stage's own error (in
    loading or in its forward) or only the echo of a peer's (a closed connection, a timeout waiting)."""
    in_stage = monitored is not None and monitored.computing
    kind = "stage" if in_stage or monitored is None or not _is_communication(exc) else "communication"
    if monitored is not None and monitored.error is not None:
        exc = monitored.error  # not the schedule's "[Stage K] failed to run forward" around it
    message = one_line_reason(exc) if not isinstance(exc, KeyboardInterrupt) else "interrupted"
    # refused while loading (a damaged stage file is one only a rank finds): the input's fault, exit 2, not a failed run
    bad_input = monitored is None and isinstance(exc, FxforgeError) and exc.exit_code == EXIT_USAGE
    status("failed")
    if result_dir is not None:
        with contextlib.suppress(OSError):
            hint = exc.hint if isinstance(exc, FxforgeError) else None
            record = {"kind": kind, "message": message, "bad_input": bad_input, "hint": hint}
            (result_dir / f"error_{status.rank}.json").write_text(json.dumps(record))
    if status.rank == 0 or not isinstance(exc, InputSpecError):
        # a bad option or input fails every rank alike: under torchrun, one line (rank 0's) says it
        print(f"fxforge stage {status.rank}: {message}", file=sys.stderr)
    if isinstance(exc, KeyboardInterrupt):
        return 130
    # bad input (an option, a missing or mismatched file) exits 2, as run-pipeline does; anything else 1
    return exc.exit_code if isinstance(exc, FxforgeError) else 1


def _is_communication(exc: BaseException) -> bool:
    """An error from talking to a peer (a peer that died or timed out), not from this stage's own work."""
    text = f"{type(exc).__name__} {exc}".lower()
    words = ("gloo", "nccl", "connection", "timed out", "timeout", "distnetworkerror", "distbackenderror", "peer")
    return any(word in text for word in words)


def _report(me: _Rank, args: argparse.Namespace, outputs: list[torch.Tensor], times: dict[str, list[float]]) -> int:
    """The last rank's summary under torchrun (no fxforge parent to print it); exit code 1 on a mismatch."""
    batch = me.specs[0].shape[0]
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name}: {median * 1000:.2f} ms per batch of {batch} ({batch / median:.1f} samples/s)")
    for note in me.notes:
        print(f"note: {note}")
    if not args.verify:
        return 0
    inputs = make_inputs(me.specs, seed=args.seed)
    reference = load_reference(me.directory, trust_pickle=args.trust_pickle or None)
    if reference is None:  # _require_reference let it through: the split said why it wrote none
        print(f"not verified: {missing_reference_reason(me.plan)}")
        return 0
    check = check_outputs(reference, inputs, outputs, args.microbatches)
    verdict = "verified" if check.ok else "MISMATCH"
    print(f"{verdict}: pipeline output vs {check.reference}: max abs err {check.max_abs_err:.3g}")
    if not check.ok:
        print("; ".join(check.problems), file=sys.stderr)
        return EXIT_FINDINGS
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fxforge.distributed",
        description="One pipeline rank of a directory written by fxforge split -o; run one process per stage "
        "(fxforge run-pipeline does, torchrun -m fxforge.distributed does across machines). The options and their "
        "defaults are run-pipeline's.",
    )
    parser.add_argument("directory")
    parser.add_argument("--input", action="append", default=None, help="whole-batch input spec (repeat)")
    parser.add_argument("--microbatches", type=int, default=None, help="default: the stage count, at least 4")
    parser.add_argument(
        "--schedule",
        action="append",
        choices=SCHEDULES,
        default=None,
        help="repeat for several (default: both; 1f1b only when microbatches >= stages)",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds a rank waits for a peer")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--trust-pickle", action="store_true")
    parser.add_argument("--no-verify", dest="verify", action="store_false", help="last rank: skip verification")
    parser.add_argument("--result-dir", default=None, help=argparse.SUPPRESS)  # set by the launching parent
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The rank's entry point: ``python -m fxforge.distributed DIR ...`` (what torchrun runs on every rank)."""
    args = _parser().parse_args(argv)
    if os.environ.get(_PYTHON_WORDING_ENV):
        return _worker(args)
    with command_line_wording():  # torchrun, or the CLI's launcher: advice names this command's --options
        return _worker(args)


# --------------------------------------------------------------------------------------------------
# the launcher (this machine)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class _Process:
    """A rank the launcher started."""

    rank: int
    process: subprocess.Popen
    stderr: Path
    failed_at: float | None = None


def _kill(ranks: Sequence[_Process]) -> None:
    """SIGKILL every rank's process group (each rank runs in its own session), then reap them."""
    for entry in ranks:
        if entry.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(entry.process.pid, signal.SIGKILL)
    for entry in ranks:
        with contextlib.suppress(subprocess.TimeoutExpired):
            entry.process.wait(timeout=10)


def _failure(entry: _Process, work: Path) -> tuple[int, str, bool, str]:
    """(priority, first line, whether it refused its input, its hint or "") of a failed rank: priority 0 for its
    own error or death, 1 for losing a peer."""
    error = work / f"error_{entry.rank}.json"
    if error.exists():
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(error.read_text())
            priority = 0 if data.get("kind") == "stage" else 1
            return priority, str(data.get("message")), data.get("bad_input") is True, str(data.get("hint") or "")
    code = entry.process.returncode
    reason = f"killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
    lines = [line for line in _read(entry.stderr).splitlines() if line.strip()]
    if lines:
        reason += f" ({first_line(lines[-1])})"
    return 0, reason, False, ""


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _launch(directory: Path, world: int, worker_args: list[str], timeout: float, threads: int, work: Path) -> None:
    """Start one rank per stage and wait for all of them; raise :class:`PipelineError` for the first that fails
    (or hangs). Every rank is killed before this returns or raises, whatever happens (Ctrl-C included)."""
    port = _free_port()
    ranks: list[_Process] = []
    started = time.monotonic()
    try:
        for rank in range(world):
            env = {
                **os.environ,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(world),
                "OMP_NUM_THREADS": str(threads),
                _PARENT_ENV: str(os.getpid()),
                _PYTHON_WORDING_ENV: said("", "1"),  # empty: the command line's words
            }
            stderr = work / f"stderr_{rank}"
            with stderr.open("w") as err:
                command = [sys.executable, "-m", "fxforge.distributed", str(directory), *worker_args]
                process = subprocess.Popen(
                    [*command, "--result-dir", str(work)],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    start_new_session=True,  # its own process group: killed as one, and not by the terminal's Ctrl-C
                )
            ranks.append(_Process(rank, process, stderr))
        _wait(ranks, work, started, timeout)
    finally:
        _kill(ranks)


def _wait(ranks: list[_Process], work: Path, started: float, timeout: float) -> None:
    grace_until: float | None = None
    while True:
        now = time.monotonic()
        for entry in ranks:
            if entry.failed_at is None and entry.process.poll() not in (None, 0):
                entry.failed_at = now
        failed = [e for e in ranks if e.failed_at is not None]
        if all(e.process.poll() == 0 for e in ranks):
            return
        if failed:
            # give the others a moment to report their own errors: the first cause is told from its echoes
            grace_until = grace_until or now + 1.0
            if now >= grace_until or all(e.process.poll() is not None for e in ranks):
                failures = sorted((*_failure(e, work), e.failed_at, e.rank) for e in failed)
                priority, message, bad_input, hint, _, rank = failures[0]
                hung = _computing(ranks, work)
                if priority > 0 and hung is not None:  # it lost its peer because that peer hangs in its forward
                    waiting = rank
                    rank, doing = hung
                    raise PipelineError(
                        f"stage {rank} hangs ({doing}); stage {waiting} gave up waiting for it: {message}",
                        rank,
                        _stopped(ranks, rank),
                    )
                # the stage's own advice (--trust-pickle for a pickled stage file) first: it was lost (QA)
                stopped = _stopped(ranks, rank)
                raise PipelineError(
                    f"stage {rank} failed: {message}",
                    rank,
                    f"{hint}; {stopped}" if hint else stopped,
                    bad_input=bad_input,
                )
        elif now - started > timeout:
            rank, doing = _hung(ranks, work)
            raise PipelineError(f"stage {rank} timed out after {timeout:g} s ({doing})", rank, _stopped(ranks, rank))
        time.sleep(0.05)


def _stopped(ranks: list[_Process], culprit: int) -> str:
    others = [str(e.rank) for e in ranks if e.rank != culprit]
    return f"stopped every other stage ({', '.join(others)})" if others else "stopped it"


def _computing(ranks: list[_Process], work: Path) -> tuple[int, str] | None:
    """A still-running rank that is inside its own forward, and what it computes."""
    for entry in ranks:
        status = _read(work / f"status_{entry.rank}")
        if entry.process.poll() is None and status.startswith("computing"):
            return entry.rank, status
    return None


def _hung(ranks: list[_Process], work: Path) -> tuple[int, str]:
    """The stage to blame for a timeout: one busy in its own forward, else one still loading or connecting, else
    the first that has not finished (the later ones wait for it)."""
    statuses = {e.rank: _read(work / f"status_{e.rank}") or "starting" for e in ranks}
    running = [e.rank for e in ranks if e.process.poll() is None]
    for prefix in ("computing", "loading", "starting", "connecting"):
        for rank in running:
            if statuses[rank].startswith(prefix):
                return rank, statuses[rank]
    rank = running[0] if running else ranks[0].rank
    return rank, statuses[rank]


# --------------------------------------------------------------------------------------------------
# the API


def run_pipeline(
    directory: str | Path,
    *,
    inputs: Sequence[str | InputSpec] | None = None,
    microbatches: int | None = None,
    schedules: Sequence[str] | None = None,
    repeats: int = 5,
    warmup: int = 1,
    timeout: float = DEFAULT_TIMEOUT,
    threads: int = 1,
    device: str = "auto",
    verify: bool = True,
    baseline: bool = True,
    seed: int = 0,
    trust_pickle: bool | None = None,
) -> PipelineRun:
    """Run the stages of ``directory`` (``fxforge split -o``) as a pipeline, one process per stage on this machine.

    The batch is ``microbatches`` (default: the stage count, at least 4) times the shape the stages were split at,
    or ``inputs`` (which must be exactly that). Each schedule (default: gpipe and 1f1b; 1f1b needs at least as
    many microbatches as stages) runs ``warmup`` + ``repeats`` times; the last rank's output is compared with the
    unsplit ``model.pt2`` (``verify``) and the timings with that model in one process (``baseline``), with one
    thread and with as many threads as the stages use together (capped at the cores). Raises
    :class:`PipelineError` when a stage fails or hangs (``timeout`` seconds for the whole run), with every process
    stopped.
    """
    started = time.perf_counter()
    directory = Path(directory)
    plan = load_plan(directory)
    world = len(plan.stages)
    _check_fault_setting(world)
    if any(stage.file is None for stage in plan.stages):
        raise FxforgeError(
            f"{directory} holds a plan without stage modules (it was made on the meta device)",
            hint="split a model with weights (leave out --device meta) to run it",
        )
    missing = [stage.file for stage in plan.stages if stage.file and not (directory / stage.file).is_file()]
    if missing:  # before starting the processes: a rank found it ~14 s later, and it was a failed run (exit 1)
        raise ModelSpecError(
            f"{directory} lacks {', '.join(missing)}, which plan.json names", hint="split the model again"
        )
    pickled = [stage.file for stage in plan.stages if stage.file and stage.file.endswith(".pt")]
    if pickled and not pickle_trusted(trust_pickle):  # before starting processes that would all refuse it
        raise ModelSpecError(
            f"{directory} holds pickled stages ({', '.join(pickled)}): unpickling them can run arbitrary code",
            hint=f"if you trust this directory, pass {option('--trust-pickle', True)} (or set FXFORGE_TRUST_PICKLE=1)",
        )
    notes: list[str] = []
    microbatches, chosen = _run_options(world, microbatches, schedules, repeats, warmup, threads, timeout, notes)
    specs = run_inputs(plan, microbatches, inputs)
    check_fits_in_memory(specs)  # before the processes: each would find it, and the run end as a failed stage
    if verify:
        _require_reference(directory, plan)
    backend, resolved = _backend_and_device(device, 0, world)  # every stage runs on this machine
    if backend == "nccl" and torch.cuda.device_count() < world:
        raise FxforgeError(
            f"{display.counted(world, 'stage')} need {world} GPUs on this machine, "
            f"torch sees {torch.cuda.device_count()}",
            hint="pass --device cpu, or run across machines with torchrun (docs/commands/run-pipeline.md)",
        )
    worker_args = [
        *(arg for spec in specs for arg in ("--input", str(spec))),
        "--microbatches", str(microbatches),
        *(arg for name in chosen for arg in ("--schedule", name)),
        "--repeats", str(repeats),
        "--warmup", str(warmup),
        "--seed", str(seed),
        "--threads", str(threads),
        "--timeout", str(timeout),
        "--device", device,
    ]  # fmt: skip
    if trust_pickle:
        worker_args.append("--trust-pickle")
    work = Path(tempfile.mkdtemp(prefix=_WORK_PREFIX))
    try:
        try:
            _launch(directory, world, worker_args, timeout, threads, work)
        except PipelineError as exc:
            # the free port found for rank 0's store was taken before it could bind it: once more, on another
            if "address already in use" not in exc.message.lower():
                raise
            for leftover in work.iterdir():
                leftover.unlink()
            _launch(directory, world, worker_args, timeout, threads, work)
        timings = [json.loads((work / f"times_{rank}.json").read_text()) for rank in range(world)]
        outputs = torch.load(work / _OUTPUTS_FILE, weights_only=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    batch = specs[0].shape[0]
    batch_inputs = make_inputs(specs, seed=seed)
    reference = None
    if verify or baseline:
        pickled_reference = not (directory / PROGRAM_FILE).exists() and (directory / MODEL_FILE).exists()
        if pickled_reference and not pickle_trusted(trust_pickle):
            notes.append(f"the unsplit model is a pickled {MODEL_FILE}: pass --trust-pickle to verify and time it")
        else:
            reference = load_reference(directory, trust_pickle=trust_pickle)
            if reference is None:  # with verify, _require_reference let it through: the split said why
                why = missing_reference_reason(plan) or f"{directory} has no {PROGRAM_FILE}"
                notes.append(f"{'not verified, no baseline' if verify else 'no baseline'}: {why}")
    check = check_outputs(reference, batch_inputs, outputs, microbatches) if verify and reference else None
    bases = []
    if baseline and reference is not None:
        for count in sorted({1, min(world * threads, os.cpu_count() or 1)}):
            bases.append(_baseline(reference[0], batch_inputs, microbatches, count, repeats, warmup))
    best = min(bases, key=lambda b: b.median_s) if bases else None
    results = []
    for name in chosen:
        # a batch is done when the slowest rank is: the time of a run is its maximum over the ranks
        per_run = [max(values) for values in zip(*(t[name] for t in timings))]
        median = statistics.median(per_run)
        speedup = best.median_s / median if best else None
        results.append(ScheduleTiming(name, median, batch / median, speedup, per_run))
    if threads * world > (os.cpu_count() or 1):
        notes.append(
            f"{display.counted(world, 'stage')} x {display.counted(threads, 'thread')} on "
            f"{display.counted(os.cpu_count() or 1, 'core')}: the stages share cores, so they cannot all compute "
            "at once"
        )
    return PipelineRun(
        directory=str(directory),
        stages=world,
        microbatches=microbatches,
        batch=batch,
        inputs=[str(s) for s in specs],
        backend=backend,
        device=resolved.type,
        threads=threads,
        schedules=results,
        baselines=bases,
        check=check,
        output_shapes=[list(t.shape) for t in outputs],
        wall_s=time.perf_counter() - started,
        notes=notes,
    )


def _schedules(names: Sequence[str] | None, microbatches: int, stages: int, notes: list[str]) -> list[str]:
    if names:
        chosen = list(dict.fromkeys(names))
        unknown = [n for n in chosen if n not in SCHEDULES]
        if unknown:
            raise InputSpecError(f"unknown schedule {unknown[0]!r}", hint=f"one of {', '.join(SCHEDULES)}")
        if "1f1b" in chosen and microbatches < stages:
            raise InputSpecError(
                f"1f1b needs at least as many microbatches as stages ({stages}), got {microbatches}",
                hint=f"pass --microbatches {stages} or more, or --schedule gpipe",
            )
        return chosen
    if microbatches < stages:
        notes.append(f"1f1b skipped: it needs at least {stages} microbatches (one per stage)")
        return ["gpipe"]
    return list(SCHEDULES)


def _baseline(
    module: nn.Module, inputs: tuple[torch.Tensor, ...], microbatches: int, threads: int, repeats: int, warmup: int
) -> Baseline:
    """The unsplit model in this process on the same batch, with ``threads`` threads."""
    _, per_microbatch = reference_outputs(module, inputs, microbatches)
    batches = split_batch(inputs, microbatches) if per_microbatch else [inputs]
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        times = []
        with torch.no_grad(), quiet_torch_logs():
            for run in range(warmup + repeats):
                start = time.perf_counter()
                for batch in batches:
                    module(*batch)
                if run >= warmup:
                    times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(saved)
    median = statistics.median(times)
    return Baseline(threads, median, inputs[0].shape[0] / median, per_microbatch)


if __name__ == "__main__":
    sys.exit(main())
