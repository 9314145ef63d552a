#!/usr/bin/env bash
# Runs ruff, the import-layer contracts and the test suite inside .venv (created by scripts/install.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check src tests benchmarks
.venv/bin/ruff format --check src tests benchmarks scripts  # one formatting, so diffs show changes, not style
.venv/bin/lint-imports  # the layering contracts in pyproject.toml (docs/architecture.md)
.venv/bin/python -m pytest -n 2 -q "$@"
