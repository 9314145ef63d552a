"""The arithmetic and the report of insert_after's privacy noise: calibrating the Gaussian mechanism (analytic,
Balle & Wang 2018) and the Laplace mechanism from (epsilon, delta) and a sensitivity, describing what one noise site
guarantees, and the per-call totals and input-to-output coverage of a graph's sites. The noise modules themselves
live in :mod:`fxforge.passes.insert_after` (saved models pickle them by that path). See docs/privacy.md."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import fx

from fxforge.graphs import reads_metadata_only
from fxforge.passes import PassError

MECHANISMS = ("gaussian", "laplace")
UNITS = ("tensor", "element")  # what neighbouring inputs may change in a released value: all of it, or one element


def _log_ndtr(t: float) -> float:
    """log Phi(t) of the standard normal CDF, accurate far into both tails (no underflow to log 0)."""
    return float(torch.special.log_ndtr(torch.tensor(t, dtype=torch.float64)))


def gaussian_delta(sigma: float, epsilon: float, sensitivity: float) -> float:
    """The smallest delta for which adding N(0, sigma^2) noise to each element of a value whose L2 sensitivity is
    ``sensitivity`` is (epsilon, delta)-differentially private -- exact, for every epsilon > 0 (Balle & Wang 2018,
    "Improving the Gaussian mechanism for differential privacy", Theorem 8):

        delta = Phi(D / (2 s) - e s / D) - exp(e) * Phi(-D / (2 s) - e s / D)

    computed as ``Phi(a) * (1 - exp(e + log Phi(b) - log Phi(a)))`` in log space, so that neither a large epsilon
    (exp overflows) nor a tiny delta (the two terms cancel) loses it."""
    a = sensitivity / (2.0 * sigma) - epsilon * sigma / sensitivity
    b = -sensitivity / (2.0 * sigma) - epsilon * sigma / sensitivity
    log_a, log_b = _log_ndtr(a), _log_ndtr(b)
    return -math.exp(log_a) * math.expm1(epsilon + log_b - log_a)


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """The smallest sigma for which the Gaussian mechanism is (epsilon, delta)-DP at this L2 sensitivity: the
    analytic Gaussian mechanism of Balle & Wang (2018), found by bisection on :func:`gaussian_delta` (which falls
    as sigma grows). Valid for every epsilon > 0, unlike the classic ``sqrt(2 ln(1.25/delta)) D / epsilon`` (only
    proven for epsilon < 1, and larger). Returns the upper end of the final bracket: the condition holds there."""
    if not (epsilon > 0 and math.isfinite(epsilon)) or not 0 < delta < 1 or not (sensitivity > 0):
        raise PassError(f"no Gaussian calibration for epsilon={epsilon}, delta={delta}, sensitivity={sensitivity}")
    low = high = sensitivity
    for _ in range(2100):  # doubling/halving from the sensitivity brackets any representable answer
        if gaussian_delta(high, epsilon, sensitivity) <= delta:
            break
        low, high = high, high * 2.0
    for _ in range(2100):
        if gaussian_delta(low, epsilon, sensitivity) > delta:
            break
        high, low = low, low / 2.0
    for _ in range(200):
        if high / low - 1.0 < 1e-14:
            break
        middle = math.sqrt(low * high)
        if gaussian_delta(middle, epsilon, sensitivity) <= delta:
            high = middle
        else:
            low = middle
    if not (math.isfinite(high) and high > 0 and gaussian_delta(high, epsilon, sensitivity) <= delta):
        raise PassError(f"could not calibrate Gaussian noise for epsilon={epsilon:g}, delta={delta:g}")
    return high


def laplace_scale(epsilon: float, sensitivity: float) -> float:
    """The Laplace mechanism's scale b = sensitivity / epsilon (L1 sensitivity; (epsilon, 0)-DP)."""
    return sensitivity / epsilon


def describe_noise(report: dict[str, Any], seed_given: bool) -> str:
    seed = f"seed {report['seed']}" if seed_given else "seed drawn at random (not logged)"
    if not report["guarantee"]:
        clip = f", clipped to [{report['clip'][0]:g}, {report['clip'][1]:g}]" if report["clip"] else ""
        claim = "raw sigma: no (epsilon, delta) guarantee is claimed"
        return f"gaussian, sigma={report['sigma']:g}{clip} ({claim}), {seed}"
    noise = f"sigma={report['sigma']:.6g}" if report["mechanism"] == "gaussian" else f"scale b={report['scale']:.6g}"
    return (
        f"{report['mechanism']} mechanism, epsilon={report['epsilon']:g}, delta={report['delta']:g}, "
        f"{report['norm']} sensitivity {report['sensitivity']:.6g} ({report['derivation']}), {noise}, {seed}"
    )


def uncovered_path(gm: fx.GraphModule, noise_nodes: set[fx.Node]) -> list[str] | None:
    """A path (node names) from a graph input to the output that passes through no noise site, or None. Reads of
    a value's shape, rank or dtype carry no values: they do not count (a shape is not protected)."""
    parent: dict[fx.Node, fx.Node | None] = {}
    queue = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node in queue:
        parent[node] = None
    while queue:
        node = queue.pop(0)
        if node.op == "output":
            path: list[str] = []
            walk: fx.Node | None = node
            while walk is not None:
                path.append(walk.name)
                walk = parent[walk]
            return path[::-1]
        if node in noise_nodes:
            continue
        for user in node.users:
            if user not in parent and not reads_metadata_only(user, node):
                parent[user] = node
                queue.append(user)
    return None


def privacy_summary(
    gm: fx.GraphModule, sites: dict[str, dict[str, Any]], noise_nodes: set[fx.Node]
) -> tuple[dict[str, Any], list[str]]:
    """The per-call totals by basic composition, and whether the sites cover every input-to-output path."""
    count = len(sites)
    epsilon = sum(r["epsilon"] for r in sites.values())
    delta = sum(r["delta"] for r in sites.values())
    uncovered = uncovered_path(gm, noise_nodes)
    summary = {
        "sites": sites,
        "per_call": {"sites": count, "epsilon": epsilon, "delta": delta, "composition": "basic"},
        "outputs_covered": uncovered is None,
        "uncovered_path": uncovered,
    }
    lines = [
        f"privacy per call of the graph: {count} noise site{'s' if count != 1 else ''}, basic composition: "
        f"epsilon={epsilon:g}, delta={delta:g}; k calls spend k times that (docs/privacy.md)"
    ]
    if uncovered is None:
        lines.append("privacy: every path from the graph's inputs to its outputs passes through a noise site")
    else:
        shown = uncovered if len(uncovered) <= 6 else [*uncovered[:3], "...", *uncovered[-2:]]
        lines.append(
            "privacy WARNING: a path from the inputs to the outputs passes through no noise site "
            f"({' -> '.join(shown)}): the outputs are not protected, only the values at the sites"
        )
    return summary, lines
