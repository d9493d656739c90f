"""The bisection's verdicts, the verdict words of a group and of a single run (consistent,
diverged, clean), the protocol's stages and the file names of a state dir and a run dir
are spelled once, in vocab.py.

Everywhere else in the package they are named by vocab's constants and functions: a
string literal equal to one of them fails here, and so does an f-string that spells a
rank's file (``f"probe.rank{rank}.json"``). A word is matched as a whole literal, so
prose that holds it ("-> consistent (3 runs, ...)") is not; a JSON field that counts runs
by a verdict word (``{"diverged": 2}``, ``data.get("diverged")``) is a field's name, not the
verdict. A few literals mean something else that is spelled the same (listed, with what
they mean).
"""

from __future__ import annotations

import ast
from pathlib import Path

from bisect_prefetch import vocab

PACKAGE = Path(vocab.__file__).parent
# An A/A group's verdicts and a single run's word (vocab.py says which is which).
VERDICT_WORDS = {vocab.CONSISTENT, vocab.DIVERGED, vocab.CLEAN}
WORDS = set(vocab.VERDICTS) | set(vocab.STAGES) | VERDICT_WORDS
# (file under the package, literal): what the literal means there instead.
ELSEWHERE = {
    ("commands/bisect_setup.py", "search"): "the bisect command's run purpose in the journal",
    ("drivers/oracle.py", "search"): "the real oracle's default run purpose",
    ("experiment/model.py", "search"): "the experiment file's search: key",
    ("report/run_view.py", "search"): "the bisect command's run purpose in the journal",
    ("simulation/search_run.py", "search"): "simulate's method: the tool's own search, not a baseline",
    ("simulation/trials.py", "search"): "simulate's method: the tool's own search, not a baseline",
    ("commands/bisect_verdict_words.py", "diverged"): "the evidence table's column: how many runs diverged",
}


# Every file name vocab spells: its constants (LOCK_FILE, "lock", is a word too common to
# police), and each rank's file as the glob of every rank's.
RANK_FILES = (vocab.digests_rank_file, vocab.metrics_rank_file, vocab.op_trace_file,
              vocab.env_rank_file, vocab.graph_rank_file, vocab.probe_rank_file,
              vocab.order_rank_file)
FILE_NAMES = ({value for name, value in vars(vocab).items()
               if name.endswith(("_FILE", "_FILES")) and isinstance(value, str)} - {vocab.LOCK_FILE}
              | {spell("*") for spell in RANK_FILES} | {vocab.manifest_process_file("*", "*")})


def _literal_nodes(tree: ast.AST) -> list[ast.Constant]:
    """Every string literal but docstrings and the text of f-strings."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    in_fstrings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)
                   for part in node.values}
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings and id(node) not in in_fstrings]


def _literals(path: Path) -> list[tuple[int, str]]:
    return [(node.lineno, node.value) for node in _literal_nodes(ast.parse(path.read_text()))]


def _field_names(tree: ast.AST) -> set[int]:
    """The ids of literals that name a field: a dict display's keys, a subscript's key,
    `.get`'s first argument (`{"diverged": 2}`, `row["diverged"]`, `data.get("diverged")`)."""
    fields: list[ast.AST | None] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            fields += node.keys
        elif isinstance(node, ast.Subscript):
            fields.append(node.slice)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "get" and node.args):
            fields.append(node.args[0])
    return {id(field) for field in fields if isinstance(field, ast.Constant)}


def _words(path: Path) -> list[tuple[int, str]]:
    """The literals the words check looks at: a verdict word naming a field is left out."""
    tree = ast.parse(path.read_text())
    fields = _field_names(tree)
    return [(node.lineno, node.value) for node in _literal_nodes(tree)
            if not (node.value in VERDICT_WORDS and id(node) in fields)]


def _fstrings(path: Path) -> list[tuple[int, str]]:
    """Each f-string with `*` for what it fills in: f"probe.rank{r}.json" -> "probe.rank*.json"."""
    return [(node.lineno, "".join(part.value if isinstance(part, ast.Constant) else "*"
                                  for part in node.values))
            for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.JoinedStr)]


def test_verdicts_and_stages_appear_only_in_vocab():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name == "vocab.py":
            continue
        found += [f"{name}:{line}: {text!r}" for line, text in _words(path)
                  if text in WORDS and (name, text) not in ELSEWHERE]
    assert found == []


def test_file_names_appear_only_in_vocab():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name == "vocab.py":
            continue
        found += [f"{name}:{line}: {text!r}" for line, text in _literals(path) + _fstrings(path)
                  if text in FILE_NAMES]
    assert found == []


def test_the_file_check_sees_a_rank_file_spelled_by_hand(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text('def f(rank):\n    return f"probe.rank{rank}.json", "plan.json"\n')
    assert [text for _, text in _fstrings(path) + _literals(path)
            if text in FILE_NAMES] == ["probe.rank*.json", "plan.json"]


def test_the_check_tells_a_verdict_from_a_field_named_by_it(tmp_path):
    path = tmp_path / "cell.py"
    path.write_text('def f(cell):\n    return {"diverged": 2}, cell.get("diverged") == "diverged"\n')
    assert len(_literals(path)) == 3 and _words(path) == [(2, "diverged")]


def test_the_check_sees_a_literal():
    tree_text = 'EXIT = {"culprit-found": 1}\n'
    path = Path(__file__).with_name("_words_probe.py")
    try:
        path.write_text(tree_text)
        assert [text for _, text in _literals(path)] == ["culprit-found"]
    finally:
        path.unlink()
