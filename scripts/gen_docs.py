"""Regenerate docs/passes.md and docs/rules.md from the pass and lint-rule registries.

Run: .venv/bin/python scripts/gen_docs.py  (tests/test_docs.py fails when the files are stale).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


def passes_markdown() -> str:
    from fxforge.passes import FIX_ORDER, all_passes

    lines = [
        "# Passes",
        "",
        "Generated from the pass registry by `scripts/gen_docs.py`; `fxforge passes` prints the same, and the",
        "passes of installed plug-ins besides ([plug-ins](plugins.md)).",
        "Every pass works on a copy of the graph unless called with `inplace=True`, records what it",
        "changed (and what it left alone, with the reason) in its `PassResult`, and keeps node provenance",
        "so that `fxforge verify` can name the pass behind a divergence. Run them with",
        "`fxforge optimize MODEL -p NAME[,NAME...] --verify -o OUT`, a pipeline file, or",
        "`fxforge.apply_pass(gm, NAME, options)`. `-p exact` (and `optimize` without `-p`) runs the exact passes, in",
        f"this order (`optimize --auto` runs the same list): {', '.join(f'`{n}`' for n in FIX_ORDER)}. `lint --fix`",
        "runs, in the same order, only the passes its findings name. A module that runs hooks (a forward hook, or",
        "a forward pre-hook: pruning, the old `weight_norm` and `spectral_norm`) computes more than its type says:",
        "the built-in passes leave it as it is (and, for a hooked container such as a model's `layer4`, what is",
        "inside it: capture keeps such a module as one call, so that its hooks run).",
        "",
        "| pass | dialects | what it does |",
        "|---|---|---|",
    ]
    specs = [spec for spec in all_passes() if spec.origin == "fxforge"]  # not the installed plug-ins'
    for spec in specs:
        lines.append(f"| [`{spec.name}`](#{spec.name}) | {', '.join(spec.dialects)} | {spec.summary} |")
    for spec in specs:
        lines += ["", f"## {spec.name}", "", spec.summary, "", f"**Guarantees.** {spec.guarantees}", ""]
        lines.append(f"**Dialects:** {', '.join(spec.dialects)}.")
        fields = spec.option_fields()
        if fields:
            lines += _options_doc(spec.options)
            lines += ["", "| option | type | default |", "|---|---|---|"]
            for field in fields:
                default = field.default if field.default is not dataclasses.MISSING else "required"
                if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                    default = repr(field.default_factory())  # type: ignore[misc]
                type_name = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", field.type)
                cells = [field.name, str(type_name), str(default)]
                lines.append("| " + " | ".join(f"`{_cell(c)}`" for c in cells) + " |")
        else:
            lines += ["", "No options."]
    lines += [
        "",
        "## Writing your own",
        "",
        "```python",
        "from fxforge.passes import PassResult, mark, register_pass",
        "",
        '@register_pass("my_pass", summary="...", guarantees="...", dialects=("torch",))',
        "def my_pass(gm, options) -> PassResult:",
        '    result = PassResult("my_pass", gm)',
        "    ...  # rewrite gm.graph; result.note('what changed'); result.skip('why not')",
        "    # mark(new_node, 'my_pass', origin_of=old_node) for each node you add in place of another",
        "    return result",
        "```",
        "",
        "`mark` records which pass made a node and which node's value it now computes (provenance): without it a",
        "wrong rewrite is still caught by `--verify`, but `verify` cannot name your pass's node as the first to",
        "diverge.",
        "",
        "Run it with `fxforge optimize MODEL -p my_passes.py:my_pass`, or ship it in a package: see",
        "[plugins.md](plugins.md) for the contract and an example plug-in.",
        "",
    ]
    return "\n".join(lines)


def _cell(text: str) -> str:
    # A bare "|" ends a markdown table cell, even inside backticks (e.g. the type "float | None").
    return text.replace("|", "\\|")


def _options_doc(options: type) -> list[str]:
    """The options dataclass's own docstring, when it has one (dataclasses invent "Name(field: type, ...)")."""
    import inspect

    doc = inspect.getdoc(options) or ""
    if not doc or doc.startswith(f"{options.__name__}("):
        return []
    return ["", doc]


def rules_markdown() -> str:
    from fxforge.lint import all_rules

    lines = [
        "# Lint rules",
        "",
        "Generated from the rule registry by `scripts/gen_docs.py`; `fxforge lint --rules` prints the same, and the",
        "rules of installed plug-ins besides ([plug-ins](plugins.md)).",
        "Select or skip rules by code or name with `--select` / `--ignore`. `fxforge lint` exits 1 when a",
        "finding at or above `--fail-on` (default `warning`) exists. `fxforge lint --fix -o OUT` runs the",
        "passes named in the fix column (verified) and reports what remains.",
        "",
        "| code | name | severity | dialects | fix | finds |",
        "|---|---|---|---|---|---|",
    ]
    for rule in [r for r in all_rules() if r.origin == "fxforge"]:  # not the installed plug-ins'
        fix = f"`{rule.fix}`" if rule.fix else ""
        lines.append(
            f"| {rule.code} | `{rule.name}` | {rule.severity} | {', '.join(rule.dialects)} | {fix} | {rule.summary} |"
        )
    lines += [
        "",
        "Add your own with `@rule` (`from fxforge.lint import rule`) in a file",
        "(`fxforge lint MODEL --rule my_rules.py:check`) or a package: see [plugins.md](plugins.md).",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    (DOCS / "passes.md").write_text(passes_markdown())
    (DOCS / "rules.md").write_text(rules_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
