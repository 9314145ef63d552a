"""Graph vocabulary: the names fxforge writes into ``node.meta`` and reads back, shared by every layer.

Provenance keys: before a pass runs, every node without one gets ``node.meta[ORIGIN]`` (the name of the
node in the captured graph whose value it computes); nodes a pass creates or rewrites get
``node.meta[PASS]``. ``verify`` reads both to name the first diverging node and the pass that made it.
"""

from __future__ import annotations

ORIGIN = "fxforge_origin"
PASS = "fxforge_pass"
