#!/usr/bin/env bash
# Creates .venv and installs fxforge with every extra, pinned by constraints.txt.
# pip (not uv/poetry) so that the pinned torch wheels are taken from the local wheel cache when present.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
"$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -c constraints.txt -e ".[all]"
# the example plug-in (docs/plugins.md): tests check that installed plug-ins reach every command
.venv/bin/python -m pip install --quiet --no-deps --no-build-isolation -e examples/fxforge-example-plugin
.venv/bin/fxforge --version
