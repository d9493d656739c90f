"""RealOracle over stand-in jobs: golden comparison, resume, retries, masks that change the math,
a golden run that drifted."""

from __future__ import annotations

import io
import json
import sys
import textwrap
from pathlib import Path

import pytest

from bisect_prefetch.commands.bisect_loop import run_bisection
from bisect_prefetch.drivers.oracle import RealOracle
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import load_experiment
from bisect_prefetch.graph import from_policy
from bisect_prefetch.runs.execute import Runner
from bisect_prefetch.runs.sessions import Scope
from bisect_prefetch.runs.store import StateDir
from bisect_prefetch.search.causes import CauseSearch
from bisect_prefetch.search.runlog import Ask
from bisect_prefetch.search.segments import Schedule, Segment
from tests.conftest import console, oracle_run
from tests.jobs.fake_job import DETERMINISTIC_EDGE, RANDOM_EDGE

FAKE_JOB = Path(__file__).resolve().parents[1] / "jobs" / "fake_job.py"
CLEAN = frozenset({DETERMINISTIC_EDGE})
DRIFTING = frozenset({RANDOM_EDGE})


def _experiment(tmp_path: Path, mode: str = "clean", timeout_s: float = 30):
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(f"""
        name: fake
        command: [{json.dumps(sys.executable)}, {json.dumps(str(FAKE_JOB))}, {mode}]
        metrics: {{format: jsonl, names: [loss]}}
        graph: {{source: static, policy: fsdp2-chain, layers: 2}}
        steps: 6
        timeout_s: {timeout_s}
    """))
    return load_experiment(path)


def _edges() -> list[str]:
    return from_policy("fsdp2-chain", 2).edge_ids()


def _oracle(state: StateDir, experiment, *, resume: bool = False, **kw) -> RealOracle:
    """The oracle of a search (resume: of the one the journal holds, as bisect --resume)."""
    runner = Runner(experiment, state, scope=Scope("bisect", resume=resume)).open()
    return RealOracle(runner, steps=6, guard="none", **kw)


def test_runs_are_trials_against_one_golden_run(tmp_path):
    experiment = _experiment(tmp_path)
    with StateDir(tmp_path / "state", "fake") as state:
        oracle = _oracle(state, experiment)
        clean = oracle_run(oracle, CLEAN)
        drifting = oracle_run(oracle, DRIFTING)
        all_off = oracle_run(oracle, frozenset())
        golden = oracle.run_golden()
    assert (clean.outcome, clean.diverged, clean.steps) == ("ok", False, 6)
    assert drifting.diverged and drifting.first_diff_step == 3
    assert all_off.diverged is False
    # One golden run plus three trials.
    assert oracle.runs_launched == 4
    records = [json.loads(line) for line in (tmp_path / "state/fake/journal.jsonl").open()]
    assert [r["reference"] for r in records[1:]] == [golden] * 3
    assert records[0]["mask"] == [] and records[0]["variant"].startswith("search-golden+")


def test_resume_replays_the_same_runs_in_order(tmp_path):
    experiment = _experiment(tmp_path)
    asks = [DRIFTING, CLEAN, DRIFTING, CLEAN]
    with StateDir(tmp_path / "state", "fake") as state:
        oracle = _oracle(state, experiment)
        first = [oracle_run(oracle, mask) for mask in asks]
        assert oracle.runs_launched == 5
    with StateDir(tmp_path / "state", "fake") as state:
        oracle = _oracle(state, experiment, resume=True)
        again = [oracle_run(oracle, mask) for mask in asks]
        assert oracle.runs_launched == 0 and oracle.runs_reused == 5
        # Asking for more than was run before launches the new run only.
        oracle_run(oracle, CLEAN)
        assert oracle.runs_launched == 1
    assert again == first


def test_errors_are_retried_then_reported(tmp_path):
    experiment = _experiment(tmp_path, "crash")
    with StateDir(tmp_path / "state", "fake") as state:
        oracle = _oracle(state, experiment, max_retries=1)
        with pytest.raises(BisectPrefetchError, match=r"reference run \(search-golden\) failed 2 times"):
            oracle_run(oracle, CLEAN)


def test_a_failed_trial_is_retried_and_never_clean(tmp_path):
    experiment = _experiment(tmp_path, "crash-when-fwd")
    with StateDir(tmp_path / "state", "fake") as state:
        oracle = _oracle(state, experiment, max_retries=2)
        result = oracle_run(oracle, CLEAN)
    assert result.outcome == "error" and result.diverged is None
    assert oracle.runs_launched == 1 + 3  # the golden run, then three attempts


def test_mask_that_changes_the_math_is_compared_within_itself(tmp_path):
    experiment = _experiment(tmp_path, "det")
    with StateDir(tmp_path / "state", "fake") as state:
        oracle = _oracle(state, experiment)
        first = oracle_run(oracle, CLEAN)
        second = oracle_run(oracle, CLEAN)
        assert first.diverged and second.diverged
        assert first.first_diff_step == second.first_diff_step == 1
        assert oracle.deterministic_masks() == [CLEAN]
        third = oracle_run(oracle, CLEAN)
    assert third.diverged is False


def test_a_job_that_cannot_switch_masks_is_said_once_and_never_retried(tmp_path):
    """A run of several masks whose ranks refused the schedule (MindSpore graph mode) is an
    error, never evidence; retrying it would be refused again, so the oracle says why
    and the command goes on with one mask a run (commands/bisect_loop.py run_bisection)."""
    experiment = _experiment(tmp_path, "graph-mode")
    with StateDir(tmp_path / "state", "fake") as state:
        oracle = _oracle(state, experiment, max_retries=2)
        schedule = Schedule((Segment(Ask(CLEAN, "search"), 1, 3),
                             Segment(Ask(frozenset(), "search"), 4, 3)))
        oracle.request_schedule(schedule)
        heard = oracle.finished()
        assert heard.planned is schedule and not heard.result.completed  # no retry
        assert oracle.finished() is None  # nothing in flight
        assert "cannot switch masks inside a run: graph mode" in oracle.schedule_refused
        assert oracle.runs_launched == 2  # the golden run and this one
        # One mask a run is not refused.
        assert oracle_run(oracle, CLEAN).completed and oracle.schedule_refused is not None


def test_a_golden_run_that_drifted_is_replaced_and_a_resume_finds_the_new_one(tmp_path):
    """The job's first run (the golden one) drifts from step 4: every run differs from it there
    until the search sees it (search/golden_drift.py) and the loop runs a new golden run."""
    experiment = _experiment(tmp_path, "first-run-drifts")
    verdicts = []
    for launched in ("first", "resumed"):
        with StateDir(tmp_path / "state", "fake") as state:
            oracle = _oracle(state, experiment, resume=launched == "resumed")
            search = CauseSearch(_edges(), steps_per_run=6, max_runs=40)
            oracle.run_golden()
            search.golden(oracle.golden_steps)
            out = io.StringIO()
            result = run_bisection(search, oracle, console=console(out))
            verdicts.append((result.verdict, result.minimal_set, result.runs_used))
            if launched == "first":
                assert oracle.runs_launched == result.runs_used + 2  # two golden runs
            else:
                assert oracle.runs_launched == 0  # the journal holds both golden runs
    assert "the golden run itself drifted at step 4" in out.getvalue()
    assert verdicts[0] == verdicts[1] and verdicts[0][:2] == ("culprit-found", [RANDOM_EDGE])
    records = [json.loads(line) for line in (tmp_path / "state/fake/journal.jsonl").open()]
    goldens = [r for r in records if r["variant"].startswith("search-golden")]
    assert [g["variant"].split("+")[0] for g in goldens] == ["search-golden", "search-golden1"]
