"""insert_after's calibrated noise: the analytic Gaussian and Laplace mechanisms, the sensitivity derived from a clip
range (or stated), the report per site, reproducibility, refusals, and the CLI.

The analytic Gaussian sigma is checked against two computations that share no code with fxforge's: the closed
form of Balle & Wang's Theorem 8 solved at 50 digits (mpmath), and the privacy condition from its definition --
the hockey-stick divergence of N(0, s^2) and N(D, s^2), integrated numerically. Noise is checked statistically on
seeded draws (standard deviation, mean absolute deviation, variance, a tail probability).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import fx, nn

import fxforge
from fxforge.cli import main
from fxforge.errors import EXIT_FINDINGS, EXIT_OK
from fxforge.passes import FIX_ORDER, PassError, apply_pass, get_pass
from fxforge.passes.insert_after import (
    GaussianNoise,
    InsertAfterError,
    LaplaceNoise,
    analytic_gaussian_sigma,
    gaussian_delta,
    laplace_scale,
    site_seed,
)
from fxforge.verify import verify

mpmath = pytest.importorskip("mpmath")

NAME = "insert_after"
REFERENCE_SIGMA = 3.7306316348159  # eps=1, delta=1e-5, sensitivity 1 (Balle & Wang 2018 report ~3.73)


def classic_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Dwork & Roth's sqrt(2 ln(1.25/delta)) D / eps: proven only for eps < 1."""
    return math.sqrt(2 * math.log(1.25 / delta)) * sensitivity / epsilon


# --------------------------------------------------------------------------------------------------
# independent computations of the Gaussian mechanism's delta (mpmath, 50 digits)


def theorem8_delta(sigma, epsilon, sensitivity=1):
    """Balle & Wang 2018, Theorem 8, in arbitrary precision."""
    with mpmath.workdps(50):
        s, e, d = mpmath.mpf(sigma), mpmath.mpf(epsilon), mpmath.mpf(sensitivity)
        return mpmath.ncdf(d / (2 * s) - e * s / d) - mpmath.exp(e) * mpmath.ncdf(-d / (2 * s) - e * s / d)


def hockey_stick_delta(sigma, epsilon, sensitivity=1):
    """The definition: the smallest delta with P[M(x) in S] <= e^eps P[M(x') in S] + delta for every S is
    sup_S (P - e^eps Q)(S) = integral of max(0, p - e^eps q) for p = N(0, s^2), q = N(D, s^2) -- integrated
    numerically over the half-line where p > e^eps q."""
    with mpmath.workdps(50):
        s, e, d = mpmath.mpf(sigma), mpmath.mpf(epsilon), mpmath.mpf(sensitivity)
        cut = d / 2 - e * s**2 / d  # p(y) > e^eps q(y) exactly for y < cut
        integrand = lambda y: mpmath.npdf(y, 0, s) - mpmath.exp(e) * mpmath.npdf(y, d, s)  # noqa: E731
        return mpmath.quad(integrand, [-mpmath.inf, cut - 10 * s, cut])


def bisect(delta_of, delta: float, low: float = 1e-3, high: float = 1e3) -> float:
    for _ in range(200):
        middle = (low + high) / 2
        if delta_of(middle) <= delta:
            high = middle
        else:
            low = middle
    return high


def test_reference_value_computed_two_independent_ways():
    from_theorem = float(mpmath.findroot(lambda s: theorem8_delta(s, 1) - mpmath.mpf("1e-5"), 3.7))
    from_definition = bisect(lambda s: hockey_stick_delta(s, 1), 1e-5, 1.0, 10.0)
    assert from_theorem == pytest.approx(REFERENCE_SIGMA, rel=1e-12)
    assert from_definition == pytest.approx(REFERENCE_SIGMA, rel=1e-9)
    assert analytic_gaussian_sigma(1.0, 1e-5, 1.0) == pytest.approx(REFERENCE_SIGMA, rel=1e-12)
    assert round(REFERENCE_SIGMA, 2) == 3.73 and classic_sigma(1.0, 1e-5) == pytest.approx(4.8448, abs=1e-4)


@pytest.mark.parametrize(
    "epsilon,delta", [(1.0, 1e-5), (0.1, 1e-6), (0.5, 1e-3), (3.0, 1e-5), (10.0, 1e-5), (50.0, 1e-10), (1.0, 0.5)]
)
def test_analytic_sigma_is_the_smallest_that_satisfies_the_privacy_condition(epsilon, delta):
    sigma = analytic_gaussian_sigma(epsilon, delta, 1.0)
    at = float(hockey_stick_delta(sigma, epsilon))
    below = float(hockey_stick_delta(sigma * (1 - 1e-6), epsilon))
    assert at <= delta * (1 + 1e-9), (sigma, at)
    assert below > delta, (sigma, below)  # a slightly smaller sigma is not (eps, delta)-DP
    # fxforge's own delta function (log-space Theorem 8) agrees with the integral
    assert gaussian_delta(sigma, epsilon, 1.0) == pytest.approx(at, rel=1e-8)


def test_the_classic_formula_is_larger_below_one_and_wrong_above():
    assert analytic_gaussian_sigma(0.5, 1e-5, 1.0) < classic_sigma(0.5, 1e-5)  # less noise for the same guarantee
    classic = classic_sigma(10.0, 1e-5)  # not proven for eps >= 1, and indeed too small
    assert float(theorem8_delta(classic, 10.0)) > 2e-5
    assert analytic_gaussian_sigma(10.0, 1e-5, 1.0) > classic


def test_sigma_scales_with_the_sensitivity_and_huge_epsilons_stay_finite():
    base = analytic_gaussian_sigma(2.0, 1e-6, 1.0)
    assert analytic_gaussian_sigma(2.0, 1e-6, 128.0) == pytest.approx(128 * base, rel=1e-12)
    big = analytic_gaussian_sigma(1000.0, 1e-6, 1.0)  # exp(1000) overflows a float: computed in log space
    assert 0 < big < 0.1 and float(theorem8_delta(big, 1000.0)) <= 1e-6 * (1 + 1e-9)
    assert laplace_scale(0.5, 3.0) == 6.0


# --------------------------------------------------------------------------------------------------
# the noise itself, statistically


def test_gaussian_noise_has_the_calibrated_standard_deviation():
    sigma = analytic_gaussian_sigma(1.0, 1e-5, 1.0)
    module = GaussianNoise("site", sigma=sigma, seed=0)
    with torch.no_grad():
        draws = module(torch.zeros(200_000, dtype=torch.float64))
    assert abs(float(draws.std()) / sigma - 1) < 0.01
    assert abs(float(draws.mean())) < 0.01 * sigma
    assert abs(float((draws.abs() > sigma).double().mean()) - 0.3173) < 0.005  # P(|N| > 1 sd)


def test_laplace_noise_has_the_calibrated_scale():
    scale = laplace_scale(0.5, 2.0)
    module = LaplaceNoise("site", scale=scale, seed=0)
    with torch.no_grad():
        draws = module(torch.zeros(1_000_000, dtype=torch.float64))
    assert abs(float(draws.abs().mean()) / scale - 1) < 0.01  # mean absolute deviation b
    assert abs(float(draws.var()) / (2 * scale**2) - 1) < 0.01  # variance 2 b^2
    assert abs(float(draws.mean())) < 0.01 * scale
    assert abs(float((draws.abs() > scale).double().mean()) - math.exp(-1)) < 0.003  # P(|X| > b) = 1/e
    assert torch.isfinite(draws).all()


# --------------------------------------------------------------------------------------------------
# the pass: derivation, report, reproducibility


class Net(nn.Module):
    """Two linear layers and a relu between them: the relu's value (2 x 16 = 32 elements) is released."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.act = nn.Linear(8, 16), nn.Linear(16, 4), nn.ReLU()

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Residual(nn.Module):
    """A skip connection around the noised relu: the output is not protected."""

    def __init__(self):
        super().__init__()
        self.fc, self.act = nn.Linear(8, 8), nn.ReLU()

    def forward(self, x):
        return self.act(self.fc(x)) + x


X = torch.randn(2, 8)
DP = {"select": "type:ReLU", "insert": "noise", "epsilon": 1.0, "delta": 1e-5, "clip_min": 0, "clip_max": 2, "seed": 0}


@pytest.fixture(params=["torch", "aten"])
def net(request, capture_as):
    torch.manual_seed(0)
    return capture_as(Net().eval(), X, request.param)


def _site(result) -> dict:
    (report,) = result.artifacts["privacy"]["sites"].values()
    return report


def test_sensitivity_derived_from_the_clip_range_and_the_shape(net):
    gaussian = apply_pass(net.graph_module, NAME, DP)
    report = _site(gaussian)
    assert report["elements"] == 32 and report["norm"] == "L2" and report["unit"] == "tensor"
    assert report["sensitivity"] == pytest.approx(2 * math.sqrt(32))
    assert report["derivation"] == "clip range [0, 2] x 32 elements (unit: tensor): L2 = 2 x sqrt(32)"
    assert report["sigma"] == pytest.approx(REFERENCE_SIGMA * 2 * math.sqrt(32), rel=1e-12)

    laplace = apply_pass(net.graph_module, NAME, {**DP, "mechanism": "laplace", "delta": None})
    report = _site(laplace)
    assert report["norm"] == "L1" and report["sensitivity"] == 64.0 and report["scale"] == 64.0
    assert report["delta"] == 0.0 and report["sigma"] is None

    element = apply_pass(net.graph_module, NAME, {**DP, "unit": "element"})
    report = _site(element)
    assert report["sensitivity"] == 2.0 and report["elements"] is None
    assert report["sigma"] == pytest.approx(2 * REFERENCE_SIGMA, rel=1e-12)

    stated = apply_pass(net.graph_module, NAME, {**DP, "clip_min": None, "clip_max": None, "sensitivity": 0.5})
    report = _site(stated)
    assert report["derivation"] == "stated: option sensitivity" and report["clip"] is None
    assert report["sigma"] == pytest.approx(0.5 * REFERENCE_SIGMA, rel=1e-12)


def test_the_report_per_site_and_per_call(net):
    result = apply_pass(net.graph_module, NAME, DP)
    privacy = result.artifacts["privacy"]
    report = _site(result)
    site = next(iter(privacy["sites"]))
    module = result.graph_module.get_submodule(report["module"])
    assert isinstance(module, GaussianNoise) and module.sigma == report["sigma"]
    assert report["seed"] == 0 and report["site_seed"] == site_seed(0, site) == module.generator_seed
    assert report["mechanism"] == "gaussian" and report["guarantee"] is True
    assert (report["epsilon"], report["delta"], report["clip"]) == (1.0, 1e-5, [0.0, 2.0])
    assert privacy["per_call"] == {"sites": 1, "epsilon": 1.0, "delta": 1e-5, "composition": "basic"}
    assert privacy["outputs_covered"] is True and privacy["uncovered_path"] is None
    line = next(line for line in result.log if line.startswith("inserted noise"))
    for part in ("gaussian mechanism", "epsilon=1", "delta=1e-05", "L2 sensitivity 11.3137", "x 32 elements"):
        assert part in line, line
    assert f"sigma={report['sigma']:.6g}" in line and line.endswith("seed 0")
    assert any(line.startswith("privacy per call of the graph: 1 noise site, basic composition") for line in result.log)
    assert "every path from the graph's inputs to its outputs passes through a noise site" in result.log[-1]
    assert module.fxforge_insert["epsilon"] == 1.0 and module.fxforge_insert["clip"] == (0.0, 2.0)


def test_per_call_totals_compose_over_sites_and_a_skip_connection_is_named(capture_as):
    demo = fxforge.prepare("demo")  # two relu module calls in a row, then a functional relu
    result = apply_pass(demo.graph_module, NAME, {**DP, "clip_max": 1})
    privacy = result.artifacts["privacy"]
    assert privacy["per_call"]["sites"] == 2 and privacy["per_call"]["epsilon"] == 2.0
    assert privacy["per_call"]["delta"] == pytest.approx(2e-5) and privacy["outputs_covered"] is True

    residual = capture_as(Residual().eval(), X, "torch")
    result = apply_pass(residual.graph_module, NAME, DP)
    assert result.artifacts["privacy"]["outputs_covered"] is False
    assert result.artifacts["privacy"]["uncovered_path"] == ["x", "add", "output"]
    assert "privacy WARNING" in result.log[-1] and "(x -> add -> output)" in result.log[-1]


def test_raw_sigma_claims_no_guarantee(net):
    result = apply_pass(net.graph_module, NAME, {"select": "type:ReLU", "insert": "noise", "sigma": 0.3, "seed": 1})
    report = _site(result)
    assert report["guarantee"] is False and report["sigma"] == 0.3 and report["epsilon"] is None
    assert "no (epsilon, delta) guarantee is claimed" in report["derivation"]
    assert "gaussian, sigma=0.3 (raw sigma: no (epsilon, delta) guarantee is claimed), seed 1" in result.log[0]
    assert result.artifacts["privacy"]["per_call"] is None
    assert not any(line.startswith("privacy") for line in result.log)


def test_reproducible_with_a_seed(net):
    x = torch.randn(2, 8)
    runs = [apply_pass(net.graph_module, NAME, {**DP, "seed": seed}).graph_module for seed in (5, 5, 6)]
    with torch.no_grad():
        first, again, other = (gm(x) for gm in runs)
        moved_on = runs[0](x)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert not torch.equal(first, moved_on)  # each call draws fresh noise: each query spends the budget


def test_seed_drawn_at_random_is_not_logged(net):
    result = apply_pass(net.graph_module, NAME, {**DP, "seed": None})
    seed = result.artifacts["seed"]
    assert _site(result)["seed"] == seed
    assert str(seed) not in " ".join(result.log) and "seed drawn at random (not logged)" in result.log[1]


def test_clipping_bounds_the_value_before_the_noise():
    # a huge epsilon per element: sigma ~ 7e-3, so the output is the clipped value plus a little noise
    module = GaussianNoise("site", sigma=analytic_gaussian_sigma(1e4, 1e-5, 1.0), seed=0, clip=(0.0, 1.0))
    x = torch.tensor([-5.0, 0.5, 3.0, math.nan, math.inf, -math.inf] * 1000)
    with torch.no_grad():
        out = module(x).reshape(1000, 6).mean(0)
    assert torch.allclose(out, torch.tensor([0.0, 0.5, 1.0, 0.0, 1.0, 0.0]), atol=1e-3)  # NaN -> clip_min
    # rounding the bounds to a dtype never widens the range
    low, high = module.clip_bounds[torch.float16]
    assert (low, high) == (0.0, 1.0)
    tenth = GaussianNoise("site", sigma=1.0, clip=(-0.1, 0.1))
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        low, high = tenth.clip_bounds[dtype]
        assert low >= -0.1 and high <= 0.1 and float(torch.tensor(high, dtype=dtype)) == high


def test_more_elements_than_calibrated_are_refused_at_run_time(net):
    gm = apply_pass(net.graph_module, NAME, DP).graph_module
    if net.dialect == "torch":
        with torch.no_grad():
            gm(torch.randn(1, 8))  # fewer elements: a smaller sensitivity, the guarantee holds
        with pytest.raises(InsertAfterError, match="calibrated for at most 32 elements"):
            gm(torch.randn(3, 8))
    module = next(m for m in gm.modules() if isinstance(m, GaussianNoise))
    with pytest.raises(InsertAfterError, match="the privacy guarantee would not hold"):
        module(torch.zeros(33))


def test_verify_fails_by_design_and_insert_after_is_no_fix_pass(net):
    result = apply_pass(net.graph_module, NAME, DP)
    check = verify(net, result.graph_module)
    assert not check.ok and check.divergence is not None and check.divergence.pass_name == NAME
    guarantees = get_pass(NAME).guarantees
    assert "verification against the model fails by design" in guarantees and "not in lint --fix" in guarantees
    assert NAME not in FIX_ORDER


def test_noise_modules_survive_pickling_and_copies(capture_as, tmp_path):
    torch.manual_seed(0)
    net = capture_as(Net().eval(), X, "torch")  # ATen results are saved by re-export (below)
    gm = apply_pass(net.graph_module, NAME, {**DP, "mechanism": "laplace", "delta": None}).graph_module
    x = torch.randn(2, 8)
    gm(x)
    torch.save(gm, tmp_path / "m.pt")
    loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    module = next(m for m in loaded.modules() if isinstance(m, LaplaceNoise))
    assert module.clip == (0.0, 2.0) and module.max_elements == 32 and module.scale == 64.0
    assert torch.equal(loaded(x), gm(x))  # the generator's state travelled: the same stream continues


def test_noise_saved_before_clipping_existed_still_loads():
    module = GaussianNoise("site", sigma=0.5, seed=3)
    state = module.__getstate__()
    for key in ("clip", "max_elements", "clip_bounds"):
        state.pop(key)  # what an older fxforge pickled
    old = GaussianNoise.__new__(GaussianNoise)
    old.__setstate__(state)
    assert old.clip is None and old.max_elements is None
    assert torch.equal(old(torch.zeros(4)), GaussianNoise("site", sigma=0.5, seed=3)(torch.zeros(4)))


def test_aten_result_with_laplace_noise_saves_by_reexport(capture_as, tmp_path):
    from fxforge.optimize import save_graph_module

    captured = capture_as(Net().eval(), X, "aten")
    gm = apply_pass(captured.graph_module, NAME, {**DP, "mechanism": "laplace", "delta": None}).graph_module
    save_graph_module(gm, tmp_path, (X,), "aten")
    program = torch.export.load(str(tmp_path / "model.pt2")).module()
    out = program(X)
    assert out.shape == (2, 4) and torch.isfinite(out).all()
    assert not torch.allclose(out, captured.graph_module(X))


# --------------------------------------------------------------------------------------------------
# refusals


@pytest.mark.parametrize(
    "options,needle",
    [
        ({"epsilon": 0}, "option epsilon must be > 0"),
        ({"epsilon": -1}, "option epsilon must be > 0"),
        ({"epsilon": "inf"}, "option epsilon must be > 0 and finite"),
        ({"delta": 0}, "option delta must be in (0, 1)"),
        ({"delta": 1}, "option delta must be in (0, 1)"),
        ({"delta": 1.5}, "option delta must be in (0, 1)"),
        ({"delta": None}, "option delta is missing"),
        ({"mechanism": "laplace"}, "option delta is not for mechanism=laplace"),
        ({"mechanism": "exponential"}, "option mechanism must be gaussian or laplace"),
        ({"clip_min": None, "clip_max": None}, "no sensitivity: give clip_min and clip_max"),
        ({"clip_max": None}, "option clip_max is missing"),
        ({"clip_min": 3}, "option clip_min (3) must be less than clip_max (2)"),
        ({"sigma": 0.1}, "options sigma and epsilon exclude each other"),
        ({"sensitivity": 1}, "options sensitivity and clip_min/clip_max exclude each other"),
        ({"clip_min": None, "clip_max": None, "sensitivity": 0}, "option sensitivity must be > 0"),
        ({"clip_min": None, "clip_max": None, "sensitivity": 1, "unit": "element"}, "option unit applies to"),
        ({"unit": "row"}, "option unit must be tensor or element"),
        ({"epsilon": None}, "insert=noise needs sigma > 0, got"),  # with a sigma below
        ({"insert": "clamp", "min": 0}, "option epsilon is for insert=noise"),
    ],
)
def test_bad_privacy_options_name_the_option(net, options, needle):
    merged = {**DP, **options}
    if needle.startswith("insert=noise needs sigma"):
        merged["sigma"] = -1
    if merged.get("insert") == "clamp":
        for key in ("delta", "clip_min", "clip_max", "seed"):
            merged.pop(key)
    merged = {k: v for k, v in merged.items() if v is not None}
    with pytest.raises(PassError) as caught:
        apply_pass(net.graph_module, NAME, merged)
    assert needle in caught.value.message, caught.value.message


def test_neither_sigma_nor_epsilon(net):
    with pytest.raises(PassError, match=r"needs epsilon \(calibrated noise\) or sigma > 0") as caught:
        apply_pass(net.graph_module, NAME, {"select": "type:ReLU", "insert": "noise"})
    assert "epsilon: 1, delta: 1e-5" in caught.value.hint


class WithArgmax(nn.Module):
    def forward(self, x):
        return torch.relu(x), x.argmax(1)


def test_calibrated_noise_fails_closed(capture_as, net):
    captured = capture_as(WithArgmax(), X, "aten")
    # raw noise skips what it cannot take; calibrated noise refuses to leave a selected value unprotected
    raw = apply_pass(captured.graph_module, NAME, {"select": "op:call_function", "insert": "noise", "sigma": 1.0})
    assert raw.inserted == 1 and any("argmax" in line for line in raw.skipped)
    with pytest.raises(PassError, match="must protect every selected node, but argmax"):
        apply_pass(captured.graph_module, NAME, {**DP, "select": "op:call_function"})
    with pytest.raises(PassError, match="no node matched select type:Conv2d"):
        apply_pass(net.graph_module, NAME, {**DP, "select": "type:Conv2d"})


def test_unknown_element_count_needs_a_stated_sensitivity_or_element_unit():
    gm = fx.symbolic_trace(Net())  # no shape metadata
    with pytest.raises(PassError, match="cannot derive the sensitivity of act") as caught:
        apply_pass(gm, NAME, DP)
    assert "option sensitivity" in caught.value.hint and "unit: element" in caught.value.hint
    assert apply_pass(gm, NAME, {**DP, "unit": "element"}).inserted == 1


# --------------------------------------------------------------------------------------------------
# the CLI


CLI_OPTIONS = [
    "insert_after.select=type:ReLU",
    "insert_after.insert=noise",
    "insert_after.epsilon=1",
    "insert_after.delta=1e-5",
    "insert_after.clip_min=0",
    "insert_after.clip_max=1",
    "insert_after.seed=0",
]


def _cli(args: list[str]) -> list[str]:
    command = ["optimize", "demo", "-p", NAME]
    for option in CLI_OPTIONS:
        command += ["--option", option]
    return command + args


def test_cli_optimize_records_the_privacy_parameters(tmp_path, capsys):
    out = tmp_path / "noisy"
    code = main(_cli(["-o", str(out), "--json"]))
    stdout, err = capsys.readouterr()
    assert code == EXIT_OK, err
    step = json.loads(stdout)["passes"][0]
    assert step["name"] == NAME and step["inserted"] == 2
    first = step["log"][0]
    assert first.startswith("inserted noise after relu as relu_noise: gaussian mechanism, epsilon=1, delta=1e-05")
    assert "x 16384 elements (unit: tensor): L2 = 1 x sqrt(16384)" in first and first.endswith("seed 0")
    assert f"sigma={REFERENCE_SIGMA * 128:.6g}" in first
    assert "basic composition: epsilon=2, delta=2e-05" in step["log"][2]
    report = json.loads((out / "report.json").read_text())
    assert report["passes"][0]["log"] == step["log"]  # recorded next to the model
    model = torch.load(out / "model.pt", weights_only=False)
    x = torch.randn(1, 3, 32, 32)
    again = torch.load(out / "model.pt", weights_only=False)
    assert torch.equal(model(x), again(x))  # seeded: the saved model draws the same noise


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_cli_optimize_writes_a_program_of_a_noisy_graph(mechanism, tmp_path, capsys):
    """QA: optimize of a noisy graph left model.pt2 out with ATen's "SymIntArrayRef expected to contain only
    concrete integers" (torch.randn's generator overload at a dynamic batch)."""
    out = tmp_path / "noisy"
    laplace = ["--option", "insert_after.mechanism=laplace", "--option", "insert_after.delta=null"]
    code = main(_cli(["-o", str(out), "--json"] + (laplace if mechanism == "laplace" else [])))
    stdout, err = capsys.readouterr()
    assert code == EXIT_OK, err
    assert not [note for note in json.loads(stdout)["notes"] if note.startswith("not written")]
    program = torch.export.load(str(out / "model.pt2")).module()
    x = torch.randn(1, 3, 32, 32)  # the noise was calibrated for one sample's elements: the program keeps that
    first, again = program(x), torch.export.load(str(out / "model.pt2")).module()(x)
    assert first.shape == (1, 10) and torch.isfinite(first).all()
    assert torch.equal(first, again)  # the generator's seeded state is in the file
    assert not torch.equal(first, program(x))  # and draws afresh on each call


def test_cli_with_verify_fails_by_design(tmp_path, capsys):
    code = main(_cli(["--verify", "-o", str(tmp_path / "noisy")]))
    stdout = capsys.readouterr().out
    assert code == EXIT_FINDINGS and "verification failed after pass insert_after" in stdout
    assert "nothing was written" in stdout and not (tmp_path / "noisy").exists()


def test_cli_bad_privacy_option_is_a_usage_error(capsys):
    options = ["insert_after.select=type:ReLU", "insert_after.insert=noise", "insert_after.epsilon=0"]
    code = main(["optimize", "demo", "-p", NAME, *(part for o in options for part in ("--option", o))])
    err = capsys.readouterr().err
    assert code != EXIT_OK and "option epsilon must be > 0" in err and "Traceback" not in err


def test_capture_of_a_noisy_graph_in_the_aten_dialect_uses_the_recorded_shape(capture_as):
    captured = capture_as(nn.Sequential(nn.Linear(3, 5), nn.ReLU()).eval(), torch.randn(4, 3), "aten")
    result = apply_pass(captured.graph_module, NAME, {**DP, "select": "kind:relu"})
    assert _site(result)["elements"] == 20 and _site(result)["sensitivity"] == pytest.approx(2 * math.sqrt(20))
