"""The bisection's verdicts and the protocol's stages are spelled once, in vocab.py.

Everywhere else in the package they are named by vocab's constants: a string
literal equal to one of them fails here. A few literals mean something else
that is spelled the same (listed, with what they mean).
"""

from __future__ import annotations

import ast
from pathlib import Path

from bisect_prefetch import vocab

PACKAGE = Path(vocab.__file__).parent
WORDS = set(vocab.VERDICTS) | set(vocab.STAGES)
# (file under the package, literal): what the literal means there instead.
ELSEWHERE = {
    ("commands/bisect.py", "search"): "the bisect command's run purpose in the journal",
    ("runs/oracle.py", "search"): "the real oracle's default run purpose",
    ("experiment_model.py", "search"): "the experiment file's search: key",
    ("report/html.py", "search"): "the bisect command's run purpose in the journal",
    ("search/simulate.py", "search"): "simulate's method: the tool's own search, not a baseline",
}


def _literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


def test_verdicts_and_stages_appear_only_in_vocab():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name == "vocab.py":
            continue
        found += [f"{name}:{line}: {text!r}" for line, text in _literals(path)
                  if text in WORDS and (name, text) not in ELSEWHERE]
    assert found == []


def test_the_check_sees_a_literal():
    tree_text = 'EXIT = {"culprit-found": 1}\n'
    path = Path(__file__).with_name("_words_probe.py")
    try:
        path.write_text(tree_text)
        assert [text for _, text in _literals(path)] == ["culprit-found"]
    finally:
        path.unlink()
