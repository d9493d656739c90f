"""What one rank of a job records, and the files it writes into the run dir.

Files (all in the plan's ``out_dir``; R is the rank):

- ``metrics.rank{R}.jsonl``: ``{"step": int, "rank": int, NAME: float, ...}`` per
  reported step. Floats keep their full repr (NaN and Infinity as Python's json
  writes them). Each line is one ``os.write``, so it is on disk (page cache) as
  soon as it is written: the engine tails it live.
- ``digests.rank{R}.jsonl``: ``{"step", "rank", "param", "digest", "norm", "max_abs"}``
  lines, same writing rule: a hash of one parameter's local gradient shard per step
  and rank, its norm and max abs as full-precision floats.

Every file is this rank's alone (nothing is appended to by two processes: O_APPEND
is not atomic across the clients of a shared filesystem). A line file is created
exclusively (O_EXCL): a second process claiming the same rank finds it taken and
writes ``NAME.rank{R}.{host}-{pid}.jsonl`` instead, which the reader reports as
two writers of one rank.
- ``order.rank{R}.jsonl``: the first few steps' unit order (adapters/order.py).
- ``graph.rank{R}.json``: ``{"nodes": [{"name", "kind", "order", "shard_size"}],
  "edges": [{"id", "phase", "src", "dst", "implicit"}]}``, written atomically.
- ``env.rank{R}.json``: the job's environment as this rank sees it (adapters/environment.py).
- ``probe.rank{R}.json``: ``{"rank", "plan_hash", "edges": {EDGE: {"fired",
  "issued", "noop", "masked", "guarded"}}, "steps": [{"step", "issued": [...],
  "noop": [...], "masked": [...], "guarded": [...]}], "step_seconds": [[step, s]], ...}``, rewritten
  atomically (temp file + rename) so a reader never sees half a file. A plan with a
  schedule of masks adds ``"schedule_followed": [[segment, first step], ...]`` (the
  segments this rank ran under, each with the step it held from) and, where the engine
  cannot switch masks inside a run, ``"schedule_refused": reason`` (adapters/__init__.py).

Probe outcomes of one prefetch attempt: ``issued`` (it started a real
unshard/all-gather), ``noop`` (target already unsharded or its all-gather
pending), ``masked`` (blocked by the mask), ``guarded`` (skipped by the
size-one guard). ``fired`` counts attempts: fired = issued + noop + masked +
guarded. Per-step lists name each edge once, in first-occurrence order.

API: ``Recorder(out_dir, rank)`` with ``metrics(step, values)``,
``digests(step, items)`` (or ``digest_columns(step, params, digests, norms, max_abs)``),
``graph(dict)``, ``environment(text)``, ``probe(head, tally)``, ``close()``;
``ProbeTally`` with ``count(edge_id, outcome)``, ``end_step(step)``,
``render(head) -> str``, ``to_json()``. Standard library only.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

from bisect_prefetch.vocab import (
    PROBE_OUTCOMES,
    RANK_FILE_SUFFIX,
    digests_rank_file,
    env_rank_file,
    graph_rank_file,
    metrics_rank_file,
    order_rank_file,
    probe_rank_file,
)

OUTCOMES = PROBE_OUTCOMES


def _to_json_number(value: Any) -> Any:
    """json default: 0-d tensors and numpy scalars become floats."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


class ProbeTally:
    """Counts prefetch outcomes per edge, in total and per step.

    A finished step's entry is serialized once, when the step ends, so that
    rewriting the probe file each step does not re-encode the whole history.
    """

    def __init__(self) -> None:
        self.edges: dict[str, dict[str, int]] = {}
        self.last_step: int | None = None
        self._finished_steps: list[str] = []  # JSON text of each finished step's entry
        self._reset_current()

    def _reset_current(self) -> None:
        self._current: dict[str, list[str]] = {outcome: [] for outcome in OUTCOMES}
        self._current_seen: dict[str, set[str]] = {outcome: set() for outcome in OUTCOMES}

    def count(self, edge_id: str, outcome: str) -> None:
        counts = self.edges.get(edge_id)
        if counts is None:
            counts = self.edges[edge_id] = dict.fromkeys(("fired", *OUTCOMES), 0)
        counts["fired"] += 1
        counts[outcome] += 1
        seen = self._current_seen[outcome]
        if edge_id not in seen:
            seen.add(edge_id)
            self._current[outcome].append(edge_id)

    def has_pending(self) -> bool:
        """Whether prefetches were counted since the last step end."""
        return any(self._current.values())

    def end_step(self, step: int) -> None:
        """Close the current step: what was counted since the last end belongs to ``step``."""
        self._finished_steps.append(json.dumps({"step": step, **self._current}))
        self.last_step = step
        self._reset_current()

    def render(self, head: dict[str, Any]) -> str:
        """The probe file's JSON text: ``head``'s fields, then "edges" and "steps"."""
        steps = list(self._finished_steps)
        if self.has_pending():
            # Prefetches after the last reported step (or in a job that never reports).
            step = (self.last_step or 0) + 1
            steps.append(json.dumps({"step": step, "partial": True, **self._current}))
        body = json.dumps({**head, "edges": self.edges}, default=_to_json_number)
        return f'{body[:-1]}, "steps": [{", ".join(steps)}]}}'

    def to_json(self) -> dict[str, Any]:
        return json.loads(self.render({}))


class Recorder:
    """Writes one rank's files into the run dir (see the module docstring)."""

    def __init__(self, out_dir: str, rank: int) -> None:
        self.out_dir = out_dir
        self.rank = rank
        self._fds: dict[str, int] = {}
        self._digest_template = ""  # a step's digest lines, %s where the values go
        self._digest_template_params: list[str] | None = None  # ... for these parameters
        os.makedirs(out_dir, exist_ok=True)

    def _append(self, filename: str, text: str) -> None:
        fd = self._fds.get(filename)
        if fd is None:
            fd = self._fds[filename] = _open_own(self.out_dir, filename)
        data = text.encode("utf-8")
        written = os.write(fd, data)
        while written < len(data):  # only on a full disk or a signal; best effort
            written += os.write(fd, data[written:])

    def _replace(self, filename: str, text: str) -> None:
        path = os.path.join(self.out_dir, filename)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)

    def metrics(self, step: int, values: dict[str, Any]) -> None:
        if "step" in values or "rank" in values:
            raise ValueError("'step' and 'rank' are reserved metric names")
        line = json.dumps({"step": step, "rank": self.rank, **values}, default=_to_json_number)
        self._append(metrics_rank_file(self.rank), line + "\n")

    def digests(self, step: int, items: list[tuple[str, str, float, float]]) -> None:
        """One write for all of a step's (param, digest, norm, max_abs) records."""
        if items:
            self.digest_columns(step, *(list(column) for column in zip(*items)))

    def digest_columns(
        self, step: int, params: list[str], digests: list[str], norms: list[float],
        max_abs: list[float],
    ) -> None:
        """digests(), given as columns: one formatting op and one write for the whole step."""
        if not params:
            return
        template = self._digest_template
        if self._digest_template_params != params:
            template = self._digest_template = "".join(
                f'{{"step": %s, "rank": {self.rank}, "param": '
                f'{json.dumps(param).replace("%", "%%")}, "digest": "%s", "norm": %s, '
                f'"max_abs": %s}}\n'
                for param in params
            )
            self._digest_template_params = list(params)
        # Full-precision float texts, all at once (NaN and Infinity as Python's json writes them).
        values: list[Any] = [step] * (4 * len(params))
        values[1::4] = digests
        values[2::4] = json.dumps(norms)[1:-1].split(", ")
        values[3::4] = json.dumps(max_abs)[1:-1].split(", ")
        self._append(digests_rank_file(self.rank), template % tuple(values))

    def order(self, line: str) -> None:
        """One finished step of the order record (adapters/order.py) into order.rank{R}.jsonl."""
        self._append(order_rank_file(self.rank), line)

    def graph(self, graph: dict[str, Any]) -> None:
        self._replace(graph_rank_file(self.rank), json.dumps(graph, indent=1))

    def environment(self, text: str) -> None:
        """env.rank{R}.json: the job's environment as this rank sees it (adapters/environment.py)."""
        self._replace(env_rank_file(self.rank), text)

    def probe(self, head: dict[str, Any], tally: ProbeTally) -> None:
        """probe.rank{R}.json: rank, ``head``'s fields (plan_hash, ...), the tally."""
        self._replace(probe_rank_file(self.rank), tally.render({"rank": self.rank, **head}))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


# Files this process created (by pid: a forked child owns none of them). Reopened after
# close() with O_APPEND; any other existing file belongs to another writer.
_CREATED: set[tuple[int, str]] = set()


def _open_own(out_dir: str, filename: str) -> int:
    """An append descriptor on a file only this process writes (see the module docstring)."""
    path = os.path.join(out_dir, filename)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
    if (os.getpid(), path) in _CREATED:
        return os.open(path, flags, 0o644)
    try:
        fd = os.open(path, flags | os.O_EXCL, 0o644)
    except FileExistsError:
        stem = filename[: -len(RANK_FILE_SUFFIX)] if filename.endswith(RANK_FILE_SUFFIX) else filename
        own = f"{stem}.{socket.gethostname()}-{os.getpid()}{RANK_FILE_SUFFIX}"
        sys.stderr.write(f"bisect-prefetch: {filename} already exists: another process claims this "
                         f"rank; writing {own} instead\n")
        path = os.path.join(out_dir, own)
        fd = os.open(path, flags, 0o644)
    _CREATED.add((os.getpid(), path))
    return fd
