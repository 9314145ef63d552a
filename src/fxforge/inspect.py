"""Inspect: per-node and per-module facts about a captured graph.

For every node: op, target, owning module, output shape and dtype, parameter count, FLOPs (from
``torch.utils.flop_counter``, which counts matmul/conv/attention as 2 FLOPs per multiply-add and
elementwise ops as zero, the convention torchvision's published figures use) and activation bytes.
The numbers come from one run of the graph under an Interpreter, on real or ``meta`` tensors, so a
model built on the meta device is inspected without allocating its weights. Work is linear in the
number of nodes.

Quantized graphs (``fxforge quantize`` output, prepared or QAT models) are read too: each node's
``quant`` kind (observer, fake_quant, qat, quantize, dequantize, int8; see
:data:`fxforge.vocabulary.QUANT_KINDS`) is reported and counted in the totals, an int8 layer's packed
weights count as its parameters (at their int8 size), and its FLOPs are counted by the float layer's
formula (torch's FLOP counter does not know the quantized kernels).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch._ops import HigherOrderOperator
from torch.utils import _pytree as pytree
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils.flop_counter import FlopCounterMode

from fxforge import display
from fxforge.capture import Captured, require_captured
from fxforge.errors import FxforgeError, InputSpecError, first_line, said
from fxforge.graphs import (
    GraphRunner,
    MethodCall,
    called_parameters,
    get_attr_value,
    is_input_guard,
    module_path,
    submodule,
    target_name,
)
from fxforge.runtime import (
    buffers_snapshot,
    keeps_rng_state,
    onednn_linear_op,
    quiet_torch_logs,
    restore_buffers,
    run_isolated,
)
from fxforge.vocabulary import QUANT_KINDS, int8_flops, int8_weights, module_quant_kind, quant_kind


@dataclass
class NodeInfo:
    name: str
    op: str
    target: str
    module: str
    shape: list[int] | list[list[int]] | None
    dtype: str | None
    params: int
    flops: int
    activation_bytes: int
    quant: str = ""  # a fxforge.vocabulary.QUANT_KINDS entry for nodes of quantized graphs
    flops_unknown: list[str] = field(default_factory=list)  # ops this node ran that have no FLOP formula
    # where each tensor of a container output sits ("[0]", "['logits']"), in the order of ``shape``; empty for a
    # tensor. ``dtype`` is then one dtype when all share it, else each tensor's, comma-separated in that order
    output_keys: list[str] = field(default_factory=list)


@dataclass
class ModuleSummary:
    path: str
    type: str
    depth: int
    params: int
    flops: int
    activation_bytes: int
    nodes: int


@dataclass
class InspectReport:
    dialect: str
    nodes: list[NodeInfo]
    modules: list[ModuleSummary]
    totals: dict[str, Any]
    capture: dict[str, Any]
    code: str = ""
    input_shapes: list[Any] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __repr__(self) -> str:
        return display.inspect_repr(self)

    def _repr_html_(self) -> str:  # Jupyter shows this for the last value of a cell
        return display.inspect_html(self)


def _describe(value: Any) -> tuple[Any, str | None, int, list[str]]:
    """(shape, dtype, bytes, keys) of a node's output; containers of tensors (tuples, dicts, a library's output
    class: whatever pytree flattens) give a list of shapes, their dtypes (one when all share it: topk's values
    and int64 indices were both said to be float32, QA) and where each tensor sits."""
    if isinstance(value, torch.Tensor):
        return list(value.shape), _dtype_name(value), value.numel() * value.element_size(), []
    if value is not None:
        leaves = [(path, v) for path, v in pytree.tree_leaves_with_path(value) if isinstance(v, torch.Tensor)]
        if leaves:
            dtypes = [_dtype_name(t) for _, t in leaves]
            return (
                [list(t.shape) for _, t in leaves],
                dtypes[0] if len(set(dtypes)) == 1 else ", ".join(dtypes),
                sum(t.numel() * t.element_size() for _, t in leaves),
                [pytree.keystr(path) for path, _ in leaves],
            )
    return None, None, 0, []


def _dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _scripted_parameters(value: torch._C.ScriptModule) -> list[torch.Tensor]:
    """The parameters of a submodule compiled with ``torch.jit.script``, which tracing reads as its C++ object
    (``get_attr s._c``, then a call of that object's forward): its weights are in the object, not in the graph's
    modules (QA: inspect counted them as 0, in the module's row and in the model's total)."""
    return list(torch.jit._recursive.wrap_cpp_module(value).parameters())


def _node_params(gm: nn.Module, node: fx.Node) -> int:
    if node.op == "call_module":
        module = submodule(gm, node)
        return _param_count(module) if module is not None else 0
    if node.op == "get_attr":
        value = get_attr_value(gm, str(node.target))
        if isinstance(value, torch._C.ScriptModule):
            return sum(p.numel() for p in _scripted_parameters(value))
        return value.numel() if isinstance(value, nn.Parameter) else 0
    return 0


# Ops counted as 0 FLOPs by the convention of published figures (torchvision, papers): data movement,
# creation, indexing, normalisation, softmax, pooling, resampling and activations. Pointwise ops, reductions
# and views are recognised by torch's own tags. Any other op that torch's counter has no formula for (cdist,
# FFTs, linalg, custom ops) is listed as unknown instead of silently counting as zero.
ZERO_BY_CONVENTION = frozenset(
    """_local_scalar_dense _softmax softmax _log_softmax log_softmax _safe_softmax _to_copy copy clone contiguous
    _unsafe_view as_strided cat stack split split_with_sizes chunk unbind constant_pad_nd pad reflection_pad1d
    reflection_pad2d reflection_pad3d replication_pad1d replication_pad2d replication_pad3d cumsum cumprod embedding
    empty empty_like empty_strided new_empty new_empty_strided fill full full_like new_full zeros zeros_like
    new_zeros ones ones_like new_ones scalar_tensor arange linspace logspace eye lift_fresh lift_fresh_copy detach
    alias gather scatter scatter_add scatter_reduce index index_select index_put index_add index_copy masked_fill
    masked_scatter masked_select where roll flip repeat repeat_interleave expand tile tril triu topk sort argsort
    max_pool1d max_pool2d max_pool3d max_pool2d_with_indices max_pool3d_with_indices avg_pool1d avg_pool2d
    avg_pool3d adaptive_avg_pool1d adaptive_avg_pool2d _adaptive_avg_pool2d adaptive_avg_pool3d
    _adaptive_avg_pool3d adaptive_max_pool1d adaptive_max_pool2d adaptive_max_pool3d native_batch_norm
    _native_batch_norm_legit _native_batch_norm_legit_no_training _native_batch_norm_legit_functional batch_norm
    native_layer_norm layer_norm native_group_norm group_norm instance_norm rms_norm _fused_rms_norm
    upsample_nearest1d upsample_nearest2d upsample_nearest3d _upsample_nearest_exact1d _upsample_nearest_exact2d
    upsample_linear1d upsample_bilinear2d upsample_bicubic2d upsample_trilinear3d pixel_shuffle pixel_unshuffle
    one_hot nonzero unique _unique2 bernoulli rand randn randint rand_like randn_like randint_like dropout
    native_dropout hardswish hardsigmoid gelu silu relu relu6 sigmoid tanh hardtanh leaky_relu elu mish softplus
    clamp clamp_min clamp_max set_ resize_ _assert_async _assert_scalar _assert_tensor_metadata sym_size sym_numel item
    slice_scatter select_scatter diagonal sign isinf isnan all any bucketize searchsorted quantize_per_tensor
    quantize_per_channel dequantize _make_per_tensor_quantized_tensor _make_per_channel_quantized_tensor
    q_scale q_zero_point q_per_channel_scales q_per_channel_zero_points int_repr _linalg_check_errors""".split()
)


def _has_no_formula(func: Any, registry: Any) -> bool:
    """Whether an executed op is real work torch's FLOP counter cannot count (see :data:`ZERO_BY_CONVENTION`)."""
    if isinstance(func, HigherOrderOperator):
        return True
    packet = func._overloadpacket
    if packet in registry:
        return False
    if func.is_view or torch.Tag.pointwise in func.tags or torch.Tag.reduction in func.tags:
        return False
    name = packet.__name__
    return name not in ZERO_BY_CONVENTION and name.rstrip("_") not in ZERO_BY_CONVENTION


class _OpRecorder(TorchDispatchMode):
    """Records every op a node runs, so that inspect can list those it cannot count."""

    # a torch.cond nested in a branch, or run by a leaf module eagerly, reaches the modes here (QA: internal errors)
    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Any] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(func)
        if isinstance(func, HigherOrderOperator):
            return _run_uncounted(func, args, kwargs or {})
        return func(*args, **(kwargs or {}))


def _run_uncounted(func: Any, args: Any, kwargs: Any) -> Any:
    """A higher-order op run with the counting modes off (torch's FLOP counter has no working rule for it) and its
    tensors detached (the counter's module hooks, still on, fail on a parameter that requires grad)."""
    args, kwargs = pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, (args, kwargs))
    with _disable_current_modes():
        return func(*args, **kwargs)


def _op_label(func: Any) -> str:
    if isinstance(func, HigherOrderOperator):
        return f"higher_order.{func.name()}"
    packet = func._overloadpacket
    namespace = getattr(func, "namespace", "aten")
    return f"{namespace}.{packet.__name__}"


class _Profiler(GraphRunner):
    """Runs the graph once, recording each node's output description, FLOPs and the ops it has no formula for."""

    def __init__(
        self, gm: fx.GraphModule, counter: FlopCounterMode, recorder: _OpRecorder, blame_inputs: bool = True
    ) -> None:
        super().__init__(gm)
        self.counter = counter
        self.recorder = recorder
        # False: the inputs are the ones the capture checked the graph on, so a failure is not theirs to fix
        self.blame_inputs = blame_inputs
        self.infos: dict[fx.Node, tuple[Any, str | None, int, int]] = {}
        self.unknown: dict[fx.Node, list[str]] = {}
        self.output_keys: dict[fx.Node, list[str]] = {}

    def run_node(self, n: fx.Node) -> Any:
        before = self.counter.get_total_flops()
        first_op = len(self.recorder.ops)
        try:
            result = self._run_higher_order(n) if isinstance(n.target, HigherOrderOperator) else super().run_node(n)
        except Exception as exc:
            if isinstance(exc, InputSpecError) or not self.blame_inputs:
                raise
            where = f"{n.op} {target_name(n)}"
            message = first_line(exc)
            hint = said("check --input", "check the inputs") + (
                ": the example inputs may not have the shape or dtype the model expects"
            )
            if "meta tensor" in message or "meta device" in message:
                # a leaf (or an op) reads tensor values (.item(), a branch on a value), which meta tensors do not
                # have: the inputs are fine, the device is not
                device = said("inspect it with --device cpu", "load it with device='cpu'")
                hint = f"this part of the model reads tensor values, which the meta device does not have: {device}"
            raise InputSpecError(f"the graph failed at node {n.name} ({where}): {message}", hint=hint) from None
        shape, dtype, nbytes, keys = _describe(result)
        flops = self.counter.get_total_flops() - before
        int8 = 0
        if n.op == "call_module":
            args, _ = self.fetch_args_kwargs_from_env(n)
            int8 = int8_flops(submodule(self.module, n), args, result)
        ran = self.recorder.ops[first_op:]
        del self.recorder.ops[first_op:]  # only this node's ops are kept: memory stays flat on 10k-node graphs
        if not int8:  # an int8 layer's kernels are counted by the float layer's formula
            unknown = sorted({_op_label(op) for op in ran if _has_no_formula(op, self.counter.flop_registry)})
            if unknown:
                self.unknown[n] = unknown
        self.infos[n] = (shape, dtype, nbytes, flops + int8)
        if keys:
            self.output_keys[n] = keys
        return result

    def _run_higher_order(self, n: fx.Node) -> Any:
        """A higher-order op (``torch.cond``, ``while_loop``, ``map``... in an exported graph) runs with the counting
        modes off: torch's FLOP counter and the op recorder have no rule for it (an internal error: QA). ``cond``'s
        FLOPs are those of the branch this input takes, counted by running that branch's graph again; any other
        higher-order op is listed among the ops inspect cannot count."""
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        result = _run_uncounted(n.target, args, kwargs)
        if n.target.name() == "cond" and len(args) == 4 and isinstance(args[1], fx.GraphModule):
            predicate, when_true, when_false, operands = args
            branch = when_true if bool(predicate) else when_false
            branch.forward(*operands)
        else:
            self.recorder.ops.append(n.target)
        return result


def _cpu_attention_flops(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any) -> int:
    return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


def _onednn_linear_flops(input_shape: Any, weight_shape: Any, *args: Any, **kwargs: Any) -> int:
    return 2 * math.prod(input_shape[:-1]) * weight_shape[0] * weight_shape[1]


def _flop_counter() -> FlopCounterMode:
    """torch's FLOP counter, taught the CPU kernels it has no formula for.

    On CPU, ``F.scaled_dot_product_attention`` (and ``nn.MultiheadAttention``'s fast path) run
    ``_scaled_dot_product_flash_attention_for_cpu``, which torch counts as 0 FLOPs: a ViT's attention
    would vanish from the totals, and a CPU model would report fewer FLOPs than the same model on meta. oneDNN's
    linear (the ``onednn_linear`` pass) counted 0 as well, and profile judged those matmuls memory-bound (QA).
    """
    custom = {}
    cpu_attention = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if cpu_attention is not None and hasattr(flop_counter, "sdpa_flop_count"):
        custom[cpu_attention] = _cpu_attention_flops
    onednn_linear = onednn_linear_op()
    if onednn_linear is not None:
        custom[onednn_linear] = _onednn_linear_flops  # keyed by the packet, as torch keys its own
    return FlopCounterMode(display=False, custom_mapping=custom)


@contextlib.contextmanager
def _countable_attention() -> Iterator[None]:
    """Turn off ``nn.MultiheadAttention``'s (and ``nn.TransformerEncoderLayer``'s) CPU fast path.

    The fast path is one fused ATen op with no FLOP formula, so a torchvision ViT counted a third of its
    FLOPs; the regular path computes the same values with projections and attention torch can count.
    """
    mha = getattr(torch.backends, "mha", None)
    if mha is None or not hasattr(mha, "set_fastpath_enabled"):
        yield
        return
    enabled = mha.get_fastpath_enabled()
    mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        mha.set_fastpath_enabled(enabled)


def count_flops(model: Any, inputs: Sequence[Any], kwargs: dict[str, Any] | None = None) -> int:
    """The float FLOPs of one call of ``model`` (2 per multiply-add), counted the way ``inspect`` counts them:
    what bench and ``--auto`` divide by a time to tell how close a backend runs to the machine's peak."""
    counter = _flop_counter()
    with torch.no_grad(), counter, quiet_torch_logs(), _countable_attention():
        run_isolated(model, inputs, dict(kwargs or {}))
    return int(counter.get_total_flops())


def _module_chain(node: fx.Node) -> list[tuple[str, str]]:
    """(path, type name) of every module enclosing ``node``, outermost first."""
    if is_input_guard(node):
        return []  # torch.export's input-shape guard: it copies the first op's module stack but is no part of it
    stack = node.meta.get("nn_module_stack") or {}
    chain = []
    for path, cls in stack.values():
        type_name = cls.__name__ if isinstance(cls, type) else str(cls).rsplit(".", 1)[-1]
        path = str(path).split("@")[0]
        if path:
            chain.append((path, type_name))
    if node.op == "call_module" and not chain:
        parts = str(node.target).split(".")
        chain = [(".".join(parts[: i + 1]), "") for i in range(len(parts))]
    return chain


def _with_containers(chain: list[tuple[str, str]], model: nn.Module) -> list[tuple[str, str]]:
    """``chain`` with the modules between its entries that are never called themselves -- a ``ModuleList`` or
    ``ModuleDict`` holding the layers (BERT's ``encoder.layer``, GPT-2's ``transformer.h``): no node's module stack
    names them, and without them the rows at their depth did not add up to the totals."""
    named = {path for path, _ in chain}
    full: list[tuple[str, str]] = []
    for path, type_name in chain:
        parts = path.split(".")
        for end in range(1, len(parts)):
            container = ".".join(parts[:end])
            if container not in named:
                named.add(container)
                full.append((container, _type_name_of(model, container)))
        full.append((path, type_name or _type_name_of(model, path)))
    return full


def _type_name_of(model: nn.Module, path: str) -> str:
    try:
        return type(model.get_submodule(path)).__name__
    except (AttributeError, TypeError):  # not a submodule of the model (a path torch.export spelt its own way)
        return ""


@keeps_rng_state
def inspect_graph(
    captured: Captured,
    *,
    depth: int = 3,
    inputs: Sequence[Any] | None = None,
    include_code: bool = True,
) -> InspectReport:
    """Profile ``captured`` on its example inputs (or ``inputs``) and summarise it by node and module.

    ``depth`` limits the module summary to paths with at most that many dotted components.
    """
    require_captured(captured, "inspect_graph")  # a GraphModule has no example inputs to run it on, a module no graph
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise FxforgeError(f"depth must be an integer of at least 0, got {depth!r}")
    gm = captured.graph_module
    values = captured.flat_inputs(inputs)
    counter = _flop_counter()
    recorder = _OpRecorder()
    checked = inputs is None and any(check.ok for check in captured.record.checks)
    profiler = _Profiler(gm, counter, recorder, blame_inputs=not checked)
    # Inspecting must not change anything: run on copies of the inputs and undo buffer writes
    # (graphs of models that update a buffer in forward write into the original model's buffers).
    snapshots = [(m, buffers_snapshot(m)) for m in (gm, captured.original)]
    try:
        with torch.no_grad(), counter, recorder, quiet_torch_logs(), _countable_attention():
            profiler.run(*[v.clone() if isinstance(v, torch.Tensor) else v for v in values])
    finally:
        for owner, snapshot in snapshots:
            restore_buffers(owner, snapshot)

    nodes: list[NodeInfo] = []
    modules: dict[str, ModuleSummary] = {}
    module_params: dict[str, int] = {}
    for node in gm.graph.nodes:
        shape, dtype, nbytes, flops = profiler.infos.get(node, (None, None, 0, 0))
        params = _node_params(gm, node)
        if node.op == "output":
            nbytes = 0  # the output node only forwards values computed elsewhere
        elif node.op == "get_attr":
            nbytes = 0  # a weight or constant the model holds, counted in param_bytes: no activation
        elif node.op == "call_function" and isinstance(node.target, type) and issubclass(node.target, tuple):
            nbytes = 0  # a namedtuple built of tensors other nodes made and counted (QA: counted twice)
        info = NodeInfo(node.name, node.op, target_name(node), module_path(node), shape, dtype, params, flops, nbytes)
        info.quant = quant_kind(gm, node) or ""
        if not info.quant and node.op in ("call_function", "call_method", "call_module") and dtype in _QUANTIZED_DTYPES:
            # an op run on int8 values by torch's quantized kernels (x.mean(), pooling, a reshape): QA saw a
            # quint8 ``mean`` with no mark, as if it ran in float
            info.quant = "int8"
        info.flops_unknown = profiler.unknown.get(node, [])
        info.output_keys = profiler.output_keys.get(node, [])
        nodes.append(info)
        for path, type_name in _with_containers(_module_chain(node), captured.original):
            summary = modules.get(path)
            if summary is None:
                summary = modules[path] = ModuleSummary(path, type_name, path.count(".") + 1, 0, 0, 0, 0)
                module_params[path] = _module_param_count(gm, path)
            summary.flops += flops
            summary.activation_bytes += nbytes
            summary.nodes += 1
            if not summary.type and node.op == "call_module" and path == str(node.target):
                summary.type = type(submodule(gm, node)).__name__
    params_under = _node_params_by_module(nodes) if any(count < 0 for count in module_params.values()) else {}
    for path, summary in modules.items():
        summary.params = module_params[path] if module_params[path] >= 0 else params_under.get(path, 0)
        summary.type = _quantized_type_name(gm, path) or summary.type

    unique_params = {_storage_key(p): p for p in gm.parameters()}
    for node in gm.graph.nodes:
        value = get_attr_value(gm, str(node.target)) if node.op == "get_attr" else None
        if isinstance(value, torch._C.ScriptModule):
            unique_params.update({_storage_key(p): p for p in _scripted_parameters(value)})
    unique_params.update({_storage_key(t): t for module in gm.modules() for t in int8_weights(module)})
    total_params = sum(p.numel() for p in unique_params.values())
    total_flops = sum(n.flops for n in nodes)
    totals = {
        "params": total_params,
        "param_bytes": sum(p.numel() * p.element_size() for p in unique_params.values()),
        "flops": total_flops,
        "macs": total_flops // 2,
        "nodes": len(nodes),
        "activation_bytes": sum(n.activation_bytes for n in nodes if n.op not in ("placeholder", "get_attr")),
        # every op whose FLOPs are unknown (counted as 0); each node's own list is its ``flops_unknown``
        "flops_unknown_ops": sorted({op for n in nodes for op in n.flops_unknown}),
    }
    totals.update({f"{kind}_nodes": sum(1 for n in nodes if n.quant == kind) for kind in QUANT_KINDS})
    return InspectReport(
        dialect=captured.dialect,
        nodes=nodes,
        modules=[m for m in modules.values() if m.depth <= depth],
        totals=totals,
        capture=captured.record.to_dict(),
        code=gm.code if include_code else "",
        input_shapes=[list(v.shape) if isinstance(v, torch.Tensor) else None for v in values],
    )


_QUANTIZED_DTYPES = frozenset({"quint8", "qint8", "qint32", "quint4x2", "quint2x4"})


def _quantized_type_name(gm: nn.Module, path: str) -> str | None:
    """torch's own name for a quantized module (``QuantizedConvReLU2d``), whose class name is the float
    one's; QAT layers, which torch names like float ones, get a ``QAT`` prefix (``QATLinear``)."""
    try:
        module = gm.get_submodule(path)
    except AttributeError:
        return None
    kind = module_quant_kind(module)
    if kind is None:
        return None
    name = module._get_name()
    return f"QAT{name}" if kind == "qat" and not name.startswith("QAT") else name


def _module_param_count(gm: nn.Module, path: str) -> int:
    """Unique parameter count of the submodule at ``path``; -1 when the graph has no such submodule."""
    try:
        module = gm.get_submodule(path)
    except AttributeError:
        return -1
    if isinstance(module, MethodCall):
        return sum(p.numel() for _, p in called_parameters(gm, path))
    scripted = vars(module).get("_c")
    if isinstance(scripted, torch._C.ScriptModule):  # the holder tracing made for a scripted submodule's object
        return sum(p.numel() for p in _scripted_parameters(scripted))
    return _param_count(module)


def _storage_key(tensor: torch.Tensor) -> Any:
    """One key per distinct weight: a tied weight is one Parameter in the model, but two Parameter objects over one
    storage in a loaded ``model.pt2`` (QA: an embedding tied to the output head counted twice there). Meta tensors
    have no storage to tell apart: each is its own."""
    if tensor.device.type == "meta":
        return id(tensor)
    try:
        storage = tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a quantized or opaque tensor
        return id(tensor)
    return storage, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype


def _param_count(module: nn.Module) -> int:
    """Parameters of ``module`` and its children, counting int8 layers' packed weights."""
    return sum(p.numel() for p in module.parameters()) + sum(
        t.numel() for sub in module.modules() for t in int8_weights(sub)
    )


def _node_params_by_module(nodes: list[NodeInfo]) -> dict[str, int]:
    """For every module path, the parameters read by the nodes it owns, directly or through its children.

    For paths the graph has no submodule at: torch.export's ``module()`` drops submodules that own no
    tensors (every ReLU), so their counts come from the nodes. One pass adding each node's count to every
    prefix of its path (O(nodes x depth)); scanning all nodes per such path was quadratic (5 s for
    inspect of a 10k-node ATen graph, 0.7 s this way).
    """
    sums: dict[str, int] = {}
    for node in nodes:
        if not node.params or not node.module:
            continue
        parts = node.module.split(".")
        for depth in range(1, len(parts) + 1):
            prefix = ".".join(parts[:depth])
            sums[prefix] = sums.get(prefix, 0) + node.params
    return sums
