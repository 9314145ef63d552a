"""merge_parallel_linears: compute linears that read the same input as one matrix multiply (Q, K and V).

``q = x @ Wq.T + bq``, ``k = x @ Wk.T + bk``, ``v = x @ Wv.T + bv`` are the column blocks of
``x @ cat(Wq, Wk, Wv).T + cat(bq, bk, bv)``: one GEMM with three times the columns, split back into the three
results -- the horizontal fusion written by hand in many torch.fx tutorials. Measured on a 2-core Xeon with Inductor
(docs/benchmarks.md): BERT-base at one sequence of 128 tokens 1.00-1.03x, ViT-small 1.00x, BERT-base at batch 8
1.00x, so it is not one of the exact passes ``-p exact`` runs; name it to use it, or let ``lint --fix`` run it where
lint rule FX014 reports a group (a runtime without a GEMM library as good as MKL's at narrow shapes may gain more).

Each result is then a column slice of the wide output, not a tensor of its own: same values, other strides. That
is only safe where nothing can tell, so a group merges only when every use of each result, followed through the
ops that return views of it, either computes a new tensor from it (any op fxforge knows returns a fresh tensor),
is a view valid on any strides (``transpose``, ``permute``, ``reshape``...), or is a ``view`` of the slice itself
that keeps every leading dimension and only splits the last one (``view(b, s, heads, head_dim)``).
A result that is returned, written in place, or read by a call fxforge cannot see into keeps its own linear.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import fx, nn

from fxforge.effects import returns_fresh, tensor_facts, written_args
from fxforge.graphs import aten_packet, node_arg, submodule
from fxforge.passes import PassResult, free_attribute_name, mark, register_pass, store_tensor
from fxforge.passes.dead_code import prune_attributes
from fxforge.passes.merge_convs import Layer, count_uses, read_layer, tied_problem

NAME = "merge_parallel_linears"

# Ops that may return a view and give the same values whatever the strides of their input: they re-label or
# select dimensions, or (reshape, flatten, contiguous) copy where a view is impossible. The copy would break the
# aliasing of a later in-place write, which is refused anyway.
_ANY_STRIDE_VIEWS = frozenset(
    {"transpose", "permute", "unsqueeze", "squeeze", "t", "expand", "select", "slice", "narrow", "swapaxes"}
    | {"swapdims", "movedim", "detach", "alias", "reshape", "reshape_as", "flatten", "contiguous"}
)
# Views that re-group dimensions: valid on a column slice only when the leading dimensions stay as they are.
_REGROUPING_VIEWS = frozenset({"view", "view_as", "_unsafe_view"})


def _call_name(node: fx.Node) -> str | None:
    """The op's name for the tables above: the ATen packet, the method name, or the torch function's name."""
    packet = aten_packet(node)
    if packet is not None:
        return packet
    if node.op == "call_method":
        return str(node.target)
    name = getattr(node.target, "__name__", None)
    if node.op == "call_function" and isinstance(name, str) and getattr(torch, name, None) is node.target:
        return name
    return None


def _keeps_leading_dims(view: fx.Node, source: fx.Node) -> bool:
    before, after = tensor_facts(source), tensor_facts(view)
    if not before or not after or before["shape"] is None or after["shape"] is None:
        return False
    lead = len(before["shape"]) - 1
    return len(after["shape"]) > lead and after["shape"][:lead] == before["shape"][:lead]


def strided_use_problem(gm: nn.Module, result: fx.Node) -> str | None:
    """Why ``result`` (a linear's output) could not be replaced by a column slice of a wider output; None if it can.

    Walks every use, and the uses of the views it makes, until each path reaches an op that returns a new tensor.
    """
    pending = [(user, result) for user in result.users]
    seen: set[fx.Node] = set()
    while pending:
        user, source = pending.pop()
        if user in seen:
            continue
        seen.add(user)
        if user.op == "output":
            what = result.name if source is result else f"{source.name}, a view of {result.name},"
            return f"{what} is returned (its strides would change)"
        if any(written is source for written in written_args(gm, user)) or (_call_name(user) or "").endswith("_"):
            return f"{user.name} writes {source.name} in place"
        if returns_fresh(gm, user):
            continue
        name = _call_name(user)
        if name in _ANY_STRIDE_VIEWS:
            pending.extend((next_user, user) for next_user in user.users)
            continue
        if name in _REGROUPING_VIEWS and source is result and _keeps_leading_dims(user, result):
            pending.extend((next_user, user) for next_user in user.users)
            continue
        return f"{user.name} ({name or user.op}) may depend on the layout of {result.name}"
    return None


@dataclass
class Group:
    """Linears of one form reading the same input, in graph order."""

    source: fx.Node
    layers: list[Layer]

    @property
    def label(self) -> str:
        return f"{', '.join(layer.node.name for layer in self.layers)} (reading {self.source.name})"


def _signature(layer: Layer) -> tuple:
    return (layer.form, layer.weight.shape[1], layer.weight.dtype, layer.weight.device, layer.bias is None)


def plan_groups(gm: fx.GraphModule, result: PassResult | None = None) -> list[Group]:
    """The groups of two or more linears this pass merges. Linears that have a partner of the same form and
    input size but cannot be merged are recorded on ``result`` with the reason; a linear alone is not mentioned."""
    uses = count_uses(gm.graph, gm=gm)
    position = {node: i for i, node in enumerate(gm.graph.nodes)}
    groups: list[Group] = []
    for source in gm.graph.nodes:
        by_signature: dict[tuple, list[Layer]] = {}
        for user in source.users:
            layer = read_layer(gm, user)
            if isinstance(layer, Layer) and layer.kind == "linear" and node_arg(user, 0, "input") is source:
                by_signature.setdefault(_signature(layer), []).append(layer)
        for candidates in by_signature.values():
            if len(candidates) < 2:
                continue
            mergeable = []
            for layer in candidates:
                reason = _layer_problem(gm, layer, uses)
                if reason is None:
                    mergeable.append(layer)
                elif result is not None:
                    result.skip(f"{layer.node.name}: {reason}")
            if len(mergeable) >= 2:
                # the merged linear goes where the earliest of them was (users are not kept in graph order)
                groups.append(Group(source, sorted(mergeable, key=lambda layer: position[layer.node])))
            elif mergeable and result is not None:
                result.skip(f"{mergeable[0].node.name}: no partner reading {source.name} can be merged with it")
    return groups


def _layer_problem(gm: fx.GraphModule, layer: Layer, uses: dict[str, int]) -> str | None:
    if any(uses[owner] != 1 for owner in layer.owners):
        return f"{layer.owners[0]} is also used elsewhere (merging would store its weights twice)"
    tied = tied_problem([layer], uses)
    if tied is not None:
        return tied
    if layer.form == "module" and (len(layer.node.args) != 1 or layer.node.kwargs):
        return "called with more than its input"
    if layer.form == "function" and len(layer.node.args) + len(layer.node.kwargs) > 3:
        return "called with arguments other than input, weight and bias"
    return strided_use_problem(gm, layer.node)


def _merge(gm: fx.GraphModule, group: Group, replaced: dict[fx.Node, fx.Node]) -> set[str]:
    """Rewrite ``group`` as one linear and a split; returns the stored tensors no node reads any more. ``replaced``
    maps each merged linear to the slice that now stands for it (and gets this group's entries): a later group may
    read one of them."""
    layers = group.layers
    weight = torch.cat([layer.weight.detach() for layer in layers])
    bias = None if layers[0].bias is None else torch.cat([layer.bias.detach() for layer in layers])
    sizes = [layer.weight.shape[0] for layer in layers]
    first = layers[0].node
    group.source = replaced.get(group.source, group.source)
    graph = gm.graph
    stale: set[str] = set()
    with graph.inserting_before(first):
        if layers[0].form == "module":
            wide = graph.call_module(_install_module(gm, layers, weight, bias), (group.source,))
            parts = graph.call_function(torch.split, (wide, sizes), {"dim": -1})
        else:
            names = [store_tensor(gm, f"{first.name}_merged_weight", weight)]
            if bias is not None:
                names.append(store_tensor(gm, f"{first.name}_merged_bias", bias))
            stored = [graph.get_attr(name) for name in names]
            wide = graph.call_function(first.target, (group.source, *stored))
            split = torch.ops.aten.split_with_sizes.default if aten_packet(first) else torch.split
            parts = graph.call_function(split, (wide, sizes, -1))
        pieces = [graph.call_function(operator.getitem, (parts, i)) for i in range(len(layers))]
    _fake_values(group, wide, parts, pieces, weight, bias, sizes)
    mark(wide, NAME)
    mark(parts, NAME)
    for layer, piece in zip(layers, pieces):
        mark(piece, NAME, origin_of=layer.node)  # the slice computes what the layer computed
        old_inputs = [n for n in layer.node.all_input_nodes if n.op == "get_attr"]
        replaced[layer.node] = piece
        layer.node.replace_all_uses_with(piece)
        graph.erase_node(layer.node)
        for node in old_inputs:
            if not node.users:
                stale.add(str(node.target))
                graph.erase_node(node)
        if layer.form == "module":
            stale.add(str(layer.node.target))
    return stale


def _install_module(
    gm: fx.GraphModule, layers: Sequence[Layer], weight: torch.Tensor, bias: torch.Tensor | None
) -> str:
    """A new ``nn.Linear`` beside the first layer (``...self.query_key_value`` for query, key and value)."""
    paths = [str(layer.node.target).rpartition(".") for layer in layers]
    parent = paths[0][0] if all(path[0] == paths[0][0] for path in paths) else ""
    owner = gm.get_submodule(parent) if parent else gm
    name = free_attribute_name(owner, "_".join(path[2] for path in paths))
    merged = nn.utils.skip_init(
        nn.Linear, weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device, dtype=weight.dtype
    )
    first = submodule(gm, layers[0].node)
    merged.weight = nn.Parameter(weight, requires_grad=first.weight.requires_grad)
    if bias is not None:
        merged.bias = nn.Parameter(bias, requires_grad=first.weight.requires_grad)
    merged.train(first.training)
    owner.add_module(name, merged)
    return f"{parent}.{name}" if parent else name


def _fake_values(group: Group, wide: fx.Node, parts: fx.Node, pieces: list[fx.Node], weight, bias, sizes) -> None:
    """Record the new nodes' values the way torch.export does (``meta["val"]``), so later passes keep their facts."""
    source = group.source.meta.get("val")
    mode = getattr(source, "fake_mode", None)
    if mode is None:
        return
    with mode:
        fake_bias = None if bias is None else mode.from_tensor(bias)
        wide_value = torch.nn.functional.linear(source, mode.from_tensor(weight), fake_bias)
        part_values = torch.split(wide_value, sizes, dim=-1)
    wide.meta["val"], parts.meta["val"] = wide_value, list(part_values)
    for piece, value in zip(pieces, part_values):
        piece.meta["val"] = value


@register_pass(
    NAME,
    summary="Compute linears that read the same input (attention's query, key and value) as one wider linear.",
    guarantees=(
        "Outputs equal up to float round-off: the merged weight and bias are the layers' own, concatenated, so each "
        "output column is the same dot product (the wider GEMM may block its reduction differently). Merges two or "
        "more nn.Linear modules, F.linear calls or ATen linear ops with stored weights that read the same node, have "
        "the same form, input size, dtype and device, and all have a bias or none; each result becomes a column slice"
        " of the wide output. Never merges a linear whose result is returned, written in place, read by a call "
        "fxforge cannot see into, or viewed in a way that depends on its strides (a view that merges the last "
        "dimension with another), nor one whose module or weights are used elsewhere or tied; each refusal is listed "
        "with its reason. Torch and ATen dialects. Not in -p exact (it gained 0-3% on the transformers measured): "
        "name it, or let lint --fix run it where lint rule FX014 finds a group."
    ),
    ensures=lambda gm, result: _group_left(gm),
)
def merge_parallel_linears(gm: fx.GraphModule, options: None) -> PassResult:
    result = PassResult(NAME, gm)
    stale: set[str] = set()
    replaced: dict[fx.Node, fx.Node] = {}
    for group in plan_groups(gm, result):
        label, columns = group.label, sum(layer.weight.shape[0] for layer in group.layers)
        stale |= _merge(gm, group, replaced)
        # each linear's node is replaced by a column slice (getitem) of the one wide linear and its split, inserted
        result.note(f"merged {label} into one linear of {columns} outputs", replaced=len(group.layers), inserted=2)
    if result.changed:
        prune_attributes(gm, stale)
    return result


def _group_left(gm: fx.GraphModule) -> str | None:
    """Postcondition: no mergeable group is left."""
    groups = plan_groups(gm)
    return f"{groups[0].label} can still be merged" if groups else None
