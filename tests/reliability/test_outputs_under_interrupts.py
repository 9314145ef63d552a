"""Outputs put in place whole or not at all, under Ctrl-C and beside the user's own files (QA, interrupts and
atomic writes): every writer goes through fxforge.artifacts' atomic_directory or StagedOutput."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import pytest

from fxforge.artifacts import StagedOutput, atomic_directory, signals_held
from fxforge.errors import FxforgeError


def test_a_side_file_of_an_export_does_not_replace_the_users_file_without_force(tmp_path):
    """An ONNX model over 2 GB writes NAME.onnx.data beside it: a user's file of that name was replaced, exit 0."""
    (tmp_path / "big.onnx.data").write_text("precious")
    with pytest.raises(FxforgeError, match=r"big\.onnx\.data exists"), StagedOutput(tmp_path / "big.onnx") as staged:
        (staged.directory / "big.onnx.data").write_text("weights")
        staged.path.write_text("graph")
        staged.commit()
    assert (tmp_path / "big.onnx.data").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.onnx.data"]  # no staging, no main file
    with StagedOutput(tmp_path / "big.onnx", force=True) as staged:
        (staged.directory / "big.onnx.data").write_text("weights")
        staged.path.write_text("graph")
        staged.commit()
    assert (tmp_path / "big.onnx.data").read_text() == "weights" and (tmp_path / "big.onnx").read_text() == "graph"


@pytest.mark.parametrize("writer", ["directory", "file"])
def test_ctrl_c_right_after_the_staging_directory_is_made_leaves_nothing(tmp_path, monkeypatch, writer):
    made = tempfile.mkdtemp

    def interrupted(*args, **kwargs):
        made(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(tempfile, "mkdtemp", interrupted)
    target = tmp_path / "a" / "b" / ("out" if writer == "directory" else "model.pt2")
    with pytest.raises(KeyboardInterrupt):
        if writer == "directory":
            with atomic_directory(target):
                pass
        else:
            with StagedOutput(target):
                pass
    assert list(tmp_path.iterdir()) == []  # neither the staging directory nor the folders made for it


def test_an_old_output_moved_aside_by_a_process_that_died_is_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".out.old-{int(dead.stdout)}"
    (stale / "optimized_model").mkdir(parents=True)
    with atomic_directory(tmp_path / "out") as staging:
        (staging / "report.json").write_text("{}")
    assert not stale.exists() and (tmp_path / "out" / "report.json").exists()


def test_an_interrupt_while_the_output_is_swapped_in_arrives_after_it():
    """Ctrl-C between the renames of --force left no output, the old one hidden as .NAME.old-PID (QA)."""
    if not hasattr(signal, "pthread_sigmask"):
        pytest.skip("needs POSIX signal masks")
    done = []
    with pytest.raises(KeyboardInterrupt), signals_held():
        os.kill(os.getpid(), signal.SIGINT)
        done.append("first rename")
        done.append("second rename")
    assert done == ["first rename", "second rename"]


def test_force_replaces_an_old_output_whole(tmp_path):
    target = tmp_path / "out"
    with atomic_directory(target) as staging:
        (staging / "report.json").write_text('{"written_by": "fxforge"}')
        (staging / "old.txt").write_text("old")
    with atomic_directory(target, force=True) as staging:
        (staging / "report.json").write_text('{"written_by": "fxforge"}')
        (staging / "new.txt").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["new.txt", "report.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_ctrl_c_inside_an_exporter_stops_the_export_rather_than_falling_back():
    """QA: Ctrl-C in the dynamo exporter came out wrapped in the exporter's error: fxforge fell back to the legacy
    exporter, and the call returned ok=False instead of stopping."""
    from fxforge.export import _exporting

    with pytest.raises(KeyboardInterrupt), _exporting("m to ONNX (dynamo exporter)", []):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as interrupt:
            raise RuntimeError("torch.onnx failed") from interrupt


def test_the_legacy_onnx_exporter_leaves_the_callers_input_alone(tmp_path):
    pytest.importorskip("onnxruntime")
    import torch
    from torch import nn

    import fxforge

    class Doubles(nn.Module):
        def forward(self, x):
            x.mul_(2)  # writes into its input
            return x + 1

    x = torch.ones(2, 3)
    fxforge.export_model(Doubles(), to="onnx", path=tmp_path / "d.onnx", example_inputs=(x,), exporter="legacy")
    assert torch.equal(x, torch.ones(2, 3))


def test_a_disk_that_fills_up_inside_torchs_writer_is_the_systems_refusal(tmp_path, monkeypatch):
    """QA: quantize -o on a full disk was "internal error: RuntimeError: [enforce fail at inline_container.cc:672]"."""
    import errno
    import shutil

    from fxforge.artifacts import disk_full_said

    full = shutil.disk_usage(tmp_path)._replace(free=1024)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: full)
    with pytest.raises(OSError) as refused, disk_full_said(tmp_path):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 11298368 vs 11298320")
    assert refused.value.errno == errno.ENOSPC
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match="something else"), disk_full_said(tmp_path):  # room left: not the disk
        raise RuntimeError("something else")


def test_a_model_pickle_refuses_is_written_as_its_program(tmp_path):
    """QA: a lambda registered as a forward hook ended optimize --auto in "internal error: AttributeError: Can't
    pickle local object", after all the timing."""
    import torch
    from torch import nn

    import fxforge
    from fxforge.deploy import write_model_itself

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    model[0].register_forward_hook(lambda module, args, output: None)
    captured = fxforge.capture(model, [torch.randn(2, 4)])
    line = write_model_itself(captured, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt2"] and "torch.export.load" in line
    reloaded = fxforge.load_model(str(tmp_path / "model.pt2")).module
    assert torch.allclose(reloaded(torch.ones(2, 4)), model(torch.ones(2, 4)))


@pytest.mark.parametrize(
    "command",
    [
        ["optimize", "{out}/model.pt2", "-p", "dead_code", "-o", "{out}"],
        ["quantize", "{out}/model.pt2", "-o", "{out}"],
        ["split", "{out}/model.pt2", "-n", "2", "-o", "{out}"],
        ["export", "{out}/model.pt2", "-o", "{out}/model.pt2"],
    ],
    ids=["optimize", "quantize", "split", "export"],
)
def test_force_never_writes_the_output_over_the_model_being_read(command, tmp_path):
    """QA: ``quantize out/model.pt -o out --force`` replaced the user's float model (and its whole output
    directory) with the int8 one; ``export m.pt2 -o m.pt2 --force`` the program it read. Refused before any work."""
    from fxforge.cli import main

    out = tmp_path / "out"
    assert main(["optimize", "demo", "-o", str(out)]) == 0
    before = {path.name: path.stat().st_mtime_ns for path in out.iterdir()}
    assert main([part.format(out=out) for part in command] + ["--force"]) == 2
    assert {path.name: path.stat().st_mtime_ns for path in out.iterdir()} == before


def test_an_output_beside_the_model_being_read_is_written(tmp_path):
    from fxforge.artifacts import refuse_output_over_input

    (tmp_path / "out").mkdir()
    refuse_output_over_input(tmp_path / "out" / "sub", str(tmp_path / "out"))  # inside the input's directory
    with pytest.raises(FxforgeError, match="would replace the model being read"):
        refuse_output_over_input(tmp_path, str(tmp_path / "out"))
    refuse_output_over_input("out", "demo")  # a spec that names no file
    with pytest.raises(FxforgeError, match="would replace the model being read"):
        refuse_output_over_input("tests", "tests/cli_models.py:RootBranch")
