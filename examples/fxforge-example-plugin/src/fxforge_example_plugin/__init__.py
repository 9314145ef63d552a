"""An example fxforge plug-in: a pass, the lint rule that shares its detection, and a bench backend."""
