"""One module per ``fxforge`` command; each defines ``command``, a click command calling the public API."""
