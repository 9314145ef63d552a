"""Loading never unpickles code without the user's opt-in; what fxforge writes for itself loads without pickle."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

from fxforge.cli import main
from fxforge.errors import EXIT_OK, EXIT_USAGE, InputSpecError, ModelSpecError
from fxforge.models import TRUST_PICKLE_ENV, load_model
from fxforge.quantize import load_calibration


class _RunsCode:
    """Unpickling this writes a marker file: what a crafted model file would do, harmlessly."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "pwned"))


def _crafted(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "marker.txt"
    path = tmp_path / "model.pt"
    with path.open("wb") as f:
        pickle.dump(_RunsCode(marker), f)
    return path, marker


def test_a_crafted_pickle_is_not_run_without_opt_in(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(TRUST_PICKLE_ENV, raising=False)
    path, marker = _crafted(tmp_path)
    code = main(["inspect", str(path)])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and not marker.exists()
    assert "arbitrary code" in err and "--trust-pickle" in err


def test_a_pickled_module_loads_with_the_flag_the_argument_or_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(TRUST_PICKLE_ENV, raising=False)
    path = tmp_path / "lin.pt"
    torch.save(nn.Linear(3, 2), path)
    with pytest.raises(ModelSpecError, match="arbitrary code"):
        load_model(str(path))
    assert isinstance(load_model(str(path), trust_pickle=True).module, nn.Linear)
    monkeypatch.setenv(TRUST_PICKLE_ENV, "1")
    assert isinstance(load_model(str(path)).module, nn.Linear)
    assert main(["inspect", str(path), "-i", "1x3"]) == EXIT_OK


def test_a_state_dict_is_read_without_pickle_and_explained(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save(nn.Linear(3, 2).state_dict(), path)
    with pytest.raises(ModelSpecError, match="state_dict"):
        load_model(str(path))


def test_calibration_data_is_loaded_weights_only(tmp_path):
    path, marker = _crafted(tmp_path)
    with pytest.raises(InputSpecError):
        load_calibration(str(path), (torch.randn(1, 3),))
    assert not marker.exists()
    data = tmp_path / "calib.pt"
    torch.save(torch.randn(4, 3), data)
    assert load_calibration(str(data), (torch.randn(1, 3),)).samples == 4


def test_an_optimize_output_loads_without_pickle_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv(TRUST_PICKLE_ENV, raising=False)
    out = tmp_path / "out"
    assert main(["optimize", "demo", "-p", "fold_bn", "-o", str(out)]) == EXIT_OK
    assert (out / "model.pt2").exists() and (out / "model.pt").exists()
    loaded = load_model(str(out))  # model.pt2: no pickled code
    assert loaded.exported_program is not None
    trusted = load_model(str(out), trust_pickle=True)  # model.pt: the torch-dialect graph, with provenance
    assert isinstance(trusted.module, torch.fx.GraphModule) and trusted.exported_program is None
    assert main(["verify", "demo", str(out)]) == EXIT_OK


def test_a_torchscript_file_needs_no_opt_in(tmp_path, monkeypatch):
    monkeypatch.delenv(TRUST_PICKLE_ENV, raising=False)
    path = tmp_path / "model.pt"
    assert main(["export", "demo", "--to", "torchscript", "-o", str(path)]) == EXIT_OK
    assert main(["verify", "demo", str(path)]) == EXIT_OK


def test_docs_say_which_outputs_are_safe_to_share():
    text = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    for word in ("--trust-pickle", "FXFORGE_TRUST_PICKLE", "model.pt2", "weights_only", "safe to share"):
        assert word in text, word
