"""remove_identity: no-op calls go in both dialects; calls that only look like no-ops stay, with the reason.

The torch dialect needs shape metadata to prove dtypes and layouts (``Pipeline`` records it; here
``with_shapes`` does); without it every arithmetic, cast and contiguous call is kept.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp

from fxforge.capture import Captured, capture, placeholder_values
from fxforge.passes import apply_pass

DIALECTS = ["torch", "aten"]


def with_shapes(captured: Captured) -> Captured:
    if captured.dialect == "torch":
        gm = captured.graph_module
        ShapeProp(gm).propagate(*placeholder_values(gm, captured.example_inputs, {}))
    return captured


def calls(gm) -> int:
    """Calls that compute something (torch.export's input guard and metadata asserts left out)."""
    return sum(
        1
        for n in gm.graph.nodes
        if n.op.startswith("call") and n.target != "_guards_fn" and "_assert" not in str(n.target)
    )


class Neutral(nn.Module):
    """Every neutral-literal form; the relu makes the inputs of the arithmetic fresh values."""

    def __init__(self):
        super().__init__()
        self.identity = nn.Identity()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(self.identity(x)).relu()
        y = 1 * (y * 1) + 0
        y = torch.add(0, y.sub(0)) / 1
        return torch.mul(y.div(1), 1.0).tanh()


@pytest.mark.parametrize("dialect", DIALECTS)
def test_removes_identity_and_neutral_arithmetic(dialect, capture_as, run_verified):
    captured = with_shapes(capture_as(Neutral().eval(), torch.randn(2, 4), dialect))
    result = run_verified(captured, "remove_identity")
    # torch.export drops nn.Identity at capture already; the eight arithmetic forms remain in both dialects
    removed = 9 if dialect == "torch" else 8
    assert result.removed == removed, (result.log, result.skipped)
    assert calls(result.graph_module) == calls(captured.graph_module) - removed == 3  # linear, relu, tanh


class NoOpLayoutAndCasts(nn.Module):
    def forward(self, x):
        y = x.relu()
        return y.contiguous().to(torch.float32).float().tanh()


@pytest.mark.parametrize("dialect", DIALECTS)
def test_removes_noop_contiguous_and_casts(dialect, capture_as, run_verified):
    captured = with_shapes(capture_as(NoOpLayoutAndCasts().eval(), torch.randn(2, 4), dialect))
    result = run_verified(captured, "remove_identity")
    # torch.export drops a contiguous() on a contiguous tensor at capture already
    assert result.removed == (3 if dialect == "torch" else 2) and result.skipped == [], (result.log, result.skipped)
    assert calls(result.graph_module) == 2  # relu, tanh


class RealCasts(nn.Module):
    def forward(self, x):
        return x.to(torch.float64), x.transpose(0, 1).contiguous(), x.long() * 1


@pytest.mark.parametrize("dialect", DIALECTS)
def test_keeps_real_casts_and_layout_changes(dialect, capture_as, run_verified):
    captured = with_shapes(capture_as(RealCasts().eval(), torch.randn(3, 4), dialect))
    result = run_verified(captured, "remove_identity")
    reasons = "\n".join(result.skipped)
    assert "converts torch.float32 to torch.float64" in reasons
    assert "not contiguous" in reasons
    assert "converts torch.float32 to torch.int64" in reasons
    assert result.removed == 1 and "x * 1" in result.log[0]  # int64 * 1 stays int64: that one goes


def test_keeps_a_real_device_change(capture_as):
    class ToMeta(nn.Module):
        def forward(self, x):
            return x.to("meta").sum()

    captured = capture_as(ToMeta(), torch.randn(2, 3), "aten", check=False)
    result = apply_pass(captured.graph_module, "remove_identity")
    assert not result.changed and "moves the tensor from cpu to meta" in result.skipped[0]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_device_move_needs_a_known_device(dialect, capture_as, run_verified):
    class ToCpu(nn.Module):
        def forward(self, x):
            return x.relu().to("cpu")

    result = run_verified(with_shapes(capture_as(ToCpu(), torch.randn(2, 3), dialect)), "remove_identity")
    if dialect == "aten":  # torch.export records devices: cpu -> cpu is a no-op
        assert result.removed == 1
    else:  # ShapeProp records no device: kept
        assert not result.changed and "device is unknown" in result.skipped[0]


class Promotes(nn.Module):
    def forward(self, i, b):
        return i * 1.0, i + 0.0, i / 1, b * 1, b + 0


@pytest.mark.parametrize("dialect", DIALECTS)
def test_keeps_arithmetic_that_promotes_the_dtype(dialect, capture_as, run_verified):
    inputs = (torch.arange(6).reshape(2, 3), torch.tensor([True, False]))
    captured = with_shapes(capture_as(Promotes(), inputs, dialect))
    result = run_verified(captured, "remove_identity")
    assert not result.changed and len(result.skipped) == 5, result.skipped
    reasons = "\n".join(result.skipped)
    for expected in ("int64 mul 1.0 promotes", "int64 add 0.0 promotes", "bool mul 1 promotes", "bool add 0 promotes"):
        assert expected in reasons
    assert "true division turns torch.int64 into a floating dtype" in reasons


class Broadcasts(nn.Module):
    def forward(self, x):
        y = x.relu()
        return y * torch.ones(3, 2, 4), y + torch.zeros(3, 2, 4), y * torch.tensor(1.0)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_keeps_multiplication_by_a_tensor_one(dialect, capture_as, run_verified):
    # a tensor of ones may broadcast to a bigger shape (or promote): only literal scalars count for * and /;
    # + and - take stored zeros that leave the shape alone (test_adding_a_stored_tensor_of_zeros...)
    captured = with_shapes(capture_as(Broadcasts(), torch.randn(2, 4), dialect))
    result = run_verified(captured, "remove_identity")
    # torch.export writes torch.tensor(1.0) as lift_fresh_copy + detach_: only that detach_ may go
    assert all("aten.detach_ of a fresh constant" in line for line in result.log), result.log
    assert calls(result.graph_module) == calls(captured.graph_module) - len(result.log)


class CopyWrittenLater(nn.Module):
    def forward(self, x):
        y = x.relu()
        z = y * 1
        z.add_(1)  # writes the copy: with z gone it would write y, which is returned as well
        return y, z


class InputWrittenLater(nn.Module):
    def forward(self, x):
        y = x.relu()
        z = y * 1
        y.mul_(2)  # writes the input after the copy was taken
        return z + 0


class CopyWrittenByInplaceModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        y = x.sin()
        return y, self.act(y * 1)


class ReturnsInputAndCopy(nn.Module):
    def forward(self, x):
        return x, x * 1  # the caller would get the same tensor twice


IN_PLACE_CASES = {
    "copy-written-later": (CopyWrittenLater, "in-place op writes"),
    "input-written-later": (InputWrittenLater, "in-place op writes"),
    "copy-written-by-inplace-module": (CopyWrittenByInplaceModule, "in-place op writes"),
    "returns-input-and-copy": (ReturnsInputAndCopy, "graph returns"),
}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("case", IN_PLACE_CASES)
def test_keeps_copies_that_aliasing_could_tell_apart(case, dialect, capture_as, run_verified):
    make, reason = IN_PLACE_CASES[case]
    captured = with_shapes(capture_as(make(), torch.randn(2, 4), dialect))
    result = run_verified(captured, "remove_identity")
    kept = [s for s in result.skipped if "x * 1" in s]
    assert len(kept) == 1 and reason in kept[0], result.skipped
    assert not any("x * 1" in line for line in result.log)


class CopiesThenViews(nn.Module):
    """Copies whose layout differs from their input's: a copy of an expanded tensor and of a slice with gaps are
    dense, and ``view(-1)`` works on the copy only (torch.export records the view it saw work)."""

    def __init__(self):
        super().__init__()
        self.v = nn.Parameter(torch.randn(4))

    def forward(self, x):
        expanded = self.v.expand(2, 4).clone()
        gapped = x[:, ::2] * 1
        return expanded.view(-1) + x.reshape(-1), gapped.view(-1) * 2


@pytest.mark.parametrize("dialect", DIALECTS)
def test_keeps_copies_laid_out_differently_from_their_input(dialect, capture_as, run_verified):
    captured = with_shapes(capture_as(CopiesThenViews(), torch.randn(2, 4), dialect))
    result = run_verified(captured, "remove_identity")
    kept = [s.split(": ")[0] for s in result.skipped if "laid out differently" in s]
    # a torch-dialect .clone() is not a candidate at all; torch.export records it as aten.clone
    assert kept == (["mul (x * 1)"] if dialect == "torch" else ["clone (aten.clone)", "mul (x * 1)"]), result.skipped
    assert not result.changed


class AliasTransposedInPlace(nn.Module):
    def forward(self, x):
        a = x + torch.arange(4.0).view(2, 2)
        b = a[:, :]  # torch.export records aten.alias: a second tensor object on a's memory
        b.t_()  # transposes b only
        return a + 2 * b


def test_keeps_aten_alias_reshaped_in_place(capture_as, run_verified):
    captured = capture_as(AliasTransposedInPlace(), torch.randn(2, 2), "aten")
    assert any("alias" in str(n.target) for n in captured.graph_module.graph.nodes)
    result = run_verified(captured, "remove_identity")  # without the alias, t_ would transpose a as well
    assert not result.changed and "in-place view op" in result.skipped[0], result.skipped


class MaskOnADetachedConstant(nn.Module):
    """transformers 5.17's attention mask: ``torch.where(keep, torch.tensor(0.0).detach_(), min)``."""

    def forward(self, x):
        keep = torch.ones(x.shape, dtype=torch.bool)
        mask = torch.where(keep, torch.tensor(0.0).detach_(), torch.finfo(x.dtype).min)
        return (x + mask).softmax(-1)


def test_detach_of_a_fresh_constant_goes_and_then_the_zero_mask(capture_as, run_verified):
    from fxforge.pipeline import Pipeline

    captured = capture_as(MaskOnADetachedConstant(), torch.randn(2, 3), "aten")
    assert any("detach_" in str(n.target) for n in captured.graph_module.graph.nodes)  # the premise
    result = run_verified(captured, "remove_identity")
    assert any("aten.detach_ of a fresh constant" in line for line in result.log), result.log
    # with it gone, fold_constants stores the mask (all zeros) and remove_identity then drops x + mask
    piped = Pipeline(["remove_identity", "fold_constants", "remove_identity", "dead_code"]).run(captured)
    adds = [n for n in piped.graph_module.graph.nodes if "add" in str(n.target)]
    assert not adds, piped.graph_module.code


class AddsZero(nn.Module):
    def forward(self, x):
        return x.relu().neg() + 0  # relu(-0.0).neg() is -0.0; + 0 makes it +0.0


@pytest.mark.parametrize("dialect", DIALECTS)
def test_signed_zeros_option_keeps_x_plus_zero(dialect, capture_as, run_verified):
    captured = with_shapes(capture_as(AddsZero(), torch.randn(2, 4), dialect))
    assert run_verified(captured, "remove_identity").removed == 1
    result = run_verified(captured, "remove_identity", {"signed_zeros": True})
    assert not result.changed and "signed_zeros=True" in result.skipped[0]


def test_torch_dialect_without_shape_metadata_keeps_everything(capture_as):
    bare = torch.fx.symbolic_trace(NoOpLayoutAndCasts())  # no shape propagation: nothing proven
    result = apply_pass(bare, "remove_identity")
    assert not result.changed and len(result.skipped) == 3
    assert all("unknown" in reason for reason in result.skipped)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_nothing_to_do(dialect, capture_as, run_verified):
    captured = with_shapes(capture_as(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.randn(2, 4), dialect))
    result = run_verified(captured, "remove_identity")
    assert not result.changed and result.log == [] and result.skipped == []
    assert result.graph_module.code == captured.graph_module.code


def test_torchvision_feature_extractor(capture_as, run_verified):
    # the usual way to turn a classifier into a feature extractor leaves an nn.Identity head
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    model.fc = nn.Identity()
    captured = with_shapes(capture_as(model, torch.randn(1, 3, 64, 64), "torch"))
    result = run_verified(captured, "remove_identity", seeds=(0,))
    assert result.log == ["removed fc (nn.Identity)"]
    assert not hasattr(result.graph_module, "fc") and isinstance(model.fc, nn.Identity)


def test_torchvision_shufflenet_keeps_the_channel_shuffle_contiguous(capture_as, run_verified):
    # channel_shuffle calls .contiguous() on a transposed view: a real copy, never a no-op
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    captured = with_shapes(
        capture_as(torchvision.models.shufflenet_v2_x0_5().eval(), torch.randn(1, 3, 64, 64), "torch")
    )
    result = run_verified(captured, "remove_identity", seeds=(0,))
    assert not result.changed and len(result.skipped) == 16
    assert all("not contiguous" in reason for reason in result.skipped)


class ZeroMask(nn.Module):
    """x + a stored tensor of zeros (what fold_constants leaves of an unpadded attention mask), and what stays."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("zeros", torch.zeros(1, 4))  # broadcasts over the batch, leaves x's shape
        self.register_buffer("wide", torch.zeros(3, 2, 4))  # broadcasts x (2, 4) to (3, 2, 4)
        self.register_buffer("ones", torch.ones(1, 4))  # not zeros
        self.register_buffer("zeros64", torch.zeros(1, 4, dtype=torch.float64))  # promotes x to float64
        self.fresh_bias = nn.Parameter(torch.zeros(4))  # a weight that is zero only until trained or loaded

    def forward(self, x):
        y = self.fc(x).relu()
        y = ((y + self.zeros) - self.zeros).tanh()
        return y + self.ones, y + self.wide, y + self.zeros64, y + self.fresh_bias


@pytest.mark.parametrize("dialect", DIALECTS)
def test_adding_a_stored_tensor_of_zeros_goes_unless_it_broadcasts_or_promotes(dialect, capture_as, run_verified):
    captured = with_shapes(capture_as(ZeroMask().eval(), torch.randn(2, 4), dialect))
    result = run_verified(captured, "remove_identity")
    assert result.removed == 2, (result.log, result.skipped)
    assert calls(result.graph_module) == calls(captured.graph_module) - 2
    kept = " ".join(result.skipped)
    assert "broadcasts x to another shape" in kept and "promotes the dtype" in kept
    outputs = result.graph_module(torch.randn(2, 4))
    assert [o.shape for o in outputs] == [(2, 4), (3, 2, 4), (2, 4), (2, 4)] and outputs[2].dtype == torch.float64
    assert "fresh_bias" in str(result.graph_module.code)


class ZeroOperands(nn.Module):
    """The stored zeros on either side and on both: Z + x, Z + Z, buffer + Z, each used once more below."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("zeros", torch.zeros(1, 4))
        self.register_buffer("ones", torch.ones(1, 4))

    def forward(self, x):
        y = self.fc(x).relu()
        z_plus_y = self.zeros + y
        z_plus_z = self.zeros + self.zeros
        ones_plus_z = self.ones + self.zeros
        return (z_plus_y * ones_plus_z + z_plus_z).tanh()


@pytest.mark.parametrize("dialect", DIALECTS)
def test_stored_zeros_on_either_side_go_and_each_is_read_once(dialect, capture_as, run_verified, monkeypatch):
    from fxforge.passes import remove_identity as module

    captured = with_shapes(capture_as(ZeroOperands().eval(), torch.randn(2, 4), dialect))
    proofs: list[str] = []
    prove = module._zero_tensor

    def counting(gm, value):
        proofs.append(str(value.target))
        return prove(gm, value)

    monkeypatch.setattr(module, "_zero_tensor", counting)
    result = run_verified(captured, "remove_identity")
    # both dialects record buffer + buffer (capture traces with buffers as proxies where plain tracing would have
    # computed Z + Z and ones + Z into constants): the three adds of a zero go
    expected = 3
    assert result.removed == expected, (result.log, result.skipped)
    assert calls(result.graph_module) == calls(captured.graph_module) - expected
    # the pass runs its plan once: every stored tensor it looked at was read once, however many adds use it
    assert sorted(proofs) == sorted(set(proofs)) and proofs, proofs


def test_the_reason_for_keeping_x_times_one_after_a_leaf_names_the_leaf():
    """A user's leaf module may write into what it is given, so x * 1.0 beside it stays; the reason spoke of an
    in-place op the model does not have (QA)."""
    from fxforge.capture import capture

    class Gate(nn.Module):
        def forward(self, x):
            return x if x.mean() > 0 else x.relu()

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = Gate()

        def forward(self, x):
            y = x * 1.0
            return self.gate(y) + y

    captured = capture(Model().eval(), (torch.randn(2, 4),))
    assert captured.record.leaves == ["gate"]
    result = apply_pass(captured.graph_module, "remove_identity")
    assert any("leaf module" in reason for reason in result.skipped), result.skipped


def test_a_cast_or_literal_on_a_graph_input_stays_in_the_torch_dialect():
    """QA: ``lin(x.float())`` lost its ``.float()`` because the example was float32, and the written model refused the
    float64 input the model takes. A torch-dialect graph runs any dtype it is given; the example's dtype proves the
    cast a no-op for that dtype only. Inside the graph (``lin(x).float()``) the recorded dtype still decides."""

    class CastsItsInput(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x, y):
            return self.lin(x.float()) + (y * 1.0).sum() + self.lin(x).float().sum()

    model, x = CastsItsInput(), torch.randn(2, 4)
    captured = capture(model, (x, torch.randn(2)))
    result = apply_pass(captured.graph_module, "remove_identity")
    assert [line.split()[1] for line in result.log] == ["float_2"], result.log
    assert sum("graph input, whose dtype the caller chooses" in line for line in result.skipped) == 2
    ids = torch.arange(2)  # an int input: y * 1.0 promotes it, as the model does
    torch.testing.assert_close(result.graph_module(x, ids), model(x, ids))
