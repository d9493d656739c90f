"""The import rules of docs/ARCHITECTURE.md, checked on the source (every import, lazy ones too)."""

from __future__ import annotations

import ast
import re
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


# -- the table of docs/ARCHITECTURE.md: every row's "may import" column ----------------------
TABLE = ROOT.parent / "docs" / "ARCHITECTURE.md"


def _names(text: str) -> list[str]:
    """The parts named in backticks: `cli.py` -> cli, `commands/` -> commands,
    `workloads/mindformers.py` -> workloads.mindformers."""
    return [n.removesuffix(".py").strip("/").replace("/", ".") for n in re.findall(r"`([^`]+)`", text)]


def parse_rule(column: str) -> tuple[str, list[str], dict[str, list[str]]]:
    """A "may import" column as ("only", parts, extras) or ("but", parts, {}).

    "anything but A and B": all but those; "nothing", "only A and B", "A, B, never C":
    only those (and the part itself); "(`m`: `x`, `y`)": module m may import x, y too.
    """
    extras = {}
    for inner in re.findall(r"\(([^)]*)\)", column):
        names = _names(inner)
        if ":" in inner and names:
            extras[names[0]] = names[1:]
    plain = re.sub(r"\([^)]*\)", "", column)
    if plain.strip().startswith("anything but"):
        return "but", _names(plain), {}
    return "only", _names(plain.split("never")[0]), extras


def _rows() -> list[tuple[list[str], str]]:
    rows = []
    for line in TABLE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows.append((_names(cells[0]), cells[2]))
    return rows


ROWS = _rows()


def test_the_table_is_read():
    assert parse_rule("anything but `commands/`, `report/`, `cli`") == ("but", ["commands", "report", "cli"], {})
    assert parse_rule("nothing (`files`: `errors`)") == ("only", [], {"files": ["errors"]})
    assert parse_rule("`adapters/`, `vocab`, `errors`, never `runs/`") == ("only", ["adapters", "vocab", "errors"], {})
    assert {"cli", "commands", "runs", "search", "adapters", "vocab"} <= {p for parts, _ in ROWS for p in parts}


def test_every_module_belongs_to_exactly_one_row():
    rows_of = {m: [names for names, _ in ROWS if any(_in(p, m) for p in names)]
               for m in MODULES if m != PACKAGE}
    assert sorted(m for m, rows in rows_of.items() if len(rows) != 1) == []


# -- rooms: a row is a room, a package or loose modules of the package root ---------------
LOOSE_MODULES_MAX = 6


def _room(module: str) -> str:
    """The room a module is in: its package under the root, or the loose module itself."""
    return module.split(".")[1] if module != PACKAGE else PACKAGE


def test_a_row_names_rooms():
    """A part a row names is a package of the root or a loose module of it, not a piece of a room."""
    loose = {p.stem for p in ROOT.glob("*.py") if p.name != "__init__.py"}
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert sorted(p for names, _ in ROWS for p in names if p not in loose | packages) == []


def test_the_root_holds_at_most_six_loose_modules():
    loose = sorted(p.stem for p in ROOT.glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= LOOSE_MODULES_MAX, loose


def test_there_is_no_circle_between_rooms():
    rooms: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        rooms.setdefault(_room(module), set()).update(
            _room(t) for t in targets if _room(t) != _room(module))
    assert find_circle(rooms) is None


def _breaking(parts, bad) -> list[str]:
    return sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items() if any(_in(p, module) for p in parts)
        for target in targets if bad(module, target)
    )


@pytest.mark.parametrize("parts, column", ROWS, ids=[",".join(parts) for parts, _ in ROWS])
def test_a_part_imports_only_what_its_row_allows(parts, column):
    kind, named, extras = parse_rule(column)

    def own(module: str) -> str:
        return next(p for p in parts if _in(p, module))

    def bad(module: str, target: str) -> bool:
        if _in(own(module), target):
            return False  # a part's modules use each other
        if kind == "but":
            return any(_in(n, target) for n in named)
        allowed = named + next((x for m, x in extras.items() if _in(m, module)), [])
        return not any(_in(a, target) for a in allowed)

    assert _breaking(parts, bad) == []


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
