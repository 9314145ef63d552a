"""replace_modules: swap modules of one type (or chosen by a predicate) for new ones, functional calls included.

``mapping={nn.ReLU: nn.ReLU6}`` replaces every ``call_module`` node whose module is exactly an ``nn.ReLU``
and every functional form of the same activation (``F.relu``, ``torch.relu``, ``x.relu()``, ``relu_`` ...)
with a call to a new module. Each replaced call site gets its own new module instance, so a module the
model calls twice (torchvision's ``BasicBlock.relu``) becomes two modules. The mapping's value says how
to build it: a class (constructed with no arguments, plus the old module's ``inplace`` flag when the new
class takes one), an instance (deep-copied per site) or a factory called with the old module (for a
functional call: the equivalent module, e.g. ``nn.ReLU(inplace=True)`` for ``relu_``).

From YAML or the CLI, names are strings: ``{ReLU: ReLU6, GELU: "GELU(approximate='tanh')"}`` resolve
against ``torch.nn``; ``pkg.module:Class`` (or ``path/file.py:Class``) names a class of your own; literal
constructor arguments may follow in parentheses.

In-place calls keep their meaning: an in-place site whose new module is not in place writes its result
back into the input (``x.copy_(new(x))``) unless no later reader could see the difference; a new module
that is in place where the old call was not is made out-of-place (writing into a tensor the original left
alone could change other readers).
"""

from __future__ import annotations

import ast
import copy
import difflib
import importlib
import inspect
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from fxforge import references
from fxforge.effects import AliasClasses
from fxforge.errors import said
from fxforge.graphs import module_path, submodule, target_name
from fxforge.passes import PassError, PassResult, free_attribute_name, mark, register_pass

NAME = "replace_modules"

_NAME_HINT = (
    "names resolve against torch.nn (ReLU6, \"GELU(approximate='tanh')\"); name your own classes as "
    "pkg.module:Class or path/to/file.py:Class"
)

Predicate = Callable[[str, nn.Module], bool]
Builder = Callable[[nn.Module], nn.Module]


# --------------------------------------------------------------------------------------------------
# resolving names given as strings (YAML, CLI)


def import_reference(reference: str, what: str, pass_name: str) -> Any:
    """The object named by ``pkg.module:attr`` or ``path/to/file.py:attr``, as a PassError when it can't be found."""
    return references.import_reference(
        reference, what=f"{pass_name}: {what}", error=PassError, hint="e.g. my_package.patterns:fuse"
    )


def _resolve_class_name(name: str, text: str) -> Any:
    """A class named ``ReLU6``, ``nn.ReLU6``, ``torch.nn.ReLU6``, ``pkg.mod.Class`` or ``pkg.mod:Class``."""
    if ":" in name:
        return import_reference(name, "module name", NAME)
    parts = name.split(".")
    if parts[0] == "nn":
        parts = ["torch", *parts]
    if len(parts) == 1:
        found = getattr(nn, name, None)
        if isinstance(found, type):
            return found
        modules = [n for n in dir(nn) if isinstance(getattr(nn, n), type) and issubclass(getattr(nn, n), nn.Module)]
        close = difflib.get_close_matches(name, modules, n=1)
        hint = f"did you mean {close[0]!r}? {_NAME_HINT}" if close else _NAME_HINT
        raise PassError(f"{NAME}: unknown module name {text!r}: torch.nn has no {name!r}", hint=hint)
    for split in range(len(parts) - 1, 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for part in parts[split:]:
            value = getattr(value, part, None)
        if value is not None:
            return value
    raise PassError(f"{NAME}: unknown module name {text!r}", hint=_NAME_HINT)


def _parse_module_text(text: str) -> tuple[type, tuple[Any, ...], dict[str, Any]] | tuple[type, None, None]:
    """``"GELU(approximate='tanh')"`` -> (nn.GELU, (), {"approximate": "tanh"}); ``"ReLU6"`` -> (ReLU6, None, None)."""
    text = text.strip()
    # ``pkg.mod:Class(...)``: the colon is not Python, so read the module part before parsing the rest
    prefix, call = "", text
    colon, paren = text.find(":"), text.find("(")
    if colon != -1 and (paren == -1 or colon < paren):
        prefix, call = text[: colon + 1], text[colon + 1 :]
    try:
        tree = ast.parse(call, mode="eval").body
    except SyntaxError:
        raise PassError(f"{NAME}: cannot read module name {text!r}", hint=_NAME_HINT) from None
    args: tuple[Any, ...] | None = None
    kwargs: dict[str, Any] | None = None
    if isinstance(tree, ast.Call):
        try:
            args = tuple(ast.literal_eval(a) for a in tree.args)
            if any(k.arg is None for k in tree.keywords):
                raise ValueError("**kwargs")
            kwargs = {str(k.arg): ast.literal_eval(k.value) for k in tree.keywords}
        except ValueError:
            raise PassError(
                f"{NAME}: the arguments in {text!r} must be literals (numbers, strings, booleans, None)"
            ) from None
        tree = tree.func
    if not isinstance(tree, (ast.Name, ast.Attribute)):
        raise PassError(f"{NAME}: cannot read module name {text!r}", hint=_NAME_HINT)
    cls = _resolve_class_name(prefix + ast.unparse(tree), text)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise PassError(f"{NAME}: {text!r} names {cls!r}, not an nn.Module class", hint=_NAME_HINT)
    return cls, args, kwargs


def _resolve_key(key: Any) -> type[nn.Module]:
    if isinstance(key, str):
        cls, args, _ = _parse_module_text(key)
        if args is not None:
            raise PassError(f"{NAME}: mapping key {key!r} must name a module class, without arguments")
        return cls
    if isinstance(key, type) and issubclass(key, nn.Module):
        return key
    raise PassError(f"{NAME}: mapping key {key!r} is not an nn.Module class", hint=_NAME_HINT)


def _construct(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any], old: nn.Module) -> nn.Module:
    """``cls(*args, **kwargs)``, carrying the old module's ``inplace`` flag when ``cls`` takes one."""
    if "inplace" not in kwargs and _is_inplace(old) and _takes_inplace(cls):
        kwargs = {**kwargs, "inplace": True}
    return cls(*args, **kwargs)


def _takes_inplace(cls: type) -> bool:
    try:
        return "inplace" in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False


def _builder(value: Any) -> Builder:
    """How to build the new module for one site from a mapping value (class, instance, factory or string)."""
    if isinstance(value, str):
        cls, args, kwargs = _parse_module_text(value)
        return _checked(lambda old: _construct(cls, args or (), kwargs or {}, old), repr(value))
    if isinstance(value, type):
        if not issubclass(value, nn.Module):
            raise PassError(f"{NAME}: replacement {value!r} is not an nn.Module class")
        return _checked(lambda old: _construct(value, (), {}, old), value.__name__)
    if isinstance(value, nn.Module):
        return lambda old: copy.deepcopy(value)
    if callable(value):
        return _checked(value, getattr(value, "__name__", repr(value)))
    raise PassError(f"{NAME}: replacement {value!r} is not a module class, module, factory or name", hint=_NAME_HINT)


def _checked(build: Builder, label: str) -> Builder:
    def run(old: nn.Module) -> nn.Module:
        try:
            new = build(old)
        except PassError:
            raise
        except Exception as exc:
            raise PassError(f"{NAME}: building the replacement {label} failed: {type(exc).__name__}: {exc}") from None
        if not isinstance(new, nn.Module):
            raise PassError(f"{NAME}: replacement {label} returned a {type(new).__name__}, not an nn.Module")
        return new

    return run


# --------------------------------------------------------------------------------------------------
# options


@dataclass
class ReplaceModulesOptions:
    """``mapping`` {old module class: new module}: replaces the calls of modules of exactly that class, and the
    functional calls of the same activation (``F.relu``, ``torch.relu``, ``x.relu()``, ``relu_``). A new module
    is given as a class, an instance (deep-copied per call site), a factory ``f(old_module) -> nn.Module``, or a
    string: ``ReLU6``, ``"GELU(approximate='tanh')"`` (torch.nn names, literal arguments), ``pkg.module:Class``
    or ``path/to/file.py:Class``; classes are built with the old module's ``inplace`` flag when they take one.
    ``predicate(name, module) -> bool`` (a callable, or ``pkg.module:function``) narrows the mapping to the call
    sites it accepts, or alone, with ``replacement``, selects the sites to replace; ``name`` is the module path,
    or for a functional call its owner's path and node name, and ``module`` the module equivalent to the call.
    ``functional: false`` leaves functional calls alone.
    """

    mapping: Mapping[type | str, Any] | None = None
    predicate: Callable[[str, nn.Module], bool] | str | None = None
    replacement: Any = None
    functional: bool = True

    def __post_init__(self) -> None:
        if self.mapping is not None and not isinstance(self.mapping, Mapping):
            raise PassError(f"{NAME}: mapping must map module classes to replacements, got {self.mapping!r}")
        if isinstance(self.predicate, str):
            self.predicate = import_reference(self.predicate, "predicate", NAME)
        if self.predicate is not None and not callable(self.predicate):
            raise PassError(f"{NAME}: predicate must be a callable (name, module) -> bool, got {self.predicate!r}")
        if not self.mapping and self.predicate is None:
            raise PassError(
                f"{NAME} needs a mapping or a predicate",
                hint=said(
                    "e.g. --option replace_modules.mapping='{ReLU: ReLU6}'",
                    "e.g. fxforge.optimize(captured, [('replace_modules', {'mapping': {nn.ReLU: nn.ReLU6}})])",
                ),
            )
        if self.replacement is not None and self.predicate is None:
            raise PassError(f"{NAME}: replacement goes with a predicate (use mapping to replace by type)")
        if self.predicate is not None and not self.mapping and self.replacement is None:
            raise PassError(f"{NAME}: a predicate needs a replacement (a module class, module, factory or name)")
        self.rules = [(_resolve_key(key), _builder(value)) for key, value in (self.mapping or {}).items()]
        self.fallback = _builder(self.replacement) if self.replacement is not None else None

    def builder_for(self, name: str, module: nn.Module) -> Builder | None:
        """The builder for a site calling ``module`` (named ``name``), or None to leave it alone."""
        chosen = self.fallback
        for cls, build in self.rules:
            if type(module) is cls:  # exact type: a subclass may override forward with anything
                chosen = build
                break
        if chosen is None or (self.predicate is not None and not self._accepts(name, module)):
            return None
        return chosen

    def may_replace(self, cls: type) -> bool:
        """Whether calls equivalent to a ``cls`` module are candidates at all (for reporting skips)."""
        return self.fallback is not None or any(cls is key for key, _ in self.rules)

    def _accepts(self, name: str, module: nn.Module) -> bool:
        try:
            return bool(self.predicate(name, module))
        except Exception as exc:
            raise PassError(f"{NAME}: the predicate raised {type(exc).__name__} on {name}: {exc}") from None


# --------------------------------------------------------------------------------------------------
# functional forms: target -> (equivalent module class, its parameters after the input, writes input)

_Form = tuple[type, tuple[str, ...], bool]
_FUNCTIONS: dict[Any, _Form] = {
    F.relu: (nn.ReLU, ("inplace",), False),
    torch.relu: (nn.ReLU, (), False),
    torch.relu_: (nn.ReLU, (), True),
    F.relu6: (nn.ReLU6, ("inplace",), False),
    F.gelu: (nn.GELU, ("approximate",), False),
    F.silu: (nn.SiLU, ("inplace",), False),
    F.mish: (nn.Mish, ("inplace",), False),
    F.hardswish: (nn.Hardswish, ("inplace",), False),
    F.hardsigmoid: (nn.Hardsigmoid, ("inplace",), False),
    F.leaky_relu: (nn.LeakyReLU, ("negative_slope", "inplace"), False),
    F.leaky_relu_: (nn.LeakyReLU, ("negative_slope",), True),
    F.elu: (nn.ELU, ("alpha", "inplace"), False),
    F.elu_: (nn.ELU, ("alpha",), True),
    F.celu: (nn.CELU, ("alpha", "inplace"), False),
    F.selu: (nn.SELU, ("inplace",), False),
    torch.selu: (nn.SELU, (), False),
    torch.selu_: (nn.SELU, (), True),
    F.hardtanh: (nn.Hardtanh, ("min_val", "max_val", "inplace"), False),
    F.hardtanh_: (nn.Hardtanh, ("min_val", "max_val"), True),
    F.softplus: (nn.Softplus, ("beta", "threshold"), False),
    torch.sigmoid: (nn.Sigmoid, (), False),
    F.sigmoid: (nn.Sigmoid, (), False),
    torch.sigmoid_: (nn.Sigmoid, (), True),
    torch.tanh: (nn.Tanh, (), False),
    F.tanh: (nn.Tanh, (), False),
    torch.tanh_: (nn.Tanh, (), True),
}
_METHODS: dict[str, _Form] = {
    "relu": (nn.ReLU, (), False),
    "relu_": (nn.ReLU, (), True),
    "sigmoid": (nn.Sigmoid, (), False),
    "sigmoid_": (nn.Sigmoid, (), True),
    "tanh": (nn.Tanh, (), False),
    "tanh_": (nn.Tanh, (), True),
}


@dataclass
class _Site:
    node: fx.Node
    old: nn.Module  # the module called, or the module equivalent to the functional call
    inplace: bool  # the original call writes its result into its input
    name: str  # module path (call_module) or owner path and node name (functional)
    form: str  # how the original is called, for the log


def _functional_form(node: fx.Node) -> _Form | None:
    if node.op == "call_method":
        return _METHODS.get(str(node.target))
    if node.op == "call_function":
        try:
            return _FUNCTIONS.get(node.target)
        except TypeError:  # an unhashable callable
            return None
    return None


def _functional_site(node: fx.Node, form: _Form) -> tuple[_Site | None, str | None]:
    """The site for a functional call, or the reason it cannot be read as its module equivalent."""
    cls, params, fixed_inplace = form
    kwargs = dict(node.kwargs)
    source = node.args[0] if node.args else kwargs.pop("input", kwargs.pop("self", None))
    extra = node.args[1:]
    if len(extra) > len(params):
        return None, "it has more arguments than its module equivalent"
    bound = dict(zip(params, extra))
    for key, value in kwargs.items():
        if key not in params or key in bound:
            return None, f"its argument {key!r} has no module equivalent"
        bound[key] = value
    if not isinstance(source, fx.Node):
        return None, "its input is not a node of the graph"
    if any(isinstance(v, fx.Node) for v in bound.values()):
        return None, "an argument is computed in the graph, not a literal"
    if fixed_inplace and _takes_inplace(cls):
        bound["inplace"] = True  # relu_ is ReLU(inplace=True): what a factory sees, and what the log says
    try:
        equivalent = cls(**bound)
    except (TypeError, ValueError) as exc:
        return None, f"its arguments do not build {cls.__name__}: {exc}"
    inplace = fixed_inplace or bound.get("inplace") is True
    owner = module_path(node)
    name = f"{owner}.{node.name}" if owner else node.name
    return _Site(node, equivalent, inplace, name, target_name(node)), None


def _describe(module: nn.Module) -> str:
    extra = module.extra_repr()
    return f"{type(module).__name__}({extra.splitlines()[0] if extra else ''})"


# --------------------------------------------------------------------------------------------------
# the pass


@register_pass(
    NAME,
    summary="Replace modules by type mapping (ReLU -> ReLU6) or predicate, functional forms (F.relu, x.relu()) too.",
    guarantees=(
        "Not exact in general: the graph computes the new modules, so outputs differ wherever a new module's output "
        "differs from the old one's (ReLU6 clips at 6); verify is expected to report a divergence only at replaced "
        "call sites (marked with this pass). Nothing else changes: each call site gets its own new module instance, "
        "in-place calls keep writing into their input when a later reader could see it, and a new in-place module "
        "is made out-of-place where the original call was not in place. Matches module types exactly (not "
        "subclasses). Torch dialect only: ATen graphs have no modules left to map (an activation there is a few "
        "aten ops, and its module only survives as metadata); use replace_pattern with an ATen-level pattern there."
    ),
    options=ReplaceModulesOptions,
    dialects=("torch",),
)
def replace_modules(gm: fx.GraphModule, options: ReplaceModulesOptions) -> PassResult:
    result = PassResult(NAME, gm)
    plan = _plan(gm, options, result)
    if not plan:
        return result
    observable = _observable_writes(gm, [site for site, new in plan if site.inplace and not _is_inplace(new)])
    calls = Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_module")
    replaced_calls = Counter(str(site.node.target) for site, _ in plan if site.node.op == "call_module")
    reused: set[str] = set()
    for site, new in plan:
        if not site.inplace and _is_inplace(new):
            new.inplace = False
        target = _install(gm, site, new, calls, replaced_calls, reused)
        _rewire(gm, site, target, write_back=site.node in observable)
        how = "; writes back into its input" if site.node in observable else ""
        change = f"{_describe(site.old)} -> {_describe(new)} as {target}{how}"
        result.note(f"{site.name} ({site.form}): {change}", replaced=1)
    gm.delete_all_unused_submodules()
    return result


def _plan(gm: fx.GraphModule, options: ReplaceModulesOptions, result: PassResult) -> list[tuple[_Site, nn.Module]]:
    """(site, new module) for every call to replace, in graph order; skipped candidates are logged."""
    plan: list[tuple[_Site, nn.Module]] = []
    occurrence: Counter[str] = Counter()
    for node in gm.graph.nodes:
        if node.op == "call_module":
            module = submodule(gm, node)
            occurrence[str(node.target)] += 1
            count = occurrence[str(node.target)]
            form = "module" if count == 1 else f"module, call {count}"
            site = _Site(node, module, _is_inplace(module), str(node.target), form)
            build = options.builder_for(site.name, module)
            if build is not None:
                plan.append((site, build(module)))
            continue
        form = _functional_form(node) if options.functional else None
        if form is None:
            continue
        site, reason = _functional_site(node, form)
        if site is None:
            if options.may_replace(form[0]):
                result.skip(f"{node.name} ({target_name(node)}): {reason}")
            continue
        build = options.builder_for(site.name, site.old)
        if build is not None:
            plan.append((site, build(site.old)))
    return plan


def _is_inplace(module: nn.Module) -> bool:
    return getattr(module, "inplace", False) is True


def _observable_writes(gm: fx.GraphModule, sites: list[_Site]) -> set[fx.Node]:
    """The in-place sites whose write into their input someone could see after the call.

    That is: the input is a graph input or stored tensor (the caller sees it), or some tensor that may
    share its storage is read after the call by anything but the call itself. One sweep over the graph
    keeps the set of values still to be read (their last use lies ahead), so each site only looks at
    the values live across it.
    """
    if not sites:
        return set()
    aliases = AliasClasses(gm)
    wanted = {site.node: site.node.args[0] if site.node.args else site.node.kwargs.get("input") for site in sites}
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    expiring: dict[int, list[fx.Node]] = {}
    live: set[fx.Node] = set()
    observable: set[fx.Node] = set()
    for i, node in enumerate(gm.graph.nodes):
        for done in expiring.pop(i, ()):
            live.discard(done)
        if node in wanted:
            source = wanted[node]
            if isinstance(source, fx.Node) and (
                aliases.external(source) or any(aliases.same(value, source) for value in live)
            ):
                observable.add(node)
        last = max((order[user] for user in node.users), default=-1)
        if last > i:
            live.add(node)
            expiring.setdefault(last, []).append(node)
    return observable


def _install(
    gm: fx.GraphModule,
    site: _Site,
    new: nn.Module,
    calls: Counter[str],
    replaced_calls: Counter[str],
    reused: set[str],
) -> str:
    """Register ``new`` for ``site`` and return its target path.

    The first replaced call of a module takes over its path when every call of that module is
    replaced; other sites get a fresh name beside it (``layer1.0.relu_1``).
    """
    node = site.node
    if node.op == "call_module":
        path = str(node.target)
        if path not in reused and calls[path] == replaced_calls[path]:
            reused.add(path)
            parent, _, child = path.rpartition(".")
            setattr(gm.get_submodule(parent) if parent else gm, child, new)
            return path
        parent, _, child = path.rpartition(".")
    else:
        parent, child = module_path(node), node.name
        try:
            gm.get_submodule(parent)
        except AttributeError:
            parent = ""  # the owner was traced through and is not kept in the GraphModule
    owner = gm.get_submodule(parent) if parent else gm
    name = free_attribute_name(owner, child)
    owner.add_module(name, new)
    return f"{parent}.{name}" if parent else name


def _rewire(gm: fx.GraphModule, site: _Site, target: str, *, write_back: bool) -> None:
    """Make the graph call ``target`` at ``site``; with ``write_back``, copy the result into the input."""
    node = site.node
    graph = gm.graph
    source = node.args[0] if node.args else node.kwargs.get("input", node.kwargs.get("self"))
    if node.op == "call_module":
        node.target = target
        call = node
        mark(call, NAME)
    else:
        with graph.inserting_before(node):
            call = graph.call_module(target, (source,))
        mark(call, NAME, origin_of=node)
    value = call
    if write_back:
        with graph.inserting_after(call):
            value = graph.call_method("copy_", (source, call))
        mark(value, NAME, origin_of=node)
    if value is not node:
        node.replace_all_uses_with(value, delete_user_cb=lambda user: user is not value)
    if call is not node:
        graph.erase_node(node)
