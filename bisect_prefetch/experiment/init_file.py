"""What `init` writes: which arguments of a command set steps, seed and port, and the file.

`find_placeholders(argv)` finds the words that set the number of training
steps, the seed and the rendezvous port (`--steps 100`, `--steps=100`,
`--training.steps 100`, `--max_steps`, `trainer.max_steps=100`, `--seed`,
`--debug.seed`, `--master_port`/`--master-port`, `--rdzv-endpoint HOST:PORT`,
`MASTER_PORT=29500`) and puts `{steps}`, `{seed}` and `{port}` in their values;
torchrun's `--standalone` picks a free port itself. `render_experiment(...)`
is the commented YAML text of the experiment file (docs/contract.md, the
`command:` form). Pure: no I/O, no runs.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field

import yaml

from bisect_prefetch.vocab import (
    INTEGER,
    PORT,
    SEED,
    STEPS,
    Marked,
    Placeholders,
    escape_placeholders,
)

# The last dotted part of an argument's name, dashes read as underscores.
STEPS_KEYS = frozenset({"steps", "max_steps", "num_steps", "train_steps", "total_steps",
                        "training_steps", "num_train_steps", "max_iters", "train_iters",
                        "num_iterations", "max_iterations"})
SEED_KEYS = frozenset({"seed", "random_seed", "manual_seed", "rng_seed", "global_seed"})
PORT_KEYS = frozenset({"master_port", "main_process_port"})
ENDPOINT_KEYS = frozenset({"rdzv_endpoint"})  # HOST:PORT
# Programs (or `python -m` modules) that start several processes that meet at a port.
LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch", "msrun",
             "mindspore.parallel.cluster.run", "deepspeed", "accelerate")
PLACEHOLDER_MEANING = {
    STEPS: "the number of training steps of each run (steps: below; aa --steps)",
    SEED: "the seed (seed: below), the same in every run of a group",
    PORT: "a free rendezvous port for each run, so that runs can go at once (executor.slots)",
}
_NAME = re.compile(r"^-{0,2}([A-Za-z_][A-Za-z0-9_.\-]*)$")


def _key(name: str) -> str:
    return name.lstrip("-").lower().replace("-", "_").rsplit(".", 1)[-1]


def _kind(name: str) -> str | None:
    key = _key(name)
    if key in STEPS_KEYS:
        return STEPS
    if key in SEED_KEYS:
        return SEED
    if key in PORT_KEYS or key in ENDPOINT_KEYS:
        return PORT
    return None


def _launcher(word: str) -> str | None:
    base = word.rsplit("/", 1)[-1]
    return next((name for name in LAUNCHERS if base == name), None)


def find_placeholders(argv: Sequence[str]) -> Placeholders:
    """The command with placeholders in the values that set steps, seed and port.

    argv is what a shell would run: a `{steps}` already in it is the job's own text, kept
    literal (written `{{steps}}`); only the arguments found here get placeholders.
    """
    out = Placeholders(original=list(argv), argv=[escape_placeholders(w) for w in argv])
    i = 0
    while i < len(out.argv):
        word = out.argv[i]
        if out.launcher is None and (found := _launcher(word)):
            out.launcher = found
        if word == "--standalone":
            out.standalone = True
        if word.startswith("-") and "=" in word:  # --steps=100
            name, value = word.split("=", 1)
            _mark(out, i, name, value, prefix=name + "=")
        elif word.startswith("-"):  # --steps 100
            match = _NAME.match(word)
            if match and _kind(word) and i + 1 < len(out.argv):
                _mark(out, i + 1, word, out.argv[i + 1], prefix="")
                i += 1
        elif "=" in word:  # trainer.max_steps=100 (Hydra), MASTER_PORT=29500 (env)
            name, value = word.split("=", 1)
            if _NAME.match(name):
                _mark(out, i, name, value, prefix=name + "=")
        i += 1
    return out


def _mark(out: Placeholders, index: int, name: str, value: str, *, prefix: str) -> None:
    """Put the placeholder in argv[index] (prefix + value) when the value is what it should be."""
    if not _NAME.match(name):
        return
    kind = _kind(name)
    if kind is None:
        return
    placeholder = f"{{{kind}}}"
    if _key(name) in ENDPOINT_KEYS:
        host, colon, port = value.rpartition(":")
        if colon and INTEGER.match(port):
            out.argv[index] = f"{prefix}{host}:{placeholder}"
            out.marked.append(Marked(kind, name, value, index))
        else:
            out.notes.append(f"{name} {value}: no :PORT at its end, left as it is")
        return
    if not INTEGER.match(value) or (kind == STEPS and int(value) < 1):
        out.notes.append(f"{name} {value}: not a {'positive ' if kind == STEPS else ''}whole "
                         f"number, left as it is")
        return
    out.argv[index] = f"{prefix}{placeholder}"
    out.marked.append(Marked(kind, name, value, index))


# -- the experiment file -----------------------------------------------------------------
COMMENT_COLUMN = 33  # where a key's comment starts, as in the README's example


def _scalar(value: object) -> str:
    """A YAML scalar, quoted where YAML needs it ({steps} would be a mapping unquoted)."""
    # Line breaks YAML folds (U+0085, U+2028, U+2029) and control characters are written
    # escaped (\\u2028): raw, a quoted scalar would read back as a space.
    plain = not isinstance(value, str) or value.isprintable()
    text = yaml.safe_dump([value], default_flow_style=True, allow_unicode=plain,
                          width=1 << 30).strip()
    return text[1:-1]  # [x] -> x


def _flow_list(values: Sequence[str]) -> str:
    return "[" + ", ".join(_scalar(v) for v in values) + "]"


def _line(text: str, comment: str = "") -> str:
    if not comment:
        return text
    comment = _one_line(comment)
    return f"{text.ljust(COMMENT_COLUMN - 1)} # {comment}" if len(text) < COMMENT_COLUMN - 1 \
        else f"{text}  # {comment}"


def _one_line(text: str) -> str:
    """Text for a comment: one line (YAML also breaks lines at U+0085, U+2028, U+2029, all
    whitespace to str.split), no control or format character (a right-to-left override),
    escaped as Python writes them."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in " ".join(text.split()))


@dataclass
class MetricsChoice:
    """What init found about the job's metric lines (metrics/detect.py's reading, in words)."""

    format: str
    names: list[str]
    files: str | None = None  # metrics.files; None: the default (stdout, or metrics.jsonl)
    found_in: str = ""  # where init read them ("the job's stdout", "LOG")
    sample: str = ""  # one metric line as printed
    left_out: list[str] = field(default_factory=list)  # names not compared (timing, memory)
    todo: str = ""  # what the user should check, if anything


def render_experiment(
    *,
    name: str,
    placeholders: Placeholders,
    metrics: MetricsChoice,
    steps: int,
    seed: int,
    graph_note: str = "",
    timeout_s: float = 600,
    job_steps: int | None = None,
) -> str:
    """The commented experiment file for a user's command.

    job_steps: the steps the command trained by itself when it has no steps argument.
    """
    p = placeholders
    lines = [
        "# bisect-prefetch experiment, written by `bisect-prefetch init` for:",
        f"#   {_one_line(' '.join(p.original))}",
        "# Every key: docs/contract.md, \"Experiment file\". Edit freely; run aa and bisect from",
        "# the directory init ran in (the command's relative paths start there).",
        _line(f"name: {_scalar(name)}", f"state directory .bisect-prefetch/{name}/"),
        "# Your command, an argument list (no shell). In every run the tool replaces:",
    ]
    lines += [f"#   {{{kind}}}".ljust(13) + meaning for kind, meaning in PLACEHOLDER_MEANING.items()]
    lines.append("#   ({{steps}} is a literal {steps}, and so on)")
    for todo in _todos(p):
        lines += _todo_lines(todo)
    lines.append("command:")
    by_index = {m.index: m for m in p.marked if m.value}
    for i, word in enumerate(p.argv):
        comment = ""
        if i in by_index:
            comment = f"was {by_index[i].value}"
        elif word == "--standalone":
            comment = "torchrun picks a free port itself: no {port} needed"
        lines.append(_line(f"  - {_scalar(word)}", comment))
    lines.append(_line("# env: {NAME: value}", "more environment for every run (the tool's own "
                                               "is passed on)"))
    lines += _metrics_lines(metrics)
    lines.append(_line("graph: {source: runtime}",
                       graph_note or "learned by one short run of your job under the adapter"))
    steps_mark, seed_mark = p.found(STEPS), p.found(SEED)
    lines.append(_line(f"steps: {steps}",
                       f"training steps of each run (your command had {steps_mark.flag} "
                       f"{steps_mark.value})" if steps_mark and steps_mark.value else
                       "training steps of each run" if steps_mark else
                       f"your command trains {job_steps} (TODO above)" if job_steps else
                       "TODO: the steps your command trains (no steps argument found)"))
    lines.append(_line(f"seed: {seed}",
                       f"your command had {seed_mark.flag} {seed_mark.value}"
                       if seed_mark and seed_mark.value else
                       "given to {seed}" if seed_mark else
                       "unused: no seed argument found; your job's own seed is the same every run"))
    lines.append(_line(f"timeout_s: {timeout_s:g}", "a run that takes longer is stopped and "
                                                    "counts as failed"))
    lines.append(_line("guard: none", "or size-one: skip prefetches into shard-size-1 units"))
    lines.append(_line("executor: {kind: local, slots: 1}",
                       "slots: 2 runs two at once" + (" (needs {port})" if p.needs_port() else "")))
    text = "\n".join(lines) + "\n"
    metrics_back = {"format": metrics.format, "names": list(metrics.names),
                    **({"files": metrics.files} if metrics.files else {})}
    _check_read_back(text, {"name": name, "command": list(p.argv), "metrics": metrics_back,
                            "graph": {"source": "runtime"}, "steps": steps, "seed": seed,
                            "timeout_s": timeout_s, "guard": "none",
                            "executor": {"kind": "local", "slots": 1}})
    return text


def _check_read_back(text: str, expected: dict) -> None:
    """ValueError unless YAML reads text back as exactly these values: text from the
    command or the job (a line break in a comment, a crafted key) must not change the file."""
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"not YAML ({_one_line(str(exc))[:200]})") from None
    if not isinstance(loaded, dict):
        raise ValueError("not a mapping")
    for key in sorted(set(loaded) | set(expected), key=str):
        if loaded.get(key) != expected.get(key):
            raise ValueError(f"{key!s} reads back as {loaded.get(key)!r}, not {expected.get(key)!r}")


def _todo_lines(text: str) -> list[str]:
    return textwrap.wrap(_one_line(text), width=96, initial_indent="# TODO: ", subsequent_indent="#   ",
                         break_on_hyphens=False, break_long_words=False)


def _todos(p: Placeholders) -> list[str]:
    todos = []
    if p.found(STEPS) is None:
        todos.append("no argument that sets the number of training steps was found: write "
                     "\"{steps}\" as its value below, and set steps: to match until then")
    if p.needs_port():
        todos.append(f"{p.launcher} starts several processes that meet at a port, and no port "
                     "argument was found: give it one with \"{port}\" (e.g. --master_port "
                     "\"{port}\") before running two runs at once")
    todos += [f"{note} (mark it by hand if it should change per run)" for note in p.notes]
    return todos


def _metrics_lines(m: MetricsChoice) -> list[str]:
    lines = [_one_line(f"# Metric lines found in {m.found_in}, format {m.format}"
                       + (f", e.g.: {_one_line(m.sample)[:120]}" if m.sample else ""))]
    if m.left_out:
        lines.append(_one_line("# Not compared (they differ run to run by nature): "
                               + ", ".join(m.left_out)))
    if m.todo:
        lines += _todo_lines(m.todo)
    lines.append("metrics:")
    lines.append(_line(f"  format: {m.format}",
                       "jsonl | mindformers | torchtitan | megatron | regex"))
    lines.append(_line(f"  names: {_flow_list(m.names)}", "compared in every run, every step"))
    if m.files:
        lines.append(_line(f"  files: {_scalar(m.files)}", "a glob under each run's directory"))
    return lines
