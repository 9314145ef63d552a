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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib
import torch
import yaml
from torch import fx

from fxforge.capture import Captured
from fxforge.errors import FxforgeError
from fxforge.passes import PassError, PassResult, apply_pass, copy_graph_module, get_pass, stamp_provenance
from fxforge.verify import VerifyResult, verify


@dataclass
class PassStep:
    name: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepRecord:
    """One entry of the change log."""

    result: PassResult
    lint_findings: int | None = None
    verification: VerifyResult | None = None

    def to_dict(self) -> dict[str, Any]:
        data = self.result.to_dict()
        data["lint_findings"] = self.lint_findings
        data["verify"] = self.verification.to_dict() if self.verification else None
        return data


@dataclass
class PipelineResult:
    graph_module: fx.GraphModule
    steps: list[StepRecord]
    verification: VerifyResult | None = None
    failed_pass: str | None = None

    @property
    def ok(self) -> bool:
        return self.failed_pass is None and (self.verification is None or self.verification.ok)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passes": [s.to_dict() for s in self.steps],
            "verify": self.verification.to_dict() if self.verification else None,
            "failed_pass": self.failed_pass,
        }


def _as_step(item: str | PassStep | tuple[str, Mapping[str, Any]] | Mapping[str, Any]) -> PassStep:
    if isinstance(item, PassStep):
        return item
    if isinstance(item, str):
        return PassStep(item.strip())
    if isinstance(item, tuple):
        return PassStep(item[0], dict(item[1] or {}))
    if isinstance(item, Mapping) and "name" in item:
        unknown = set(item) - {"name", "options"}
        if unknown:
            raise PassError(f"pipeline step {item['name']!r} has unknown keys {sorted(unknown)}")
        return PassStep(str(item["name"]), dict(item.get("options") or {}))
    raise PassError(f"cannot read pipeline step {item!r}", hint="a pass name, or {name: ..., options: {...}}")


class Pipeline:
    """An ordered list of passes; :meth:`run` never mutates the captured graph unless ``inplace``."""

    def __init__(
        self,
        steps: Sequence[str | PassStep | tuple[str, Mapping[str, Any]] | Mapping[str, Any]],
        *,
        verify_each: bool = False,
        lint_between: bool = True,
        rtol: float | None = None,
        atol: float | None = None,
    ) -> None:
        self.steps = [_as_step(s) for s in steps]
        for step in self.steps:
            get_pass(step.name)  # fail early, before any work, on an unknown name
        self.verify_each = verify_each
        self.lint_between = lint_between
        self.rtol, self.atol = rtol, atol

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> Pipeline:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise FxforgeError(f"cannot read pipeline file {path}: {exc.strerror}") from None
        try:
            data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
        except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
            first = str(exc).splitlines()[0]
            raise FxforgeError(
                f"pipeline file {path} is not valid {path.suffix.lstrip('.') or 'YAML'}: {first}"
            ) from None
        if isinstance(data, list):
            data = {"passes": data}
        if not isinstance(data, Mapping) or not isinstance(data.get("passes"), list):
            raise FxforgeError(f"pipeline file {path} needs a 'passes' list")
        settings = {"verify_each": bool(data.get("verify", False))}
        settings.update(overrides)
        return cls(data["passes"], **settings)

    def run(
        self,
        target: Captured | fx.GraphModule,
        *,
        inplace: bool = False,
        inputs: Sequence[Any] | None = None,
    ) -> PipelineResult:
        captured = target if isinstance(target, Captured) else None
        reference = target.graph_module if isinstance(target, Captured) else target
        work = reference if inplace else copy_graph_module(reference)
        stamp_provenance(work)
        example = tuple(inputs) if inputs is not None else (captured.example_inputs if captured else ())
        _propagate_shapes(work, captured, example)
        steps: list[StepRecord] = []
        verify_target = captured if captured is not None else reference
        for step in self.steps:
            result = apply_pass(work, step.name, step.options, inplace=True)
            record = StepRecord(result)
            if self.lint_between:
                from fxforge.lint import lint

                record.lint_findings = len(lint(work).findings)
            steps.append(record)
            if self.verify_each and example:
                record.verification = verify(
                    verify_target,
                    work,
                    inputs=example if inputs is not None else None,
                    input_specs=None if captured else _specs(example),
                    rtol=self.rtol,
                    atol=self.atol,
                )
                if not record.verification.ok:
                    return PipelineResult(work, steps, record.verification, failed_pass=step.name)
        final = None
        if self.verify_each and steps:
            final = steps[-1].verification
        return PipelineResult(work, steps, final)


def _specs(example: tuple[Any, ...]):
    from fxforge.inputs import specs_of

    return specs_of(example)


def _propagate_shapes(gm: fx.GraphModule, captured: Captured | None, example: tuple[Any, ...]) -> None:
    """Fill ``node.meta['tensor_meta']`` so passes can check ranks (e.g. Linear + BatchNorm1d)."""
    if not example:
        return
    from torch.fx.passes.shape_prop import ShapeProp

    from fxforge.capture import placeholder_values, quiet_torch_logs

    flat = placeholder_values(gm, example, captured.example_kwargs if captured else {})
    try:
        with torch.no_grad(), quiet_torch_logs():
            ShapeProp(gm).propagate(*flat)
    except Exception:  # shape facts are an optimisation: passes that need them skip with a reason instead
        return
