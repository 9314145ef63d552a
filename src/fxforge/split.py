"""Split: plan where to cut a captured graph into pipeline stages, build the stage modules, write them.

Owns :func:`plan_split` (the cost of every node, the bytes a cut at each place would send, the optimal cuts by
:func:`fxforge.partition.partition`), :func:`split` (plan, stage modules, verification, output directory),
:class:`SplitPlan` (what ``plan.json`` holds) and :func:`load_split` (reading a split directory back).

The graph's nodes are taken in their (topological) order; a stage is a contiguous run of them. What a node
costs depends on ``balance``:

* ``flops``: its FLOPs, as ``inspect`` counts them;
* ``params``: the bytes of the stored tensors (parameters, buffers, constants) it is the first to use;
* ``memory``: those bytes plus the bytes of the value it produces (``inspect``'s activation bytes);
* ``time``: its milliseconds in a profile (``fxforge profile --json``: ``{"nodes": [{"name", "time_ms"}]}``).

A cut after node ``i`` carries every value produced at or before ``i`` and used after it (model inputs used
later included; stored tensors are not carried: each stage holds its own). Cuts where such a value is not one
tensor (a Python number, a tuple before its ``getitem``) are not allowed: a pipeline stage sends tensors only.
The crossing bytes of every possible cut come from one difference array over the values' lifetimes, O(nodes +
edges). Planning works on the ``meta`` device (nothing but shapes is needed); building stage modules needs
weights.

A split directory holds ``plan.json`` (plain JSON), one ``stage_K.pt2`` per stage (a ``torch.export`` program:
loads with torch alone, without unpickling code) and ``model.pt2``, the unsplit model, which ``run-pipeline``
verifies the pipeline's output against. A stage graph that cannot be exported is written as a pickled
GraphModule ``stage_K.pt`` instead, which loads only with the pickle opt-in (docs/security.md). Unpickling it
needs the classes of the model's Python file (a ``file.py:factory`` spec): the split keeps a copy of that file in
``source/`` and records where the original was, so that the stages load from any working directory and on any
machine the directory is copied to.
"""

from __future__ import annotations

import inspect as pyinspect
import json
import math
import re
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from fxforge import display
from fxforge.artifacts import (
    MODEL_FILE,
    PLAN_FILE,
    PROGRAM_FILE,
    SOURCE_DIR,
    StructuredOutputs,
    atomic_directory,
    check_free_space,
    check_output_directory,
    describe_structure,
    plain_containers,
    rebuild_structure,
    rebuilt_with_opaque_calls,
    structure_tensor_count,
    write_inputs,
)
from fxforge.capture import Captured, placeholder_values, require_captured
from fxforge.compare import compare_outputs
from fxforge.effects import AliasClasses
from fxforge.errors import (
    FxforgeError,
    ModelSpecError,
    first_line,
    format_location,
    option,
    recorded_user_frame,
    refuse_without_verification,
)
from fxforge.graphs import (
    GraphRunner,
    builds_namedtuple,
    get_attr_value,
    is_input_guard,
    is_var_keyword,
    module_path,
    submodule,
)
from fxforge.inputs import InputSpec, draw_like, parse_input_spec, refuse_containers
from fxforge.inspect import NodeInfo, inspect_graph
from fxforge.models import LoadedModel, load_model, pickle_trusted
from fxforge.partition import partition, prefix_sums
from fxforge.references import import_file
from fxforge.runtime import (
    export_program,
    keeps_rng_state,
    preserved_state,
    quiet_torch_logs,
)
from fxforge.verify import DEFAULT_CASES, VerifyResult, verify
from fxforge.visual.graph import check_profile_matches, read_profile

BALANCES = ("flops", "params", "memory", "time")
PLAN_FORMAT = "fxforge-split"
PLAN_VERSION = 1
_NO_REFERENCE_NOTE = "no unsplit model written"  # the note that says why a split directory has no model.pt2
_COMPUTE = ("call_function", "call_method", "call_module")
# torch.export's input-shape check: no part of the model's computation, and no module a stage could hold


def stage_file(index: int, pickled: bool = False) -> str:
    return f"stage_{index}.pt" if pickled else f"stage_{index}.pt2"


# --------------------------------------------------------------------------------------------------
# the plan


@dataclass
class TensorInfo:
    """A tensor a stage receives or sends: the graph value it is, its shape, dtype and size."""

    name: str
    shape: list[int]
    dtype: str
    bytes: int


@dataclass
class StagePlan:
    """One stage: its nodes and what it costs. ``memory_bytes`` = stored tensors + activations + received."""

    index: int
    nodes: int
    first_node: str
    last_node: str
    first_module: str
    last_module: str
    params: int  # parameter count
    param_bytes: int  # every stored tensor the stage holds: parameters, buffers, constants
    flops: int
    activation_bytes: int  # the values its nodes produce, as inspect counts them (no reuse assumed)
    input_bytes: int  # what it receives from the previous stage (the model's inputs for stage 0)
    memory_bytes: int
    cost: float  # by the plan's balance
    time_ms: float | None = None  # from the profile, when one was given
    inputs: list[TensorInfo] = field(default_factory=list)
    outputs: list[TensorInfo] = field(default_factory=list)
    file: str | None = None


@dataclass
class CutPlan:
    """A cut between two stages: the tensors crossing it, and the same cut in ``torch.distributed.pipelining``'s
    terms: a ``split_spec`` entry (``{"layer3": "BEGINNING"}``) when it falls on a submodule call's boundary, and
    where to call ``pipe_split()`` otherwise."""

    after_stage: int
    after_node: str
    before_node: str
    tensors: list[TensorInfo]
    bytes: int
    split_spec: dict[str, str] | None
    pipe_split: str


@dataclass
class SplitPlan:
    """Where the graph is cut and what every stage costs; ``to_dict()`` is ``plan.json``."""

    model: str
    dialect: str
    balance: str
    slack: float
    inputs: list[str]  # example input specs the plan was made at (the microbatch shape)
    stages: list[StagePlan]
    cuts: list[CutPlan]
    nodes: int  # compute nodes split
    total_cost: float
    bottleneck: float
    imbalance: float  # bottleneck / mean stage cost
    crossing_bytes: int
    on_meta: bool
    plan_s: float
    notes: list[str] = field(default_factory=list)
    # The model's Python file (a file.py:factory spec) where it was split, and its copy inside the split directory
    # (written when a stage or the unsplit model is pickled): unpickling them imports it for the classes.
    model_file: str | None = None
    model_source: str | None = None
    # How the model's output nests its tensors (fxforge.artifacts.describe_structure), which model.pt2 returns flat:
    # loading the directory as a model puts them back, under the model's own keys (None: not recorded)
    output_structure: Any = None

    def __repr__(self) -> str:  # the dataclass's would print every stage and cut
        return display.split_plan_repr(self)

    def _repr_html_(self) -> str:  # Jupyter shows this for the last value of a cell
        return display.split_plan_html(self)

    @property
    def split_spec(self) -> dict[str, str] | None:
        """Every cut as one ``split_spec`` for ``torch.distributed.pipelining.pipeline``, or None when some cut
        falls inside a module call, or two cuts fall on the same module (then ``pipe_split()`` calls in the model's
        code express the split)."""
        if any(cut.split_spec is None for cut in self.cuts):
            return None
        spec = {name: point for cut in self.cuts for name, point in (cut.split_spec or {}).items()}
        # one entry per module: a module both begun and ended by cuts (a stage of its own) cannot be expressed
        return spec if len(spec) == len(self.cuts) else None

    def to_dict(self) -> dict[str, Any]:
        data = {"format": PLAN_FORMAT, "version": PLAN_VERSION, **asdict(self), "split_spec": self.split_spec}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SplitPlan:
        """The plan ``to_dict`` wrote; ValueError, TypeError or KeyError where ``data`` is not one."""
        if not isinstance(data, Mapping):
            raise ValueError("not a JSON object")
        if data.get("format") != PLAN_FORMAT or data.get("version") != PLAN_VERSION:
            raise ValueError(f"not an {PLAN_FORMAT} plan of version {PLAN_VERSION}")
        fields = {k: v for k, v in data.items() if k not in ("format", "version", "split_spec")}
        fields["stages"] = [
            StagePlan(
                **{
                    **s,
                    "inputs": [TensorInfo(**t) for t in s["inputs"]],
                    "outputs": [TensorInfo(**t) for t in s["outputs"]],
                }
            )
            for s in data["stages"]
        ]
        fields["cuts"] = [CutPlan(**{**c, "tensors": [TensorInfo(**t) for t in c["tensors"]]}) for c in data["cuts"]]
        plan = cls(**fields)
        plan._check_consistent()
        return plan

    def _check_consistent(self) -> None:
        """What a hand-edited or truncated plan.json breaks: an internal error later (no stage launched, its output
        read), or a file path leading out of the split directory."""
        if not isinstance(self.inputs, list) or not all(isinstance(text, str) for text in self.inputs):
            raise ValueError("'inputs' is not a list of input specs")
        try:
            self.input_specs  # noqa: B018 -- parses each spec
        except FxforgeError as exc:
            raise ValueError(f"'inputs': {exc.message}") from None
        if not self.stages:
            raise ValueError("it has no stages")
        if [stage.index for stage in self.stages] != list(range(len(self.stages))):
            raise ValueError("its stages are not numbered 0, 1, 2, ... in order")
        if len(self.cuts) != len(self.stages) - 1:
            raise ValueError(f"{len(self.stages)} stages need {len(self.stages) - 1} cuts, it has {len(self.cuts)}")
        for stage in self.stages:
            if stage.file is not None and (Path(stage.file).is_absolute() or ".." in Path(stage.file).parts):
                raise ValueError(f"stage {stage.index}'s file {stage.file!r} is outside the split directory")
            for where, tensors in (("inputs", stage.inputs), ("outputs", stage.outputs)):
                for tensor in tensors:
                    _check_tensor_info(tensor, f"stage {stage.index}'s {where}")
        for cut in self.cuts:
            for tensor in cut.tensors:
                _check_tensor_info(tensor, f"the cut after stage {cut.after_stage}")
        if self.output_structure is not None:
            count = structure_tensor_count(self.output_structure)
            if count != len(self.stages[-1].outputs):
                raise ValueError(
                    f"'output_structure' holds {count} tensors, the last stage returns {len(self.stages[-1].outputs)}"
                )

    @property
    def input_specs(self) -> list[InputSpec]:
        return [parse_input_spec(text) for text in self.inputs]


def _check_tensor_info(tensor: TensorInfo, where: str) -> None:
    """A tensor of a hand-edited plan that no stage could take or return: refused with the plan, before any stage
    starts (QA: a dtype "complex999" or a shape [-1, 3] launched every stage, then failed as exit 1)."""
    shape_ok = isinstance(tensor.shape, list) and all(
        isinstance(size, int) and not isinstance(size, bool) and size >= 0 for size in tensor.shape
    )
    if not shape_ok:
        raise ValueError(f"{where}: {tensor.name!r} has shape {tensor.shape!r}, not a list of sizes >= 0")
    # "" is a tensor the split could not describe (its plan says so): the stage files' own check reads the rest
    if tensor.dtype != "" and not isinstance(getattr(torch, str(tensor.dtype), None), torch.dtype):
        raise ValueError(f"{where}: {tensor.name!r} has dtype {tensor.dtype!r}, which torch does not have")


# --------------------------------------------------------------------------------------------------
# facts about the graph the plan needs


@dataclass
class _Value:
    """A value a cut may carry: a model input or a node's output, alive from ``start`` to ``end`` (prefix lengths:
    it crosses the cuts ``start <= j < end``)."""

    node: fx.Node
    start: int
    end: int
    info: TensorInfo | None  # None: not one tensor (a cut while it is alive is not allowed)


@dataclass
class _Graph:
    """The graph as the plan sees it: compute nodes in order, the values that can cross cuts, the stored tensors
    each node uses, and the model inputs that are constants (non-tensor values baked into the stages)."""

    gm: fx.GraphModule
    compute: list[fx.Node]
    position: dict[fx.Node, int]
    values: list[_Value]
    infos: dict[str, NodeInfo]
    stored: dict[fx.Node, list[torch.Tensor]]
    tensor_inputs: list[fx.Node]
    constants: dict[fx.Node, Any]
    output_leaves: list[fx.Node]
    state_spans: list[_StateSpan] = field(default_factory=list)


@dataclass
class _StateSpan:
    """The compute nodes from the first use of a stored tensor that the graph writes in place to the last write
    into it, which one stage must hold together: every stage holds its own copy of its stored tensors, so a read
    on one side of a cut would miss a write on the other (on this call, or on the next one). A later stage that
    reads the tensor after the last write receives its value across the cut instead."""

    name: str  # the stored tensor's attribute path
    start: int  # cuts ``start <= j < end`` are not allowed (prefix lengths, as for a value)
    end: int


def _tensor_info(node: fx.Node, info: NodeInfo | None) -> TensorInfo | None:
    if info is None or info.shape is None or not all(isinstance(d, int) for d in info.shape):
        return None
    return TensorInfo(node.name, list(info.shape), info.dtype or "", info.activation_bytes)


def _stored_tensors(gm: fx.GraphModule, node: fx.Node) -> list[torch.Tensor]:
    """Parameters, buffers and constants ``node`` reads: a called module's own, and ``get_attr`` inputs."""
    tensors: list[torch.Tensor] = []
    if node.op == "call_module":
        module = submodule(gm, node)
        if module is not None:
            tensors += [*module.parameters(), *module.buffers()]
    for arg in node.all_input_nodes:
        if arg.op == "get_attr":
            value = get_attr_value(gm, str(arg.target))
            if isinstance(value, torch.Tensor):
                tensors.append(value)
            elif isinstance(value, nn.Module):
                tensors += [*value.parameters(), *value.buffers()]
    return tensors


def _output_structure_nodes(gm: fx.GraphModule) -> set[fx.Node]:
    """The nodes that only build the model's output: a namedtuple it returns is a call of its class in the graph
    (symbolic_trace records one), which holds tensors but is no computation a stage could send."""
    structure: set[fx.Node] = set()
    for node in reversed(gm.graph.nodes):
        if (
            builds_namedtuple(node)
            and not node.kwargs
            and node.users
            and all(user.op == "output" or user in structure for user in node.users)
        ):
            structure.add(node)
    return structure


def output_tree(gm: fx.GraphModule, structure: set[fx.Node] | None = None) -> Any:
    """What ``gm``'s output node returns, with the namedtuples the graph builds as namedtuples of nodes (as
    ``torch.fx.node.map_aggregate`` walks and rebuilds them). ``structure``: the graph's
    :func:`_output_structure_nodes`, where the caller has them."""
    output = next(node for node in reversed(gm.graph.nodes) if node.op == "output")
    structure = _output_structure_nodes(gm) if structure is None else structure

    def expand(value: Any) -> Any:
        if isinstance(value, fx.Node) and value in structure:
            return value.target(*fx.node.map_aggregate(value.args, expand))
        return value

    return fx.node.map_aggregate(output.args[0] if output.args else (), expand)


def _analyse(captured: Captured, infos: dict[str, NodeInfo]) -> _Graph:
    gm = captured.graph_module
    nodes = list(gm.graph.nodes)
    structure = _output_structure_nodes(gm)
    compute = [n for n in nodes if n.op in _COMPUTE and not is_input_guard(n) and n not in structure]
    position = {n: i for i, n in enumerate(compute)}
    n = len(compute)
    # a forward's ``**kwargs`` is a placeholder that no call fills (placeholder_values passes it over): counted, it
    # shifted every input after it and became a stage input of its own (QA: GPT-Neo, split refused its own files)
    placeholders = [p for p in nodes if p.op == "placeholder" and not is_var_keyword(p.target)]
    flat = captured.flat_inputs()
    constants = {p: v for p, v in zip(placeholders, flat) if not isinstance(v, torch.Tensor)}
    tensor_inputs = [p for p in placeholders if p not in constants]
    leaves: list[fx.Node] = []
    fx.node.map_arg(output_tree(gm, structure), leaves.append)

    values = []
    for node in [*tensor_inputs, *compute]:
        users = [u for u in node.users if not is_input_guard(u)]
        if not users:
            continue
        start = 0 if node.op == "placeholder" else position[node] + 1
        end = max(n if u.op == "output" or u in structure else position[u] + 1 for u in users)
        if end > start:
            values.append(_Value(node, start, end, _tensor_info(node, infos.get(node.name))))
    stored = {node: _stored_tensors(gm, node) for node in compute}
    spans = _written_state(gm, nodes, position, values)
    return _Graph(gm, compute, position, values, infos, stored, tensor_inputs, constants, leaves, spans)


def _written_state(
    gm: fx.GraphModule, nodes: list[fx.Node], position: dict[fx.Node, int], values: list[_Value]
) -> list[_StateSpan]:
    """The spans that stored tensors written in place pin to one stage, and (added to ``values``) each such tensor
    as a value sent on to the later stages that read it after its last write.

    QA: a model adding to a buffer in its forward (``self.running.add_(...)``) and reading it three layers later
    was split with the read in a stage of its own, which read its own copy, never written: the stages did not
    match the model, and the refusal suggested --no-verify, which would have written them."""
    aliases = AliasClasses(gm)
    spans: list[_StateSpan] = []
    for node in nodes:
        if node.op != "get_attr" or not aliases.written(node):
            continue
        writes = [position[nodes[at]] for at in aliases.write_positions(node) if nodes[at] in position]
        uses = [position[user] for user in node.users if user in position]
        if not writes or not uses:
            continue
        last_write = max(writes)
        spans.append(_StateSpan(str(node.target), min(uses + writes) + 1, last_write + 1))
        later = [at for at in uses if at > last_write]
        stored = get_attr_value(gm, str(node.target))
        if later and isinstance(stored, torch.Tensor):
            info = TensorInfo(
                node.name,
                list(stored.shape),
                str(stored.dtype).removeprefix("torch."),
                stored.numel() * stored.element_size(),
            )
            values.append(_Value(node, last_write + 1, max(later) + 1, info))
    return spans


def _crossings(graph: _Graph) -> tuple[list[int], list[bool]]:
    """Bytes crossing each cut (by prefix length) and whether the cut is allowed: difference arrays over the
    values' lifetimes, O(values)."""
    n = len(graph.compute)
    nbytes = [0] * (n + 2)
    blocked = [0] * (n + 2)
    for value in graph.values:
        if value.info is None:
            blocked[value.start] += 1
            blocked[value.end] -= 1
        else:
            nbytes[value.start] += value.info.bytes
            nbytes[value.end] -= value.info.bytes
    for span in graph.state_spans:
        blocked[span.start] += 1
        blocked[span.end] -= 1
    crossing, allowed = [0] * (n + 1), [False] * (n + 1)
    running_bytes = running_blocked = 0
    for j in range(n + 1):
        running_bytes += nbytes[j]
        running_blocked += blocked[j]
        crossing[j] = running_bytes
        allowed[j] = running_blocked == 0 and 0 < j < n
    return crossing, allowed


@dataclass
class CutOptions:
    """Every place the graph could be cut: ``nodes`` in order; ``bytes[j]`` crossing a cut after the first ``j``
    of them and ``allowed[j]`` whether that cut is possible (indexed by prefix length, 0 and ``len(nodes)``
    included, which are no cut at all)."""

    nodes: list[str]
    bytes: list[int]
    allowed: list[bool]


def cut_options(captured: Captured) -> CutOptions:
    """The bytes every possible cut of ``captured``'s graph would send, and which cuts are possible."""
    report = inspect_graph(captured, include_code=False)
    graph = _analyse(captured, {info.name: info for info in report.nodes})
    crossing, allowed = _crossings(graph)
    return CutOptions([n.name for n in graph.compute], crossing, allowed)


def _node_costs(graph: _Graph, balance: str, profile: Mapping[str, float] | None) -> list[float]:
    first_use: list[int] = []
    seen: set[int] = set()
    for node in graph.compute:  # each stored tensor counts once, at the first node that uses it
        total = 0
        for tensor in graph.stored[node]:
            if id(tensor) not in seen:
                seen.add(id(tensor))
                total += tensor.numel() * tensor.element_size()
        first_use.append(total)
    if balance == "flops":
        return [graph.infos[n.name].flops if n.name in graph.infos else 0 for n in graph.compute]
    if balance == "params":
        return first_use
    if balance == "memory":
        return [
            stored + (graph.infos[n.name].activation_bytes if n.name in graph.infos else 0)
            for n, stored in zip(graph.compute, first_use)
        ]
    assert profile is not None
    return [float(profile.get(n.name, 0.0)) for n in graph.compute]


# --------------------------------------------------------------------------------------------------
# profiles (balance "time")


def load_profile(path: str | Path) -> dict[str, float]:
    """Node times from a profile JSON (``fxforge profile --json``): ``{"nodes": [{"name": ..., "time_ms": ...}]}``,
    checked as the graph page checks it; a name listed twice adds up."""
    times: dict[str, float] = {}
    for entry in read_profile(path)["nodes"]:
        times[entry["name"]] = times.get(entry["name"], 0.0) + float(entry["time_ms"])
    return times


# --------------------------------------------------------------------------------------------------
# planning


def plan_split(
    captured: Captured,
    stages: int,
    balance: str = "flops",
    *,
    profile: Mapping[str, float] | str | Path | None = None,
    slack: float = 0.0,
    model_name: str = "",
) -> SplitPlan:
    """Choose ``stages - 1`` cuts of ``captured``'s graph that balance ``balance`` (see the module docstring),
    fewest crossing bytes among equally balanced ones (or within ``slack`` of the best balance)."""
    return _plan(captured, stages, balance, profile, slack, model_name)[0]


def check_split_request(
    stages: int, balance: str, profile: Any, slack: float, *, verify_stages: bool = True, cases: int | None = None
) -> None:
    """Refuse a request that cannot be planned as asked; cheap, so the CLI calls it before the model loads."""
    refuse_without_verification(verify_stages, "verify_stages=False", {"--cases": cases is not None})
    if balance not in BALANCES:
        raise FxforgeError(f"unknown balance {balance!r}", hint=f"one of {', '.join(BALANCES)}")
    if balance == "time" and profile is None:
        raise FxforgeError(
            f"{option('--balance', 'time')} needs node times: pass {option('--profile', 'profile.json')}",
            hint="write one with fxforge profile MODEL --json > profile.json",
        )
    if balance != "time" and profile is not None:
        # the profile's times balance nothing but time: with another balance it was read, checked and then silently
        # ignored, and the cuts were not the profiled ones the user asked for
        raise FxforgeError(
            f"{option('--profile')} applies to {option('--balance', 'time')}: with {option('--balance', balance)} "
            "the profile would be ignored",
            hint=f"add {option('--balance', 'time')} to balance the profiled times, or drop {option('--profile')}",
        )
    if not (isinstance(stages, int) and stages >= 1):
        raise FxforgeError(f"{option('--stages')} must be at least 1, got {stages}")
    if not (math.isfinite(slack) and slack >= 0):
        raise FxforgeError(f"{option('--slack')} must be a number >= 0, got {slack}")


def _plan(
    captured: Captured,
    stages: int,
    balance: str,
    profile: Mapping[str, float] | str | Path | None,
    slack: float,
    model_name: str,
) -> tuple[SplitPlan, _Graph]:
    require_captured(captured, "split")
    if isinstance(captured.original, StructuredOutputs) and captured.exported_program is not None:
        # its model.pt2 returns the outputs flat, which the directory gives back their structure: split that again
        # and the new stages' outputs were read as a tuple of the model's tensor (QA: MISMATCH, nothing written)
        raise ModelSpecError(
            "a split directory cannot be split again",
            hint="split the model it was made from (its spec is in plan.json) with the new stage count",
        )
    started = time.perf_counter()
    check_split_request(stages, balance, profile, slack)
    # a dict or list argument was baked into the stages as constants (they ignored their inputs: QA); a fixed
    # value (an int flag) is fine, the stages hold it as the model would
    refuse_containers(captured.example_inputs, "split")
    times = load_profile(profile) if isinstance(profile, (str, Path)) else dict(profile) if profile else None
    report = inspect_graph(captured, include_code=False)
    graph = _analyse(captured, {info.name: info for info in report.nodes})
    notes: list[str] = []
    if times is not None:
        check_profile_matches({n.name for n in graph.compute}, times, notes)
    n = len(graph.compute)
    if stages > n:
        raise FxforgeError(
            f"{option('--stages', stages)} is more than the graph's {display.counted(n, 'compute node')}",
            # a graph with no compute node (it returns its input) has nothing to split: "at most 0 stages" (QA)
            hint=f"at most {display.counted(n, 'stage')}" if n else "a graph that computes nothing cannot be split",
        )
    crossing, allowed = _crossings(graph)
    possible = sum(allowed)
    if stages - 1 > possible:
        raise FxforgeError(
            f"the graph can be cut in only {display.counted(possible, 'place')} (elsewhere values that are not single "
            f"tensors cross), too few for {stages} stages",
            hint=f"at most {display.counted(possible + 1, 'stage')}",
        )
    _note_blocked_cuts(graph, allowed, notes)
    _note_state_spans(graph, notes)
    costs = _node_costs(graph, balance, times)
    calls, spans = _call_spans(graph.compute)
    # Ties in crossing bytes go to cuts on a submodule call's boundary (expressible as a split_spec): bytes are
    # scaled by the stage count, so the at most stages - 1 penalties of 1 never outweigh a single byte.
    preference = [
        crossing[j] * stages + (0 if 0 < j < n and _split_point(calls, spans, j) else 1) for j in range(n + 1)
    ]
    result = partition(costs, stages, crossing=preference, allowed=allowed, slack=slack)

    crossing_tensors = [_crossing_at(graph, cut) for cut in result.cuts]
    sends = [*crossing_tensors, _output_infos(graph)]  # what each stage sends on (the last: the model's outputs)
    receives = [[_placeholder_info(graph, p) for p in graph.tensor_inputs], *crossing_tensors]
    stage_plans = [
        _stage_plan(graph, index, start, end, costs, times, receives[index], sends[index])
        for index, (start, end) in enumerate(result.stage_bounds(n))
    ]
    cut_plans = [
        CutPlan(
            index,
            graph.compute[cut - 1].name,
            graph.compute[cut].name,
            crossing_tensors[index],
            sum(t.bytes for t in crossing_tensors[index]),
            _split_point(calls, spans, cut),
            _pipe_split(graph.compute[cut]),
        )
        for index, cut in enumerate(result.cuts)
    ]
    total = prefix_sums(costs)[-1]
    if balance in ("params", "memory"):
        total = _charge_shared_tensors(stage_plans, balance, total, notes)
    if total == 0:
        notes.append(f"every node costs 0 by {balance}: the cuts only minimise the bytes crossing them")
    else:
        idle = [stage.index for stage in stage_plans if stage.cost == 0]
        if idle:  # more stages than nodes with a cost: a process each, doing nothing but pass tensors on
            costly = sum(1 for cost in costs if cost > 0)
            notes.append(
                f"{len(idle)} of {stages} stages cost nothing by {balance} (only {costly} nodes cost anything): "
                "fewer stages do the same work"
            )
    unknown = report.totals.get("flops_unknown_ops") or []
    if balance == "flops" and unknown:
        notes.append("ops with no FLOP formula count as 0: " + ", ".join(unknown[:8]))
    tensors = [*captured.graph_module.parameters(), *captured.graph_module.buffers(), *captured.flat_inputs()]
    mean = total / stages
    bottleneck = max(stage.cost for stage in stage_plans)
    plan = SplitPlan(
        model=model_name,
        dialect=captured.dialect,
        balance=balance,
        slack=slack,
        inputs=[_spec_text(v) for v in captured.flat_inputs() if isinstance(v, torch.Tensor)],
        stages=stage_plans,
        cuts=cut_plans,
        nodes=n,
        total_cost=total,
        bottleneck=bottleneck,
        imbalance=(bottleneck / mean) if mean else 1.0,
        crossing_bytes=sum(c.bytes for c in cut_plans),
        on_meta=any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in tensors),
        plan_s=time.perf_counter() - started,
        notes=notes,
    )
    return plan, graph


def _charge_shared_tensors(stage_plans: list[StagePlan], balance: str, total: float, notes: list[str]) -> float:
    """Each stage's cost as the bytes it really holds, and the new total. The partition charges a stored tensor
    once, at its first use; a tensor used by two stages (GPT-2's embedding, tied to its output layer) is held by
    both, and the plan said 1.09 imbalance where the stages' weights were 1.5 apart."""
    held = [stage.param_bytes + (stage.activation_bytes if balance == "memory" else 0) for stage in stage_plans]
    extra = sum(held) - total
    if extra <= 0:
        return total
    for stage, cost in zip(stage_plans, held):
        stage.cost = float(cost)
    notes.append(
        f"{display.byte_size(int(extra))} of stored tensors are used by more than one stage (tied weights): each "
        "such stage holds a copy, and its cost counts it (the cuts were chosen counting each tensor once)"
    )
    return float(sum(held))


def _note_blocked_cuts(graph: _Graph, allowed: list[bool], notes: list[str]) -> None:
    """Say which values forbid cuts when they forbid most: a symbolic batch size (``sym_size``, from a capture with
    a dynamic batch) is alive from the first node to the last, and leaves almost no place to cut."""
    n = len(graph.compute)
    blocked = n - 1 - sum(allowed)
    if n < 2 or blocked <= (n - 1) // 2:
        return
    longest = sorted((v for v in graph.values if v.info is None), key=lambda v: v.start - v.end)[:3]
    if not longest:
        return  # the blocks are stored tensors written in place, noted by _note_state_spans
    names = ", ".join(v.node.name for v in longest)
    notes.append(
        f"{blocked} of {n - 1} places to cut are blocked by values that are not tensors ({names}...): a stage sends "
        "tensors only. Symbolic sizes come from a dynamic batch: capture without --check-batch for static shapes"
    )


def _note_state_spans(graph: _Graph, notes: list[str]) -> None:
    for span in graph.state_spans:
        if span.end - span.start < 1:
            continue
        first, last = graph.compute[span.start - 1].name, graph.compute[span.end - 1].name
        notes.append(
            f"{span.name} is written in place by the model: the nodes from its first use to its last write "
            f"({first} .. {last}) stay in one stage, which holds it; later stages that read it receive its value"
        )


def _spec_text(tensor: torch.Tensor) -> str:
    return str(InputSpec(tuple(tensor.shape), tensor.dtype))


def _placeholder_info(graph: _Graph, node: fx.Node) -> TensorInfo:
    info = _tensor_info(node, graph.infos.get(node.name))
    if info is None:  # an input inspect could not describe: say what can be said
        return TensorInfo(node.name, [], "", 0)
    return info


def _crossing_at(graph: _Graph, cut: int) -> list[TensorInfo]:
    """The tensors a cut after the first ``cut`` compute nodes carries, in the order they were produced."""
    return [v.info for v in graph.values if v.start <= cut < v.end and v.info is not None]


def _output_infos(graph: _Graph) -> list[TensorInfo]:
    return [info for node in graph.output_leaves if (info := _tensor_info(node, graph.infos.get(node.name)))]


def _stage_plan(
    graph: _Graph,
    index: int,
    start: int,
    end: int,
    costs: list[float],
    times: Mapping[str, float] | None,
    inputs: list[TensorInfo],
    outputs: list[TensorInfo],
) -> StagePlan:
    nodes = graph.compute[start:end]
    held: dict[int, torch.Tensor] = {}
    for node in nodes:
        for tensor in graph.stored[node]:
            held[id(tensor)] = tensor
    params = sum(t.numel() for t in held.values() if isinstance(t, nn.Parameter))
    param_bytes = sum(t.numel() * t.element_size() for t in held.values())
    flops = sum(graph.infos[n.name].flops for n in nodes if n.name in graph.infos)
    activations = sum(graph.infos[n.name].activation_bytes for n in nodes if n.name in graph.infos)
    received = sum(t.bytes for t in inputs)
    return StagePlan(
        index=index,
        nodes=len(nodes),
        first_node=nodes[0].name,
        last_node=nodes[-1].name,
        first_module=module_path(nodes[0]),
        last_module=module_path(nodes[-1]),
        params=params,
        param_bytes=param_bytes,
        flops=flops,
        activation_bytes=activations,
        input_bytes=received,
        memory_bytes=param_bytes + activations + received,
        cost=sum(costs[start:end]),
        time_ms=sum(times.get(n.name, 0.0) for n in nodes) if times is not None else None,
        inputs=inputs,
        outputs=outputs,
    )


def _calls(node: fx.Node) -> list[tuple[str, str]]:
    """The module calls enclosing ``node``, outermost first: (call key, module path). A key with ``@N`` is the
    N+1-th call of a module called more than once."""
    if node.op == "call_module" and not is_input_guard(node) and not node.meta.get("nn_module_stack"):
        parts = str(node.target).split(".")
        return [(".".join(parts[: i + 1]),) * 2 for i in range(len(parts))]
    stack = node.meta.get("nn_module_stack") or {}
    return [(str(key), str(path)) for key, (path, _) in stack.items() if path]


def _call_spans(compute: list[fx.Node]) -> tuple[list[list[tuple[str, str]]], dict[str, tuple[int, int]]]:
    """Every node's enclosing calls, and the first and last node position of every call: O(nodes x depth)."""
    calls = [_calls(node) for node in compute]
    spans: dict[str, tuple[int, int]] = {}
    for position, chain in enumerate(calls):
        for key, _ in chain:
            first, _last = spans.get(key, (position, position))
            spans[key] = (first, position)
    return calls, spans


def _split_point(
    calls: list[list[tuple[str, str]]], spans: dict[str, tuple[int, int]], cut: int
) -> dict[str, str] | None:
    """The cut after the first ``cut`` nodes as ``{module path: "BEGINNING"|"END"}`` when it is exactly where a
    submodule call begins (or ends), as ``torch.distributed.pipelining.pipeline(model, split_spec=...)`` takes it;
    None inside a call (or at a module called more than once, which a split_spec entry cannot single out)."""
    before_calls, after_calls = calls[cut - 1], calls[cut]
    before_keys = {key for key, _ in before_calls}
    after_keys = {key for key, _ in after_calls}
    new = [(key, path) for key, path in after_calls if key not in before_keys]
    if new and "@" not in new[0][0] and spans[new[0][0]][0] == cut:
        return {new[0][1]: "BEGINNING"}
    ended = [(key, path) for key, path in before_calls if key not in after_keys]
    if ended and "@" not in ended[0][0] and spans[ended[0][0]][1] == cut - 1:
        return {ended[0][1]: "END"}
    return None


def _pipe_split(node: fx.Node) -> str:
    """Where to call ``pipe_split()`` in the model's code to cut before ``node``: the innermost line of the model's
    own code that produced it, when the capture recorded one (both dialects do), else the node and its module."""
    recorded = recorded_user_frame(node.meta.get("stack_trace") or "")
    if recorded is not None:
        return f"before {format_location(*recorded)} in the code that computes node {node.name}"
    where = module_path(node) or "the model's own forward"
    return f"before node {node.name} (in {where})"


# --------------------------------------------------------------------------------------------------
# stage modules


def _stage_graph_module(graph: _Graph, plan: SplitPlan, index: int) -> fx.GraphModule:
    """Stage ``index`` as a GraphModule: the cut's tensors in, the next cut's tensors out (the last stage: the
    model's output tensors, flat). Stored tensors it uses are its own attributes; constant inputs are baked in."""
    stage = plan.stages[index]
    by_name = {node.name: node for node in graph.gm.graph.nodes}
    new = fx.Graph()
    env: dict[fx.Node, Any] = {}
    for info in stage.inputs:
        node = by_name[info.name]
        env[node] = new.placeholder(node.name)
        env[node].meta = dict(node.meta)

    def value_of(node: fx.Node) -> Any:
        if node in env:
            return env[node]
        if node.op == "get_attr":
            env[node] = new.get_attr(str(node.target))
            env[node].meta = dict(node.meta)
            return env[node]
        if node in graph.constants:
            return graph.constants[node]
        raise FxforgeError(f"internal: stage {index} uses {node.name}, which no earlier stage sends")

    start = graph.position[by_name[stage.first_node]]
    end = graph.position[by_name[stage.last_node]] + 1
    for node in graph.compute[start:end]:
        env[node] = new.node_copy(node, value_of)
    if index == len(plan.stages) - 1:
        new.output(tuple(value_of(node) for node in graph.output_leaves))
    else:
        # What a stage sends must be contiguous (gloo and NCCL send flat buffers), and it arrives as a tensor of its
        # own: a view and its base are two tensors in the next stage. contiguous() returns a contiguous tensor
        # itself and copies a view, so the chained stages compute exactly what the processes will, and
        # verification catches a model that relies on a view seeing its base's later writes.
        sent = [new.call_method("contiguous", (value_of(by_name[t.name]),)) for t in stage.outputs]
        new.output(tuple(sent))
    module = fx.GraphModule(graph.gm, new, class_name=f"Stage{index}")
    # its own flag only: the stage shares its submodules with the captured graph, and so with the user's model,
    # whose mode eval() would have changed (QA: split() switched a model in training to eval mode)
    module.training = False
    return module


def run_in_order(stages: Sequence[nn.Module], values: tuple[Any, ...]) -> tuple[Any, ...]:
    """Each stage called on what the one before it returned (a tuple or list of tensors, or one tensor)."""
    for stage in stages:
        out = stage(*values)
        values = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return values


class ChainedStages(nn.Module):
    """The stages run one after the other in one process: the split model, callable like the original (same
    inputs, same output structure). What ``split`` verifies against the model, and a one-process baseline."""

    def __init__(self, stages: Sequence[nn.Module], template: fx.GraphModule) -> None:
        super().__init__()
        self.stages = nn.ModuleList(stages)
        self._template = template  # the captured graph: how inputs map to placeholders, how outputs nest
        self._output = output_tree(template)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        flat = placeholder_values(self._template, args, kwargs)
        values = run_in_order(self.stages, tuple(v for v in flat if isinstance(v, torch.Tensor)))
        leaves: list[fx.Node] = []
        fx.node.map_arg(self._output, leaves.append)
        by_node = dict(zip(leaves, values))
        result = fx.node.map_aggregate(self._output, lambda v: by_node[v] if isinstance(v, fx.Node) else v)
        result = plain_containers(result)  # what the model itself returns, not fx's immutable containers
        out_spec = getattr(self._template, "_out_spec", None)
        if out_spec is not None:  # an ATen graph returns flat outputs that its forward nests again
            result = pytree.tree_unflatten(list(result), out_spec)
        return result


def _stage_examples(graph: _Graph, plan: SplitPlan, captured: Captured) -> list[tuple[torch.Tensor, ...]]:
    """Each stage's example inputs: the values crossing its cut on the example inputs (one run of the graph)."""
    wanted = {t.name for stage in plan.stages for t in stage.inputs}
    recorded: dict[str, Any] = {}

    class Recorder(GraphRunner):
        def run_node(self, n: fx.Node) -> Any:
            result = super().run_node(n)
            if n.name in wanted:
                recorded[n.name] = result.detach().clone() if isinstance(result, torch.Tensor) else result
            return result

    with torch.no_grad(), quiet_torch_logs(), preserved_state(graph.gm, captured.original):
        Recorder(graph.gm).run(*[v.clone() if isinstance(v, torch.Tensor) else v for v in captured.flat_inputs()])
        for node in graph.gm.graph.nodes:  # a stored tensor written in place is sent as it is after the writes
            if node.op == "get_attr" and node.name in wanted:
                recorded[node.name] = get_attr_value(graph.gm, str(node.target)).detach().clone()
    return [tuple(recorded[t.name] for t in stage.inputs) for stage in plan.stages]


# --------------------------------------------------------------------------------------------------
# the whole flow


@dataclass
class SplitResult:
    """``fxforge.split``'s answer: the plan, the stage modules (None on ``meta``), how they were verified, and the
    files written (when an output directory was given)."""

    plan: SplitPlan
    stages: list[fx.GraphModule] | None
    template: fx.GraphModule | None = field(default=None, repr=False)  # the captured graph the stages came from
    verification: VerifyResult | None = None
    files: list[str] = field(default_factory=list)
    directory: str | None = None

    @property
    def ok(self) -> bool:
        return self.verification is None or self.verification.ok

    def __repr__(self) -> str:  # the dataclass's would print every stage's GraphModule
        stages = len(self.plan.stages)
        checked = f", {self.verification!r}" if self.verification is not None else ""
        where = f", written to {self.directory}" if self.directory else ""
        return f"<SplitResult {stages} stages{checked}{where}>"

    def chained(self) -> ChainedStages:
        """The stages chained in one process, callable like the captured model."""
        if self.stages is None or self.template is None:
            raise FxforgeError("no stage modules: the model is on the meta device")
        return ChainedStages(self.stages, self.template)

    def _repr_html_(self) -> str:  # Jupyter shows this for the last value of a cell
        return display.split_result_html(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_dict(),
            "verification": self.verification.to_dict() if self.verification is not None else None,
            "files": self.files,
            "directory": self.directory,
        }


@keeps_rng_state
def split(
    captured: Captured,
    stages: int = 2,
    balance: str = "flops",
    *,
    profile: Mapping[str, float] | str | Path | None = None,
    slack: float = 0.0,
    output_dir: str | Path | None = None,
    force: bool = False,
    verify_stages: bool = True,
    cases: int | None = None,
    seed: int = 0,
    model_name: str = "",
) -> SplitResult:
    """Plan ``stages`` pipeline stages of ``captured`` and build them.

    With real weights the stage modules are built, chained in one process and verified against the model on
    ``cases`` varied inputs (``verify_stages``); with ``output_dir`` they are written (atomically) with
    ``plan.json`` and the unsplit ``model.pt2``, and what is verified is the written files, reloaded. On the
    ``meta`` device only the plan is made (and ``plan.json`` written). ``cases`` (default 16) is refused with
    ``verify_stages=False``.
    """
    refuse_without_verification(verify_stages, "verify_stages=False", {"--cases": cases is not None})
    cases = DEFAULT_CASES if cases is None else cases
    if output_dir is not None:  # before the work: refusing afterwards would waste it
        check_output_directory(output_dir, force=force)
    plan, graph = _plan(captured, stages, balance, profile, slack, model_name)
    if plan.on_meta:
        plan.notes.append("the model is on the meta device: planned only, no stage modules (they need weights)")
        result = SplitResult(plan, None)
        if output_dir is not None:
            with atomic_directory(output_dir, force=force) as staging:
                _write_plan(staging, plan)
            result.files, result.directory = [PLAN_FILE], str(output_dir)
        return result

    if len(_output_infos(graph)) != len(graph.output_leaves):
        raise FxforgeError(
            "the model returns a value that is not a tensor, which a pipeline stage cannot send",
            hint="return tensors (tuples, lists, dicts of tensors are fine)",
        )
    modules = [_stage_graph_module(graph, plan, k) for k in range(len(plan.stages))]
    microbatch_problem = _microbatch_problem(captured)
    if microbatch_problem:
        plan.notes.append(microbatch_problem)
    result = SplitResult(plan, modules, captured.graph_module)
    candidate: nn.Module = result.chained()
    if output_dir is not None:
        with atomic_directory(output_dir, force=force) as staging:
            check_free_space(staging, captured.graph_module, copies=2)  # the stages, and the unsplit reference
            examples = _stage_examples(graph, plan, captured)
            result.files = _write_stages(staging, plan, modules, examples)
            result.files += _write_reference(staging, captured, plan)
            if any(name.endswith(".pt") for name in result.files):
                result.files += _write_model_source(staging, plan)
            tensors = [v for v in captured.flat_inputs() if isinstance(v, torch.Tensor)]
            result.files.append(write_inputs(staging, tensors))
            loaded = [_load_stage(staging, stage, plan, trust_pickle=True) for stage in plan.stages]
            candidate = ChainedStages(loaded, captured.graph_module)
            if verify_stages:
                # the stage programs are fixed to the example's shapes (the microbatch shape): every case at
                # that batch
                result.verification = verify(
                    captured, candidate, cases=cases, seed=seed, batch_sizes=[None], bisect=False
                )
                if not result.verification.ok:  # nothing is written: atomic_directory removes the staging dir
                    raise SplitVerificationError(result)
            _write_plan(staging, plan)
            result.files.insert(0, PLAN_FILE)
        result.directory = str(output_dir)
    elif verify_stages:
        result.verification = verify(captured, candidate, cases=cases, seed=seed, bisect=False)
    return result


def joins_along_batch(module: nn.Module, batch_inputs: tuple[torch.Tensor, ...], microbatches: int) -> bool:
    """Is ``module``'s output on the whole batch its outputs on ``microbatches`` pieces of it joined along dim 0, as
    a pipeline joins its microbatches' outputs? Not for an output computed across samples (``x - x.mean(0)``) or
    whose first dimension is not the batch."""
    with torch.no_grad(), quiet_torch_logs():
        whole = tensor_leaves(module(*batch_inputs))
        pieces = [tensor_leaves(module(*part)) for part in split_batch(batch_inputs, microbatches)]
    try:
        joined = [torch.cat(parts) for parts in zip(*pieces)]
    except RuntimeError:  # the pieces do not even join along dim 0
        return False
    return compare_outputs(tuple(whole), tuple(joined)).ok


def split_batch(inputs: tuple[torch.Tensor, ...], count: int) -> list[tuple[torch.Tensor, ...]]:
    """``inputs`` cut into ``count`` microbatches along dim 0, as the pipeline cuts them."""
    return [tuple(parts) for parts in zip(*(t.tensor_split(count) for t in inputs))]


def tensor_leaves(output: Any) -> list[torch.Tensor]:
    """The tensors in ``output`` (a pytree), in pytree order: what the last pipeline stage returns."""
    return [leaf for leaf in pytree.tree_leaves(output) if isinstance(leaf, torch.Tensor)]


def repeatable(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> bool:
    """Does a second call on the same inputs give the first's outputs? Not for a model that changes its own state
    (a buffer written in forward) or draws random numbers. Wrap it in preserved_state: the calls change the state."""
    with torch.no_grad(), quiet_torch_logs():
        first, second = (tensor_leaves(module(*inputs)) for _ in range(2))
    return compare_outputs(tuple(first), tuple(second)).ok


@keeps_rng_state
def _microbatch_problem(captured: Captured) -> str | None:
    """A note where the model's output on two samples is not its outputs on each joined along dim 0: run-pipeline
    then matches it only with one microbatch. Checked on a batch of twice the example's (drawn like it), for models
    that take batched tensors only; a model that refuses that batch is not judged."""
    example = captured.example_inputs
    if captured.example_kwargs or not example:
        return None
    if not all(isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == example[0].shape[0] for v in example):
        return None
    module = captured.original
    doubled = draw_like(tuple(example), "normal", 0, 2 * example[0].shape[0])
    try:
        with preserved_state(module):
            if joins_along_batch(module, doubled, 2) or not repeatable(module, doubled):
                return None  # (a model that draws random numbers, dropout in training mode: cannot be judged)
    except Exception:  # a model fixed to its example's batch, say: run-pipeline's own check will tell
        return None
    return (
        "the model's output on a batch is not its outputs on the batch's halves joined along dim 0 (an output "
        "computed across samples, or whose first dimension is not the batch): run-pipeline joins microbatch outputs "
        "along dim 0, so it matches the model only with --microbatches 1"
    )


class SplitVerificationError(FxforgeError):
    """The stages chained together compute something other than the model: nothing was written."""

    exit_code = 1

    def __init__(self, result: SplitResult) -> None:
        check = result.verification
        problems = "; ".join((check.problems if check else [])[:2])
        if check is not None and check.unverifiable:
            # the model gives nothing to compare against (an output its input does not change, a random one):
            # "do not match" blamed the split for it (QA)
            message = f"cannot verify the split stages: the model itself cannot be checked: {problems}"
            hint = "--no-verify writes the stages unverified"
        else:
            message = f"the split stages do not match the model: {problems}"
            # not --no-verify: that would write stages known to be wrong (QA)
            hint = "try other cut places (--stages, --balance); please report the model, this is a bug in split"
        super().__init__(f"{message}; nothing was written", hint=hint)
        self.result = result


def _write_plan(directory: Path, plan: SplitPlan) -> None:
    (directory / PLAN_FILE).write_text(json.dumps(plan.to_dict(), indent=2) + "\n")


def _write_stages(
    directory: Path, plan: SplitPlan, modules: list[fx.GraphModule], examples: list[tuple[torch.Tensor, ...]]
) -> list[str]:
    """One ``stage_K.pt2`` per stage (a program fixed to the example's shapes: the microbatch shape); a stage that
    cannot be exported is pickled instead (``stage_K.pt``), with a note."""
    files = []
    for index, (module, example) in enumerate(zip(modules, examples)):
        try:
            # preserved_state: the stage shares its leaf modules with the caller's model, and torch.export (non-strict)
            # rebinds their attributes (a Conv2d's stride, padding... tuples left as new objects), as _write_reference
            # guards against for the whole model
            with preserved_state(module, runs=False):
                program = export_program(module, example, {}, dynamic_batch=False)
            with quiet_torch_logs():
                torch.export.save(program, str(directory / stage_file(index)))
            name = stage_file(index)
        except Exception as exc:
            # torch.export.save may fail half-way through its archive: no partial stage_K.pt2 beside the pickle
            (directory / stage_file(index)).unlink(missing_ok=True)
            name = stage_file(index, pickled=True)
            # a helper capture kept as one call stays one when torch.load rebuilds the stage from its code (QA:
            # traced into, its branch failed and the stage loaded nowhere)
            with quiet_torch_logs(), rebuilt_with_opaque_calls(module):
                torch.save(module, directory / name)
            plan.notes.append(
                f"stage {index} could not be exported ({first_line(exc)}): written as a pickled GraphModule {name}, "
                "which loads only with --trust-pickle"
            )
        plan.stages[index].file = name
        files.append(name)
    return files


def _tensor_outputs(model: nn.Module) -> nn.Module:
    """``model`` returning its output's tensors as a flat tuple, in pytree order (as the last stage returns them):
    its program loads with torch alone, with no output type (a transformers ``ModelOutput``) to import first.
    The wrapper's ``forward`` carries the model's signature: torch.export names dynamic shapes after it."""

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        output = self.model(*args, **kwargs)
        return tuple(leaf for leaf in pytree.tree_leaves(output) if isinstance(leaf, torch.Tensor))

    signature = pyinspect.signature(model.forward)
    itself = pyinspect.Parameter("self", pyinspect.Parameter.POSITIONAL_OR_KEYWORD)
    forward.__signature__ = signature.replace(parameters=[itself, *signature.parameters.values()])  # type: ignore[attr-defined]
    wrapper = type("TensorOutputs", (nn.Module,), {"forward": forward})()
    wrapper.model = model
    return wrapper


def _write_reference(directory: Path, captured: Captured, plan: SplitPlan) -> list[str]:
    """The unsplit model, the reference run-pipeline checks the pipeline's output against: ``model.pt2`` with its
    output tensors flat (a dynamic batch where the model allows one), exported from the original model, else from
    the captured graph; when neither exports, the captured graph pickled as ``model.pt`` (needs the opt-in)."""
    plan.output_structure = _output_structure(captured)
    problems = []
    for module in (captured.original, captured.graph_module):
        try:
            with preserved_state(module, runs=False):
                program = export_program(
                    _tensor_outputs(module), captured.example_inputs, captured.example_kwargs, dynamic_batch=True
                )
            with quiet_torch_logs():
                torch.export.save(program, str(directory / PROGRAM_FILE))
            return [PROGRAM_FILE]
        except Exception as exc:
            # a save that failed half-way left a partial model.pt2, which loading the directory would read first
            (directory / PROGRAM_FILE).unlink(missing_ok=True)
            problems.append(first_line(exc))
    try:
        with quiet_torch_logs(), rebuilt_with_opaque_calls(captured.graph_module):
            torch.save(captured.graph_module, directory / MODEL_FILE)
    except Exception as exc:  # a TorchScript submodule, say: there is nothing to verify the pipeline against
        (directory / MODEL_FILE).unlink(missing_ok=True)
        plan.notes.append(
            f"{_NO_REFERENCE_NOTE} ({problems[-1]}; {first_line(exc)}): run-pipeline cannot verify the pipeline"
        )
        return []
    plan.notes.append(
        f"the unsplit model does not export ({problems[-1]}): written as a pickled GraphModule {MODEL_FILE}, "
        "which loads only with --trust-pickle"
    )
    return [MODEL_FILE]


def _output_structure(captured: Captured) -> Any:
    """The description of the graph's output on the example (None where it does not run or is not describable).
    Without it, model.pt2's flat tensors were put into the structure of whatever they were compared with, by
    position: a split of a model returning ``{"a": x, "b": y}`` verified OK against one returning ``{"b": x, "a": y}``
    (QA)."""
    try:
        with torch.no_grad(), preserved_state(captured.graph_module, runs=True):
            output = captured.graph_module(*captured.example_inputs, **captured.example_kwargs)
    except Exception:
        return None
    return describe_structure(output)


def _write_model_source(directory: Path, plan: SplitPlan) -> list[str]:
    """Copy the model's Python file (a ``file.py:factory`` spec) into ``source/``: a pickled stage names its classes
    by the module fxforge imported that file as, so loading it needs the file, wherever the directory is run from
    or copied to. Its absolute path is recorded too, for a file that imports sibling modules of its own."""
    file = _spec_file(plan.model)
    if file is None or not file.is_file():
        return []
    plan.model_file = str(file.resolve())
    copy = Path(SOURCE_DIR) / file.name
    (directory / SOURCE_DIR).mkdir()
    shutil.copy2(file, directory / copy)
    plan.model_source = copy.as_posix()
    return [copy.as_posix()]


def _spec_file(model: str) -> Path | None:
    """The Python file of a ``file.py:factory`` spec, else None."""
    file, sep, _attr = model.rpartition(":")
    return Path(file) if sep and file.endswith(".py") else None


# --------------------------------------------------------------------------------------------------
# reading a split directory


def load_plan(directory: str | Path) -> SplitPlan:
    """The plan of a split directory; a clear error when there is none or it is damaged."""
    directory = Path(directory)
    path = directory / PLAN_FILE
    if not directory.is_dir():
        raise ModelSpecError(f"{directory} is not a directory", hint="give a directory written by fxforge split -o")
    if not path.is_file():
        raise ModelSpecError(f"{directory} has no {PLAN_FILE}", hint="give a directory written by fxforge split -o")
    try:
        return SplitPlan.from_dict(json.loads(path.read_text()))
    except KeyError as exc:  # first_line read a bare "'stages'" (QA)
        raise ModelSpecError(f"{path} is corrupt: it has no {exc.args[0]!r}", hint="split the model again") from None
    except (OSError, UnicodeDecodeError, ValueError, TypeError) as exc:
        raise ModelSpecError(f"{path} is corrupt: {first_line(exc)}", hint="split the model again") from None


def _load_stage(
    directory: Path,
    stage: StagePlan,
    plan: SplitPlan,
    trust_pickle: bool | None = None,
    device: torch.device | None = None,
) -> nn.Module:
    if stage.file is None:
        raise ModelSpecError(f"stage {stage.index} has no module file: the plan was made on the meta device")
    path = directory / stage.file
    loaded = _load_pickle_aware(path, directory, plan, trust_pickle)
    _check_stage_signature(loaded, stage)
    if device is None or device.type == "cpu":
        return loaded.module
    if loaded.exported_program is not None:
        # devices are constants in an exported graph (torch.arange(..., device="cpu")): rewrite them, not just weights
        from torch.export.passes import move_to_device_pass

        return move_to_device_pass(loaded.exported_program, device).module()
    return loaded.module.to(device)


def load_stage(
    directory: str | Path, index: int, *, trust_pickle: bool | None = None, device: torch.device | str | None = None
) -> nn.Module:
    """Stage ``index`` of a split directory, as a module on ``device`` (default: the CPU); a ``.pt2`` program
    loads without unpickling code, a pickled ``stage_K.pt`` needs the opt-in. A file that does not take and return
    the tensors the plan says of that stage (files swapped or mixed from two splits) is refused."""
    plan = load_plan(directory)
    if not 0 <= index < len(plan.stages):
        raise FxforgeError(f"stage {index} does not exist: the plan has {display.counted(len(plan.stages), 'stage')}")
    where = torch.device(device) if device else None
    return _load_stage(Path(directory), plan.stages[index], plan, trust_pickle, where)


class StagesInOrder(nn.Module):
    """A split directory's stage files run one after the other in one process: the model's tensor inputs in, by
    position, and its outputs out in the structure plan.json records -- what the pipeline computes, without the
    processes (``fxforge verify MODEL SPLIT_DIR`` checks this, not the unsplit ``model.pt2``)."""

    def __init__(self, stages: Sequence[nn.Module], structure: Any) -> None:
        super().__init__()
        self.stages = nn.ModuleList(stages)
        self.structure = structure

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise FxforgeError(
                f"a split model's stages take its tensors by position, not {', '.join(kwargs)} by keyword"
            )
        values = run_in_order(self.stages, tuple(args))
        if isinstance(self.structure, dict) or self.structure == "tensor":
            return rebuild_structure(self.structure, iter(values))
        return values  # a structure plan.json could not record: the tensors flat, as model.pt2 returns them


def load_stages_in_order(directory: str | Path, *, trust_pickle: bool | None = None) -> tuple[nn.Module, str]:
    """Every stage of a split directory chained in one process (:class:`StagesInOrder`) and a label naming the
    files; a stage file that is missing, or does not take and return what the plan says, is refused."""
    directory = Path(directory)
    plan = load_plan(directory)
    stages = [_load_stage(directory, stage, plan, trust_pickle) for stage in plan.stages]
    files = [str(stage.file) for stage in plan.stages]
    label = files[0] if len(files) == 1 else f"{files[0]} .. {files[-1]}, {len(files)} stages chained"
    return StagesInOrder(stages, plan.output_structure), label


def load_reference(directory: str | Path, *, trust_pickle: bool | None = None) -> tuple[nn.Module, str] | None:
    """The unsplit model of a split directory and its file name (``model.pt2``, else a pickled ``model.pt``
    with the opt-in), or None when the directory holds neither (:func:`missing_reference_reason` says whether the
    split could not write one)."""
    directory = Path(directory)
    if (directory / PROGRAM_FILE).exists():
        return load_model(str(directory / PROGRAM_FILE)).module, PROGRAM_FILE
    if (directory / MODEL_FILE).exists():
        loaded = _load_pickle_aware(directory / MODEL_FILE, directory, load_plan(directory), trust_pickle)
        return loaded.module, MODEL_FILE
    return None


def missing_reference_reason(plan: SplitPlan) -> str | None:
    """Why the split wrote no unsplit model (its note in ``plan.json``), or None when it wrote one: then a split
    directory without ``model.pt2`` (or ``model.pt``) has lost it."""
    return next((note for note in plan.notes if note.startswith(_NO_REFERENCE_NOTE)), None)


def _load_pickle_aware(path: Path, directory: Path, plan: SplitPlan, trust_pickle: bool | None) -> LoadedModel:
    """``load_model`` of a stage or unsplit-model file; before a pickled one, the model's Python file is imported
    (its classes are what the pickle names), and when they still cannot be found, the error says which file."""
    import_problem = None
    if path.suffix == ".pt" and pickle_trusted(trust_pickle):
        import_problem = _import_model_file(directory, plan)
    try:
        return load_model(str(path), trust_pickle=trust_pickle)
    except ModelSpecError as exc:
        missing = re.search(r"No module named '(fxforge_user_\w+)", exc.message)
        if missing is None:
            raise
        raise _model_file_error(path, directory, plan, missing.group(1), import_problem) from None


def _model_file_candidates(directory: Path, plan: SplitPlan) -> list[Path]:
    """Where the model's Python file may be, best first: the copy in the split directory (the code the stages were
    pickled from, and it travels with the directory), the file where it was split, and the spec as written
    (relative to the working directory: all that plans written before the copy have)."""
    candidates = [directory / plan.model_source] if plan.model_source else []
    if plan.model_file:
        candidates.append(Path(plan.model_file))
    spec_file = _spec_file(plan.model)
    if spec_file is not None:
        candidates.append(spec_file)
    return list(dict.fromkeys(candidates))


def _import_model_file(directory: Path, plan: SplitPlan) -> str | None:
    """Import the model's Python file as the split did, so that unpickling finds its classes; None when done (or
    there is no such file to import), else why none of the candidates imported."""
    candidates = _model_file_candidates(directory, plan)
    if not candidates:
        return None
    imported = sys.modules.get(f"fxforge_user_{candidates[0].stem}")
    imported_from = getattr(imported, "__file__", None)
    if imported_from and Path(imported_from).resolve() in {c.resolve() for c in candidates}:
        return None  # this process built the model from it (the split itself): importing again would fork its classes
    problems = []
    for candidate in candidates:
        if candidate.is_file():
            try:
                import_file(candidate, error=ModelSpecError, what="the pickled stage's classes")
                return None
            except ModelSpecError as exc:  # a copy whose sibling imports are elsewhere: the original may work
                problems.append(exc.message)
    return problems[-1] if problems else f"it is not at {' nor at '.join(str(c.absolute()) for c in candidates)}"


def _model_file_error(
    path: Path, directory: Path, plan: SplitPlan, module_name: str, import_problem: str | None
) -> ModelSpecError:
    file_name = module_name.removeprefix("fxforge_user_") + ".py"
    if not _model_file_candidates(directory, plan):  # split through the API without model_name: nothing recorded
        return ModelSpecError(
            f"cannot read {path}: its classes are in the model's file {file_name}, and the split did not record where "
            "that file is",
            hint=f"import {file_name} with fxforge.references.import_file before loading, or split from a "
            "file.py:factory spec (fxforge split keeps a copy of the file)",
        )
    reason = import_problem or "it could not be imported"
    return ModelSpecError(
        f"cannot read {path}: its classes are in the model's file {file_name} (split from {plan.model}), and {reason}",
        hint=f"put {file_name} where it was split, or split again: fxforge split keeps a copy in {SOURCE_DIR}/",
    )


def _signature_of(loaded: LoadedModel) -> tuple[list[TensorInfo | str], list[TensorInfo | str]] | None:
    """What a loaded stage takes and returns: a ``TensorInfo`` where its shape and dtype are recorded (a program's
    are; its output names are torch.export's own, left out), else the input's name; None for other modules."""

    def described(node: fx.Node, name: str) -> TensorInfo | str:
        value = node.meta.get("val", node.meta.get("tensor_meta"))
        shape = getattr(value, "shape", None)
        if shape is None or not all(isinstance(d, int) for d in shape):
            return name
        return TensorInfo(name, list(shape), str(value.dtype).removeprefix("torch."), 0)

    program = loaded.exported_program
    if program is not None:
        nodes = {node.name: node for node in program.graph.nodes}
        signature = program.graph_signature
        inputs = [described(nodes[name], name) for name in signature.user_inputs if name in nodes]
        outputs = [described(nodes[name], "") for name in signature.user_outputs if name in nodes]
        return inputs, outputs
    if isinstance(loaded.module, fx.GraphModule):
        graph = loaded.module.graph
        inputs = [described(node, node.name) for node in graph.nodes if node.op == "placeholder"]
        output = next(node for node in reversed(graph.nodes) if node.op == "output")
        leaves: list[fx.Node] = []
        fx.node.map_arg(output.args[0] if output.args else (), leaves.append)
        return inputs, [described(node, "") for node in leaves]
    return None


def _check_stage_signature(loaded: LoadedModel, stage: StagePlan) -> None:
    """Refuse a stage file that does not take and return what the plan says stage K does: files renamed, swapped,
    or copied from another split fail here, by name, instead of deep in the schedule (``KeyError: 2``)."""
    signature = _signature_of(loaded)
    if signature is None:
        return
    inputs, outputs = signature
    if not _same_tensors(inputs, stage.inputs, names=True):
        verb, found, planned = "takes", _describe_tensors(inputs), _describe_tensors(stage.inputs)
    elif not _same_tensors(outputs, stage.outputs, names=False):
        verb = "returns"
        found, planned = _describe_tensors(outputs, names=False), _describe_tensors(stage.outputs, names=False)
    else:
        return
    raise ModelSpecError(
        f"{stage.file} does not match stage {stage.index} of {PLAN_FILE} (it {verb} {found}; the plan says {planned})",
        hint="the stage files were renamed, swapped or mixed from two splits: split the model again",
    )


def _same_tensors(found: list[TensorInfo | str], planned: list[TensorInfo], names: bool) -> bool:
    if len(found) != len(planned):
        return False
    for have, want in zip(found, planned):
        name = have if isinstance(have, str) else have.name
        if names and name != want.name:
            return False
        if isinstance(have, TensorInfo) and (have.shape, have.dtype) != (want.shape, want.dtype):
            return False
    return True


def _describe_tensors(tensors: Sequence[TensorInfo | str], names: bool = True, limit: int = 6) -> str:
    if not tensors:
        return "no tensors"
    parts = []
    for tensor in tensors[:limit]:
        if isinstance(tensor, str):
            parts.append(tensor or "a tensor")
            continue
        shape = "x".join(map(str, tensor.shape)) or "scalar"
        parts.append(f"{tensor.name} {shape} {tensor.dtype}" if names else f"{shape} {tensor.dtype}")
    more = f" and {len(tensors) - limit} more" if len(tensors) > limit else ""
    return ", ".join(parts) + more
