"""Partition: the optimal split of a sequence of costs into contiguous stages (a pure algorithm, no torch).

Owns :func:`partition`, which ``fxforge split`` runs over a graph's nodes in topological order. Given
``costs[0..n-1]`` (a node's FLOPs, parameter bytes, memory or milliseconds), ``crossing[j]`` (the bytes a cut
after the first ``j`` items would send to the next stage) and ``allowed[j]`` (whether such a cut is possible at
all), it returns the ``stages - 1`` cuts that

1. minimise the cost of the most expensive stage (the pipeline's throughput is set by its slowest stage), and
2. among all cuts achieving that (or within ``slack`` of it), minimise the total bytes crossing the cuts.

Both steps are exact dynamic programmes over prefix sums ``P``, never a greedy guess:

* **bottleneck** ``g[s][i]``: the least possible maximum stage cost when the first ``i`` items form at most
  ``s`` stages. ``g[s][i] = min_j max(g[s-1][j], P[i] - P[j])`` over allowed cuts ``j < i``. ``g[s-1][j]`` never
  decreases with ``j`` and ``P[i] - P[j]`` never increases, so the best ``j`` is where the two curves cross,
  found by binary search: O(n log n) per stage count, O(S n log n) in all;
* **crossing bytes** ``f[s][i]``: the least total crossing bytes for exactly ``s`` non-empty stages covering the
  first ``i`` items, each costing at most the bound ``B``. ``f[s][i] = min_j f[s-1][j] + crossing[j]`` over
  allowed ``j`` with ``P[i] - P[j] <= B``; the lowest such ``j`` only moves right as ``i`` grows, so a sliding
  window minimum (a monotone deque) gives every ``f[s][i]`` in amortised O(1): O(S n) in all.

A stage costing ``P[i] - P[j]`` is compared with ``B`` through the very same float expression the bound was
computed from, so the optimum of step 1 is always feasible in step 2 (no rounding can lose it).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

Number = int | float


@dataclass(frozen=True)
class Partition:
    """The chosen cuts and what they achieve.

    ``cuts`` are prefix lengths, ascending: a cut ``j`` ends a stage after the first ``j`` items.
    ``bottleneck`` is the cost of the most expensive stage, ``crossing`` the bytes summed over the cuts.
    """

    cuts: tuple[int, ...]
    stage_costs: tuple[Number, ...]
    bottleneck: Number
    crossing: Number

    def stage_bounds(self, n: int) -> list[tuple[int, int]]:
        """``(start, end)`` item ranges of the stages, ``end`` exclusive."""
        edges = [0, *self.cuts, n]
        return list(itertools.pairwise(edges))


def prefix_sums(values: Sequence[Number]) -> list[Number]:
    """``P[i]`` = the sum of the first ``i`` values (``P[0] = 0``)."""
    return [0, *itertools.accumulate(values)]


def partition(
    costs: Sequence[Number],
    stages: int,
    *,
    crossing: Sequence[Number] | None = None,
    allowed: Sequence[bool] | None = None,
    slack: float = 0.0,
) -> Partition:
    """Split ``costs`` into ``stages`` contiguous non-empty stages; see the module docstring.

    ``crossing`` and ``allowed`` are indexed by prefix length (length ``n + 1``; entries 0 and ``n`` are unused);
    they default to zero bytes everywhere and every cut allowed. ``slack`` (>= 0) lets the bottleneck exceed the
    optimum by that fraction when that buys cuts with fewer crossing bytes.

    Raises:
        ValueError: negative costs, fewer items than stages, or fewer allowed cuts than ``stages - 1``.
    """
    n = len(costs)
    if stages < 1:
        raise ValueError(f"stages must be at least 1, got {stages}")
    if stages > n:
        raise ValueError(f"cannot make {stages} non-empty stages of {n} items")
    if any(c < 0 for c in costs):
        raise ValueError("costs must not be negative")
    if slack < 0:
        raise ValueError(f"slack must not be negative, got {slack}")
    crossing = list(crossing) if crossing is not None else [0] * (n + 1)
    allowed = list(allowed) if allowed is not None else [True] * (n + 1)
    if len(crossing) != n + 1 or len(allowed) != n + 1:
        raise ValueError("crossing and allowed are indexed by prefix length: give n + 1 entries")
    cut_points = [j for j in range(1, n) if allowed[j]]
    if len(cut_points) < stages - 1:
        raise ValueError(f"only {len(cut_points)} allowed cut points for {stages} stages")

    prefix = prefix_sums(costs)
    bound = _min_bottleneck(prefix, stages, cut_points)
    if slack:
        bound = bound * (1 + slack)
    cuts = _fewest_crossing_bytes(prefix, stages, cut_points, crossing, bound)
    edges = [0, *cuts, n]
    stage_costs = tuple(prefix[b] - prefix[a] for a, b in itertools.pairwise(edges))
    return Partition(tuple(cuts), stage_costs, max(stage_costs), sum(crossing[j] for j in cuts))


def _min_bottleneck(prefix: list[Number], stages: int, cut_points: list[int]) -> Number:
    """The least possible cost of the most expensive stage (``g[stages][n]``), by the binary-search DP."""
    n = len(prefix) - 1
    # g over the allowed cut points (as the end of a shorter prefix) and over n (the whole sequence)
    ends = [*cut_points, n]
    g = {i: prefix[i] for i in ends}  # one stage: the whole prefix
    for _ in range(2, stages + 1):
        # "at most s stages": g never increases with s, and g[j] never decreases with j over the cut points
        values = [g[j] for j in cut_points]
        new = {}
        for i in ends:
            limit = bisect.bisect_left(cut_points, i)  # cut points j < i
            best = g[i]
            lo, hi = 0, limit
            # first j (index t) whose prefix bottleneck reaches the cost of the last stage P[i] - P[j]
            while lo < hi:
                mid = (lo + hi) // 2
                if values[mid] >= prefix[i] - prefix[cut_points[mid]]:
                    hi = mid
                else:
                    lo = mid + 1
            for t in (lo - 1, lo):
                if 0 <= t < limit:
                    j = cut_points[t]
                    best = min(best, max(values[t], prefix[i] - prefix[j]))
            new[i] = best
        g = new
    return g[n]


def _fewest_crossing_bytes(
    prefix: list[Number], stages: int, cut_points: list[int], crossing: list[Number], bound: Number
) -> list[int]:
    """The ``stages - 1`` cuts with the fewest crossing bytes among those whose stages all cost at most ``bound``
    (exactly ``stages`` non-empty stages), by the sliding-window DP; backtracked from the recorded choices."""
    n = len(prefix) - 1
    inf = math.inf
    ends = [*cut_points, n]
    # f[i]: fewest crossing bytes with the current number of stages covering the first i items
    f = {i: (0 if prefix[i] <= bound else inf) for i in ends}
    choices: list[dict[int, int]] = []
    for s in range(2, stages + 1):
        targets = ends if s < stages else [n]
        new: dict[int, Number] = {}
        choice: dict[int, int] = {}
        window: deque[int] = deque()  # candidate cuts j, their f[j] + crossing[j] increasing front to back
        next_j = 0  # index into cut_points of the next cut to enter the window
        for i in targets:
            while next_j < len(cut_points) and cut_points[next_j] < i:
                j = cut_points[next_j]
                next_j += 1
                if f[j] == inf:
                    continue
                value = f[j] + crossing[j]
                while window and f[window[-1]] + crossing[window[-1]] > value:
                    window.pop()
                window.append(j)
            # the first stage cannot be longer than the bound: drop cuts j with P[i] - P[j] > bound
            while window and prefix[i] - prefix[window[0]] > bound:
                window.popleft()
            if window:
                best = window[0]
                new[i] = f[best] + crossing[best]
                choice[i] = best
            else:
                new[i] = inf
        f = new
        choices.append(choice)
    if f[n] == inf:  # cannot happen for the optimal bound: every cut of the optimum is allowed and within it
        raise ValueError(f"no split into {stages} stages keeps every stage within {bound}")
    cuts: list[int] = []
    i = n
    for choice in reversed(choices):
        i = choice[i]
        cuts.append(i)
    return sorted(cuts)
