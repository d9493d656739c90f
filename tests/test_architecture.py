"""The import rules of docs/ARCHITECTURE.md, checked on the source (every import, lazy ones too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "bisect_prefetch"
PACKAGE = "bisect_prefetch"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in ROOT.rglob("*.py") if "site" not in p.parts}


def _imports(name: str) -> set[str]:
    """The package's modules that module `name` imports, anywhere in its body."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            # `from pkg import sub` imports the module pkg.sub; `from mod import name`, mod.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]  # `import a.b.c` of a name in a.b
            if target.startswith(PACKAGE) and target not in (name, PACKAGE):
                found.add(target)
    return found


GRAPH = {name: _imports(name) for name in MODULES}


def _in(part: str, module: str) -> bool:
    """Whether module is the part (a module or a package of modules), e.g. "runs"."""
    full = f"{PACKAGE}.{part}"
    return module == full or module.startswith(full + ".")


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (a path that comes back to its start), or None."""
    state: dict[str, str] = {}  # module -> "open" while on the path, "done" after

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (circle := visit(target, [*path, target])):
                return circle
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (circle := visit(module, [module])):
            return circle
    return None


def test_there_is_no_import_circle():
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # it can see one
    assert find_circle(GRAPH) is None


# (what, may import only these) and (what, may not import these), as in docs/ARCHITECTURE.md
ONLY = [
    (("cli",), ("commands", "errors", "vocab")),
    (("search",), ("search", "graph", "select", "vocab", "errors")),
    (("metrics",), ("metrics", "vocab", "errors", "files")),
    (("adapters",), ("adapters", "vocab")),
    (("vocab", "errors", "files"), ("errors",)),
]
NEVER = [
    (("graph", "select", "experiment"), ("runs", "commands", "report", "cli")),
    (("runs",), ("commands", "report", "cli")),
    (("report",), ("commands", "cli")),
    (("commands",), ("cli",)),
]


def _breaking(parts, bad) -> list[str]:
    return sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items() if any(_in(p, module) for p in parts)
        for target in targets if bad(target)
    )


@pytest.mark.parametrize("parts, allowed", ONLY)
def test_a_part_imports_only_what_it_may(parts, allowed):
    assert _breaking(parts, lambda target: not any(_in(a, target) for a in allowed)) == []


@pytest.mark.parametrize("parts, forbidden", NEVER)
def test_a_part_never_imports_what_it_may_not(parts, forbidden):
    assert _breaking(parts, lambda target: any(_in(f, target) for f in forbidden)) == []


def test_only_the_cli_drives_commands():
    users = {module for module, targets in GRAPH.items()
             if any(_in("commands", t) for t in targets) and not _in("commands", module)}
    assert users == {f"{PACKAGE}.cli"}


def test_the_checker_sees_imports():
    """The rules above can fail: known imports are found, lazy and relative ones too."""
    assert f"{PACKAGE}.runs.state" in GRAPH[f"{PACKAGE}.commands.aa"]
    assert f"{PACKAGE}.commands.bisect" in GRAPH[f"{PACKAGE}.cli"]  # imported inside a function
    assert f"{PACKAGE}.graph" in GRAPH[f"{PACKAGE}.commands.graph"]  # from bisect_prefetch import graph
    assert f"{PACKAGE}.adapters.units" in GRAPH[f"{PACKAGE}.adapters.fsdp2"]
