"""Lint: rule-based analysis of a captured graph, one rule per module under ``fxforge.lint.rules``.

Like ruff, every rule has a stable code (``FX001``), a name (``dead-node``), a severity and a
summary; rules are registered with :func:`rule` and run by :func:`lint`. A rule is a function from a
:class:`LintContext` to ``(node, message)`` pairs; the framework turns those into :class:`Finding`
objects with the rule's metadata. Rules that can be fixed name the pass that fixes them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from torch import fx, nn

from fxforge import display
from fxforge.capture import LOADED, Captured
from fxforge.errors import EXIT_INTERNAL, FxforgeError, one_line_reason, option, said
from fxforge.graphs import branch_graphs, dialect_of, graph_fingerprint, module_path
from fxforge.passes import FIX_ORDER, registered_passes
from fxforge.plugins import RULES_GROUP, load_group
from fxforge.references import as_names, import_reference
from fxforge.registry import BUILTIN, Registry, registering_from

SEVERITIES = ("info", "warning", "error")


def severity_rank(severity: str) -> int:
    return SEVERITIES.index(severity)


@dataclass(frozen=True)
class Finding:
    code: str
    name: str
    severity: str
    message: str
    node: str | None = None
    module: str | None = None
    fix: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LintContext:
    """What a rule may look at: the graph, and when known the original model and example inputs."""

    gm: fx.GraphModule
    captured: Captured | None = None

    @cached_property
    def dialect(self) -> str:
        return self.captured.dialect if self.captured is not None else dialect_of(self.gm)

    @property
    def graph(self) -> fx.Graph:
        return self.gm.graph

    @property
    def original(self) -> nn.Module | None:
        return self.captured.original if self.captured is not None else None

    @property
    def example_inputs(self) -> tuple[Any, ...]:
        return self.captured.example_inputs if self.captured is not None else ()


RuleCheck = Callable[[LintContext], Iterable[tuple[fx.Node | None, str]]]


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    severity: str
    summary: str
    check: RuleCheck
    fix: str | None = None  # name of the pass that removes this finding
    dialects: tuple[str, ...] = ("torch", "aten")

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "name": self.name,
            "severity": self.severity,
            "summary": self.summary,
            "fix": self.fix,
            "dialects": list(self.dialects),
            "origin": self.origin,
        }

    @property
    def origin(self) -> str:
        """Where the rule comes from: ``fxforge``, a plug-in package, or the user's file."""
        return RULES.origin(self.code)


class RuleError(FxforgeError):
    """A lint rule could not be registered or found."""


class NotApplicable(Exception):
    """Raised by a rule's check when this graph cannot be judged by it (the message says why and what would
    let it run): lint lists the rule as skipped, which "All checks passed!" alone hid (QA)."""


class RuleCrashed(RuleError):
    """A rule broke its contract (it changed the graph it reads): a bug in the rule, not the user's input."""

    exit_code = EXIT_INTERNAL


RULES: Registry[Rule] = Registry("lint rule", RuleError, listing="fxforge lint --rules")


def rule(
    code: str,
    name: str,
    severity: str,
    summary: str,
    fix: str | None = None,
    dialects: tuple[str, ...] = ("torch", "aten"),
) -> Callable[[RuleCheck], RuleCheck]:
    """Register a lint rule; the decorated function yields ``(node, message)`` for each finding."""
    if severity not in SEVERITIES:
        raise RuleError(f"rule {code}: severity must be one of {', '.join(SEVERITIES)}, not {severity!r}")

    def register(check: RuleCheck) -> RuleCheck:
        clash = next((r for r in RULES.values() if r.name == name and r.code != code), None)
        if clash is not None:
            origin = RULES.origin(clash.code)
            raise RuleError(f"lint rule name {name!r} is already used by {clash.code} (from {origin})")
        rule_ = Rule(code, name, severity, summary, check, fix, dialects)
        RULES.register(code, rule_, same=_same_check, module=check.__module__)
        return check

    return register


@dataclass
class LintReport:
    findings: list[Finding] = field(default_factory=list)
    rules_run: list[str] = field(default_factory=list)
    dialect: str = "torch"
    # a rule that raised, or yielded something other than findings: its findings are missing, the others stand
    rule_failures: list[str] = field(default_factory=list)
    # the codes of the rules that crashed (among rule_failures): a check that did not run must not pass in CI
    rules_crashed: list[str] = field(default_factory=list)
    # a rule that does not run on this graph (another dialect, or :class:`NotApplicable`): why, and what would run it
    rules_skipped: list[str] = field(default_factory=list)
    # the graphs an exported graph hands to torch.cond and other higher-order ops: rules read around them, not in them
    graphs_not_linted: list[str] = field(default_factory=list)

    def at_least(self, severity: str) -> list[Finding]:
        """The findings of ``severity`` or worse; ``"never"`` (``--fail-on never``): none."""
        if severity == "never":
            return []
        if severity not in SEVERITIES:
            raise FxforgeError(f"unknown severity {severity!r}", hint=f"one of {', '.join(SEVERITIES)} or never")
        return [f for f in self.findings if severity_rank(f.severity) >= severity_rank(severity)]

    def __repr__(self) -> str:
        return display.lint_repr(self)

    def _repr_html_(self) -> str:  # Jupyter shows this for the last value of a cell
        return display.lint_html(self)

    def to_dict(self) -> dict[str, Any]:
        counts = {s: sum(1 for f in self.findings if f.severity == s) for s in SEVERITIES}
        return {
            "dialect": self.dialect,
            "findings": [f.to_dict() for f in self.findings],
            "counts": counts,
            "rules_run": self.rules_run,
            "rule_failures": self.rule_failures,
            "rules_crashed": self.rules_crashed,
            "rules_skipped": self.rules_skipped,
            "graphs_not_linted": self.graphs_not_linted,
        }


def _same_check(old: Rule, new: Rule) -> bool:
    return old.check is new.check


def _select_rules(select: Iterable[str] | None, ignore: Iterable[str] | None) -> list[Rule]:
    _load_rules()
    by_key = {**{r.code: r for r in RULES.values()}, **{r.name: r for r in RULES.values()}}
    for key in [*(select or []), *(ignore or [])]:
        if key not in by_key:
            raise FxforgeError(f"unknown lint rule {key!r}", hint="list them with: fxforge lint --rules")
    chosen = [by_key[k] for k in select] if select else list(RULES.values())
    ignored = {by_key[k].code for k in ignore or []}
    return sorted((r for r in chosen if r.code not in ignored), key=lambda r: r.code)


def _how_to_get_the_torch_dialect(context: LintContext) -> str:
    """Advice on a rule skipped for needing the torch dialect: capture with symbolic_trace, unless it already failed
    on this model (regression QA: the advice sent the user to a capture that fails)."""
    record = context.captured.record if context.captured is not None else None
    if record is not None and record.method == LOADED:
        # a saved program (an optimize output's model.pt2): --method is not applied to a graph, so "capture with
        # --method symbolic_trace" was followed, ignored and given again (QA)
        return (
            f" (this model is already an {record.dialect} graph, which no capture turns back into the torch dialect: "
            "lint the model it was made from)"
        )
    failed = record.trace_failure if record is not None else None
    if failed is None:
        return f" (capture with {option('--method', 'symbolic_trace')})"
    return f" (symbolic_trace cannot capture this model: it stopped{failed.where()})"


def lint(
    target: Captured | fx.GraphModule,
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
    rules: Iterable[str] = (),
) -> LintReport:
    """Run the lint rules (all, or those in ``select`` minus ``ignore``; codes or names) on a graph.

    ``rules``: ``file.py:function`` or ``package.module:function`` references to ``@fxforge.register_rule``
    functions to run too (``lint --rule``), each added as :func:`load_rule_reference` adds it."""
    for reference in [rules] if isinstance(rules, str) else rules:
        load_rule_reference(reference)
    if isinstance(target, Captured):
        context = LintContext(target.graph_module, target)
    elif isinstance(target, fx.GraphModule):
        context = LintContext(target)
    else:
        raise FxforgeError(
            f"lint takes a captured graph, not a {type(target).__name__}",
            hint="capture it first: fxforge.capture(model, example_inputs), or fxforge.prepare('torchvision:resnet18')",
        )
    report = LintReport(dialect=context.dialect, graphs_not_linted=branch_graphs(context.gm))
    for current in _select_rules(as_names(select), as_names(ignore)):
        if context.dialect not in current.dialects:
            other = " or ".join(current.dialects)
            how = _how_to_get_the_torch_dialect(context) if "torch" in current.dialects else ""
            report.rules_skipped.append(
                f"{current.code} {current.name} needs the {other} dialect, not {context.dialect}{how}"
            )
            continue
        trusted = current.origin == BUILTIN
        before = None if trusted else graph_fingerprint(context.graph)
        report.rules_run.append(current.code)  # a rule that crashes ran too (rule_failures says so)
        try:
            report.findings += _findings_of(current, context)
        except NotApplicable as reason:
            report.rules_run.remove(current.code)
            report.rules_skipped.append(f"{current.code} {current.name} {reason}")
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # one broken rule (a plug-in's) stopped lint and optimize for every model
            where = "" if trusted else f" (from {current.origin})"
            report.rule_failures.append(
                f"rule {current.code} {current.name}{where} crashed: {one_line_reason(exc)}; its findings are missing"
            )
            report.rules_crashed.append(current.code)
        if before is not None and graph_fingerprint(context.graph) != before:
            # rules only read: a plug-in rule that edited the graph corrupted optimize's output, and the next pass
            # was blamed (QA)
            raise RuleCrashed(
                f"rule {current.code} {current.name} (from {current.origin}) changed the graph it was given to read",
                hint=f"a rule yields findings; a change belongs in a pass (its fix), to the maker of {current.origin}",
            )
    if select and not report.rules_run and report.rules_skipped:  # "All checks passed!" with nothing checked (QA)
        raise FxforgeError(f"no selected rule runs on this graph: {'; '.join(report.rules_skipped)}")
    known = registered_passes()
    for code, name in sorted({(f.code, f.fix) for f in report.findings if f.fix and f.fix not in known}):
        # lint --fix passed over such a finding in silence (QA: a plug-in rule's misspelt fix)
        origin = RULES[code].origin if code in RULES else BUILTIN
        where = "" if origin == BUILTIN else f" (from {origin})"
        report.rule_failures.append(
            f"rule {code}{where}: its fix {name!r} is not a registered pass: lint --fix cannot apply it"
        )
    order = {node.name: i for i, node in enumerate(context.graph.nodes)}
    report.findings.sort(key=lambda f: (-severity_rank(f.severity), order.get(f.node or "", -1), f.code))
    return report


def _findings_of(current: Rule, context: LintContext) -> list[Finding]:
    findings = []
    for found in current.check(context):
        # a rule yields (node, message), or (node, message, fix) where one finding's fix is not the rule's
        # (an active dropout: remove_dropout keeps it, so it names no fix)
        if not isinstance(found, tuple) or len(found) not in (2, 3) or not isinstance(found[1], str):
            raise TypeError(f"yielded {found!r}, not (node, message) or (node, message, fix)")
        node, message, *fix = found
        if node is not None and not isinstance(node, fx.Node):
            raise TypeError(f"yielded {node!r} as the node, not an fx.Node or None")
        findings.append(
            Finding(
                current.code,
                current.name,
                current.severity,
                message,
                node.name if node is not None else None,
                module_path(node) if node is not None else None,
                fix[0] if fix else current.fix,
            )
        )
    return findings


# the decorator under the name fxforge exports it by, as register_pass and register_backend: what `lint --rule
# FILE.py:FUNCTION` runs is a function decorated with it, and `import fxforge` alone had no name for it
register_rule = rule


def all_rules() -> list[Rule]:
    _load_rules()
    return sorted(RULES.values(), key=lambda r: r.code)


def _load_rules() -> None:
    """fxforge's rules (importing the package registers every rule module in it), then the plug-ins'."""
    import fxforge.lint.rules  # noqa: F401

    load_group(RULES_GROUP, _adopt_rule)


def _adopt_rule(name: str, check: Any, origin: str) -> None:
    if not any(rule_.check is check for rule_ in RULES.values()):
        raise RuleError(
            f"{origin} names {check!r}, which is not a lint rule", hint="decorate it with @fxforge.register_rule"
        )


# rules a --rule file defined but no reference named: importing the file registered them, and a later reference
# to the same (already imported) file brings its rule back from here
_UNNAMED_RULES: dict[int, Rule] = {}


def load_rule_reference(reference: str) -> list[str]:
    """Import ``path/to/file.py:function`` (or ``package.module:function``) and add the ``@rule`` it names; returns
    the codes of the rules it added. The file's other ``@rule`` functions are not added (QA: ``--rule
    my_rules.py:one`` ran every rule in the file); name each one to run it."""
    _load_rules()
    before = set(RULES)
    with registering_from(f"file {reference.rpartition(':')[0]}"):
        check = import_reference(
            reference,
            what="lint rule",
            error=RuleError,
            hint=said("e.g. --rule my_rules.py:check", "e.g. rules=['my_rules.py:check']"),
        )
    for code in set(RULES) - before:
        if RULES[code].check is not check:
            unnamed = RULES.pop(code)
            _UNNAMED_RULES[id(unnamed.check)] = unnamed
    if id(check) in _UNNAMED_RULES:
        named = _UNNAMED_RULES.pop(id(check))
        RULES[named.code] = named
    if not any(rule_.check is check for rule_ in RULES.values()):
        raise RuleError(
            f"{reference} is not a lint rule", hint="decorate it with @fxforge.register_rule(code, name, ...)"
        )
    return sorted(set(RULES) - before)


# The order lint --fix applies fix passes in; defined beside the passes, re-exported here where users look.
__all__ = ["FIX_ORDER", "Finding", "LintContext", "LintReport", "Rule", "all_rules", "lint", "rule"]
