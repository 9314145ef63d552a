"""Capture on models with randomness (``torch.rand_like``, dropout in training mode): the model's own randomness
is not blamed on the trace. Model and graph are compared under the same random seed; a model that differs from
itself even then is reported as random; a trace that really computes something else is still caught. Capture
changes neither the model nor the caller's random state."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from fxforge.capture import EXPORT, LOADED, SYMBOLIC_TRACE, capture
from fxforge.cli import main
from fxforge.graphs import ATEN, TORCH


@pytest.fixture(autouse=True)
def _fixed_seed() -> None:
    torch.manual_seed(0)


class RandLike(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + torch.rand_like(x)


class WithDropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv(x)))
        return self.fc(self.drop(x.mean((2, 3))))


class OwnGenerator(nn.Module):
    """Random even under a fixed global seed: it draws from a generator of its own, which advances every call."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.generator = torch.Generator().manual_seed(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + torch.rand(x.shape, generator=self.generator)


class FrozenNoise(nn.Module):
    """``torch.randn(8)`` takes no traced value: symbolic tracing runs it once and bakes that draw in a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + torch.randn(8)


class TracesWrong(nn.Module):
    """Deterministic, and traces without error into a graph that computes something else."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = 3.0 if isinstance(x, torch.fx.Proxy) else 2.0  # torch.export runs forward on tensors: 2.0
        return self.fc(x) * scale


def x8(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 8, generator=torch.Generator().manual_seed(batch))


def image() -> torch.Tensor:
    return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))


def training_flags(model: nn.Module) -> dict[str, bool]:
    return {name: m.training for name, m in model.named_modules()}


def random_notes(record) -> list[str]:
    return [note for note in record.notes if "the model is random" in note]


@pytest.mark.parametrize("check_batch", [None, 3])
def test_rand_like_model_captures_in_the_torch_dialect_with_a_note(check_batch):
    model = RandLike()
    state = torch.get_rng_state()
    captured = capture(model, x8(), check_batch=check_batch)
    record = captured.record
    assert record.method == SYMBOLIC_TRACE and record.dialect == TORCH
    assert record.attempts == []  # no "traced graph differs", no torch.export fallback
    assert record.ok and len(record.checks) == (1 if check_batch is None else 3)  # example, check_batch, batch 1
    (note,) = random_notes(record)
    assert "two calls on the same input differ" in note and "rand_like" in note
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random state is untouched


def test_dropout_in_training_mode_captures_in_the_torch_dialect():
    model = WithDropout().train()
    flags = training_flags(model)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    state = torch.get_rng_state()
    captured = capture(model, image())
    record = captured.record
    assert record.method == SYMBOLIC_TRACE and record.dialect == TORCH and record.attempts == []
    assert record.ok
    (note,) = random_notes(record)
    assert "dropout in training mode" in note and "model.eval()" in note
    # the model was neither put in eval mode nor changed, and the caller's RNG did not move
    assert training_flags(model) == flags
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), state)


def test_dropout_in_training_mode_quantizes_static():
    from fxforge.quantize import quantize

    model = WithDropout().train()
    flags = training_flags(model)
    state = torch.get_rng_state()
    with pytest.warns(UserWarning, match="random inputs"):  # no calibration data given
        result = quantize(model, "static", example_inputs=(image(),))
    assert result.mode == "static" and "fx" in result.machinery and result.quantized_layers
    assert training_flags(model) == flags
    assert torch.equal(torch.get_rng_state(), state)  # calibration's dropout drew from a fork of the caller's RNG


def test_eval_mode_dropout_is_not_called_random():
    captured = capture(WithDropout().eval(), image())
    assert captured.record.ok and random_notes(captured.record) == []


def test_functional_dropout_in_eval_mode_is_not_called_random():
    class Functional(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.dropout(x, 0.5, training=self.training)

    captured = capture(Functional().eval(), x8())
    assert captured.record.ok and random_notes(captured.record) == []
    captured = capture(Functional().train(), x8())
    assert captured.record.method == SYMBOLIC_TRACE and captured.record.ok
    assert "dropout in training mode" in random_notes(captured.record)[0]


def test_model_random_under_a_fixed_seed_keeps_the_trace_and_says_so():
    model = OwnGenerator()
    generator_state = model.generator.get_state()
    captured = capture(model, x8())
    record = captured.record
    assert record.method == SYMBOLIC_TRACE and record.dialect == TORCH
    assert record.attempts == []  # not blamed on the trace: no torch.export fallback
    assert record.checks == [] and record.ok
    (note,) = random_notes(record)
    assert note.startswith("output check skipped") and "even under the same random seed" in note
    assert "it calls rand" in note
    # the model's own generator is given back as it was, as torch's global one is (it once moved on: the caller's
    # next call drew other numbers than it would have without the capture)
    assert torch.equal(model.generator.get_state(), generator_state)


def test_explicit_symbolic_trace_of_a_random_model_is_not_a_failure():
    captured = capture(RandLike(), x8(), method="symbolic_trace")
    assert captured.record.ok and random_notes(captured.record)


def test_a_random_draw_frozen_by_the_trace_is_still_caught():
    model = FrozenNoise()
    state = torch.get_rng_state()
    captured = capture(model, x8())
    record = captured.record
    assert record.method == EXPORT and record.dialect == ATEN
    assert record.attempts[0].strategy == SYMBOLIC_TRACE
    assert "traced graph differs from the model under the same random seed" in record.attempts[0].error
    assert record.ok  # torch.export records the draw: model and graph agree under one seed
    assert random_notes(record) and "randn" in random_notes(record)[0]
    assert torch.equal(torch.get_rng_state(), state)  # tracing drew from a fork of the caller's RNG


def test_a_wrong_trace_of_a_deterministic_model_is_still_caught():
    model = TracesWrong()
    captured = capture(model, x8())
    record = captured.record
    assert record.method == EXPORT and record.ok
    error = record.attempts[0].error
    assert error.startswith("traced graph differs from the model on the example inputs"), error
    assert random_notes(record) == []

    traced = capture(model, x8(), method="symbolic_trace").record
    assert traced.method == SYMBOLIC_TRACE and not traced.ok and not traced.checks[0].ok
    assert random_notes(traced) == []


def test_loaded_graph_of_a_random_model_is_checked_under_one_seed():
    graph = capture(RandLike(), x8()).graph_module
    again = capture(graph, x8())
    assert again.record.method == LOADED and again.record.ok
    assert random_notes(again.record)


def test_cli_inspect_of_a_random_model(capsys, tmp_path: Path):
    path = tmp_path / "rand_model.py"
    path.write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn


            class R(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(8, 8)

                def forward(self, x):
                    return self.fc(x) + torch.rand_like(x)


            def build():
                return R()


            example_inputs = (torch.randn(2, 8),)
            """
        )
    )
    code = main(["inspect", f"{path}:build"])
    out, err = capsys.readouterr()
    assert code == 0, err
    out = " ".join(out.split())  # rich wraps long lines
    assert "captured by symbolic_trace (torch dialect)" in out
    assert "the model is random: two calls on the same input differ" in out
    assert "captured graph differs" not in " ".join(err.split())
    assert "symbolic_trace failed" not in out and "captured by torch.export" not in out
