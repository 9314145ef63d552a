"""graphs: dialect-independent facts about a graph, here the index bounds of inputs that embeddings look up."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fxforge.capture import capture
from fxforge.graphs import index_bounds
from fxforge.models import load_model


class _Embeds(nn.Module):
    """Token ids through a reshape into one table, type ids into another by F.embedding, and a float mask."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.types = nn.Embedding(10, 4), nn.Embedding(2, 4)

    def forward(self, ids, types, mask):
        return (self.tokens(ids.reshape(1, 6)) + F.embedding(types, self.types.weight)) * mask.unsqueeze(-1)


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_index_bounds_follow_inputs_into_embeddings_in_both_dialects(method):
    example = (torch.randint(0, 10, (1, 6)), torch.zeros(1, 6, dtype=torch.long), torch.ones(1, 6))
    captured = capture(_Embeds().eval(), example, method=method)
    assert index_bounds(captured.graph_module) == {0: 10, 1: 2}  # the mask is no index


def test_index_bounds_of_a_transformer():
    model = load_model(
        "transformers:BertModel",
        model_kwargs={"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2},
    ).module
    captured = capture(model, (torch.randint(0, 100, (1, 8)),))
    assert index_bounds(captured.graph_module) == {0: model.config.vocab_size}
