"""``python -m fxforge`` runs the CLI (with the console script's Ctrl-C handling)."""

from fxforge.cli import run

run()
