"""Pipelines: run passes in order on a copy of a captured graph, with a change log, lint counts
between passes, and optional verification after each pass so that a broken pass is named.

A pipeline file (YAML or TOML) lists the passes::

    passes:
      - fold_bn
      - remove_dropout
      - name: replace_modules
        options: {mapping: {ReLU: ReLU6}}
    verify: true
"""

from __future__ import annotations

import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

import yaml
from torch import fx

from fxforge.capture import LOADED, Captured, has_shapes, placeholder_values, record_shapes
from fxforge.errors import FxforgeError, first_line, one_line_reason, option
from fxforge.lint import lint
from fxforge.passes import (
    PassCrashed,
    PassError,
    PassResult,
    apply_pass,
    check_options,
    copy_graph_module,
    exact_passes,
    expand_groups,
    get_pass,
    parse_options,
    resolve_pass_reference,
    stamp_provenance,
)
from fxforge.references import as_names, parse_value
from fxforge.registry import BUILTIN
from fxforge.verify import Verifier, VerifyResult

# The cases each pass that changed the graph is checked on as it runs (the first: the example's batch size, N(0, 1)),
# to name and roll back a broken pass at once; the final graph is then checked on every case of the Verifier.
QUICK_CASES = (0,)


@dataclass
class PassStep:
    name: str
    options: Any = field(default_factory=dict)  # a mapping, or the pass's options dataclass


@dataclass
class StepRecord:
    """One entry of the change log. ``verification`` is None when the pass changed nothing (nothing to prove); for a
    pass that changed the graph it is the quick check on :data:`QUICK_CASES`, or the full check of its graph when the
    final check failed and this pass was found to blame."""

    result: PassResult
    lint_findings: int | None = None
    verification: VerifyResult | None = None
    rolled_back: str | None = None  # why the pass's result was discarded (the run then stopped, unless keep_going)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        data = self.result.to_dict()
        data["lint_findings"] = self.lint_findings
        data["verify"] = self.verification.to_dict() if self.verification else None
        data["rolled_back"] = self.rolled_back
        data["seconds"] = round(self.seconds, 3)
        return data


@dataclass
class PipelineResult:
    """The rewritten graph and the change log.

    ``failed_pass`` names the pass that stopped a fail-fast run; ``problem`` says why the run could not be
    verified at all (a non-deterministic model); rolled-back passes (``keep_going``) do not make it fail.
    """

    graph_module: fx.GraphModule
    steps: list[StepRecord]
    verification: VerifyResult | None = None
    failed_pass: str | None = None
    problem: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    # no pass changed the graph and the reference is that graph itself (a bare GraphModule, a loaded program):
    # the final check compared it with a copy of itself, which could not fail, so it is not called "verified"
    compared_with_itself: bool = False

    @property
    def ok(self) -> bool:
        return self.failed_pass is None and self.problem is None and (self.verification is None or self.verification.ok)

    def __repr__(self) -> str:  # the dataclass's would print the whole GraphModule
        changed = [step.result.name for step in self.steps if step.result.changed and not step.rolled_back]
        verdict = "ok" if self.ok else f"FAILED ({self.failed_pass or self.problem or 'verification'})"
        checked = f", {self.verification!r}" if self.verification is not None else ", not verified"
        return f"<PipelineResult {verdict}: {len(self.steps)} passes, changed {changed}{checked}>"

    @property
    def rolled_back(self) -> list[StepRecord]:
        return [step for step in self.steps if step.rolled_back]

    def to_dict(self) -> dict[str, Any]:
        return {
            "passes": [s.to_dict() for s in self.steps],
            "verify": self.verification.to_dict() if self.verification else None,
            "failed_pass": self.failed_pass,
            "problem": self.problem,
            "rolled_back": [s.result.name for s in self.rolled_back],
            "compared_with_itself": self.compared_with_itself,
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
        }


def pass_name(name_or_reference: str) -> str:
    """A registered pass's name; ``path/to/file.py:function`` or ``package.module:function`` is imported first
    and the function it names is registered (see docs/plugins.md)."""
    name = name_or_reference.strip()
    return resolve_pass_reference(name) if ":" in name else name


def _relative_to(folder: Path, step: Any) -> Any:
    """A pipeline file's ``my_passes.py:function`` step names a file beside the pipeline file (where it is)."""
    name = step.get("name") if isinstance(step, Mapping) else step
    if not isinstance(name, str) or ".py:" not in name:
        return step
    file, _, function = name.strip().rpartition(":")
    beside = folder / file
    if Path(file).is_absolute() or not beside.is_file():
        return step
    resolved = f"{beside}:{function}"
    return {**step, "name": resolved} if isinstance(step, Mapping) else resolved


def _as_step(item: str | PassStep | tuple[str, Mapping[str, Any]] | Mapping[str, Any]) -> PassStep:
    if isinstance(item, PassStep):
        return item
    if isinstance(item, str):
        return PassStep(pass_name(item))
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
        return PassStep(pass_name(item[0]), _step_options(item[0], item[1]))
    if isinstance(item, Mapping) and "name" in item:
        unknown = set(item) - {"name", "options"}
        if unknown:
            raise PassError(f"pipeline step {item['name']!r} has unknown keys {sorted(unknown)}")
        return PassStep(pass_name(str(item["name"])), _step_options(str(item["name"]), item.get("options")))
    raise PassError(f"cannot read pipeline step {item!r}", hint="a pass name, or {name: ..., options: {...}}")


def _step_options(name: str, options: Any) -> Any:
    """A step's options: a mapping (from YAML or Python), or the pass's options dataclass itself; anything else
    is refused by name (QA: a YAML list of options was an internal error, a dataclass "not iterable")."""
    if options is None:
        return {}
    if isinstance(options, Mapping):
        return dict(options)
    if is_dataclass(options) and not isinstance(options, type):
        return options
    raise PassError(
        f"the options of pipeline step {name!r} are a {type(options).__name__}, not a mapping",
        hint="options: {name: value, ...}",
    )


class Pipeline:
    """An ordered list of passes; :meth:`run` never mutates the captured graph unless ``inplace``.

    ``verify_each``: prove the passes against the model (reference outputs are computed once,
    :class:`~fxforge.verify.Verifier`), in two stages: every pass that changed the graph is checked as it runs on
    :data:`QUICK_CASES`, and the final graph on every case. When the final check fails, the graph each pass produced
    is checked in order on the failing case: the first that fails it is the pass to blame (its record then holds
    the full check of its graph, with the first diverging node). ``keep_going``: a pass that fails (raises, or
    fails verification) is rolled back and reported, the remaining passes still run (after a failed final check,
    again from the graph the blamed pass started from, and the final graph is checked again); otherwise the run
    stops at the first failure. Either way ``PipelineResult.verification`` is the full check of the graph handed
    back (or of the blamed pass's graph when a fail-fast run stops).
    """

    def __init__(
        self,
        steps: Sequence[str | PassStep | tuple[str, Mapping[str, Any]] | Mapping[str, Any]],
        *,
        verify_each: bool = False,
        lint_between: bool = True,
        keep_going: bool = False,
        rtol: float | None = None,
        atol: float | None = None,
    ) -> None:
        self.steps = [_as_step(s) for s in expand_groups(as_names(steps))]
        for step in self.steps:
            # fail early, before any work, on an unknown name or option: parsed only when the step ran, a misspelt
            # option was rolled back under keep_going and the run said "verified", exit 0 (QA)
            check_options(get_pass(step.name), step.options)
        self.verify_each = verify_each
        self.lint_between = lint_between
        self.keep_going = keep_going
        self.rtol, self.atol = rtol, atol

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> Pipeline:
        """Read a YAML or TOML pipeline file; ``overrides`` that are None keep the file's own setting."""
        path = Path(path)
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise FxforgeError(f"cannot read pipeline file {path}: {getattr(exc, 'strerror', None) or exc}") from None
        try:
            data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
        except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
            raise FxforgeError(
                f"pipeline file {path} is not valid {path.suffix.lstrip('.') or 'YAML'}: {first_line(exc)}"
            ) from None
        if isinstance(data, list):
            data = {"passes": data}
        if not isinstance(data, Mapping) or not isinstance(data.get("passes"), list):
            raise FxforgeError(f"pipeline file {path} needs a 'passes' list")
        unknown = set(data) - {"passes", "verify", "keep_going"}
        if unknown:
            raise FxforgeError(f"pipeline file {path} has unknown keys {sorted(unknown)}", hint="passes, verify")
        for key in ("verify", "keep_going"):
            # bool("no") is True: a quoted string must not switch a setting on
            if not isinstance(data.get(key, False), bool):
                raise FxforgeError(
                    f"pipeline file {path}: {key} must be true or false, not {data[key]!r}",
                    hint=f"{key} = true (TOML) or {key}: true (YAML), unquoted",
                )
        settings: dict[str, Any] = {
            "verify_each": data.get("verify", False),
            "keep_going": data.get("keep_going", False),
        }
        settings.update({key: value for key, value in overrides.items() if value is not None})
        return cls([_relative_to(path.parent, step) for step in data["passes"]], **settings)

    def run(
        self,
        target: Captured | fx.GraphModule,
        *,
        inplace: bool = False,
        inputs: Sequence[Any] | None = None,
        verifier: Verifier | None = None,
    ) -> PipelineResult:
        """Run the passes on a copy of ``target``'s graph (see the class docstring).

        ``inputs``: example inputs for a bare GraphModule (a Captured brings its own). ``verifier``: reuse
        reference outputs computed earlier (``optimize --auto`` verifies several pipelines against one).
        """
        timings: dict[str, float] = {}
        captured = target if isinstance(target, Captured) else None
        if captured is not None:
            self._refuse_other_dialect(captured)
        # the options' own checks (insert_after's epsilon > 0) before any work, after the dialect's: raised while the
        # pass ran, such a mistake of the user's was rolled back under keep_going (QA); built once, and run with
        built = [PassStep(step.name, self._built_options(step)) for step in self.steps]
        reference = target.graph_module if isinstance(target, Captured) else target
        work = reference if inplace else copy_graph_module(reference)
        stamp_provenance(work)
        example = tuple(inputs) if inputs is not None else (captured.example_inputs if captured else ())
        example_kwargs = captured.example_kwargs if captured else {}
        start = time.perf_counter()
        if example and not has_shapes(work):  # facts for the passes: capture records them, a bare graph lacks them
            record_shapes(work, placeholder_values(work, example, example_kwargs))
        timings["shapes"] = time.perf_counter() - start
        steps: list[StepRecord] = []
        if self.verify_each and verifier is None and (example or example_kwargs):
            start = time.perf_counter()
            # a bare graph rewritten in place is the reference too: its outputs are taken from a copy (sharing the
            # weights, which passes never write), so that the final graph is a candidate apart from it, as without
            # inplace (regression QA: Pipeline([]) in place was CANNOT VERIFY, "the reference model itself")
            verifier = Verifier(
                captured if captured is not None else (copy_graph_module(reference) if inplace else reference),
                example=(example, example_kwargs),
                rtol=self.rtol,
                atol=self.atol,
            )
            timings["reference"] = time.perf_counter() - start
            if verifier.problems:
                problem = "cannot verify: " + "; ".join(verifier.problems)
                return PipelineResult(work, steps, verifier.check(work), problem=problem, timings=timings)
        records: list[StepRecord] = []
        befores: list[fx.GraphModule] = []  # the graph each step started from
        position = 0
        while True:
            for step in built[position:]:
                befores.append(work)
                start = time.perf_counter()
                record, candidate = self._run_step(work, step, verifier)
                record.seconds = time.perf_counter() - start
                timings[step.name] = timings.get(step.name, 0.0) + record.seconds
                records.append(record)
                if record.rolled_back and not self.keep_going:
                    return PipelineResult(work, records, record.verification, failed_pass=step.name, timings=timings)
                if record.rolled_back:
                    continue
                work = candidate
                if self.lint_between:
                    record.lint_findings = len(lint(work).findings)
            if verifier is None:
                return PipelineResult(work, records, timings=timings)
            # The final graph against the model on every case (also when nothing changed: the graph handed back).
            start = time.perf_counter()
            final = verifier.check(work)
            culprit = None if final.ok else self._culprit(records, final, verifier)
            timings["verify"] = timings.get("verify", 0.0) + time.perf_counter() - start
            if culprit is None:
                unchanged = not any(r.result.changed and not r.rolled_back for r in records)
                itself = captured is None or captured.record.method == LOADED
                return PipelineResult(work, records, final, timings=timings, compared_with_itself=unchanged and itself)
            record = records[culprit]
            if not self.keep_going:
                return PipelineResult(
                    befores[culprit],
                    records[: culprit + 1],
                    record.verification,
                    failed_pass=record.result.name,
                    timings=timings,
                )
            # Roll the pass back and run the passes after it again, on the graph it started from.
            work, position = befores[culprit], culprit + 1
            del records[position:], befores[position:]

    def _refuse_other_dialect(self, captured: Captured) -> None:
        """A pass for the other dialect, refused before any work with a hint that can be followed: "capture with
        --method symbolic_trace" sent a transformers model's user to a capture that fails (QA)."""
        for step in self.steps:
            spec = get_pass(step.name)
            if captured.dialect in spec.dialects:
                continue
            failed = captured.record.trace_failure
            rewrites = captured.dialect in get_pass("replace_pattern").dialects
            if captured.record.method == LOADED and "torch" in spec.dialects:
                # a saved program (an optimize output's model.pt2) is not captured again, whatever --method says:
                # "capture with --method symbolic_trace" was followed, ignored and given again (QA)
                hint = (
                    f"this model is already an {captured.dialect} graph, which no capture turns back into the torch "
                    f"dialect: run {step.name} on the model it was made from"
                    + (f"; on its {captured.dialect} graph, replace_pattern rewrites ops" if rewrites else "")
                )
            elif failed is not None and "torch" in spec.dialects:
                hint = (
                    f"symbolic_trace cannot capture this model (it stopped{failed.where()}), so {step.name} cannot "
                    "run on it"
                    + (f"; on its {captured.dialect} graph, replace_pattern rewrites ops" if rewrites else "")
                    + " (fxforge passes lists each pass's dialects)"
                )
            else:
                method = "symbolic_trace" if "torch" in spec.dialects else "export"
                hint = f"capture with {option('--method', method)}"
            raise PassError(
                f"pass {step.name!r} works on {' and '.join(spec.dialects)} graphs, but this graph is "
                f"{captured.dialect}",
                hint=hint,
            )

    @staticmethod
    def _culprit(records: list[StepRecord], final: VerifyResult, verifier: Verifier) -> int | None:
        """The first kept pass whose graph fails the case the final graph failed on, its record now holding the
        full check of that graph (and the first diverging node) and why it is rolled back; None when no pass is
        to blame (nothing changed the graph, or the failure does not repeat)."""
        if final.failing_case is None:
            return None
        for index, record in enumerate(records):
            if record.rolled_back or not record.result.changed:
                continue
            graph = record.result.graph_module
            if verifier.check(graph, only=[final.failing_case], bisect=False).ok:
                continue
            record.verification = check = verifier.check(graph)
            record.rolled_back = _failure(check)
            return index
        return None

    @staticmethod
    def _built_options(step: PassStep) -> Any:
        """The step's options dataclass, built and checked; a plug-in's options that crash (not a PassError) are
        the plug-in's fault, named as a crashing pass is (exit 4), not an internal error of fxforge's."""
        spec = get_pass(step.name)
        try:
            return parse_options(spec, step.options)
        except (PassError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            raise _crashed(step.name, "crashed building its options", exc) from exc

    def _run_step(
        self, work: fx.GraphModule, step: PassStep, verifier: Verifier | None
    ) -> tuple[StepRecord, fx.GraphModule]:
        """Apply one pass to a copy of ``work``; verify it when it changed something. A failure is recorded in
        ``rolled_back`` (the copy is discarded) and raised only when a fail-fast run has no verification to show.
        """
        try:
            result = apply_pass(work, step.name, step.options)
        except PassError as exc:
            if not self.keep_going:
                raise
            failed = PassResult(step.name, work)
            return StepRecord(failed, rolled_back=exc.message), work
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # a crash inside the pass is the pass's fault, named as such (GeneratorExit too)
            if not self.keep_going:
                raise _crashed(step.name, "crashed", exc) from exc
            failed = PassResult(step.name, work)
            return StepRecord(failed, rolled_back=f"crashed: {one_line_reason(exc)}"), work
        record = StepRecord(result)
        if verifier is not None and result.changed:
            check = verifier.check(result.graph_module, only=QUICK_CASES)
            record.verification = check
            if not check.ok:
                record.rolled_back = _failure(check)
        return record, result.graph_module


def _crashed(name: str, what: str, exc: BaseException) -> PassCrashed:
    """A crash inside a pass (or its options) is the pass's fault, named with the plug-in it came from."""
    origin = get_pass(name).origin
    source = "" if origin == BUILTIN else f" (from {origin})"
    return PassCrashed(
        f"pass {name!r}{source} {what}: {one_line_reason(exc)}",
        hint="rerun with --debug for the traceback, and please report it"
        + ("" if origin == BUILTIN else f" to the maker of {origin}"),
    )


def _failure(check: VerifyResult) -> str:
    """Why a pass whose graph failed ``check`` is rolled back: the first diverging node, or the problems."""
    if check.divergence is not None:
        return check.divergence.describe()
    return "; ".join(check.problems[:2]) or "verification failed"


def parse_option_assignments(assignments: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``["insert_after.insert=stats", "fold_constants.max_bytes=1024"]`` -> ``{pass: {option: value}}``.

    Values are YAML scalars or flow collections (``10`` an int, ``0.5`` a float, ``true`` a bool, ``{ReLU: ReLU6}``
    a mapping), as on the command line and in pipeline files.
    """
    options: dict[str, dict[str, Any]] = {}
    for item in assignments:
        key, sep, raw = item.partition("=")
        pass_name, dot, option = key.partition(".")
        if not sep or not dot or not pass_name.strip() or not option.strip():
            raise PassError(f"--option {item!r} is not PASS.KEY=VALUE", hint="e.g. --option insert_after.insert=stats")
        options.setdefault(pass_name.strip(), {})[option.strip()] = parse_value(raw, f"--option {item!r}")
    return options


def build_pipeline(
    passes: Sequence[str] = (),
    options: Mapping[str, Mapping[str, Any]] | Sequence[str] = (),
    *,
    pipeline_file: str | Path | None = None,
    verify: bool | None = None,
    keep_going: bool | None = None,
) -> Pipeline:
    """The pipeline the CLI's ``--passes``/``--option``/``--pipeline`` describe, checked before any work.

    ``passes``: names, comma-separated groups allowed; ``exact`` stands for the exact passes, and is what runs
    when neither passes nor a pipeline file are given. ``options``: ``{pass: {option: value}}`` or
    ``PASS.KEY=VALUE`` strings, for passes in the list. ``verify``/``keep_going`` None keep a pipeline file's
    own settings (False for a list of names).
    """
    if passes and not any(name.strip() for group in passes for name in str(group).split(",")):
        raise FxforgeError("--passes names no pass", hint="e.g. --passes fold_bn,dead_code; leave it out for 'exact'")
    names = [pass_name(name) for group in passes for name in str(group).split(",") if name.strip()]
    names = expand_groups(names)
    parsed = dict(options) if isinstance(options, Mapping) else parse_option_assignments(list(options))
    if pipeline_file is not None and names:
        raise FxforgeError("give either --passes or --pipeline, not both")
    if pipeline_file is not None:
        if parsed:
            raise FxforgeError("--option applies to --passes; put options in the pipeline file instead")
        return Pipeline.from_file(pipeline_file, verify_each=verify, keep_going=keep_going)
    if not names:
        names = exact_passes()
    unknown = [name for name in parsed if name not in names]
    if unknown:
        raise FxforgeError(f"--option names pass {unknown[0]!r}, which is not in the pipeline")
    steps = [(name, dict(parsed.get(name, {}))) for name in names]
    return Pipeline(steps, verify_each=bool(verify), keep_going=bool(keep_going))
