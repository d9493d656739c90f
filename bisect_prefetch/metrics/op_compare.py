"""Two runs' op traces side by side: per rank, the first op whose fingerprint differs, and why.

The traces are the ``optrace.rank{R}.jsonl`` files the in-job tracer writes
(adapters/op_trace.py says what one line holds). Ops are aligned per rank by identity: the
n-th op of a step in one run is the n-th of the other, and it must be the same op (name;
its occurrence then follows). Per rank, the first aligned op where any input or output
fingerprint differs is classified:

- ``origin``: every input matched and an output differed: this op computed differently
  (an unseeded generator, a nondeterministic kernel);
- ``receiver``: a collective whose local inputs matched returned something else, or an
  input differed that a collective wrote: the difference came from another rank;
- ``changed-behind``: an input differed from the fingerprint the traced op that wrote it
  left (in either run), while that op's output matched: the buffer was written outside
  the traced ops (a prefetch race, a copy the dispatcher never saw). An unsharded
  parameter is written by FSDP's copy-out, so this is also a parameter that differed at
  its use from its fingerprint after the unshard. A prefetch's window (op
  ``prefetch-window``: its target's parameter shards at the prefetch's issue and at the
  target's use) whose shards matched at the issue and differed at the use is one too:
  a parameter changed behind the ops while the prefetch was in flight;
- ``untraced-input``: an input differed that no traced op wrote (written before the
  traced window, or by code outside torch's dispatcher).

Where no rank has an origin or changed-behind and the earliest divergence is a collective
whose inputs matched (untraced inputs elsewhere only later), no rank computed a difference
before it: what the ranks sent matched, so its buffer changed behind the traced ops (read
before the collective completed: a race) and it is said as changed-behind, with the op
that read it. That is said only where every rank's two traces were compared up to it.

"First" is exact within a rank only. Across ranks the finding is the earliest origin,
changed-behind or untraced-input by (step, position in the step); receivers only when
no rank has another kind. Where the two runs ran different ops before any fingerprint
differed (a data-dependent branch), alignment broke: that place is the finding.

Only ops both runs traced on a rank are compared. A run the orchestrator stopped at its
first differing step has every op of that step up to its update; a trace that ends before
that (cut short: the job killed mid-step, a write that failed) or a rank whose trace is
missing in one run is said with its counts (``coverage``), never taken for agreement.

The edge (``edge_of``): the first differing op is tied to a prefetch edge when it ran
inside that prefetch (issued by it, or its copy-out at the target's use), when it is that
prefetch's window, or when an input that differed was filled by an op of that prefetch.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.vocab import op_trace_file

TRACE_GLOB = op_trace_file("*")
ORIGIN, RECEIVER, CHANGED_BEHIND, UNTRACED_INPUT = (
    "origin", "receiver", "changed-behind", "untraced-input")
ALIGNMENT = "alignment"
KINDS = (ORIGIN, RECEIVER, CHANGED_BEHIND, UNTRACED_INPUT, ALIGNMENT)
_LOCAL_KINDS = (ORIGIN, CHANGED_BEHIND, UNTRACED_INPUT)  # said before receivers
COLLECTIVE_PREFIXES = ("c10d.", "_c10d_functional.", "c10d_functional.")
WINDOW_OP = "prefetch-window"  # adapters/op_trace.py's record of a prefetch's window
# How an op is tied to an edge (adapters/trace_scope.py's words, and a reader's)
ISSUED, COPY_OUT, WINDOW, READ = "issued", "copy-out", "window", "read"
# Verdicts of a comparison
EXPLAINED = "explained"  # an op differed first somewhere
ALIGNMENT_BROKEN = "alignment-broken"  # the runs ran different ops before any differed
NO_OP_DIFFERS = "no-op-differs"  # every op both runs traced agrees, and both traced it all
TRACES_INCOMPLETE = "traces-incomplete"  # what was compared agrees; a trace is cut or missing


@dataclass
class RankFinding:
    """One rank's first divergence (or where its alignment broke), and how much of its
    two traces there was to compare."""

    rank: int
    kind: str | None  # one of KINDS; None: every compared op agrees
    ops_compared: int
    step: int | None = None
    seq: int | None = None  # position in the step
    phase: str | None = None
    module: str | None = None
    op: str | None = None
    occurrence: int | None = None
    stack: str | None = None  # the job's first frame (file:line)
    inputs_differing: list[int] = field(default_factory=list)
    outputs_differing: list[int] = field(default_factory=list)
    detail: str = ""
    other_op: str | None = None  # alignment: the other run's op at this place
    tensor: str | None = None  # the first differing input's parameter name, where it is one
    edge: str | None = None  # the prefetch edge the op is tied to (edge_of)
    edge_how: str | None = None  # ISSUED, COPY_OUT, WINDOW or READ
    read_by: dict[str, Any] | None = None  # a collective's: the op that read its output
    traced: list[int | None] = field(default_factory=lambda: [None, None])  # ops a, b
    coverage: dict[str, Any] | None = None  # a trace cut short or missing (None: complete)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def key(self) -> tuple[int, int]:
        return (self.step or 0, self.seq or 0)


@dataclass
class Explanation:
    verdict: str
    first: RankFinding | None
    ranks: list[RankFinding]
    steps_traced: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        first = None
        if self.first is not None:
            f = self.first
            first = {"rank": f.rank, "step": f.step, "phase": f.phase, "module": f.module,
                     "op": f.op, "kind": f.kind, "seq": f.seq, "stack": f.stack,
                     "occurrence": f.occurrence, "detail": f.detail, "tensor": f.tensor,
                     "edge": f.edge, "edge_how": f.edge_how, "read_by": f.read_by}
        return {"verdict": self.verdict, "first": first,
                "ranks": [r.to_json() for r in self.ranks], "steps_traced": self.steps_traced}

    def gaps(self) -> list[RankFinding]:
        """The ranks whose traces were not compared in full (cut short or missing)."""
        return [r for r in self.ranks if r.coverage is not None]


def trace_files(run_dir: Path) -> dict[int, Path]:
    """rank -> its trace file in a run dir."""
    found = {}
    for path in Path(run_dir).glob(TRACE_GLOB):
        match = re.fullmatch(r"optrace\.rank(\d+)\.jsonl", path.name)
        if match:
            found[int(match.group(1))] = path
    return found


def read_trace(path: Path) -> list[dict[str, Any]]:
    """A trace file's ops in order; a last line cut by a stopped job is left out."""
    ops = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise BisectPrefetchError(f"cannot read op trace {path}: {e}") from e
    for line in text.splitlines():
        try:
            ops.append(json.loads(line))
        except ValueError:
            break  # the job was stopped mid-write: what came before stands
    return ops


def _is_collective(op: str | None) -> bool:
    return bool(op) and op.startswith(COLLECTIVE_PREFIXES)


def compare_rank(rank: int, a: list[dict[str, Any]], b: list[dict[str, Any]],
                 *, through: int | None = None) -> RankFinding:
    """The first divergence of one rank's two traces (see the module docstring), over the
    ops both traced; through: the step both runs must have traced up to its update."""
    by_place = {(op["step"], op["seq"]): op for op in a}
    n = min(len(a), len(b))
    traced = [len(a), len(b)]
    for i in range(n):
        x, y = a[i], b[i]
        if (x["step"], x["op"]) != (y["step"], y["op"]):
            tied = x.get("pf") or y.get("pf") or [None, None]
            return _finding(rank, ALIGNMENT, i, x, stack=x.get("at"), other_op=y["op"],
                            traced=traced, edge=tied[0], edge_how=tied[1],
                            detail=(f"the runs ran different ops here: {x['op']} (step "
                                    f"{x['step']}) against {y['op']} (step {y['step']})"))
        ins_a, ins_b = x.get("in") or [], y.get("in") or []
        outs_a, outs_b = x.get("out") or [], y.get("out") or []
        if len(ins_a) != len(ins_b) or len(outs_a) != len(outs_b):
            return _finding(rank, ALIGNMENT, i, x, stack=x.get("at"), other_op=y["op"],
                            traced=traced,
                            detail=f"{x['op']} took {len(ins_a)} against {len(ins_b)} tensors")
        ins = [k for k, (p, q) in enumerate(zip(ins_a, ins_b, strict=True)) if p != q]
        outs = [k for k, (p, q) in enumerate(zip(outs_a, outs_b, strict=True)) if p != q]
        if not ins and not outs:
            continue
        kind, detail = _classify(x, y, ins, by_place)
        params = dict(x.get("par") or [])
        named = next((k for k in ins if k in params), None)
        if named is None and x["op"] == WINDOW_OP:
            named = next((k for k in outs if k in params), None)
        tensor = None if named is None else params[named]
        if tensor is not None:
            detail = f"{detail}; {'input' if named in ins else 'shard'} {named} is the parameter {tensor}"
        finding = _finding(rank, kind, i, x, stack=x.get("at") or y.get("at"), detail=detail,
                           inputs_differing=ins, outputs_differing=outs, tensor=tensor,
                           traced=traced)
        finding.edge, finding.edge_how = edge_of(x, ins, by_place)
        finding.read_by = _reader(x, by_place)
        return finding
    return RankFinding(rank=rank, kind=None, ops_compared=n, traced=traced,
                       coverage=_coverage(a, b, through))


def _coverage(a: list[dict[str, Any]], b: list[dict[str, Any]],
              through: int | None) -> dict[str, Any] | None:
    """Where the shorter of two agreeing traces ends before what both should hold: every
    op up to the update of step ``through`` (default: the shorter trace's last step)."""
    if len(a) == len(b):
        return None
    short, long_, run = (b, a, "b") if len(b) < len(a) else (a, b, "a")
    last = through if through is not None else (short[-1]["step"] if short else None)
    if last is None:
        expected = len(long_)
    else:
        expected = 0
        for k, op in enumerate(long_):
            if op["step"] < last or (op["step"] == last and op.get("phase") != "optimizer"):
                expected = k + 1
            elif op["step"] > last:
                break
    if len(short) >= expected:
        return None
    stops = [short[-1]["step"], short[-1]["seq"]] if short else None
    return {"run": run, "traced": len(short), "expected": expected, "stops_at": stops,
            "through_step": last}


def _classify(x: dict[str, Any], y: dict[str, Any], ins: list[int],
              by_place: dict[tuple[int, int], dict[str, Any]]) -> tuple[str, str]:
    if not ins:
        if x["op"] == WINDOW_OP:
            opened = x.get("open") or [x["step"], None]
            return CHANGED_BEHIND, (f"the prefetched unit's shards matched when the prefetch "
                                    f"was issued (step {opened[0]}, op {opened[1]}) and "
                                    "differed at its use: written outside the traced ops "
                                    "while the prefetch was in flight")
        if _is_collective(x["op"]):
            reader = by_place.get(tuple(x["rd"])) if x.get("rd") else None
            read = (f", as {reader['op']} read it ({reader['phase']} of "
                    f"{reader['module'] or 'no module'}, op {reader['seq']})" if reader else "")
            return RECEIVER, f"its local inputs matched, what it received differed{read}"
        return ORIGIN, "inputs matched, output differed"
    changed = set(x.get("chg") or []) | set(y.get("chg") or [])
    sources = x.get("src") or []
    for k in ins:
        if k in changed:
            source = sources[k] if k < len(sources) else None
            writer = by_place.get(tuple(source)) if source else None
            by = f" by {writer['op']} (step {writer['step']}, op {writer['seq']})" if writer else ""
            return CHANGED_BEHIND, (f"input {k} differed from its fingerprint when it was "
                                    f"written{by}: written outside the traced ops")
    for k in ins:
        source = sources[k] if k < len(sources) else None
        writer = by_place.get(tuple(source)) if source else None
        if writer is not None and _is_collective(writer["op"]):
            return RECEIVER, f"input {k} came from {writer['op']} (another rank's data)"
    for k in ins:
        if k >= len(sources) or sources[k] is None:
            return UNTRACED_INPUT, (f"input {k} differed and no traced op wrote it (written "
                                    "before the traced steps, or outside the dispatcher)")
    return CHANGED_BEHIND, f"input {ins[0]} differed while the op that wrote it matched"


def edge_of(x: dict[str, Any], ins: list[int],
            by_place: dict[tuple[int, int], dict[str, Any]]) -> tuple[str | None, str | None]:
    """(edge id, how) the op is tied to: run inside a prefetch (issued, copy-out), a
    prefetch's window, or reading a differing input an op of a prefetch filled; else
    (None, None)."""
    tied = x.get("pf")
    if tied:
        return tied[0], tied[1]
    sources = x.get("src") or []
    for k in ins:
        source = sources[k] if k < len(sources) else None
        writer = by_place.get(tuple(source)) if source else None
        if writer is not None and writer.get("pf"):
            return writer["pf"][0], READ
    return None, None


def _reader(x: dict[str, Any], by_place: dict[tuple[int, int], dict[str, Any]]
            ) -> dict[str, Any] | None:
    """The op that first read a collective's output (its wait, or the op that waited)."""
    reader = by_place.get(tuple(x["rd"])) if x.get("rd") else None
    if reader is None:
        return None
    return {"op": reader["op"], "phase": reader.get("phase"), "module": reader.get("module"),
            "step": reader["step"], "seq": reader["seq"]}


def _finding(rank: int, kind: str, index: int, op: dict[str, Any], **extra: Any) -> RankFinding:
    return RankFinding(rank=rank, kind=kind, ops_compared=index, step=op["step"],
                       seq=op["seq"], phase=op.get("phase"), module=op.get("module"),
                       op=op["op"], occurrence=op.get("n"), **extra)


def compare_traces(run_a: Path, run_b: Path, *, through: int | None = None) -> Explanation:
    """Both runs' traces, rank by rank (every rank either traced), and the finding across
    ranks. through: the step both runs must have traced up to its update (the step they
    first differ at)."""
    files_a, files_b = trace_files(run_a), trace_files(run_b)
    if not files_a and not files_b:
        raise BisectPrefetchError(f"no op trace in {run_a} or {run_b} (was the tracer active? "
                                  "it needs a torch or MindSpore job under the adapter)")
    findings, steps = [], set()
    for rank in sorted(set(files_a) | set(files_b)):
        a = read_trace(files_a[rank]) if rank in files_a else []
        b = read_trace(files_b[rank]) if rank in files_b else []
        steps |= {op["step"] for op in a} | {op["step"] for op in b}
        finding = compare_rank(rank, a, b, through=through)
        if rank not in files_a or rank not in files_b:
            finding.traced = [len(a) if rank in files_a else None,
                              len(b) if rank in files_b else None]
            finding.coverage = {"run": "a" if rank not in files_a else "b", "traced": None,
                                "expected": max(len(a), len(b)), "stops_at": None,
                                "through_step": through}
        findings.append(finding)
    return explain(findings, steps_traced=sorted(steps))


def _compared_through(finding: RankFinding) -> tuple[int, int] | None:
    """How far a rank's two traces were compared: None for all of what both should hold;
    (step, seq) where the shorter one stops, (0, 0) where one is missing."""
    coverage = finding.coverage
    if coverage is None or finding.kind is not None:
        return None
    stops = coverage.get("stops_at")
    return (0, 0) if stops is None else (stops[0], stops[1])


def explain(findings: list[RankFinding], *, steps_traced: list[int] | None = None) -> Explanation:
    """The finding across ranks from each rank's (see the module docstring)."""
    found = [f for f in findings if f.kind is not None]
    received = [f for f in found if f.kind == RECEIVER and _is_collective(f.op)
                and not f.inputs_differing]
    earliest = min(received, key=lambda f: (f.key(), f.rank), default=None)
    # A rank compared only up to before that collective might have computed the difference.
    blind = earliest is not None and any(
        (through := _compared_through(f)) is not None and through < earliest.key()
        for f in findings)
    if earliest is not None and not blind and not any(
            f.kind in (ORIGIN, CHANGED_BEHIND, ALIGNMENT) or (
                f.kind == UNTRACED_INPUT and f.key() <= earliest.key()) for f in found):
        # No rank computed anything differently before it, yet a collective's output
        # differed where its inputs matched: what the ranks sent matched, so its buffer
        # changed behind the traced ops (read before it completed, or written by something
        # else). Later differences on other ranks are its consequences.
        earliest.kind = CHANGED_BEHIND
        earliest.detail = ("no rank computed a difference before it: this collective's "
                           "output differed where its inputs matched (read before it "
                           "completed, or written outside the traced ops); "
                           + earliest.detail)
    first = None
    for kinds in (_LOCAL_KINDS + (ALIGNMENT,), (RECEIVER,)):
        candidates = [f for f in found if f.kind in kinds]
        if candidates:
            first = min(candidates, key=lambda f: (f.key(), f.rank))
            break
    if first is None:
        verdict = TRACES_INCOMPLETE if any(f.coverage for f in findings) else NO_OP_DIFFERS
    elif first.kind == ALIGNMENT:
        verdict = ALIGNMENT_BROKEN
    else:
        verdict = EXPLAINED
    return Explanation(verdict=verdict, first=first, ranks=findings,
                       steps_traced=steps_traced or [])


def neighbours(run_a: Path, run_b: Path, finding: RankFinding | None,
               around: int = 3) -> list[dict[str, Any]]:
    """The ops around a rank's finding in run a's trace (``around`` each side), each with
    what differed between the runs there: "inputs", "outputs", "both" or "" (none)."""
    if finding is None or finding.step is None:
        return []
    files_a, files_b = trace_files(run_a), trace_files(run_b)
    if finding.rank not in files_a or finding.rank not in files_b:
        return []
    a, b = read_trace(files_a[finding.rank]), read_trace(files_b[finding.rank])
    at = next((i for i, op in enumerate(a)
               if (op["step"], op["seq"]) == (finding.step, finding.seq)), None)
    if at is None:
        return []
    rows = []
    for i in range(max(at - around, 0), min(at + around + 1, len(a))):
        x, y = a[i], b[i] if i < len(b) else {}
        ins = (x.get("in") or []) != (y.get("in") or [])
        outs = (x.get("out") or []) != (y.get("out") or [])
        differs = "both" if ins and outs else "inputs" if ins else "outputs" if outs else ""
        rows.append({"step": x["step"], "seq": x["seq"], "op": x["op"], "phase": x.get("phase"),
                     "module": x.get("module"), "at": x.get("at"), "differs": differs,
                     "first": i == at, **({"edge": x["pf"][0]} if x.get("pf") else {})})
    return rows
