"""``python -m fxforge`` runs the CLI."""

import sys

from fxforge.cli import main

sys.exit(main())
