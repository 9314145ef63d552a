"""The layering of docs/architecture.md: no import cycles (function-level imports included), a fast --help."""

from __future__ import annotations

import subprocess
import sys

import grimp


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module; an import of one's own ancestor package
    (a registry package importing its plug-ins) is not a layering edge."""
    modules = sorted(graph.modules)
    edges = {m: {t for t in graph.find_modules_directly_imported_by(m) if not m.startswith(t + ".")} for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in edges[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in modules:
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_among_fxforge_modules():
    graph = grimp.build_graph("fxforge", include_external_packages=False)
    assert len(graph.modules) > 50  # the whole package was read
    assert _cycles(graph) == []


def test_help_imports_no_torch():
    code = "import sys; from fxforge.cli import main; main(['--help']); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip().endswith("False"), result.stdout[-300:]


def test_import_fxforge_is_lazy_but_complete():
    code = (
        "import sys, fxforge; lazy = 'torch' not in sys.modules; "
        "missing = [n for n in fxforge.__all__ if not hasattr(fxforge, n)]; print(lazy, missing)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "True []", result.stdout + result.stderr[-500:]


def test_every_command_has_its_public_function():
    """profile, debug, doctor, lint --fix and the listings (passes, lint --rules, bench --list-backends) were
    reachable only through submodules `import fxforge` does not export (QA finding: the CLI is a thin layer over
    the public API, so each command's work is a public name)."""
    import fxforge

    for name in ("profile_model", "debug_model", "doctor", "fix", "all_passes", "all_rules", "all_backends"):
        assert name in fxforge.__all__ and callable(getattr(fxforge, name)), name
    import fxforge.doctor  # importing the submodule must not replace the function of its name

    assert callable(fxforge.doctor) and {spec.name for spec in fxforge.all_passes()} >= {"fold_bn", "dead_code"}
