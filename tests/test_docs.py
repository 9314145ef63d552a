"""The docs stay true: generated catalogs match the registries, and CI runs the README's commands."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pass_catalog_is_current():
    assert (ROOT / "docs" / "passes.md").read_text() == _gen_docs().passes_markdown(), (
        "docs/passes.md is stale: run .venv/bin/python scripts/gen_docs.py"
    )


def test_rule_catalog_is_current():
    assert (ROOT / "docs" / "rules.md").read_text() == _gen_docs().rules_markdown(), (
        "docs/rules.md is stale: run .venv/bin/python scripts/gen_docs.py"
    )


def test_readme_states_the_two_commands_ci_runs():
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set up", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.strip() for line in setup.strip().splitlines() if line.strip()]
    assert commands == ["bash scripts/install.sh", "bash scripts/test.sh"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert [line for line in ci.splitlines() if line.startswith("bash ")] == commands


def test_every_cli_command_has_a_page():
    from fxforge.cli import cli

    pages = {p.stem for p in (ROOT / "docs" / "commands").glob("*.md")}
    for name in cli.commands:
        assert name in pages or name == "passes", f"docs/commands/{name}.md is missing"
    index = (ROOT / "docs" / "commands" / "index.md").read_text()
    for name in cli.commands:
        assert re.search(rf"`fxforge {name}\b", index), f"{name} missing from docs/commands/index.md"
