"""dead_code: remove nodes whose values never reach the output, keeping every call with an effect.

``torch.fx.Graph.eliminate_dead_code`` decides liveness by users alone, so it deletes an in-place
call whose result is unused -- ``y = x.clone(); y.mul_(2); return y`` loses the ``mul_``
(pytorch/pytorch#68301). Here a node is live when its value reaches the output *or* it has an
effect: in-place ops and buffer writes, ``out=`` calls, asserts (symbolic_trace's ``_assert_is_none`` on an
argument fixed to None too: without it a passed mask was ignored), prints, random ops (they advance the
generator) and calls into modules and functions fxforge cannot see through. An assert that provably holds
(:func:`proven_metadata_assert`: torch.export's dtype/device/layout checks) is not an effect. Writes are those of
:func:`~fxforge.effects.written_args` too, which knows the ones a call's name or schema does not
show: a training-mode ``batch_norm`` updating its running statistics, ``F.relu(x, True)`` with ``inplace``
given by position, ``F.embedding`` with ``max_norm`` renormalising its weight; and the torch.nn modules
that write their own state (:func:`~fxforge.effects.module_state_write`). Everything a live node
reads is live.
One reverse sweep decides liveness, a second erases, so the pass is linear in the graph size.

Stored tensors and submodules only the removed nodes used are deleted from the GraphModule too.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import fx, nn

from fxforge.effects import is_effectful, module_state_write, written_args
from fxforge.graphs import aten_packet, submodule, target_name
from fxforge.passes import PassResult, register_pass

NAME = "dead_code"
_LOG_LIMIT = 200  # a 100k-node graph can lose most of its nodes: keep the log readable


def has_effect(gm: nn.Module, node: fx.Node) -> bool:
    """Does running ``node`` matter even when nothing uses its value? Effects, any in-place write into an
    argument, and torch.nn modules that update their own state (training-mode norms, max_norm embeddings).
    An assert that cannot fail (:func:`proven_metadata_assert`) has none."""
    if proven_metadata_assert(node):
        return False
    if is_effectful(gm, node) or written_args(gm, node):
        return True
    return node.op == "call_module" and module_state_write(submodule(gm, node)) is not None


def proven_metadata_assert(node: fx.Node) -> bool:
    """``aten._assert_tensor_metadata(x, dtype=..., device=..., layout=...)`` whose every fact x's recorded value
    (torch.export's ``val``) already has, with no size or stride to check: it cannot fail.

    torch.export records one for each ``.to(dtype)`` in the model (transformers' attention casts its softmax
    ``.to(query.dtype)``). Once remove_identity drops the no-op cast, the assert is the softmax's second user,
    and Inductor's attention fusion, which wants the softmax used once, no longer matches: vit_small compiled
    from its exported program ran math attention, 8% slower than the same model compiled from Python.
    """
    if aten_packet(node) != "_assert_tensor_metadata" or not node.args or not isinstance(node.args[0], fx.Node):
        return False
    value = node.args[0].meta.get("val")
    if not isinstance(value, torch.Tensor):
        return False
    schema = node.target._schema  # type: ignore[union-attr]
    checked = {arg.name: given for arg, given in zip(schema.arguments, node.args)}
    checked.update(node.kwargs)
    if checked.get("size") is not None or checked.get("stride") is not None:
        return False
    facts = {"dtype": value.dtype, "device": value.device, "layout": value.layout}
    for name, fact in facts.items():
        wanted = checked.get(name)
        if wanted is not None and (torch.device(wanted) if name == "device" else wanted) != fact:
            return False
    return set(checked) <= {"a", "size", "stride", *facts}


def live_nodes(gm: fx.GraphModule) -> set[fx.Node]:
    """Nodes whose value reaches the output or an effectful node, and the effectful nodes themselves."""
    live: set[fx.Node] = set()
    for node in reversed(gm.graph.nodes):
        if node in live or node.op == "output" or has_effect(gm, node):
            live.add(node)
            live.update(node.all_input_nodes)
    return live


@register_pass(
    NAME,
    summary="Remove nodes whose values never reach the output; never removes calls with side effects.",
    guarantees=(
        "Exact: only nodes that cannot influence the outputs or any side effect go. Never removes placeholders, "
        "in-place ops (even with an unused result; inplace=True given by position too), buffer writes (the "
        "running statistics of training-mode norms and the max_norm renormalisation of embeddings, module or "
        "functional), out= calls, asserts (except torch.export's dtype/device/layout asserts that the value recorded "
        "for their input already proves), prints, random ops or calls into user leaf modules or functions fxforge "
        "cannot see into (a helper captured as one call may write what it is given). Unused get_attr nodes go, "
        "then the parameters, buffers and submodules that nothing references any more. Linear in graph size. "
        "Torch and ATen dialects."
    ),
)
def dead_code(gm: fx.GraphModule, options: None) -> PassResult:
    result = PassResult(NAME, gm)
    live = live_nodes(gm)
    dropped_targets: set[str] = set()
    removed = 0
    for node in reversed(gm.graph.nodes):
        if node in live:
            continue
        # users of a dead node are dead and come later, so the reverse sweep has erased them already
        if node.op == "get_attr":
            dropped_targets.add(str(node.target))
        if removed < _LOG_LIMIT:
            result.log.append(f"removed {node.name} ({target_name(node)})")
        removed += 1
        gm.graph.erase_node(node)
    if removed:
        if removed > _LOG_LIMIT:
            result.log.append(f"... and {removed - _LOG_LIMIT} more")
        result.note(f"removed {removed} dead node(s)", removed=removed)
        deleted = prune_attributes(gm, dropped_targets)
        if deleted:
            result.log.append(f"deleted {deleted} stored tensor(s)/submodule(s) nothing uses any more")
    return result


def prune_attributes(gm: fx.GraphModule, candidates: Iterable[str]) -> int:
    """Delete the attributes named in ``candidates`` that no node reaches any more, then unused submodules.

    An attribute stays when a remaining ``get_attr`` names it, or a called submodule owns it. Tensors are
    deleted only from ``gm`` itself and from the plain ``nn.Module`` containers fx and torch.export build
    for attribute paths: any other owner may be the user's own module (``call_module`` targets are shared,
    not copied), and deleting from it would change their model. Such a module goes as a whole instead,
    once nothing calls or reads it.
    """
    fetched: set[str] = set()
    fetched_prefixes: set[str] = set()  # every module path some get_attr reaches into
    called: set[str] = set()
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            target = str(node.target)
            fetched.add(target)
            fetched_prefixes.update(_prefixes(target))
        elif node.op == "call_module":
            called.add(str(node.target))
    deleted = 0
    for target in sorted(set(candidates) - fetched):
        owner_path, _, attr = target.rpartition(".")
        if target in fetched_prefixes or any(p in called for p in (*_prefixes(target), target)):
            continue  # a get_attr reaches into it, or a called module uses it internally
        try:
            owner = gm.get_submodule(owner_path) if owner_path else gm
        except AttributeError:
            continue
        if owner is not gm and type(owner) is not nn.Module:
            continue
        if attr in owner._parameters:
            del owner._parameters[attr]
        elif attr in owner._buffers:
            del owner._buffers[attr]
        elif attr in owner._modules:
            continue  # submodules are handled below
        elif attr in owner.__dict__:
            delattr(owner, attr)
        else:
            continue
        deleted += 1
    before = sum(1 for _ in gm.modules())
    gm.delete_all_unused_submodules()
    return deleted + before - sum(1 for _ in gm.modules())


def _prefixes(path: str) -> list[str]:
    """The proper dotted prefixes of ``path``: ``a.b.c`` -> ``a``, ``a.b``."""
    parts = path.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]
