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
# The browser tests (tests/visual) drive the system Chromium with Playwright (whose own browser download needs a
# network we do not assume): install it with the OS package manager when it is missing and we may.
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO=none; fi
    if [ "$SUDO" != none ]; then
        echo "installing Chromium for the browser tests: $SUDO apt-get install -y chromium"
        $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
    else
        echo "note: /usr/bin/chromium is missing and apt-get needs root: the browser tests will fail under CI"
    fi
fi
.venv/bin/fxforge --version
