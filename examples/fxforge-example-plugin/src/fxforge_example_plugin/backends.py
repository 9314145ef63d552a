"""Bench backend ``channels_last``: the captured graph with its weights and 4-D inputs in NHWC memory layout.

Convolutions on CPU often run faster on channels-last tensors (oneDNN's native layout); whether they do on this
machine is what ``fxforge bench --backends eager,channels_last`` measures.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from fxforge.bench import BuildSettings, Runner, register_backend
from fxforge.capture import Captured


def _to_channels_last(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() == 4:
        return value.contiguous(memory_format=torch.channels_last)
    return value


@register_backend("channels_last", "the captured graph with weights and 4-D inputs in channels-last (NHWC) layout")
def build_channels_last(captured: Captured, settings: BuildSettings) -> Runner:
    # a copy: bench must not change the user's model (and the eager row times the original layout)
    graph_module = copy.deepcopy(captured.graph_module).to(memory_format=torch.channels_last)
    settings.notes.append("weights and 4-D inputs converted to channels-last")

    def run(*inputs: Any, **kwargs: Any) -> Any:
        return graph_module(*(_to_channels_last(x) for x in inputs), **kwargs)

    return run
