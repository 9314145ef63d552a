"""fxforge run-pipeline: split models run as one process per stage on torch.distributed (gloo, CPU) through
torch.distributed.pipelining's schedules, outputs verified against the unsplit model; stages that fail, die or
hang are named and every process is stopped (Ctrl-C too); the same worker under torchrun."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from fxforge import distributed
from fxforge.api import prepare
from fxforge.cli import main
from fxforge.distributed import FAULT_ENV, PipelineError, run_pipeline
from fxforge.errors import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, FxforgeError, InputSpecError, ModelSpecError
from fxforge.split import PLAN_FILE, split

pytestmark = pytest.mark.slow  # every test starts processes that import torch


def _workers(directory: Path) -> list[int]:
    """Pids of live pipeline ranks working on ``directory`` (from /proc: no dependency needed)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().split(") ", 1)[1][0]
        except (OSError, IndexError):
            continue
        if state != "Z" and b"fxforge.distributed" in command and str(directory).encode() in command:
            pids.append(int(entry.name))
    return pids


def _no_workers_left(directory: Path) -> bool:
    # a rank polls for its launcher every 0.5 s; on a loaded machine (a CI run beside other jobs, load 7 on 2 cores)
    # the exit of a process holding torch took over 5 s: the wait ends as soon as they are gone
    deadline = time.monotonic() + 30
    while _workers(directory) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _workers(directory)


class _Splits:
    """Split directories made on first use and kept for the module: resnet18 (torch dialect) and a tiny GPT-2
    (ATen) in 2 and 4 stages. Lazily, so that each pytest-xdist worker splits only what its tests run."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: dict[str, Path] = {}
        self.captured: dict[str, object] = {}

    def _capture(self, model: str):
        if model not in self.captured:
            if model == "resnet18":
                torchvision = pytest.importorskip("torchvision")
                torch.manual_seed(0)
                self.captured[model] = prepare(torchvision.models.resnet18().eval(), ["1x3x224x224"])
            else:
                transformers = pytest.importorskip("transformers")
                config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64)
                config._attn_implementation = "eager"
                config.use_cache = False
                torch.manual_seed(0)
                self.captured[model] = prepare(transformers.GPT2Model(config).eval(), ["2x16:int64"])
        return self.captured[model]

    def __getitem__(self, name: str) -> Path:
        if name not in self.made:
            model, stages = name.rsplit("-", 1)
            directory = self.root / name
            # the split's own verification is tested in test_split.py; here the pipeline's output is verified
            split(self._capture(model), int(stages), "flops", output_dir=directory, verify_stages=False)
            self.made[name] = directory
        return self.made[name]


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    return _Splits(tmp_path_factory.mktemp("splits"))


@pytest.mark.parametrize("name", ["resnet18-4", "gpt2-4"])  # resnet18-2 and gpt2-2: the CLI and torchrun tests
def test_stages_run_as_processes_and_match_the_unsplit_model(splits, name):
    directory = splits[name]
    stages = int(name.rsplit("-", 1)[1])
    run = run_pipeline(directory, microbatches=4, repeats=1, warmup=0, baseline=False, device="cpu")
    assert run.stages == stages and run.backend == "gloo" and run.device == "cpu"
    assert [t.schedule for t in run.schedules] == ["gpipe", "1f1b"]  # 4 microbatches >= stages: both run
    assert all(t.samples_per_s > 0 and len(t.times_s) == 1 and t.speedup is None for t in run.schedules)
    assert run.check is not None and run.check.ok, run.check
    assert run.check.reference.startswith("model.pt2")
    micro = 1 if name.startswith("resnet18") else 2
    assert run.batch == 4 * micro and run.output_shapes[0][0] == 4 * micro
    assert _no_workers_left(directory)


def test_two_stages_from_the_cli_with_the_one_process_baseline(splits, capsys):
    directory = splits["resnet18-2"]
    code = main(["run-pipeline", str(directory), "--microbatches", "2", "--repeats", "1", "--warmup", "0", "--json"])
    out, _ = capsys.readouterr()
    assert code == EXIT_OK
    data = json.loads(out)
    assert data["ok"] and data["check"]["ok"] and data["inputs"] == ["2x3x224x224"] and data["stages"] == 2
    assert [t["schedule"] for t in data["schedules"]] == ["gpipe", "1f1b"]
    assert [b["threads"] for b in data["baselines"]] == sorted({1, min(2, os.cpu_count() or 1)})
    assert all(t["speedup"] > 0 and len(t["times_s"]) == 1 for t in data["schedules"])
    assert data["output_shapes"] == [[2, 1000]]
    assert _no_workers_left(directory)


def test_bad_input(splits, tmp_path, capsys):
    directory = splits["resnet18-2"]
    with pytest.raises(FxforgeError, match="1f1b needs at least as many microbatches as stages"):
        run_pipeline(splits["resnet18-4"], microbatches=2, schedules=["1f1b"])
    with pytest.raises(FxforgeError, match="one microbatch"):
        run_pipeline(directory, microbatches=2, inputs=["3x3x224x224"])
    for args, needle in (
        ([str(tmp_path / "missing")], "is not a directory"),
        ([str(tmp_path)], "has no plan.json"),
        ([str(directory), "--microbatches", "0"], "0 is not in the range"),
        ([str(directory), "--schedule", "zigzag"], "'zigzag' is not one of"),
    ):
        assert main(["run-pipeline", *args]) == EXIT_USAGE
        assert needle in capsys.readouterr().err
    meta = tmp_path / "meta"
    assert main(["split", "torchvision:resnet18", "--device", "meta", "--stages", "2", "-o", str(meta)]) == EXIT_OK
    capsys.readouterr()
    assert main(["run-pipeline", str(meta)]) == EXIT_USAGE
    assert "meta device" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------
# failures: named, and nothing left running


@pytest.fixture
def small_split(splits, tmp_path):
    directory = tmp_path / "gpt2-2"
    shutil.copytree(splits["gpt2-2"], directory)
    return directory


@pytest.mark.parametrize(
    "fault,message",
    [
        # stage 1 then loses its peer: the error it reports is an echo, and stage 0 is named
        ("0:raise", "stage 0 failed: RuntimeError: injected fault (FXFORGE_PIPELINE_FAULT)"),
        # no error file: the exit code is all there is
        ("1:exit", "stage 1 failed: exited with code 3"),
    ],
)
def test_a_failing_or_dead_stage_is_named_and_every_process_stopped(small_split, monkeypatch, fault, message):
    monkeypatch.setenv(FAULT_ENV, fault)
    with pytest.raises(PipelineError) as info:
        run_pipeline(small_split, microbatches=2, repeats=1, warmup=0, timeout=120)
    assert str(info.value.message) == message and info.value.stage == int(fault[0])
    assert info.value.exit_code == EXIT_FINDINGS
    assert _no_workers_left(small_split)


def test_a_hung_stage_times_out_named(small_split, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "1:hang")
    start = time.monotonic()
    with pytest.raises(PipelineError) as info:
        # the timeout is the whole run's, loading included: at 12 s, a CI machine other work loaded (load 6 on 2
        # cores) timed stage 0 out while it was still loading, before stage 1 could hang
        run_pipeline(small_split, microbatches=2, repeats=1, warmup=0, timeout=45)
    # a bound only against hanging for good: a CI machine other work loaded (load 9 on 2 cores) took 214 s
    assert time.monotonic() - start < 600
    assert info.value.message.startswith("stage 1 timed out after 45 s (computing microbatch 0")
    assert _no_workers_left(small_split)


@pytest.mark.parametrize("content", [b"not a program", b"\x80\x04\x95\x0b\x00\x00\x00\x00\x00\x00\x00}\x94."])
def test_a_corrupt_stage_file_is_named(small_split, content, capsys):
    """A stage file only its rank can read (corrupt, or a bare pickle under the name) is bad input, exit 2: it was
    exit 1, a failed run."""
    (small_split / "stage_1.pt2").write_bytes(content)
    with pytest.raises(PipelineError, match=r"stage 1 failed: cannot read exported program .*stage_1\.pt2") as info:
        run_pipeline(small_split, microbatches=2, repeats=1, warmup=0, timeout=120)
    assert info.value.exit_code == EXIT_USAGE
    assert _no_workers_left(small_split)
    code = main(["run-pipeline", str(small_split), "-m", "2", "--repeats", "1", "--warmup", "0", "--no-baseline"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == EXIT_USAGE and len(errors) == 1 and "stage_1.pt2" in errors[0]


def _retyped(stage: dict, dtype: str) -> dict:
    return {**stage, "inputs": [{**stage["inputs"][0], "dtype": dtype}, *stage["inputs"][1:]]}


def _reshaped(tensor: dict) -> dict:
    return {**tensor, "shape": [-1, *tensor["shape"][1:]]}


def _edit_plan(directory: Path, edit) -> None:
    plan = json.loads((directory / PLAN_FILE).read_text())
    (directory / PLAN_FILE).write_text(json.dumps(edit(plan)))


@pytest.mark.parametrize(
    "edit,reason",
    [
        (lambda plan: {**plan, "stages": []}, "it has no stages"),
        (lambda plan: list(plan), "not a JSON object"),
        (lambda plan: {**plan, "inputs": None}, "'inputs' is not a list of input specs"),
        (lambda plan: {**plan, "stages": plan["stages"][:1]}, "1 stages need 0 cuts, it has 1"),
        (
            lambda plan: {**plan, "stages": [plan["stages"][0], {**plan["stages"][1], "file": "../../etc/passwd"}]},
            "stage 1's file '../../etc/passwd' is outside the split directory",
        ),
        # QA: these launched every stage, then failed as exit 1 ("stage 0 failed: ... does not match")
        (
            lambda plan: {**plan, "stages": [_retyped(plan["stages"][0], "complex999"), *plan["stages"][1:]]},
            "stage 0's inputs: 'input_ids' has dtype 'complex999', which torch does not have",
        ),
        (
            lambda plan: {**plan, "cuts": [{**plan["cuts"][0], "tensors": [_reshaped(plan["cuts"][0]["tensors"][0])]}]},
            "the cut after stage 0: ",
        ),
    ],
)
def test_a_damaged_plan_is_one_line_before_any_stage_starts(small_split, edit, reason):
    """A hand-edited plan.json was an internal error (no stage launched, then their output read; a list's missing
    .get), or ran one stage as the whole model and called the result a MISMATCH."""
    _edit_plan(small_split, edit)
    with pytest.raises(ModelSpecError, match="plan.json is corrupt: " + re.escape(reason)):
        run_pipeline(small_split, microbatches=2, repeats=1, warmup=0, timeout=120)


def test_inputs_larger_than_the_machine_are_refused_before_any_stage_starts(small_split):
    """QA: a plan.json whose "inputs" were 99999x99999x99999 launched the stages, and the run failed as exit 1."""
    _edit_plan(small_split, lambda plan: {**plan, "inputs": ["99999x99999x99999"]})
    with pytest.raises(InputSpecError, match=r"need [\d,.]+ GiB, more than this machine's"):
        run_pipeline(small_split, microbatches=2, repeats=1, warmup=0, timeout=120)
    assert _no_workers_left(small_split)


def test_a_missing_stage_file_is_named_before_any_stage_starts(small_split):
    """A rank found it after every process had started (~14 s), and the run failed with exit 1, not 2."""
    (small_split / "stage_1.pt2").unlink()
    with pytest.raises(ModelSpecError, match=r"lacks stage_1\.pt2, which plan\.json names"):
        run_pipeline(small_split, microbatches=2, repeats=1, warmup=0, timeout=120)


def test_swapped_stage_files_are_named_before_they_run(small_split):
    # they ran, and failed inside the schedule with "stage 1 failed: KeyError: 2"
    (small_split / "stage_0.pt2").rename(small_split / "swap")
    (small_split / "stage_1.pt2").rename(small_split / "stage_0.pt2")
    (small_split / "swap").rename(small_split / "stage_1.pt2")
    pattern = r"stage (\d) failed: stage_\1\.pt2 does not match stage \1 of plan\.json \(it takes .*; the plan says "
    with pytest.raises(PipelineError, match=pattern) as info:
        run_pipeline(small_split, microbatches=2, repeats=1, warmup=0, timeout=120)
    assert info.value.exit_code == EXIT_USAGE
    assert _no_workers_left(small_split)


def test_a_lost_unsplit_model_is_an_error_unless_the_split_said_why_it_wrote_none(small_split, capsys):
    # a missing model.pt2 ran unverified with exit 0, pointing at plan.json's notes, which were empty
    (small_split / "model.pt2").unlink()
    with pytest.raises(ModelSpecError, match=r"has no model\.pt2: the unsplit model"):
        run_pipeline(small_split, microbatches=2)
    assert not _workers(small_split)  # refused before any stage started
    assert main(["run-pipeline", str(small_split)]) == EXIT_USAGE
    assert "--no-verify" in capsys.readouterr().err
    plan = json.loads((small_split / PLAN_FILE).read_text())
    why = "no unsplit model written (TorchScript submodule; cannot pickle): run-pipeline cannot verify the pipeline"
    plan["notes"].append(why)
    (small_split / PLAN_FILE).write_text(json.dumps(plan))
    run = run_pipeline(small_split, microbatches=2, schedules=["gpipe"], repeats=1, warmup=0)
    assert run.check is None and f"not verified, no baseline: {why}" in run.notes


def test_pickled_stages_run_from_any_directory_and_wherever_the_split_is_copied(tmp_path, monkeypatch):
    # a pickled stage names its classes by the module fxforge imported the model's file as: run from another
    # directory, the ranks failed with "No module named 'fxforge_user_...'"; the split now keeps a copy of the file
    project = tmp_path / "project"
    project.mkdir()
    (project / "leafy_pipeline_model.py").write_text(
        textwrap.dedent(
            """\
            import torch
            from torch import nn

            class Gate(nn.Module):
                def forward(self, x):
                    if x.mean() > 0:  # data-dependent: a leaf, which torch.export cannot write
                        return x.relu()
                    return -x

            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.a, self.gate, self.b = nn.Linear(8, 8), Gate(), nn.Linear(8, 8)

                def forward(self, x):
                    return self.b(self.gate(self.a(x)))
            """
        )
    )
    monkeypatch.chdir(project)
    args = ["split", "leafy_pipeline_model.py:Net", "--input", "2x8", "--stages", "2", "--no-verify", "-o", "out"]
    assert main(args) == EXIT_OK
    copied = tmp_path / "elsewhere" / "split"
    shutil.copytree(project / "out", copied)
    (project / "leafy_pipeline_model.py").unlink()  # only the copy in the split directory is left
    monkeypatch.chdir(tmp_path)
    plan = json.loads((copied / PLAN_FILE).read_text())
    assert plan["model_source"] == "source/leafy_pipeline_model.py"
    assert any(stage["file"].endswith(".pt") for stage in plan["stages"])
    options = {"microbatches": 2, "schedules": ["gpipe"], "repeats": 1, "warmup": 0, "baseline": False}
    run = run_pipeline("elsewhere/split", trust_pickle=True, **options)
    assert run.check is not None and run.check.ok
    shutil.rmtree(copied / "source")
    expected = (
        r"stage \d failed: cannot read .*stage_\d\.pt: its classes are in the model's file leafy_pipeline_model\.py "
        r"\(split from leafy_pipeline_model\.py:Net\), and it is not at .*source/leafy_pipeline_model\.py"
    )
    with pytest.raises(PipelineError, match=expected):
        run_pipeline("elsewhere/split", trust_pickle=True, **options)
    assert _no_workers_left(copied)


@pytest.mark.parametrize("sent", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "launcher-killed"])
def test_interrupting_or_killing_the_launcher_stops_every_stage(small_split, sent, tmp_path):
    work_root = tmp_path / "tmp"  # where the launcher makes its work directory (fxforge-pipeline-XXXX)
    work_root.mkdir()
    env = {**os.environ, FAULT_ENV: "1:hang", "TMPDIR": str(work_root)}
    cli = Path(sys.executable).with_name("fxforge")
    process = subprocess.Popen(
        [str(cli), "run-pipeline", str(small_split), "--microbatches", "2", "--timeout", "120"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while len(_workers(small_split)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(_workers(small_split)) == 2
    time.sleep(1)
    process.send_signal(sent)
    _, err = process.communicate(timeout=30)
    if sent == signal.SIGINT:  # the launcher kills the ranks and reports
        assert process.returncode == 130 and err.strip().endswith("interrupted")
    else:  # no launcher left to clean up: each rank sees its parent gone, removes its work directory and exits
        assert process.returncode == -signal.SIGKILL
    assert _no_workers_left(small_split)
    assert not list(work_root.glob("fxforge-pipeline-*"))  # SIGKILL left it behind


# --------------------------------------------------------------------------------------------------
# torchrun


def test_the_worker_runs_under_torchrun(splits):
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed next to this Python")
    directory = splits["gpt2-2"]
    process = subprocess.run(
        [
            str(torchrun), "--standalone", "--nproc-per-node", "2",
            "-m", "fxforge.distributed", str(directory), "--microbatches", "2", "--repeats", "1", "--device", "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )  # fmt: skip
    assert process.returncode == 0, process.stderr[-2000:]
    # the worker's defaults are run-pipeline's: both schedules (it ran gpipe alone)
    assert "gpipe:" in process.stdout and "1f1b:" in process.stdout
    assert "verified: pipeline output vs model.pt2" in process.stdout


def test_the_worker_checks_its_options_before_loading_anything(splits, tmp_path, monkeypatch, capsys):
    # under torchrun, --schedule 1f1b with too few microbatches failed late, with torch's ValueError and a
    # traceback on every rank; the worker now checks what run-pipeline checks, in one line (rank 0's), exit 2
    directory = splits["gpt2-2"]
    monkeypatch.delenv("MASTER_ADDR", raising=False)  # a worker that went on would fail to connect, not hang
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, printed in (("0", True), ("1", False)):
        monkeypatch.setenv("RANK", rank)
        assert distributed.main([str(directory), "--microbatches", "1", "--schedule", "1f1b"]) == EXIT_USAGE
        message = "1f1b needs at least as many microbatches as stages (2), got 1"
        assert capsys.readouterr().err == (f"fxforge stage 0: {message}\n" if printed else "")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert distributed.main([str(directory)]) == EXIT_USAGE
    assert "holds 2 stages, but 1 process was started" in capsys.readouterr().err  # "1 processes were"
    # the last rank verifies under torchrun: without model.pt2 it says so before the run, not after it
    lost = tmp_path / "lost"
    shutil.copytree(directory, lost)
    (lost / "model.pt2").unlink()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert distributed.main([str(lost), "--microbatches", "2"]) == EXIT_USAGE
    assert "has no model.pt2" in capsys.readouterr().err
    # the defaults are run-pipeline's: microbatches = stages, at least 4; 1f1b too when there are enough
    notes: list[str] = []
    assert distributed._run_options(2, None, None, 5, 1, 1, 300.0, notes) == (4, ["gpipe", "1f1b"])
    assert distributed._run_options(8, None, None, 5, 1, 1, 300.0, notes) == (8, ["gpipe", "1f1b"])
    assert distributed._run_options(4, 2, None, 5, 1, 1, 300.0, notes) == (2, ["gpipe"]) and notes


def test_stages_torch_export_cannot_write_are_pickled_and_run_only_with_the_opt_in(tmp_path, capsys):
    """GatedNet's gate branches on a value (a leaf in the torch dialect): neither its stage nor the whole model
    exports, so both are pickled GraphModules, refused before any process starts unless pickles are trusted."""
    directory = tmp_path / "gated"
    models = Path(__file__).parent / "cli_models.py"
    args = ["split", f"{models}:GatedNet", "--input", "2x8", "--stages", "2", "-o", str(directory), "--json"]
    assert main(args) == EXIT_OK
    data = json.loads(capsys.readouterr().out)
    assert "stage_1.pt" in data["files"] and "model.pt" in data["files"] and data["verification"]["ok"]
    with pytest.raises(FxforgeError, match=r"pickled stages \(stage_1\.pt\)"):
        run_pipeline(directory, microbatches=2)
    assert not _workers(directory)
    run = run_pipeline(
        directory, microbatches=2, schedules=["gpipe"], repeats=1, warmup=0, baseline=False, trust_pickle=True
    )
    assert run.check is not None and run.check.ok and run.check.reference == "model.pt"
    assert _no_workers_left(directory)


def test_a_gpu_run_says_its_one_process_baseline_ran_on_the_cpu():
    # seen on an H200: "1 stages as 1 processes", and the CPU baseline was labelled like a GPU one; "median of 1 runs"
    from rich.console import Console

    from fxforge.cli.render import render_pipeline_run
    from fxforge.distributed import Baseline, PipelineRun, ScheduleTiming

    run = PipelineRun(
        directory="out/r1", stages=1, microbatches=2, batch=4, inputs=["4x3x64x64"], backend="nccl", device="cuda",
        threads=1, schedules=[ScheduleTiming("gpipe", 0.0047, 847.2, 4.38, [0.0047])],
        baselines=[Baseline(1, 0.0207, 193.6, False)], check=None, output_shapes=[[4, 1000]], wall_s=13.8,
    )  # fmt: skip
    console = Console(record=True, width=120)
    render_pipeline_run(console, run)
    text = console.export_text()
    assert "1 stage as 1 process (nccl on cuda" in text
    assert "one process, unsplit (1 thread, CPU)" in text
    assert "Throughput, median of 1 run" in text and "1 runs" not in text


@pytest.mark.parametrize("fault", ["9:hang", "banana", "1:explode"])
def test_a_fault_asked_for_in_words_no_stage_reads_is_refused(small_split, monkeypatch, fault):
    """They ran a healthy pipeline, exit 0: a timeout test would have passed without its fault."""
    monkeypatch.setenv(FAULT_ENV, fault)
    with pytest.raises(FxforgeError, match="names no fault this pipeline can inject") as info:
        run_pipeline(small_split, microbatches=2, repeats=1, warmup=0, timeout=120)
    assert "STAGE from 0 to 1" in info.value.hint


def test_a_model_not_per_sample_along_dim_0_is_said_why_the_pipeline_differs():
    """QA: a model returning ``q.t()`` split and verified, then every run-pipeline was a MISMATCH reading only "shape
    (64, 2) != (16, 8)": a pipeline joins microbatch outputs along dim 0. The check now says so."""
    from fxforge.distributed import check_outputs

    class Transposes(torch.nn.Module):
        def forward(self, x):
            return x * 2, (x * 3).t()

    model, x = Transposes(), torch.randn(4, 3)
    joined = [torch.cat(parts) for parts in zip(*(model(mb) for mb in x.tensor_split(2)))]  # what a pipeline gathers
    check = check_outputs((model, "m"), (x,), joined, microbatches=2)
    assert not check.ok and any("--microbatches 1" in problem for problem in check.problems)
    per_sample = check_outputs((lambda x: (x * 2,), "m"), (x,), [x * 2], microbatches=2)
    assert per_sample.ok and not any("--microbatches" in problem for problem in per_sample.problems)


def test_a_model_that_changes_its_state_is_not_said_to_mix_samples():
    """QA: a model adding to a buffer in forward was told its output is computed across samples; it is per sample,
    but each microbatch sees the state the one before it left."""
    from fxforge.distributed import check_outputs

    class Accumulates(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("total", torch.zeros(3))

        def forward(self, x):
            self.total.add_(1)
            return x * self.total

    model, x = Accumulates(), torch.randn(4, 3)
    joined = [torch.cat([mb * (k + 1) for k, mb in enumerate(x.tensor_split(2))])]  # each from the state left
    check = check_outputs((model, "m"), (x,), joined, microbatches=2)
    assert not check.ok and any("changes its own state" in problem for problem in check.problems)
    assert not any("computed across samples" in problem for problem in check.problems)
    assert torch.equal(model.total, torch.ones(3))  # the check's own calls are undone: only the reference's stays


@pytest.mark.parametrize("microbatches", [1, 2])
def test_a_mismatch_from_insert_afters_noise_names_the_noise(microbatches):
    """QA: run-pipeline of a split of an optimize output with insert_after's noise said "the model changes its own
    state when it runs (a buffer written in forward, or random numbers) ... run it with --microbatches 1", which
    cannot help (the stages draw in other processes), and at --microbatches 1 it said nothing at all."""
    from fxforge.distributed import check_outputs
    from fxforge.passes import apply_pass

    class Relu(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2

    captured = prepare(Relu().eval(), "4x3", method="export")
    options = {"select": "kind:relu", "insert": "noise", "sigma": 0.5, "seed": 0}
    noisy = apply_pass(captured.graph_module, "insert_after", options).graph_module.eval()
    x = torch.randn(4, 3)
    check = check_outputs((noisy, "model.pt2"), (x,), [torch.relu(x) * 2], microbatches=microbatches)
    assert not check.ok
    problem = next(p for p in check.problems if "noise inserted by insert_after (relu_noise)" in p)
    assert "differ at any --microbatches" in problem
    assert not any("changes its own state" in p for p in check.problems)


def test_a_stage_that_refuses_its_pickle_gives_its_advice_in_the_users_words(tmp_path, monkeypatch, capsys):
    """A stage program holding pickled objects (insert_after's noise modules) is refused by the rank that loads it:
    the launcher's hint said only "stopped every other stage (0)", the advice to trust the file was lost (QA)."""
    from fxforge import apply_pass, capture, split
    from fxforge.demo import DemoConvNet

    torch.manual_seed(0)
    x = torch.randn(1, 3, 32, 32)
    options = {"select": "kind:relu", "insert": "noise", "sigma": 0.1, "seed": 1}
    noisy = apply_pass(capture(DemoConvNet().eval(), (x,)).graph_module, "insert_after", options).graph_module
    split(capture(noisy, (x,)), 2, output_dir=tmp_path / "s", verify_stages=False)
    monkeypatch.delenv("FXFORGE_TRUST_PICKLE", raising=False)
    with pytest.raises(PipelineError, match="holds pickled Python objects") as info:
        run_pipeline(tmp_path / "s", microbatches=1, repeats=1, warmup=0, baseline=False)
    assert "pass trust_pickle=True" in info.value.hint and "stopped every other stage" in info.value.hint
    assert main(["run-pipeline", str(tmp_path / "s"), "-m", "1", "--repeats", "1", "--warmup", "0"]) != EXIT_OK
    assert "hint: if you trust this file, pass --trust-pickle" in capsys.readouterr().err
