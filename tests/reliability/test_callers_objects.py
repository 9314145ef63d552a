"""fxforge never changes the caller's model, inputs or files: each case that once did, through the Python API."""

from __future__ import annotations

import pytest
import torch
from reliability_models import ConvBN, Counter, CounterThenBranch, WritesInput
from torch import nn

import fxforge
from fxforge import runtime
from fxforge.capture import capture
from fxforge.errors import CaptureError
from fxforge.export import ExportError
from fxforge.passes import apply_pass
from fxforge.verify import verify


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def _same_state(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    after = model.state_dict()
    return before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_a_failed_capture_restores_the_module():
    model = CounterThenBranch()
    x = torch.randn(2, 4)
    before, attributes = _state(model), dict(vars(model))
    try:
        capture(model, (x,))
        raise AssertionError("expected a CaptureError")
    except CaptureError as error:
        assert "x.sum() > 0" in error.message  # the line that blocks both capture methods
    assert _same_state(model, before) and vars(model).keys() == attributes.keys()
    assert type(model.count) is torch.Tensor and isinstance(model(x), torch.Tensor)


def test_a_buffer_write_is_named_with_its_line_and_captured_by_export():
    model = Counter()
    captured = capture(model, (torch.randn(2, 4),))
    assert captured.record.method == "torch.export" and captured.record.ok
    attempt = captured.record.attempts[0]
    assert "buffer 'count'" in attempt.error and "control flow" not in attempt.error
    assert attempt.location and "self.count += 1" in attempt.location
    assert type(model.count) is torch.Tensor and float(model.count) == 0.0  # untouched by tracing or checking


def test_optimize_does_not_write_into_the_callers_input():
    x = torch.randn(2, 4)
    original = x.clone()
    captured = capture(WritesInput().eval(), (x,))
    fxforge.optimize(captured, ["dead_code", "cse"], verify=True)
    fxforge.inspect_graph(captured)
    verify(captured, captured.graph_module)
    assert torch.equal(x, original)


def test_prepare_keeps_the_callers_training_mode():
    model = ConvBN().train()
    fxforge.prepare(model, ["2x3x8x8"])
    assert model.training and all(m.training for m in model.modules())
    model.eval()
    fxforge.prepare(model, ["2x3x8x8"])
    assert not model.training


def test_bisection_does_not_update_the_callers_batchnorm_statistics():
    model = ConvBN().train()  # training mode: every run updates running statistics in place
    captured = capture(model, (torch.randn(2, 3, 8, 8),), method="symbolic_trace", check=False)
    before = _state(model)
    noise = {"select": "type:Conv2d", "insert": "noise", "sigma": 10.0, "seed": 0}
    broken = apply_pass(captured.graph_module, "insert_after", noise).graph_module
    result = verify(captured, broken)
    assert not result.ok
    assert _same_state(model, before)


def test_passes_never_write_the_callers_parameters():
    torchvision = __import__("torchvision")
    model = torchvision.models.resnet18().eval()
    captured = capture(model, (torch.randn(1, 3, 32, 32),))
    before = _state(model)
    for name in ("fold_bn", "merge_convs", "fold_constants", "cse", "dead_code", "remove_identity"):
        apply_pass(captured.graph_module, name)
    fxforge.optimize(captured, ["fold_bn", "fold_constants"], verify=True)
    assert _same_state(model, before)


def test_state_restore_leaves_dict_valued_attributes_alone():
    """A module holding a dict subclass that forbids update (transformers' ModelOutput: ONNX Runtime's runner keeps
    one to restore the output structure) ran fine, but every verification of it failed after the run."""
    from fxforge.runtime import run_isolated

    class FrozenDict(dict):
        def update(self, *args, **kwargs):
            raise Exception("You cannot use update on this instance")

        def clear(self):
            raise Exception("You cannot use clear on this instance")

    class HoldsOutput(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.output_like = FrozenDict(logits=torch.zeros(1))

        def forward(self, x):
            return x + 1

    model = HoldsOutput()
    held = model.output_like
    assert torch.equal(run_isolated(model, (torch.zeros(2),), {}), torch.ones(2))
    assert model.output_like is held


def test_bench_and_a_failed_export_do_not_update_the_callers_batchnorm_statistics(tmp_path):
    """The runners and the TorchScript trace run the caller's modules (the graph shares them): in training mode
    each call updated running statistics -- bench's eager and fx rows, and an export that then failed."""
    model = ConvBN().train()
    captured = capture(model, (torch.randn(2, 3, 8, 8),), method="symbolic_trace")
    before = _state(model)
    report = fxforge.bench(captured, ["eager", "fx"], repeats=2, warmup=1, peak=False)
    assert all(row.ok for row in report.rows)
    assert _same_state(model, before)
    with pytest.raises(ExportError, match="the trace fixed a value"):  # BatchNorm's training-mode size check
        fxforge.export_model(captured, "torchscript", tmp_path / "m.pt", verify_export=False)
    assert _same_state(model, before) and model.training


def test_a_sparse_buffer_is_compared_by_value():
    """torch.equal has no sparse kernel: the buffer checks around verify's runs raised NotImplementedError
    (an internal error from `optimize --verify` on any model holding a sparse buffer)."""

    class SparseMix(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("mix", torch.eye(4).to_sparse())
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(torch.sparse.mm(self.mix, x.t()).t())

    model = SparseMix().eval()
    captured = capture(model, (torch.randn(2, 4),))
    result = fxforge.optimize(captured, ["dead_code", "cse"], verify=True)
    assert result.pipeline.ok and result.pipeline.failed_pass is None
    assert verify(captured, captured.graph_module).ok
    snapshot = runtime.buffers_snapshot(model)
    assert runtime.changed_buffers(model, snapshot) == []
    model.mix = (torch.eye(4) * 2).to_sparse()
    assert runtime.changed_buffers(model, snapshot) == ["mix"]


def test_verifier_gives_back_the_callers_random_state():
    """verify kept the caller's random state, but the public Verifier it wraps did not: its constructor runs the
    reference (dropout in training mode draws from the global generator), and check runs the candidate."""
    from fxforge.verify import Verifier

    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).train()
    captured = capture(model, (torch.randn(2, 4),), method="symbolic_trace", check=False)
    before = torch.get_rng_state()
    Verifier(captured, cases=2)
    assert torch.equal(torch.get_rng_state(), before)
    model.eval()
    verifier = Verifier(capture(model, (torch.randn(2, 4),)), cases=2)
    before = torch.get_rng_state()
    assert verifier.check(lambda x: model(x) + 0 * torch.rand_like(x)).ok
    assert torch.equal(torch.get_rng_state(), before)


def test_split_leaves_the_callers_module_attributes_bound(tmp_path):
    """Writing the stages exported each stage module, which shares its leaf modules with the caller's model, outside
    preserved_state: torch.export rebound the Conv2d's stride, padding... to new (equal) tuples."""
    model = ConvBN().eval()
    captured = capture(model, (torch.randn(2, 3, 8, 8),))
    bindings = {name: dict(vars(module)) for name, module in model.named_modules()}
    fxforge.split(captured, 2, output_dir=tmp_path / "split", cases=2)
    for name, module in model.named_modules():
        assert all(vars(module).get(key) is value for key, value in bindings[name].items()), name
        assert vars(module).keys() == bindings[name].keys()


@pytest.mark.parametrize(
    "call",
    [
        lambda noisy, clean: fxforge.prepare(noisy, "2x8"),
        lambda noisy, clean: verify(fxforge.prepare(clean, "2x8"), noisy),
        lambda noisy, clean: fxforge.inspect_graph(fxforge.prepare(noisy, "2x8")),
        lambda noisy, clean: fxforge.Verifier(fxforge.prepare(clean, "2x8"), cases=2).check(noisy),
    ],
    ids=["prepare", "verify", "inspect", "Verifier.check"],
)
def test_the_noise_stream_a_module_holds_is_where_it_was(call):
    """The random streams a caller's module holds itself (insert_after's noise keeps a torch.Generator per site):
    split rewound them, prepare, verify and inspect advanced them, so the caller's next call drew other noise."""
    import copy

    torch.manual_seed(0)
    clean = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)).eval()
    graph = capture(clean, (torch.randn(2, 8),), method="symbolic_trace").graph_module
    options = {"select": "kind:relu", "insert": "noise", "sigma": 0.5, "seed": 0}
    noisy = apply_pass(graph, "insert_after", options).graph_module.eval()
    x = torch.ones(2, 8)
    noisy(x)  # its generator exists, and has drawn
    untouched = copy.deepcopy(noisy)
    call(noisy, clean)
    assert torch.equal(noisy(x), untouched(x))
    assert torch.equal(noisy(x), untouched(x))
