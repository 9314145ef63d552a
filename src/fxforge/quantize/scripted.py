"""The int8 model as frozen TorchScript: traced, frozen, and kept only where it computes bit for bit what the
quantized GraphModule computes.

Why: an FX-quantized GraphModule calls every quantized layer through Python (the module's ``forward``, the
attribute reads of each scale and zero point); TorchScript's interpreter calls the same int8 kernels without it.
Measured on an AMD EPYC (Zen 5), 2 threads, 2026-11-28: resnet18 batch 1 2.87 -> 2.47 ms, mobilenet_v2 batch 1
2.52 -> 1.48 ms; at batch 8 the kernels dominate (resnet18 17.7 -> 17.1 ms). ``optimize_for_inference`` on top
made mobilenet_v2 slower again (2.26 ms), so it is not applied. A TorchScript file also loads without unpickling
Python objects (``torch.jit.load``), which a pickled GraphModule cannot.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from fxforge.errors import InputSpecError, one_line_reason
from fxforge.graphs import builds_namedtuple, get_attr_value
from fxforge.inputs import make_inputs, specs_of
from fxforge.runtime import cloned


def frozen_torchscript(
    model: nn.Module, example_inputs: tuple[Any, ...], example_kwargs: dict[str, Any] | None = None
) -> tuple[torch.jit.ScriptModule | None, str]:
    """``model`` (an int8 model in eval mode) traced and frozen, with what was checked; or None and why not.
    ``example_kwargs``: the captured model's keyword inputs, which a trace cannot take.

    A trace keeps one path through the Python it runs. The quantized GraphModule's own code is straight-line, and
    so are torch's modules it calls; a module or function of the user's kept whole (a capture leaf, a wrapped
    function) may branch on its input's values (``if x.sum() > 0``), so a graph that calls one is not traced.
    Kept only when the trace read no tensor as a Python value (a bool is a branch; a number, such as a split size
    computed from ``x.shape[1]``, is fixed in the trace: QA had one silently wrong at another sequence length) --
    the scales and zero points the int8 graph keeps as tensors are written in as numbers first, being constants --
    and its outputs equal the model's bit for bit, in the same structure, on the example inputs and on inputs of
    another batch size (the trace must not have fixed the batch size)."""
    if example_kwargs:
        return None, "the model takes keyword inputs (--concrete values among them), which a trace does not keep"
    if not isinstance(model, fx.GraphModule):  # dynamic int8 of an exported model swaps the model's own layers
        return None, f"it is not an fx graph but the {type(model).__name__} module's own code, which a trace would fix"
    opaque = _user_calls(model)
    if opaque:
        return None, f"it calls {opaque}, whose Python a trace cannot see into"
    try:
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always", torch.jit.TracerWarning)
            traced = torch.jit.trace(_scales_inlined(model), cloned(example_inputs), strict=False, check_trace=False)
            frozen = torch.jit.freeze(traced.eval())
    except Exception as exc:  # TorchScript refuses many Python constructs: the GraphModule is kept as it is
        reason = one_line_reason(exc, 120)
        if "cannot infer type of" in reason:  # its message goes on to print the output's tensors, values and all
            reason = "TorchScript has no type for the model's output"
        return None, f"TorchScript could not trace it ({reason})"
    fixed = [w for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    if fixed:
        return None, f"its trace fixed a value read from a tensor ({one_line_reason(fixed[0].message, 120)})"
    computed = _computed_from_sizes(frozen)
    if computed:
        return None, f"its trace computes with a size of the input as a tensor ({computed}), not as Python does"
    checked = [example_inputs]
    other = _other_batch(example_inputs)
    if other is not None and _runs(model, other):  # a model fixed to its batch size is checked at that one only
        checked.append(other)
    for inputs in checked:
        problem = _differs(model, frozen, inputs)
        if problem:
            return None, f"its trace {problem}"
    sizes = " and ".join(str(_batch_of(inputs)) for inputs in checked)
    return frozen, f"traced and frozen TorchScript, equal bit for bit to the fx GraphModule at batch {sizes}"


# where a size of the input read in Python (``x.size(1)``) may go in a trace: into another size (a shape argument),
# through integer arithmetic. Anything else computes with it as a tensor, where Python computed with a number: QA had
# ``h * x.size(1) ** -0.5`` traced as a float32 pow, one ulp off the GraphModule's double at some lengths only.
_SIZE_ENDS = {"aten::Int", "aten::IntImplicit", "aten::ScalarImplicit", "prim::ListConstruct"}
_SIZE_ARITHMETIC = {"aten::floor_divide", "aten::floordiv", "aten::add", "aten::sub", "aten::mul", "aten::remainder"}


def _computed_from_sizes(frozen: torch.jit.ScriptModule) -> str | None:
    """The first op of the trace that computes with a size of the input other than to make another size (None:
    there is none); see :data:`_SIZE_ENDS`."""
    pending = [node for node in frozen.graph.nodes() if node.kind() == "prim::NumToTensor"]
    seen: set[int] = set()
    while pending:
        node = pending.pop()
        for output in node.outputs():
            for use in output.uses():
                user = use.user
                if user.kind() in _SIZE_ENDS:
                    continue
                if user.kind() not in _SIZE_ARITHMETIC:
                    return user.kind()
                if id(user) not in seen:
                    seen.add(id(user))
                    pending.append(user)
    return None


# code a trace may run through: torch's, Python's operators, and torchvision's (its ops, such as the
# stochastic_depth that efficientnet calls as one wrapped function, are written to be traced and scripted)
_TORCH_OWNED = ("torch", "torchvision", "operator", "_operator", "builtins", "math")


def _user_calls(model: fx.GraphModule) -> str | None:
    """The first module or function of ``model``'s graph whose code is not torch's (None: none is), as named in the
    graph."""
    for node in model.graph.nodes:
        if node.op == "call_module":
            kind = type(model.get_submodule(str(node.target)))
            owner, named = kind.__module__, f"{node.target} ({kind.__name__})"
        elif builds_namedtuple(node):
            continue  # builds a namedtuple of the user's, no code (TorchScript returns a plain tuple: checked later)
        elif node.op == "call_function":
            owner = getattr(node.target, "__module__", None) or "torch"  # torch.ops overloads have none
            named = f"{getattr(node.target, '__name__', node.target)}()"
        else:
            continue
        if owner.split(".")[0] not in _TORCH_OWNED:
            return named
    return None


def _is_quantized_call(node: fx.Node) -> bool:
    return node.op == "call_function" and (
        node.target is torch.quantize_per_tensor or str(node.target).startswith("quantized.")
    )


def _scales_inlined(model: nn.Module) -> nn.Module:
    """``model`` where the scales and zero points that convert_fx keeps as one-element tensor attributes, read by
    ``quantize_per_tensor`` and the ``quantized.add``-like ops (and the scale buffers of quantized modules such as
    Hardswish), are written in as Python numbers. They are constants, but the tracer cannot tell them from values
    of the input and warns that the trace fixed them, and :func:`frozen_torchscript` refuses a trace that did. A new
    GraphModule over the same submodules: ``model`` is left as it is."""
    if not isinstance(model, fx.GraphModule):
        return model
    graph = fx.Graph()
    values: dict[fx.Node, fx.Node] = {}
    inlined_modules: dict[str, nn.Module] = {}
    graph.output(graph.graph_copy(model.graph, values))
    for node in list(graph.nodes):
        if node.op == "call_module":
            _modules_with_number_scales(model, str(node.target), inlined_modules)
        if node.op != "get_attr" or not node.users or not all(_is_quantized_call(user) for user in node.users):
            continue
        value = get_attr_value(model, str(node.target))
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            continue
        for user in list(node.users):
            _read_as_number(user, node, value.item())
        graph.erase_node(node)
    inlined = fx.GraphModule(model, graph)
    for target, module in inlined_modules.items():
        # GraphModule copied the path to each called module as new containers holding the model's modules: a module
        # set in them leaves the model's own as it is
        parent, _, leaf = target.rpartition(".")
        setattr(inlined.get_submodule(parent), leaf, module)
    return inlined


# the one-element tensors torch's quantized modules read as numbers in forward (torch.ao.nn.quantized.Hardswish:
# ``torch.ops.quantized.hardswish(input, self.scale, self.zero_point)``)
_SCALE_BUFFERS = ("scale", "zero_point")


def _modules_with_number_scales(model: nn.Module, target: str, inlined: dict[str, nn.Module]) -> None:
    """Where ``target`` is a quantized module keeping its scale or zero point as a one-element tensor buffer, a
    shallow copy reading them as Python numbers goes into ``inlined`` (the model's own module is left as it is)."""
    module = model.get_submodule(target)
    if target in inlined or not type(module).__module__.startswith("torch.ao.nn.quantized"):
        return
    scalars = {
        name: module._buffers[name]
        for name in _SCALE_BUFFERS
        if isinstance(module._buffers.get(name), torch.Tensor) and module._buffers[name].numel() == 1
    }
    if not scalars:
        return
    copied = copy.copy(module)
    copied._buffers = {k: v for k, v in module._buffers.items() if k not in scalars}
    for name, value in scalars.items():
        object.__setattr__(copied, name, value.item())
    inlined[target] = copied


def _read_as_number(user: fx.Node, attribute: fx.Node, number: float | int) -> None:
    def swap(arg: fx.Node) -> Any:
        return number if arg is attribute else arg

    user.args = pytree.tree_map_only(fx.Node, swap, user.args)
    user.kwargs = pytree.tree_map_only(fx.Node, swap, user.kwargs)


def write_frozen(
    model: nn.Module, path: Path, example_inputs: tuple[Any, ...], example_kwargs: dict[str, Any] | None = None
) -> tuple[bool, str]:
    """``model`` as :func:`frozen_torchscript` at ``path``, loaded back and computing the same bits on the example
    inputs: (True, what was checked), or (False, why not; no file is left)."""
    scripted, how = frozen_torchscript(model, example_inputs, example_kwargs)
    if scripted is None:
        return False, how
    with _quiet_jit():
        torch.jit.save(scripted, str(path))
        problem = _differs(scripted, torch.jit.load(str(path)), example_inputs)
    if problem:
        path.unlink()
        return False, f"the saved TorchScript {problem} once loaded"
    return True, how


@contextlib.contextmanager
def _quiet_jit() -> Iterator[None]:
    """torch 2.14 warns on every ``torch.jit.save``/``load`` that TorchScript is deprecated: fxforge chose it
    for int8 (torch.export has no int8 kernels to run), and the warning would be a stray line in the user's output."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)
        yield


def _batch_of(inputs: tuple[Any, ...]) -> int | str:
    first = inputs[0] if inputs else None
    return first.shape[0] if isinstance(first, torch.Tensor) and first.dim() else "?"


def _other_batch(inputs: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Random inputs like ``inputs`` with the batch dimension one larger; None where they cannot be made (an input
    that is not a tensor, a 0-d first input)."""
    batch = _batch_of(inputs)
    if not isinstance(batch, int):
        return None
    try:
        return make_inputs(specs_of(inputs), seed=1, batch=batch + 1)
    except InputSpecError:
        return None


def _runs(model: nn.Module, inputs: tuple[Any, ...]) -> bool:
    try:
        with torch.no_grad():
            model(*inputs)
        return True
    except Exception:
        return False


def _differs(model: nn.Module, frozen: torch.jit.ScriptModule, inputs: tuple[Any, ...]) -> str | None:
    """How the frozen trace's outputs differ from the model's on ``inputs`` (None: they are equal, bit for bit)."""
    with torch.no_grad():
        expected = model(*cloned(inputs))
        try:
            got = frozen(*cloned(inputs))
        except Exception as exc:
            return f"fails at batch {_batch_of(inputs)} ({one_line_reason(exc, 100)})"
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    got_leaves, got_spec = pytree.tree_flatten(got)
    if expected_spec != got_spec:
        return "returns another structure than the model (TorchScript keeps tensors, tuples, lists and dicts)"
    for want, have in zip(expected_leaves, got_leaves):
        same = torch.equal(want, have) if isinstance(want, torch.Tensor) else want == have
        if not same:
            return f"computes other values at batch {_batch_of(inputs)}"
    return None
