"""Calibration and evaluation data that cannot give a meaningful int8 model or accuracy: no samples, a file that
is not what torch.save writes, batches of the wrong shape. Each is refused with one error line (and a hint) and
exit 2, through the CLI and the Python API."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

import fxforge
from fxforge.cli import main
from fxforge.errors import EXIT_USAGE, InputSpecError
from fxforge.quantize import AccuracyReport, CalibrationData, QuantizeResult, load_calibration, quantize

DEMO_INPUTS = (torch.zeros(1, 3, 32, 32),)  # the demo model's example inputs


class Pickled:
    """An object torch.save pickles by reference: loading it would run code."""


@pytest.fixture(scope="module")
def demo():
    return fxforge.prepare("demo")


def _quantize_cli(capsys, *args: str) -> tuple[int, str]:
    code = main(["quantize", "demo", *args])
    return code, capsys.readouterr().err


def _one_error(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), err
    return lines[0]


# --------------------------------------------------------------------------------------------------
# no samples


@pytest.mark.parametrize(
    "data",
    [torch.randn(0, 3, 32, 32), [], [torch.randn(0, 3, 32, 32)] * 2],
    ids=["tensor-of-0-samples", "empty-list", "empty-batches"],
)
def test_calibration_data_without_samples_is_refused(tmp_path, capsys, data):
    path = tmp_path / "calib.pt"
    torch.save(data, path)
    code, err = _quantize_cli(capsys, "--calib", str(path), "-o", str(tmp_path / "out"))
    assert code == EXIT_USAGE
    assert f"calibration data from file {path} holds no samples" in _one_error(err)
    assert not (tmp_path / "out").exists()
    with pytest.raises(InputSpecError, match="holds no samples"):
        load_calibration(data, DEMO_INPUTS)


def test_eval_data_without_samples_is_refused(tmp_path, capsys):
    calib, empty = tmp_path / "calib.pt", tmp_path / "eval.pt"
    torch.save(torch.randn(4, 3, 32, 32), calib)
    torch.save(torch.randn(0, 3, 32, 32), empty)
    code, err = _quantize_cli(capsys, "--calib", str(calib), "--eval", str(empty))
    assert code == EXIT_USAGE and f"eval data from file {empty} holds no samples" in _one_error(err)


def test_empty_calibration_data_in_memory_is_refused(demo):
    empty = CalibrationData([(torch.randn(0, 3, 32, 32),)], "my batches")
    with pytest.raises(InputSpecError, match="calibration data from my batches holds no samples"):
        quantize(demo, "static", calibration=empty)
    with pytest.raises(InputSpecError, match="eval data from my batches holds no samples"):
        quantize(demo, "static", calibration=torch.randn(4, 3, 32, 32), eval_data=empty)


def test_accuracy_measured_on_no_samples_is_not_known(demo):
    # nothing compared reads as 0% error: it must not pass for a measured accuracy
    nothing = AccuracyReport(samples=0, classifier=False, top1_agreement=None, max_abs_err=0, mean_abs_err=0, rel_err=0)
    evaluation = {"source": "file e.pt", "batches": 1, "samples": 0, "random": False, "labels": False}
    result = QuantizeResult(demo.graph_module, "static", "x86", "", None, nothing, evaluation=evaluation)
    assert not result.accuracy_known and result.to_dict()["accuracy_known"] is False


# --------------------------------------------------------------------------------------------------
# files torch.save did not write


def test_random_bytes_are_not_a_torch_save_file(tmp_path, capsys):
    path = tmp_path / "bad.pt"
    path.write_bytes(os.urandom(512).replace(b"\x80", b"\x00"))  # no pickle PROTO opcode up front
    code, err = _quantize_cli(capsys, "--calib", str(path))
    assert code == EXIT_USAGE
    line = _one_error(err)
    assert f"cannot read calibration file {path}: not a file torch.save wrote" in line
    assert "weights_only" not in err  # torch's advice to unpickle code is wrong for a damaged file


def test_pickled_objects_and_bare_pickles_are_named(tmp_path, capsys):
    objects, bare = tmp_path / "objects.pt", tmp_path / "bare.pt"
    torch.save([Pickled()], objects)
    with bare.open("wb") as file:
        pickle.dump([torch.randn(2, 3, 32, 32)], file, protocol=4)
    code, err = _quantize_cli(capsys, "--calib", str(objects))
    line = _one_error(err)
    assert code == EXIT_USAGE and f"{objects} holds pickled Python objects" in line and "Pickled" in line
    assert "weights_only" not in err
    with pytest.raises(InputSpecError, match=r"a pickle stream, but not one torch.save wrote") as caught:
        load_calibration(str(bare), DEMO_INPUTS, kind="eval")
    assert "cannot read eval file" in str(caught.value)


# --------------------------------------------------------------------------------------------------
# batches of the wrong shape


def test_calibration_of_the_wrong_shape_names_the_data(tmp_path, capsys):
    path = tmp_path / "calib.pt"
    torch.save(torch.randn(5, 4, 32, 32), path)  # 4 channels; the demo model takes 3
    code, err = _quantize_cli(capsys, "--calib", str(path))
    assert code == EXIT_USAGE
    line = _one_error(err)
    assert f"batch 0 of the calibration data from file {path}" in line
    assert "inputs 5x4x32x32; the example inputs are 1x3x32x32" in line
    assert "FX graph-mode quantization failed" not in err and "--leaf" not in err


def test_a_later_calibration_batch_of_the_wrong_shape_is_named(demo):
    batches = [torch.randn(2, 3, 32, 32), torch.randn(2, 4, 32, 32)]
    with pytest.raises(InputSpecError, match=r"batch 1 of the calibration data .*inputs 2x4x32x32"):
        quantize(demo, "static", calibration=batches, eval_data=torch.randn(2, 3, 32, 32))


def test_eval_data_of_the_wrong_shape_is_an_input_error(tmp_path, capsys, demo):
    calib, wrong = tmp_path / "calib.pt", tmp_path / "eval.pt"
    torch.save(torch.randn(4, 3, 32, 32), calib)
    torch.save(torch.randn(4, 4, 32, 32), wrong)
    code, err = _quantize_cli(capsys, "--calib", str(calib), "--eval", str(wrong))
    assert code == EXIT_USAGE and f"batch 0 of the eval data from file {wrong}" in _one_error(err)
    # dynamic quantization runs --calib data only to measure accuracy: the same error, not a crash
    with pytest.raises(InputSpecError, match=r"batch 0 of the calibration data .*inputs 4x4x32x32"):
        quantize(demo, "dynamic", calibration=torch.randn(4, 4, 32, 32))


def test_a_calibration_generator_that_fails_part_way_is_the_datas_error(tmp_path, capsys):
    """QA: a file.py:function generator raising after some batches gave exit 4 (internal error) with the user's
    exception; it is the data's error: one line naming the item it stopped at, exit 2."""
    source = tmp_path / "calib_source.py"
    source.write_text(
        "import torch\n\n"
        "def batches():\n"
        "    for i in range(3):\n"
        "        if i == 2:\n"
        "            raise OSError('disk gone')\n"
        "        yield torch.randn(2, 3, 32, 32)\n"
    )
    code, err = _quantize_cli(capsys, "--calib", f"{source}:batches", "-o", str(tmp_path / "out"))
    assert code == EXIT_USAGE, err
    assert (
        _one_error(err)
        == f"error: calibration data from function {source}:batches failed at item 2: OSError: disk gone"
    )
    assert not (tmp_path / "out").exists()


def test_endless_calibration_data_is_refused_before_it_fills_the_memory(monkeypatch):
    """QA: an endless generator (itertools.cycle(loader)) was read into memory until the allocator failed."""
    from fxforge.quantize import data as data_module

    monkeypatch.setattr(data_module, "MAX_DATA_BYTES", 10 * 4 * 3 * 32 * 32 * 4)  # ten batches of four samples

    def endless():
        while True:
            yield torch.randn(4, 3, 32, 32)

    with pytest.raises(InputSpecError, match=r"holds more than .* GiB of tensors after 11 items \(an endless gen"):
        load_calibration(endless(), DEMO_INPUTS)


class _CorruptDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        if index == 5:
            raise IndexError("corrupt sample 5")
        return torch.randn(3, 32, 32)


def test_a_dataloader_worker_error_keeps_its_own_message():
    """QA: a DataLoader with workers re-raises "Caught IndexError in DataLoader worker process 0." and puts the
    dataset's own message on its last line, which the one-line error dropped."""
    loader = torch.utils.data.DataLoader(_CorruptDataset(), batch_size=2, num_workers=1)
    with pytest.raises(InputSpecError) as raised:
        load_calibration(loader, DEMO_INPUTS)
    assert raised.value.message.endswith("failed at item 2: IndexError: corrupt sample 5"), raised.value.message
