"""The narrated driver: one whole-transcript test per exit path, against the simulator."""

import io
import json

import pytest
from rich.console import Console

from bisect_prefetch.bisection import render_result, reproduce_mask, result_to_json, run_bisection
from bisect_prefetch.graph import from_policy
from bisect_prefetch.search.protocol import Bisection
from bisect_prefetch.search.simulate import SimulatedOracle
from bisect_prefetch.search.stats import hazard_for_chance

EDGES = from_policy("fsdp2-chain", 3).edge_ids()
STEPS = 20
SEED = 9


class CountingOracle(SimulatedOracle):
    def __init__(self, culprits, *, q=0.5, background=0.0, trial=0):
        super().__init__(
            culprits, hazard=hazard_for_chance(q, STEPS), steps=STEPS, seed=SEED, trial=trial,
            background=hazard_for_chance(background, STEPS) if background else 0.0,
        )
        self.masks = []

    def run(self, mask):
        self.masks.append(mask)
        return super().run(mask)


def transcript(culprits, *, background=0.0, **options):
    print(f"seed {SEED}")
    out = io.StringIO()
    console = Console(file=out, width=100)
    search = Bisection(EDGES, steps_per_run=STEPS, **options)
    result = run_bisection(search, CountingOracle(culprits, background=background), console=console)
    return out.getvalue(), result


def test_culprit_found_transcript():
    text, result = transcript(["bwd:layers.2->layers.1"])
    assert text == """\
checking that all-on diverges...
  -> diverged at run 1 (step 18)
checking that all-off is consistent...
  -> clean (1 run)
testing keep-only:fwd:layers.0->layers.1...
  -> clean (1 run)
testing keep-only:fwd:layers.1->layers.2...
  -> clean (1 run)
testing keep-only:bwd:layers.2->layers.1...
  -> clean (1 run)
testing keep-only:bwd:layers.1->layers.0...
  -> clean (1 run)
testing keep-only:fwd:layers.0->layers.1...
  -> clean (1 run)
testing keep-only:fwd:layers.1->layers.2...
  -> clean (1 run)
testing keep-only:bwd:layers.2->layers.1...
  -> diverged at run 1 (step 20)
double checking the answer: drop-only:bwd:layers.2->layers.1 should be consistent...
  -> clean (2 runs)
"""
    assert result.verdict == "culprit-found"


def test_no_drift_reproduced_transcript():
    text, result = transcript([], calibration_runs=4)
    assert text == "checking that all-on diverges...\n  -> clean (4 runs)\n"
    assert result.verdict == "no-drift-reproduced"


def test_not_prefetch_transcript():
    text, result = transcript([], background=0.9)
    assert text == """\
checking that all-on diverges...
  -> diverged at run 1 (step 2)
checking that all-off is consistent...
  -> diverged at run 1 (step 5)
"""
    assert result.verdict == "not-prefetch"


def test_inconclusive_transcript():
    text, result = transcript(["fwd:layers.0->layers.1"], max_runs=4)
    assert text == """\
checking that all-on diverges...
  -> diverged at run 2 (step 13)
checking that all-off is consistent...
  -> clean (1 run)
testing keep-only:fwd:layers.0->layers.1...
  -> clean (1 run)
"""
    assert result.verdict == "inconclusive"


def test_render_result_shows_verdict_facts_evidence_and_reproduction():
    _, result = transcript(["bwd:layers.2->layers.1"])
    out = io.StringIO()
    render_result(result, Console(file=out, width=120), reproduce="bisect-prefetch aa x.yaml --mask "
                  + reproduce_mask(result))
    text = out.getvalue()
    assert text.startswith("verdict: culprit-found\nminimal set: bwd:layers.2->layers.1\n")
    assert f"runs: {result.runs_used}   steps: {result.steps_used}" in text
    for fact in result.facts:
        assert fact in text
    assert "evidence" in text and "double" not in text  # the table holds steps, not titles
    assert text.count("keep-only:bwd:layers.2->layers.1") >= 2
    assert text.rstrip().endswith("reproduce: bisect-prefetch aa x.yaml --mask keep-only:bwd:layers.2->layers.1")


def test_resume_replays_the_journal_and_reruns_nothing():
    culprit = "fwd:layers.1->layers.2"
    first = Bisection(EDGES, steps_per_run=STEPS)
    oracle = CountingOracle([culprit], trial=3)
    journal = []
    for _ in range(5):  # a crash after five runs
        mask = first.next_mask()
        result = oracle.run(mask)
        journal.append((mask, result))
        first.record(mask, result)

    out = io.StringIO()
    fresh = CountingOracle([culprit], trial=4)
    appended = []
    search = Bisection(EDGES, steps_per_run=STEPS)
    result = run_bisection(search, fresh, console=Console(file=out, width=100), journal_results=journal,
                           on_result=lambda mask, r: appended.append((mask, r)))
    assert search.history[:5] == journal
    assert len(fresh.masks) == len(appended) == result.runs_used - 5
    assert "(from the journal)" in out.getvalue()
    assert "replayed 5 finished runs from the journal" in out.getvalue()
    assert result.verdict == "culprit-found" and result.minimal_set == [culprit]


class InterruptingOracle:
    def run(self, mask):
        raise KeyboardInterrupt


def test_interrupt_prints_the_resume_command():
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        run_bisection(Bisection(EDGES), InterruptingOracle(), console=Console(file=out, width=100),
                      resume_hint="bisect-prefetch bisect exp.yaml --resume")
    text = out.getvalue()
    assert "interrupted after 0 runs" in text
    assert text.rstrip().endswith("resume with: bisect-prefetch bisect exp.yaml --resume")


def test_result_to_json_has_the_design_fields():
    _, result = transcript(["bwd:layers.2->layers.1"])
    data = json.loads(json.dumps(result_to_json(result, "bisect-prefetch aa x.yaml")))
    assert {"verdict", "minimal_set", "confidence", "runs_used", "steps_used", "evidence",
            "reproduce"} <= set(data)
    assert data["minimal_set"] == ["bwd:layers.2->layers.1"]
    assert data["reproduce"] == "bisect-prefetch aa x.yaml"
    assert data["evidence"][0] == {
        "step": "calibrate", "mask": "all-on", "edges": 4, "runs": 1, "divergences": 1, "errors": 0,
        "first_diff_steps": [18], "verdict": "diverged",
    }
