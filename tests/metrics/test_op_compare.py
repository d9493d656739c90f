"""Two runs' op traces compared: per rank the first op that differs and its kind (origin,
receiver, changed-behind, untraced-input), the finding across ranks, alignment that breaks,
said with where, never a crash; the prefetch edge the first op is tied to (issued by it, its
window, reading what it filled); and only ops both runs traced compared, a trace cut short
or missing said with its counts. Traces are written by hand as the in-job tracer writes
them (optrace.rank{R}.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.metrics.op_compare import (
    ALIGNMENT_BROKEN,
    EXPLAINED,
    NO_OP_DIFFERS,
    TRACES_INCOMPLETE,
    compare_traces,
)

A, B, C, D = ("a" * 32, "b" * 32, "c" * 32, "d" * 32)


def op(step, seq, name, ins=(), outs=(), src=None, chg=(), phase="forward", module="layers.1",
       n=0):
    return {"step": step, "seq": seq, "op": name, "n": n, "phase": phase, "module": module,
            "in": list(ins), "out": list(outs), "src": list(src or [None] * len(ins)),
            "chg": list(chg), "at": "train.py:12"}


def write(run_dir: Path, rank: int, ops: list[dict], *, cut: bool = False) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(o) + "\n" for o in ops)
    (run_dir / f"optrace.rank{rank}.jsonl").write_text(text[:-10] if cut else text)


def common() -> list[dict]:
    return [op(1, 0, "aten.mm", ins=[A, A], outs=[B]), op(1, 1, "aten.add", ins=[B], outs=[C],
                                                           src=[[1, 0]])]


def test_an_op_whose_inputs_matched_and_output_differed_is_the_origin(tmp_path):
    for rank in (0, 1):
        write(tmp_path / "a", rank, common() + [op(2, 0, "aten.randn", outs=[A]),
                                                op(2, 1, "aten.add", ins=[A], outs=[B],
                                                   src=[[2, 0]])])
        write(tmp_path / "b", rank, common() + [op(2, 0, "aten.randn", outs=[D]),
                                                op(2, 1, "aten.add", ins=[D], outs=[C],
                                                   src=[[2, 0]])])
    result = compare_traces(tmp_path / "a", tmp_path / "b")
    assert result.verdict == EXPLAINED
    first = result.first
    assert (first.rank, first.step, first.seq, first.op, first.kind) == (0, 2, 0, "aten.randn",
                                                                         "origin")
    assert first.module == "layers.1" and first.phase == "forward" and first.stack == "train.py:12"
    assert [r.kind for r in result.ranks] == ["origin", "origin"]
    assert result.to_json()["first"]["kind"] == "origin"


def test_a_collective_that_received_something_else_is_a_receiver_and_the_origin_wins(tmp_path):
    gather = "c10d._allgather_base_"
    # rank 0 computed differently (origin); rank 1 only received it through the all-gather.
    write(tmp_path / "a", 0, common() + [op(2, 0, "aten.mm", ins=[A], outs=[B]),
                                         op(2, 1, gather, ins=[B], outs=[C], src=[[2, 0]])])
    write(tmp_path / "b", 0, common() + [op(2, 0, "aten.mm", ins=[A], outs=[D]),
                                         op(2, 1, gather, ins=[D], outs=[A], src=[[2, 0]])])
    write(tmp_path / "a", 1, common() + [op(2, 0, "aten.mm", ins=[A], outs=[B]),
                                         op(2, 1, gather, ins=[B], outs=[C], src=[[2, 0]])])
    write(tmp_path / "b", 1, common() + [op(2, 0, "aten.mm", ins=[A], outs=[B]),
                                         op(2, 1, gather, ins=[B], outs=[A], src=[[2, 0]])])
    result = compare_traces(tmp_path / "a", tmp_path / "b")
    kinds = {r.rank: (r.kind, r.op) for r in result.ranks}
    assert kinds == {0: ("origin", "aten.mm"), 1: ("receiver", gather)}
    assert result.first.rank == 0 and result.first.kind == "origin"


def test_an_input_that_came_from_a_collective_is_received(tmp_path):
    for run, value in (("a", B), ("b", D)):
        # The collective's own output fingerprint is missing (never read): its reader shows it.
        write(tmp_path / run, 0, [op(1, 0, "c10d._allgather_base_", ins=[A], outs=[None]),
                                  op(1, 1, "aten.mm", ins=[value], outs=[value],
                                     src=[[1, 0]])])
    result = compare_traces(tmp_path / "a", tmp_path / "b")
    assert result.first.kind == "receiver" and result.first.op == "aten.mm"


def test_an_input_changed_since_its_writer_left_it_is_changed_behind(tmp_path):
    # The copy-out wrote the unsharded parameter with the same bits in both runs; at its use
    # in run b it held other bits (chg: its fingerprint differs from the writer's).
    write(tmp_path / "a", 0, [op(1, 0, "fsdp.split_with_sizes_copy", ins=[A], outs=[B],
                                 module="layers.2"),
                              op(1, 1, "aten.mm", ins=[B, C], outs=[A], src=[[1, 0], None],
                                 module="layers.2")])
    write(tmp_path / "b", 0, [op(1, 0, "fsdp.split_with_sizes_copy", ins=[A], outs=[B],
                                 module="layers.2"),
                              op(1, 1, "aten.mm", ins=[D, C], outs=[C], src=[[1, 0], None],
                                 chg=[0], module="layers.2")])
    result = compare_traces(tmp_path / "a", tmp_path / "b")
    first = result.first
    assert (first.kind, first.op, first.module, first.inputs_differing) == (
        "changed-behind", "aten.mm", "layers.2", [0])
    assert "fsdp.split_with_sizes_copy" in first.detail


def test_an_input_no_traced_op_wrote_is_said_as_such(tmp_path):
    write(tmp_path / "a", 0, [op(1, 0, "aten.embedding", ins=[A, B], outs=[C])])
    write(tmp_path / "b", 0, [op(1, 0, "aten.embedding", ins=[A, D], outs=[A])])
    assert compare_traces(tmp_path / "a", tmp_path / "b").first.kind == "untraced-input"


def test_ops_that_stop_lining_up_are_the_finding_with_where(tmp_path):
    write(tmp_path / "a", 0, common() + [op(2, 0, "aten.relu", ins=[A], outs=[A])])
    write(tmp_path / "b", 0, common() + [op(2, 0, "aten.tanh", ins=[A], outs=[A])])
    result = compare_traces(tmp_path / "a", tmp_path / "b")
    assert result.verdict == ALIGNMENT_BROKEN
    first = result.first
    assert (first.kind, first.step, first.seq, first.op, first.other_op) == (
        "alignment", 2, 0, "aten.relu", "aten.tanh")
    assert "different ops" in first.detail


def test_a_difference_before_the_break_is_the_finding(tmp_path):
    write(tmp_path / "a", 0, [op(1, 0, "aten.randn", outs=[A]), op(1, 1, "aten.relu")])
    write(tmp_path / "b", 0, [op(1, 0, "aten.randn", outs=[B]), op(1, 1, "aten.tanh")])
    assert compare_traces(tmp_path / "a", tmp_path / "b").first.kind == "origin"


def test_a_run_stopped_early_is_compared_as_far_as_it_got(tmp_path):
    ops = common() + [op(2, 0, "aten.mm", ins=[A], outs=[B])]
    write(tmp_path / "a", 0, ops)
    write(tmp_path / "b", 0, ops[:2] + [ops[2]], cut=True)  # its last line cut by the stop
    result = compare_traces(tmp_path / "a", tmp_path / "b")
    assert result.verdict == NO_OP_DIFFERS and result.first is None
    assert result.ranks[0].ops_compared == 2


def test_runs_without_any_trace_are_one_error(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(BisectPrefetchError, match="no op trace"):
        compare_traces(tmp_path / "a", tmp_path / "b")


def test_a_trace_cut_short_is_said_with_its_counts_never_taken_for_agreement(tmp_path):
    # Run b was stopped at its first differing step, 2, but its rank 1 wrote only the
    # first ops of step 1 (killed mid-write): what both traced agrees, and that is all.
    steps = [op(1, k, "aten.mm", ins=[A], outs=[B]) for k in range(6)] + [
        op(2, k, "aten.mm", ins=[A], outs=[B]) for k in range(4)] + [
        op(2, 4, "aten.add_", ins=[A], outs=[A], phase="optimizer")]
    for rank in (0, 1):
        write(tmp_path / "a", rank, steps)
    write(tmp_path / "b", 0, steps[:-1])  # complete through step 2's update
    write(tmp_path / "b", 1, steps[:3])
    result = compare_traces(tmp_path / "a", tmp_path / "b", through=2)
    assert result.verdict == TRACES_INCOMPLETE and result.first is None
    rank0, rank1 = result.ranks
    assert rank0.coverage is None and rank0.traced == [11, 10]
    assert rank1.coverage == {"run": "b", "traced": 3, "expected": 10, "stops_at": [1, 2],
                              "through_step": 2}
    assert rank1.ops_compared == 3


def test_a_rank_whose_trace_is_missing_is_not_compared_and_no_collective_is_blamed_over_it(
        tmp_path):
    gather = "c10d._allgather_base_"
    write(tmp_path / "a", 0, [op(1, 0, gather, ins=[A], outs=[B])])
    write(tmp_path / "b", 0, [op(1, 0, gather, ins=[A], outs=[C])])
    write(tmp_path / "a", 1, [op(1, 0, gather, ins=[A], outs=[B])])  # b's rank 1: no trace
    result = compare_traces(tmp_path / "a", tmp_path / "b")
    missing = result.ranks[1]
    assert missing.coverage["traced"] is None and missing.traced == [1, None]
    # Rank 1 might have computed the difference: the collective stays a receiver.
    assert result.first.kind == "receiver"
    assert "no rank computed" not in result.first.detail


def test_an_op_a_prefetch_issued_is_tied_to_its_edge_and_its_reader_is_named(tmp_path):
    gather = "c10d._allgather_base_"
    edge = "fwd:layers.1->layers.2"
    reader = op(1, 1, "aten.view", ins=[None], outs=[None], src=[[1, 0]], module="layers.2")
    for rank, out in ((0, B), (1, D)):
        write(tmp_path / "a", rank, [op(1, 0, gather, ins=[A], outs=[B]) | {
            "rd": [1, 1], "pf": [edge, "issued"]}, reader])
        write(tmp_path / "b", rank, [op(1, 0, gather, ins=[A], outs=[out]) | {
            "rd": [1, 1], "pf": [edge, "issued"]}, reader])
    first = compare_traces(tmp_path / "a", tmp_path / "b").first
    assert (first.kind, first.edge, first.edge_how) == ("changed-behind", edge, "issued")
    assert first.read_by == {"op": "aten.view", "phase": "forward", "module": "layers.2",
                             "step": 1, "seq": 1}


def test_a_prefetch_window_whose_shards_changed_is_changed_behind_with_its_edge(tmp_path):
    edge = "bwd:layers.5->layers.4"
    window = {"step": 5, "seq": 9, "op": "prefetch-window", "n": 0, "phase": "backward",
              "module": "layers.4", "in": [A, B], "src": [None, None], "chg": [], "at": None,
              "par": [[0, "layers.4.w"], [1, "layers.4.b"]], "pf": [edge, "window"],
              "open": [5, 2]}
    write(tmp_path / "a", 0, [window | {"out": [A, B]}])
    write(tmp_path / "b", 0, [window | {"out": [A, C]}])
    first = compare_traces(tmp_path / "a", tmp_path / "b").first
    assert (first.kind, first.edge, first.edge_how, first.tensor) == (
        "changed-behind", edge, "window", "layers.4.b")
    assert "matched when the prefetch was issued (step 5, op 2)" in first.detail


def test_an_input_a_prefetch_filled_ties_its_reader_to_the_edge(tmp_path):
    edge = "bwd:layers.3->layers.2"
    copy_out = op(1, 0, "aten.copy_", ins=[A], outs=[B], module="layers.2") | {
        "pf": [edge, "copy-out"]}
    write(tmp_path / "a", 0, [copy_out, op(1, 1, "aten.mm", ins=[B], outs=[C], src=[[1, 0]],
                                           chg=[])])
    write(tmp_path / "b", 0, [copy_out, op(1, 1, "aten.mm", ins=[D], outs=[C], src=[[1, 0]],
                                           chg=[0])])
    first = compare_traces(tmp_path / "a", tmp_path / "b").first
    assert (first.kind, first.edge, first.edge_how) == ("changed-behind", edge, "read")
    # Nothing of a prefetch around it: no edge.
    write(tmp_path / "c", 0, [op(1, 0, "aten.randn", outs=[A])])
    write(tmp_path / "d", 0, [op(1, 0, "aten.randn", outs=[B])])
    assert compare_traces(tmp_path / "c", tmp_path / "d").first.edge is None


def test_when_every_rank_only_received_the_collective_buffer_changed_behind(tmp_path):
    gather = "c10d._allgather_base_"
    for rank in (0, 1):
        # Every rank sent the same (inputs matched); rank 1's output, as the copy-out read
        # it, differed: the buffer was read before the all-gather completed.
        reader = op(1, 1, "fsdp.split_with_sizes_copy", ins=[B], outs=[C], src=[[1, 0]],
                    module="layers.2")
        write(tmp_path / "a", rank, [op(1, 0, gather, ins=[A], outs=[B]) | {"rd": [1, 1]},
                                     reader])
        out = D if rank == 1 else B
        write(tmp_path / "b", rank, [op(1, 0, gather, ins=[A], outs=[out]) | {"rd": [1, 1]},
                                     reader | {"in": [out], "out": [C if out == B else D]}])
    result = compare_traces(tmp_path / "a", tmp_path / "b")
    first = result.first
    assert (first.rank, first.kind, first.op) == (1, "changed-behind", gather)
    assert "fsdp.split_with_sizes_copy read it (forward of layers.2, op 1)" in first.detail
    assert [r.kind for r in result.ranks] == [None, "changed-behind"]


def test_a_later_untraced_input_on_another_rank_is_a_consequence_of_the_racing_collective(
        tmp_path):
    gather = "c10d._allgather_base_"
    write(tmp_path / "a", 0, [op(1, 0, gather, ins=[A], outs=[B])])
    write(tmp_path / "b", 0, [op(1, 0, gather, ins=[A], outs=[C])])
    write(tmp_path / "a", 1, [op(1, 0, gather, ins=[A], outs=[B]), op(1, 5, "aten.copy_",
                                                                      ins=[A], outs=[A])])
    write(tmp_path / "b", 1, [op(1, 0, gather, ins=[A], outs=[B]), op(1, 5, "aten.copy_",
                                                                      ins=[D], outs=[D])])
    result = compare_traces(tmp_path / "a", tmp_path / "b")
    assert (result.first.rank, result.first.kind, result.first.op) == (0, "changed-behind",
                                                                       gather)
    assert result.first.detail.startswith("no rank computed a difference before it")
    assert result.ranks[1].kind == "untraced-input"
