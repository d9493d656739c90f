"""The `bisect` command, whole transcripts: every exit path against a simulated oracle.

The command runs for real (state dir, lock, journal, report, the one loop users
run, on one slot or two, with segments or without) except the training runs:
the oracle draws them from the simulator (search/simulate.py), answers through
the slot operations the real oracle has, and journals them as the real oracle does, so a resumed command gets the runs
that finished from the journal and runs only the rest. Every printed line is
checked, at the pinned console width (conftest.py).
"""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from bisect_prefetch.adapters.manifest import MANIFEST_VERSION
from bisect_prefetch.commands import bisect as command
from bisect_prefetch.commands import bisect_verdict_words, bisect_words
from bisect_prefetch.drivers.oracle import Earlier
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.runs.outcome import RunOutcome
from bisect_prefetch.search import verdict as v
from bisect_prefetch.search.oracle import AnswersAtOnce, Finished, RunResult
from bisect_prefetch.search.runlog import AFTER_DROP_ONLY_DIVERGED, BACKGROUND_PARITY, NO_CAUSE_HERE
from bisect_prefetch.search.simulate import SimulatedOracle
from bisect_prefetch.search.stats import hazard_for_chance
from bisect_prefetch.vocab import KEEP_ONLY, STAGE_CALIBRATE, STAGE_CHECK_OFF, STAGE_LEADING
from tests.conftest import console

STEPS = 20
SEED = 9
CULPRIT = "bwd:layers.2->layers.1"


class Simulation:
    """Makes the command's oracle: the simulator, journaling its runs as the real oracle does.

    interrupt_after: new runs before a Ctrl-C (None: never).
    """

    def __init__(self, culprits, *, q=0.5, together=False, background=0.0, interrupt_after=None,
                 localized=None, slots=1, startup_steps=None, golden_drifts_at=None):
        print(f"seed {SEED}")
        self.culprits = culprits
        self.together = together
        self.localized = localized  # the unit every diverged run's gradients first differ in
        self.hazard = hazard_for_chance(q, STEPS)
        self.background = hazard_for_chance(background, STEPS) if background else 0.0
        self.interrupt_after = interrupt_after
        self.slots = slots  # runs at once
        self.startup_steps = startup_steps  # a golden run's start-up, in steps (segments)
        self.golden_drifts_at = golden_drifts_at  # the first golden run's own drift, a step
        self.commands = 0

    def __call__(self, opened):
        self.commands += 1
        return _Oracle(self, opened)


# A simulated run's manifest (runs/reuse.collect): its job read nothing.
READ_NOTHING = {"v": MANIFEST_VERSION, "files": {}, "links": {}, "absent": {"count": 0},
                "installed": {"count": 0}, "dists": {}, "site_dirs": [], "incomplete": None}


class _Oracle(AnswersAtOnce):
    """The real oracle's bookkeeping (journal keys, counts, each run's outcome) over simulated
    runs, answered at once through the slot operations (search/oracle.py); with several
    slots the runs asked are heard shortest first."""

    def __init__(self, sim: Simulation, opened):
        self.sim, self.runner = sim, opened.runner
        # A resumed command draws new runs from its own streams.
        self.draws = SimulatedOracle(sim.culprits, together=sim.together, hazard=sim.hazard, steps=STEPS,
                                     background=sim.background, seed=SEED, trial=sim.commands)
        self.slots = sim.slots
        self.requests: Counter = Counter()
        self.runs_launched = self.runs_reused = 0
        self.golden_steps = STEPS
        self.asked: list[tuple[object, object, RunOutcome]] = []  # (planned, what, outcome)

    def reuse_earlier(self):
        return Earlier()  # no aa or matrix runs before these searches

    def run_golden(self, steps=None) -> str:
        self.golden_steps = max(self.golden_steps, steps or 0)
        key = self.runner.key("search-golden", mask=frozenset(), guard="none",
                              steps=self.golden_steps, index=0)
        self.draws.golden_diff = self.sim.golden_drifts_at  # every run differs from it there
        return self._journaled(key, lambda: RunResult("ok", False, None, self.golden_steps),
                               timed=True).run_id

    def replace_golden(self) -> None:
        key = self.runner.key("search-golden1", mask=frozenset(), guard="none",
                              steps=self.golden_steps, index=0)
        self.draws.golden_diff = None
        self._journaled(key, lambda: RunResult("ok", False, None, self.golden_steps), timed=True)

    def _asked(self, what, planned, draw_of) -> RunOutcome:
        key = self.runner.key("search", mask=what if isinstance(what, frozenset) else what[0][1],
                              guard="none", steps=STEPS if isinstance(what, frozenset) else planned.steps,
                              index=self.requests[what],
                              schedule=None if isinstance(what, frozenset) else what)
        self.requests[what] += 1
        if isinstance(what, frozenset):
            return self._journaled(key, lambda: self.draws.run(draw_of))
        return self._journaled(key, lambda: self.draws.run_schedule(draw_of))

    def request(self, mask):
        self.asked.append((mask, mask, self._asked(mask, mask, mask)))

    def request_schedule(self, schedule):
        what = tuple((first, frozenset(mask)) for first, mask in schedule.masks)
        self.asked.append((schedule, what, self._asked(what, schedule, schedule)))

    def finished(self):
        if not self.asked:
            return None
        first = min(range(len(self.asked)), key=lambda i: self.asked[i][2].steps_done)
        planned, _, out = self.asked.pop(first)
        return Finished(planned, out.result(), outcome=out)

    def cancel(self):
        self.asked.clear()

    def _journaled(self, key, draw, *, timed=False) -> RunOutcome:
        state = self.runner.state
        if (found := self.runner.holds(key)) is not None:  # its own, or its session's (--resume)
            self.runs_reused += 1
            return RunOutcome.from_record(found)
        if self.sim.interrupt_after == 0:
            raise KeyboardInterrupt
        if self.sim.interrupt_after is not None:
            self.sim.interrupt_after -= 1
        result = draw()
        run_id, _ = state.new_run_dir("sim")
        out = RunOutcome(run_id=run_id, outcome="stopped-early" if result.diverged else "ok",
                         reason="", first_diff_step=result.first_diff_step,
                         steps_done=result.steps, wall_s=0.25, session=self.runner.scope.session,
                         launched=self.runner.reuse_check.launched, manifest=READ_NOTHING
                         | {"env": self.runner.reuse_check.env})
        if timed and self.sim.startup_steps is not None:  # what segments: auto measures
            out.step_time_ms, out.first_progress_s = 10.0, self.sim.startup_steps * 0.01
        if result.diverged and self.sim.localized:
            out.localization = {"step": result.first_diff_step, "rank": 1, "unit": self.sim.localized,
                                "param": f"{self.sim.localized}.weight", "units_differing": 1}
        state.append(key, out.to_record())
        self.runner.made.add(run_id)
        self.runs_launched += 1
        return out

    def deterministic_masks(self):
        return []


def write_experiment(tmp_path: Path, *, max_runs: int = 200) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(f"""
name: sim
command: [python, -c, "pass", "{{steps}}"]
metrics: {{format: jsonl, names: [loss]}}
graph: {{source: static, policy: fsdp2-chain, layers: 3}}
steps: {STEPS}
seed: 1
search: {{confidence: 0.95, max_runs: {max_runs}}}
""")
    return path


def run_command(tmp_path, simulation, *, resume=False, max_runs=200, **options):
    out = io.StringIO()
    tmp_path.mkdir(parents=True, exist_ok=True)
    experiment = write_experiment(tmp_path, max_runs=max_runs)
    state_dir = tmp_path / "state"
    try:
        code = command.bisect(experiment, confidence=None, max_runs=None, resume=resume,
                              state_dir=state_dir, console=console(out),
                              json_out=tmp_path / "out.json", oracle_for=simulation, **options)
    except KeyboardInterrupt:
        code = "interrupted"
    text = out.getvalue().replace(str(tmp_path), "TMP")
    return code, text


CULPRIT_FOUND = """\
bisecting sim: 20 steps a run, seed 1, guard none, confidence 0.95, at most 200 runs
running the golden reference (all-off, full length)...
segments: no run measured its start-up and step time (that takes 3 steps or more); one mask a run
checking that all-on diverges...
    run 1 (4 edges on): diverged at step 18 [0.2s]
  -> diverged at run 1 (step 18)
checking that all-off is consistent...
    run 2 (0 edges on): clean over 20 steps [0.2s]
  -> clean (1 run)
testing forward-off...
    run 3 (2 edges on): diverged at step 6 [0.2s]
  -> diverged at run 3 (step 6)
testing drop-only:bwd:layers.2->layers.1...
    run 4 (3 edges on): clean over 20 steps [0.2s]
    run 5 (3 edges on): clean over 20 steps [0.2s]
  -> clean (2 runs)
checking that the leading set is enough: keep-only:bwd:layers.2->layers.1 should diverge...
    run 6 (1 edge on): clean over 20 steps [0.2s]
  -> clean (1 run)
testing keep-only:bwd:layers.2->layers.1...
    run 7 (1 edge on): diverged at step 19 [0.2s]
  -> diverged at run 7 (step 19)
double checking the answer: drop-only:bwd:layers.2->layers.1 should be consistent...
    run 8 (3 edges on): clean over 20 steps [0.2s]
    run 9 (3 edges on): clean over 20 steps [0.2s]
    run 10 (3 edges on): clean over 20 steps [0.2s]
    run 11 (3 edges on): clean over 20 steps [0.2s]
    run 12 (3 edges on): clean over 20 steps [0.2s]
  -> clean (5 runs)
ruling out drift without prefetch as strong as the answer's: checking that all-off is consistent...
    run 13 (0 edges on): clean over 20 steps [0.2s]
  -> clean (1 run)

verdict: culprit-found, one cause (confidence 0.972)
cause 1: bwd:layers.2->layers.1 (confidence 0.972; keep-only diverged in run 7 (0008-sim) at step 19; drift in about 8 of 10 runs with it alone on; size-one: not known (no discovery run audited))
next steps:
  reproduce cause 1 alone (keep-only):
    bisect-prefetch aa TMP/exp.yaml --runs=3 '--mask=keep-only:bwd:layers.2->layers.1' --state-dir=TMP/state
  check the fix (drop-only of the cause):
    bisect-prefetch aa TMP/exp.yaml --runs=3 '--mask=drop-only:bwd:layers.2->layers.1' --state-dir=TMP/state
  explain cause 1: the first op that differs:
    bisect-prefetch explain TMP/exp.yaml '--mask=keep-only:bwd:layers.2->layers.1' --state-dir=TMP/state
runs: 14 launched, 0 reused from the journal; the search's verdict stands on 13 runs; steps: 243
  - keep-only:bwd:layers.2->layers.1 diverged (run 7, step 19): the set is enough for drift
  - drop-only:bwd:layers.2->layers.1: 7 runs, all consistent: removing the set removes drift
  - all-off and drop-only:bwd:layers.2->layers.1 after the search: 8 runs (counting the golden run as 1: the steps runs matched), all consistent: drift without
prefetch at a per-run chance of 0.312 or more is ruled out at 95%; as strong as the answer's (0.4), it would have shown at 98.3%
evidence
┏━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━┳━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━┓
┃ stage       ┃ mask                             ┃ edges ┃ runs ┃ diverged ┃ first differing steps ┃ verdict  ┃
┡━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━╇━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━┩
│ calibrate   │ all-on                           │ 4     │ 1    │ 1        │ 18                    │ diverged │
│ check-off   │ all-off                          │ 0     │ 1    │ 0        │ -                     │ clean    │
│ search      │ forward-off                      │ 2     │ 1    │ 1        │ 6                     │ diverged │
│ search      │ drop-only:bwd:layers.2->layers.1 │ 3     │ 2    │ 0        │ -                     │ clean    │
│ leading-set │ keep-only:bwd:layers.2->layers.1 │ 1     │ 1    │ 0        │ -                     │ clean    │
│ search      │ keep-only:bwd:layers.2->layers.1 │ 1     │ 1    │ 1        │ 19                    │ diverged │
│ drop-only   │ drop-only:bwd:layers.2->layers.1 │ 3     │ 5    │ 0        │ -                     │ clean    │
│ check-off   │ all-off                          │ 0     │ 1    │ 0        │ -                     │ clean    │
└─────────────┴──────────────────────────────────┴───────┴──────┴──────────┴───────────────────────┴──────────┘
per-run chance 0.75: drift in about 8 of 10 runs (95% interval 0.194-0.994), per-step hazard 0.0476, from 4 runs that enabled the set
report: TMP/state/sim/report.html
wrote TMP/out.json
"""

NO_DRIFT = """\
bisecting sim: 20 steps a run, seed 1, guard none, confidence 0.95, at most 16 runs
running the golden reference (all-off, full length)...
segments: no run measured its start-up and step time (that takes 3 steps or more); one mask a run
checking that all-on diverges...
    run 1 (4 edges on): clean over 20 steps [0.2s]
  -> clean (1 run)
testing forward-off...
    run 2 (2 edges on): clean over 20 steps [0.2s]
  -> clean (1 run)
testing keep-only:fwd:layers.0->layers.1...
    run 3 (1 edge on): clean over 20 steps [0.2s]
  -> clean (1 run)
testing keep-only:fwd:layers.1->layers.2...
    run 4 (1 edge on): clean over 20 steps [0.2s]
  -> clean (1 run)
testing backward-off...
    run 5 (2 edges on): clean over 20 steps [0.2s]
  -> clean (1 run)
checking that all-on diverges...
    run 6 (4 edges on): clean over 20 steps [0.2s]
    run 7 (4 edges on): clean over 20 steps [0.2s]
    run 8 (4 edges on): clean over 20 steps [0.2s]
    run 9 (4 edges on): clean over 20 steps [0.2s]
    run 10 (4 edges on): clean over 20 steps [0.2s]
    run 11 (4 edges on): clean over 20 steps [0.2s]
    run 12 (4 edges on): clean over 20 steps [0.2s]
    run 13 (4 edges on): clean over 20 steps [0.2s]
  -> clean (8 runs)

verdict: no-drift-reproduced (confidence 0.950)
runs: 14 launched, 0 reused from the journal; the search's verdict stands on 13 runs; steps: 260
  - every edge enabled in 10 clean runs (9 of them all-on), none diverged: a per-run chance of 0.259 or more is ruled out at 95% (fewer than 3/10)
evidence
┏━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━┳━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━┓
┃ stage     ┃ mask                             ┃ edges ┃ runs ┃ diverged ┃ first differing steps ┃ verdict ┃
┡━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━╇━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━┩
│ calibrate │ all-on                           │ 4     │ 1    │ 0        │ -                     │ clean   │
│ search    │ forward-off                      │ 2     │ 1    │ 0        │ -                     │ clean   │
│ search    │ keep-only:fwd:layers.0->layers.1 │ 1     │ 1    │ 0        │ -                     │ clean   │
│ search    │ keep-only:fwd:layers.1->layers.2 │ 1     │ 1    │ 0        │ -                     │ clean   │
│ search    │ backward-off                     │ 2     │ 1    │ 0        │ -                     │ clean   │
│ calibrate │ all-on                           │ 4     │ 8    │ 0        │ -                     │ clean   │
└───────────┴──────────────────────────────────┴───────┴──────┴──────────┴───────────────────────┴─────────┘
per-run chance 0 (95% interval 0-0.336), from 9 runs that enabled every edge (all-on)
drift at a per-run chance below 0.259 can still hide: for a prefetch race, --stress auto checks whether delays before each prefetch make it show more often (docs/stress.md)
report: TMP/state/sim/report.html
wrote TMP/out.json
"""

NOT_PREFETCH = """\
bisecting sim: 20 steps a run, seed 1, guard none, confidence 0.95, at most 200 runs
running the golden reference (all-off, full length)...
segments: no run measured its start-up and step time (that takes 3 steps or more); one mask a run
checking that all-on diverges...
    run 1 (4 edges on): diverged at step 15 [0.2s]
  -> diverged at run 1 (step 15)
checking that all-off is consistent...
    run 2 (0 edges on): diverged at step 8 [0.2s]
    run 3 (0 edges on): diverged at step 16 [0.2s]
    run 4 (0 edges on): diverged at step 11 [0.2s]
    run 5 (0 edges on): diverged at step 6 [0.2s]
    run 6 (0 edges on): diverged at step 3 [0.2s]
    run 7 (0 edges on): diverged at step 2 [0.2s]
    run 8 (0 edges on): diverged at step 4 [0.2s]
    run 9 (0 edges on): diverged at step 9 [0.2s]
    run 10 (0 edges on): diverged at step 3 [0.2s]
    run 11 (0 edges on): diverged at step 2 [0.2s]
    run 12 (0 edges on): diverged at step 3 [0.2s]
    run 13 (0 edges on): clean over 20 steps [0.2s]
  -> diverged at run 2 (step 8)

verdict: not-prefetch (confidence 1.000)
next steps:
  explain the drift without prefetch (all-off): the first op that differs:
    bisect-prefetch explain TMP/exp.yaml --mask=all-off --state-dir=TMP/state
runs: 14 launched, 0 reused from the journal; the search's verdict stands on 13 runs; steps: 102
  - all-off diverged (11 of 12 runs): drift happens with every prefetch edge off, so it has another cause
evidence
┏━━━━━━━━━━━┳━━━━━━━━━┳━━━━━━━┳━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━┓
┃ stage     ┃ mask    ┃ edges ┃ runs ┃ diverged ┃ first differing steps             ┃ verdict  ┃
┡━━━━━━━━━━━╇━━━━━━━━━╇━━━━━━━╇━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━┩
│ calibrate │ all-on  │ 4     │ 1    │ 1        │ 15                                │ diverged │
│ check-off │ all-off │ 0     │ 12   │ 11       │ 8, 16, 11, 6, 3, 2, 4, 9, 3, 2, 3 │ diverged │
└───────────┴─────────┴───────┴──────┴──────────┴───────────────────────────────────┴──────────┘
per-run chance 1: drift in about 10 of 10 runs (95% interval 0.025-1), per-step hazard 0.0667, from 1 run that enabled every edge (all-on)
report: TMP/state/sim/report.html
wrote TMP/out.json
"""

INCONCLUSIVE = """\
bisecting sim: 20 steps a run, seed 1, guard none, confidence 0.95, at most 4 runs
running the golden reference (all-off, full length)...
segments: no run measured its start-up and step time (that takes 3 steps or more); one mask a run
checking that all-on diverges...
    run 1 (4 edges on): clean over 20 steps [0.2s]
    run 2 (4 edges on): diverged at step 17 [0.2s]
  -> diverged at run 2 (step 17)
checking that all-off is consistent...
    run 3 (0 edges on): clean over 20 steps [0.2s]
  -> clean (1 run)
testing forward-off...
    run 4 (2 edges on): clean over 20 steps [0.2s]
  -> clean (1 run)

verdict: inconclusive (confidence 0.272)
runs: 5 launched, 0 reused from the journal; the search's verdict stands on 4 runs; steps: 77
  - stopped: the run budget (--max-runs 4) ran out; best guess {fwd:layers.0->layers.1} at probability 0.272
evidence
┏━━━━━━━━━━━┳━━━━━━━━━━━━━┳━━━━━━━┳━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━┓
┃ stage     ┃ mask        ┃ edges ┃ runs ┃ diverged ┃ first differing steps ┃ verdict  ┃
┡━━━━━━━━━━━╇━━━━━━━━━━━━━╇━━━━━━━╇━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━┩
│ calibrate │ all-on      │ 4     │ 2    │ 1        │ 17                    │ diverged │
│ check-off │ all-off     │ 0     │ 1    │ 0        │ -                     │ clean    │
│ search    │ forward-off │ 2     │ 1    │ 0        │ -                     │ clean    │
└───────────┴─────────────┴───────┴──────┴──────────┴───────────────────────┴──────────┘
per-run chance 0.5: drift in about 5 of 10 runs (95% interval 0.0126-0.987), per-step hazard 0.027, from 2 runs that enabled every edge (all-on)
report: TMP/state/sim/report.html
wrote TMP/out.json
"""

INTERRUPTED = """\
bisecting sim: 20 steps a run, seed 1, guard none, confidence 0.95, at most 200 runs
running the golden reference (all-off, full length)...
segments: no run measured its start-up and step time (that takes 3 steps or more); one mask a run
checking that all-on diverges...
    run 1 (4 edges on): diverged at step 18 [0.2s]
  -> diverged at run 1 (step 18)
checking that all-off is consistent...
    run 2 (0 edges on): clean over 20 steps [0.2s]
  -> clean (1 run)
testing forward-off...
    run 3 (2 edges on): diverged at step 6 [0.2s]
  -> diverged at run 3 (step 6)
testing drop-only:bwd:layers.2->layers.1...
interrupted: finished runs are in the journal; to resume, run again:
  bisect-prefetch bisect TMP/exp.yaml --resume --state-dir=TMP/state --json=TMP/out.json
"""

RESUMED = """\
bisecting sim: 20 steps a run, seed 1, guard none, confidence 0.95, at most 200 runs
resuming: 4 finished run(s) in the journal are reused
running the golden reference (all-off, full length)...
segments: no run measured its start-up and step time (that takes 3 steps or more); one mask a run
checking that all-on diverges...
    run 1 (4 edges on): diverged at step 18 [from the journal]
  -> diverged at run 1 (step 18)
checking that all-off is consistent...
    run 2 (0 edges on): clean over 20 steps [from the journal]
  -> clean (1 run)
testing forward-off...
    run 3 (2 edges on): diverged at step 6 [from the journal]
  -> diverged at run 3 (step 6)
testing drop-only:bwd:layers.2->layers.1...
    run 4 (3 edges on): clean over 20 steps [0.2s]
    run 5 (3 edges on): clean over 20 steps [0.2s]
  -> clean (2 runs)
checking that the leading set is enough: keep-only:bwd:layers.2->layers.1 should diverge...
    run 6 (1 edge on): clean over 20 steps [0.2s]
  -> clean (1 run)
testing keep-only:bwd:layers.2->layers.1...
    run 7 (1 edge on): diverged at step 2 [0.2s]
  -> diverged at run 7 (step 2)
double checking the answer: drop-only:bwd:layers.2->layers.1 should be consistent...
    run 8 (3 edges on): clean over 20 steps [0.2s]
    run 9 (3 edges on): clean over 20 steps [0.2s]
    run 10 (3 edges on): clean over 20 steps [0.2s]
    run 11 (3 edges on): clean over 20 steps [0.2s]
    run 12 (3 edges on): clean over 20 steps [0.2s]
  -> clean (5 runs)
ruling out drift without prefetch as strong as the answer's: checking that all-off is consistent...
    run 13 (0 edges on): clean over 20 steps [0.2s]
  -> clean (1 run)

verdict: culprit-found, one cause (confidence 0.972)
cause 1: bwd:layers.2->layers.1 (confidence 0.972; keep-only diverged in run 7 (0008-sim) at step 2; drift in about 8 of 10 runs with it alone on; size-one: not known (no discovery run audited))
next steps:
  reproduce cause 1 alone (keep-only):
    bisect-prefetch aa TMP/exp.yaml --runs=3 '--mask=keep-only:bwd:layers.2->layers.1' --state-dir=TMP/state
  check the fix (drop-only of the cause):
    bisect-prefetch aa TMP/exp.yaml --runs=3 '--mask=drop-only:bwd:layers.2->layers.1' --state-dir=TMP/state
  explain cause 1: the first op that differs:
    bisect-prefetch explain TMP/exp.yaml '--mask=keep-only:bwd:layers.2->layers.1' --state-dir=TMP/state
runs: 10 launched, 4 reused from the journal; the search's verdict stands on 13 runs; steps: 226
  - keep-only:bwd:layers.2->layers.1 diverged (run 7, step 2): the set is enough for drift
  - drop-only:bwd:layers.2->layers.1: 7 runs, all consistent: removing the set removes drift
  - all-off and drop-only:bwd:layers.2->layers.1 after the search: 8 runs (counting the golden run as 1: the steps runs matched), all consistent: drift without
prefetch at a per-run chance of 0.312 or more is ruled out at 95%; as strong as the answer's (0.4), it would have shown at 98.3%
evidence
┏━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━┳━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━┓
┃ stage       ┃ mask                             ┃ edges ┃ runs ┃ diverged ┃ first differing steps ┃ verdict  ┃
┡━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━╇━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━┩
│ calibrate   │ all-on                           │ 4     │ 1    │ 1        │ 18                    │ diverged │
│ check-off   │ all-off                          │ 0     │ 1    │ 0        │ -                     │ clean    │
│ search      │ forward-off                      │ 2     │ 1    │ 1        │ 6                     │ diverged │
│ search      │ drop-only:bwd:layers.2->layers.1 │ 3     │ 2    │ 0        │ -                     │ clean    │
│ leading-set │ keep-only:bwd:layers.2->layers.1 │ 1     │ 1    │ 0        │ -                     │ clean    │
│ search      │ keep-only:bwd:layers.2->layers.1 │ 1     │ 1    │ 1        │ 2                     │ diverged │
│ drop-only   │ drop-only:bwd:layers.2->layers.1 │ 3     │ 5    │ 0        │ -                     │ clean    │
│ check-off   │ all-off                          │ 0     │ 1    │ 0        │ -                     │ clean    │
└─────────────┴──────────────────────────────────┴───────┴──────┴──────────┴───────────────────────┴──────────┘
per-run chance 0.75: drift in about 8 of 10 runs (95% interval 0.194-0.994), per-step hazard 0.0652, from 4 runs that enabled the set
report: TMP/state/sim/report.html
wrote TMP/out.json
"""

# Two slots: titles are said when a run is asked, run lines when it is heard (the shorter
# first), and each verdict line names its stage.
TWO_SLOTS = """\
bisecting sim: 20 steps a run, seed 1, guard none, confidence 0.95, at most 200 runs
running the golden reference (all-off, full length)...
segments: no run measured its start-up and step time (that takes 3 steps or more); one mask a run
checking that all-on diverges...
testing forward-off...
    run 1 (2 edges on): diverged at step 6 [0.2s]
checking that all-off is consistent...
    run 2 (4 edges on): diverged at step 18 [0.2s]
  -> testing forward-off: diverged at run 1 (step 6)
testing drop-only:bwd:layers.2->layers.1...
    run 3 (0 edges on): clean over 20 steps [0.2s]
  -> checking that all-on diverges: diverged at run 2 (step 18)
    run 4 (3 edges on): clean over 20 steps [0.2s]
  -> checking that all-off is consistent: clean (1 run)
testing keep-only:bwd:layers.2->layers.1...
    run 5 (3 edges on): clean over 20 steps [0.2s]
checking that the leading set is enough: keep-only:bwd:layers.2->layers.1 should diverge...
    run 6 (1 edge on): diverged at step 19 [0.2s]
  -> testing drop-only:bwd:layers.2->layers.1: clean (2 runs)
double checking the answer: drop-only:bwd:layers.2->layers.1 should be consistent...
    run 7 (1 edge on): clean over 20 steps [0.2s]
  -> testing keep-only:bwd:layers.2->layers.1: diverged at run 6 (step 19)
testing drop-only:bwd:layers.2->layers.1...
    run 8 (3 edges on): clean over 20 steps [0.2s]
  -> checking that the leading set is enough: keep-only:bwd:layers.2->layers.1 should diverge: clean (1 run)
double checking the answer: drop-only:bwd:layers.2->layers.1 should be consistent...
    run 9 (3 edges on): clean over 20 steps [0.2s]
  -> double checking the answer: drop-only:bwd:layers.2->layers.1 should be consistent: clean (1 run)
    run 10 (3 edges on): clean over 20 steps [0.2s]
  -> testing drop-only:bwd:layers.2->layers.1: clean (1 run)
    run 11 (3 edges on): clean over 20 steps [0.2s]
testing drop-only:bwd:layers.2->layers.1...
    run 12 (3 edges on): clean over 20 steps [0.2s]
ruling out drift without prefetch as strong as the answer's: checking that all-off is consistent...
    run 13 (3 edges on): clean over 20 steps [0.2s]
  -> double checking the answer: drop-only:bwd:layers.2->layers.1 should be consistent: clean (3 runs)
    run 14 (0 edges on): clean over 20 steps [0.2s]
  -> testing drop-only:bwd:layers.2->layers.1: clean (1 run)
testing drop-only:bwd:layers.2->layers.1...
    run 15 (0 edges on): clean over 20 steps [0.2s]
  -> ruling out drift without prefetch as strong as the answer's: checking that all-off is consistent: clean (2 runs)

verdict: culprit-found, one cause (confidence 0.976)
cause 1: bwd:layers.2->layers.1 (confidence 0.976; keep-only diverged in run 6 (0008-sim) at step 19; drift in about 8 of 10 runs with it alone on; size-one: not known (no discovery run audited))
next steps:
  reproduce cause 1 alone (keep-only):
    bisect-prefetch aa TMP/exp.yaml --runs=3 '--mask=keep-only:bwd:layers.2->layers.1' --state-dir=TMP/state
  check the fix (drop-only of the cause):
    bisect-prefetch aa TMP/exp.yaml --runs=3 '--mask=drop-only:bwd:layers.2->layers.1' --state-dir=TMP/state
  explain cause 1: the first op that differs:
    bisect-prefetch explain TMP/exp.yaml '--mask=keep-only:bwd:layers.2->layers.1' --state-dir=TMP/state
runs: 17 launched, 0 reused from the journal; the search's verdict stands on 15 runs; steps: 283
  - keep-only:bwd:layers.2->layers.1 diverged (run 6, step 19): the set is enough for drift
  - drop-only:bwd:layers.2->layers.1: 8 runs, all consistent: removing the set removes drift
  - all-off and drop-only:bwd:layers.2->layers.1 after the search: 8 runs (counting the golden run as 1: the steps runs matched), all consistent: drift without
prefetch at a per-run chance of 0.312 or more is ruled out at 95%; as strong as the answer's (0.4), it would have shown at 98.3%
evidence
┏━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━┳━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━┓
┃ stage       ┃ mask                             ┃ edges ┃ runs ┃ diverged ┃ first differing steps ┃ verdict  ┃
┡━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━╇━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━┩
│ search      │ forward-off                      │ 2     │ 1    │ 1        │ 6                     │ diverged │
│ calibrate   │ all-on                           │ 4     │ 1    │ 1        │ 18                    │ diverged │
│ check-off   │ all-off                          │ 0     │ 1    │ 0        │ -                     │ clean    │
│ search      │ drop-only:bwd:layers.2->layers.1 │ 3     │ 2    │ 0        │ -                     │ clean    │
│ search      │ keep-only:bwd:layers.2->layers.1 │ 1     │ 1    │ 1        │ 19                    │ diverged │
│ leading-set │ keep-only:bwd:layers.2->layers.1 │ 1     │ 1    │ 0        │ -                     │ clean    │
│ drop-only   │ drop-only:bwd:layers.2->layers.1 │ 3     │ 1    │ 0        │ -                     │ clean    │
│ search      │ drop-only:bwd:layers.2->layers.1 │ 3     │ 1    │ 0        │ -                     │ clean    │
│ drop-only   │ drop-only:bwd:layers.2->layers.1 │ 3     │ 3    │ 0        │ -                     │ clean    │
│ search      │ drop-only:bwd:layers.2->layers.1 │ 3     │ 1    │ 0        │ -                     │ clean    │
│ check-off   │ all-off                          │ 0     │ 2    │ 0        │ -                     │ clean    │
└─────────────┴──────────────────────────────────┴───────┴──────┴──────────┴───────────────────────┴──────────┘
per-run chance 0.75: drift in about 8 of 10 runs (95% interval 0.194-0.994), per-step hazard 0.0476, from 4 runs that enabled the set
report: TMP/state/sim/report.html
wrote TMP/out.json
"""

# Segments: the golden run measured a start-up of 40 steps, so a run holds up to 10 masks.
SEGMENTS = """\
bisecting sim: 20 steps a run, seed 1, guard none, confidence 0.95, at most 200 runs
running the golden reference (all-off, full length)...
checking that all-on diverges (and how often, for segments)...
    run 1 (4 edges on): diverged at step 18 [0.2s]
  -> diverged at run 1 (step 18)
checking that all-off is consistent...
    run 2 (0 edges on): clean over 20 steps [0.2s]
  -> clean (1 run)
segments: a start-up costs 40 steps' worth of time; a run holds up to 3 masks of 20 steps each (search/segments.py)
running the golden reference again, 60 steps: as long as the longest run...
    run 3 (3 segments, 2 edges on first): diverged at step 6 [0.2s]
    run 4 (3 segments, 3 edges on first): clean over 60 steps [0.2s]
  -> testing forward-off: diverged at run 3 (step 6)
  -> testing drop-only:bwd:layers.2->layers.1: clean (2 runs)
    run 5 (3 segments, 1 edge on first): diverged at step 19 [0.2s]
  -> checking that the leading set is enough: keep-only:bwd:layers.2->layers.1 should diverge: clean (1 run)
    run 6 (3 segments, 3 edges on first): clean over 60 steps [0.2s]
  -> testing keep-only:bwd:layers.2->layers.1: diverged at run 5 (step 19)
    run 7 (2 segments, 3 edges on first): clean over 40 steps [0.2s]
  -> double checking the answer: drop-only:bwd:layers.2->layers.1 should be consistent: clean (5 runs)

verdict: culprit-found, one cause (confidence 0.977)
cause 1: bwd:layers.2->layers.1 (confidence 0.977; keep-only diverged in run 5 (0007-sim) at step 19; drift in about 8 of 10 runs with it alone on; size-one: not known (no discovery run audited))
next steps:
  reproduce cause 1 alone (keep-only):
    bisect-prefetch aa TMP/exp.yaml --runs=3 '--mask=keep-only:bwd:layers.2->layers.1' --state-dir=TMP/state
  check the fix (drop-only of the cause):
    bisect-prefetch aa TMP/exp.yaml --runs=3 '--mask=drop-only:bwd:layers.2->layers.1' --state-dir=TMP/state
  explain cause 1: the first op that differs:
    bisect-prefetch explain TMP/exp.yaml '--mask=keep-only:bwd:layers.2->layers.1' --state-dir=TMP/state
runs: 9 launched, 0 reused from the journal; the search's verdict stands on 12 trials in 7 runs (a trial: one mask's segment of a run, several masks a run); steps: 223
  - keep-only:bwd:layers.2->layers.1 diverged (run 5, step 19): the set is enough for drift
  - drop-only:bwd:layers.2->layers.1: 7 runs, all consistent: removing the set removes drift
  - all-off and drop-only:bwd:layers.2->layers.1 after the search: 9 runs (counting the golden run as 3: the steps runs matched), all consistent: drift without
prefetch at a per-run chance of 0.283 or more is ruled out at 95%; as strong as the answer's (0.4), it would have shown at 99.0%
evidence
┏━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━┳━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━┓
┃ stage       ┃ mask                             ┃ edges ┃ runs ┃ diverged ┃ first differing steps ┃ verdict  ┃
┡━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━╇━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━┩
│ calibrate   │ all-on                           │ 4     │ 1    │ 1        │ 18                    │ diverged │
│ check-off   │ all-off                          │ 0     │ 1    │ 0        │ -                     │ clean    │
│ search      │ forward-off                      │ 2     │ 1    │ 1        │ 6                     │ diverged │
│ search      │ drop-only:bwd:layers.2->layers.1 │ 3     │ 2    │ 0        │ -                     │ clean    │
│ leading-set │ keep-only:bwd:layers.2->layers.1 │ 1     │ 1    │ 0        │ -                     │ clean    │
│ search      │ keep-only:bwd:layers.2->layers.1 │ 1     │ 1    │ 1        │ 19                    │ diverged │
│ drop-only   │ drop-only:bwd:layers.2->layers.1 │ 3     │ 5    │ 0        │ -                     │ clean    │
└─────────────┴──────────────────────────────────┴───────┴──────┴──────────┴───────────────────────┴──────────┘
per-run chance 0.75: drift in about 8 of 10 runs (95% interval 0.194-0.994), per-step hazard 0.0476, from 4 runs that enabled the set
report: TMP/state/sim/report.html
wrote TMP/out.json
"""


def lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]  # rich pads a table title line


def test_culprit_found(tmp_path):
    code, text = run_command(tmp_path, Simulation([CULPRIT]))
    assert lines(text) == lines(CULPRIT_FOUND)
    assert code == 1
    data = json.loads((tmp_path / "out.json").read_text())
    assert (data["verdict"], data["minimal_set"], data["runs_used"]) == ("culprit-found", [CULPRIT], 13)
    assert data["facts"][0].startswith(f"keep-only:{CULPRIT} diverged (run 7, step 19)")
    assert data == json.loads((tmp_path / "state" / "sim" / "bisect.json").read_text())
    # One cause: reproduce is its keep-only step; no guard step where nothing was audited.
    assert [s["step"] for s in data["next_steps"]] == ["reproduce", "fix", "explain"]
    assert data["reproduce"] == data["next_steps"][0]["command"]
    assert data["culprit_sets"][0]["size_one"] is None and data["size_one_edges"] is None


def test_no_drift_reproduced(tmp_path):
    code, text = run_command(tmp_path, Simulation([]), max_runs=16)
    assert lines(text) == lines(NO_DRIFT)
    assert code == 0


def test_not_prefetch(tmp_path):
    code, text = run_command(tmp_path, Simulation([], background=0.9))
    assert lines(text) == lines(NOT_PREFETCH)
    assert code == 1


def test_inconclusive(tmp_path):
    code, text = run_command(tmp_path, Simulation(["fwd:layers.0->layers.1"]), max_runs=4)
    assert lines(text) == lines(INCONCLUSIVE)
    assert code == 1


def test_three_edges_needed_together(tmp_path):
    culprits = ["fwd:layers.0->layers.1", "fwd:layers.1->layers.2", "bwd:layers.2->layers.1"]
    code, text = run_command(tmp_path, Simulation(culprits, together=True))
    assert code == 1
    data = json.loads((tmp_path / "out.json").read_text())
    assert (data["verdict"], sorted(data["minimal_set"])) == ("culprit-found", sorted(culprits))
    assert "reducing the 3 edges every diverged run enabled: testing" in text
    assert data["facts"][1].startswith("each edge of the set is needed: runs with the rest of the set")


def test_two_independent_causes(tmp_path):
    second = "fwd:layers.0->layers.1"
    code, text = run_command(tmp_path, Simulation([CULPRIT, second], q=0.7))
    assert code == 1
    said = lines(text)
    assert ("  two diverged runs share no edge, and all-off diverges far less often than the runs "
            "without the leading set: more than one cause; round 2: the 2 edges of the "
            "smallest diverged mask first, every other edge off") in said
    assert (f"  cause 1: {{{CULPRIT}}}; drift may remain without it: round 3: the other 3 edges with "
            "cause 1 off") in said
    head = next(i for i, line in enumerate(said) if line.startswith("verdict: "))
    assert said[head].startswith("verdict: culprit-found, 2 independent causes, each enough alone")
    assert said[head + 1].startswith(f"cause 1: {CULPRIT} (confidence ")
    assert said[head + 2].startswith(f"cause 2: {second} (confidence ")
    assert said[head + 3] == "next steps:"
    data = json.loads((tmp_path / "out.json").read_text())
    assert f"'--mask=drop-only:{CULPRIT},{second}'" in data["reproduce"]  # the whole fix
    # Next steps: each cause alone, the whole fix, each cause explained; all in the state dir.
    steps = data["next_steps"]
    assert [(s["step"], s["cause"]) for s in steps] == [
        ("reproduce", 1), ("reproduce", 2), ("fix", None), ("explain", 1), ("explain", 2)]
    assert f"'--mask=keep-only:{second}'" in steps[1]["command"]
    assert steps[2]["command"] == data["reproduce"]
    assert all(s["command"].endswith(f"--state-dir={tmp_path / 'state'}") for s in steps)
    assert all(f"    {s['command'].replace(str(tmp_path), 'TMP')}" in said for s in steps)
    assert [c["edges"] for c in data["culprit_sets"]] == [[CULPRIT], [second]]
    assert data["minimal_set"] == [CULPRIT] and data["confidence"] >= 0.95
    assert data["facts"][0].startswith(f"2 independent causes: {{{CULPRIT}}} (keep-only diverged, run ")
    union = re.search(r"with all of them off \(drop-only of the union\): (\d+) runs consistent$", data["facts"][0])
    assert union and int(union[1]) >= 3, data["facts"][0]
    for found in data["culprit_sets"]:  # the runs are the transcript's
        assert all(f"    run {n} (1 edge on): diverged at step" in text for n in found["keep_only_runs"])
    assert [d["run"] for d in data["run_details"]] == list(range(1, len(data["run_details"]) + 1))


def test_localization_steers_the_search_and_is_said(tmp_path):
    code, text = run_command(tmp_path, Simulation([CULPRIT], localized="layers.1"))
    data = json.loads((tmp_path / "out.json").read_text())
    assert (data["verdict"], data["minimal_set"]) == ("culprit-found", [CULPRIT])
    said = ("  localization points at layers.1: the search weighs fwd:layers.0->layers.1, "
            "bwd:layers.2->layers.1 first (a hint the runs can overrule)")
    assert said in lines(text)
    assert data["hints"][0] == {"event": "hint", "unit": "layers.1",
                                "edges": ["fwd:layers.0->layers.1", "bwd:layers.2->layers.1"]}
    # The same runs without the hint: the hint reorders the search, so the runs differ.
    _, plain = run_command(tmp_path / "plain", Simulation([CULPRIT]))
    assert "localization points at" not in plain
    assert json.loads((tmp_path / "plain" / "out.json").read_text())["evidence"] != data["evidence"]


def test_a_unit_the_graph_lacks_is_ignored_and_said(tmp_path):
    code, text = run_command(tmp_path, Simulation([CULPRIT], localized="decoder.layers.99"))
    assert ("  localization points at decoder.layers.99, which no edge of the graph touches: "
            "hint ignored") in lines(text)
    assert json.loads((tmp_path / "out.json").read_text())["verdict"] == "culprit-found"


def test_interrupted_then_resumed(tmp_path):
    simulation = Simulation([CULPRIT], interrupt_after=4)  # the golden run and three more
    code, text = run_command(tmp_path, simulation)
    assert code == "interrupted"
    assert lines(text) == lines(INTERRUPTED)
    # What was learned is kept, unfinished.
    saved = json.loads((tmp_path / "state" / "sim" / "bisect.json").read_text())
    assert (saved["verdict"], saved["finished"], saved["runs_used"]) == ("inconclusive", False, 3)
    assert saved["facts"][0].startswith("not finished; best guess")

    simulation.interrupt_after = None
    code, text = run_command(tmp_path, simulation, resume=True)
    assert lines(text) == lines(RESUMED)
    assert code == 1
    data = json.loads((tmp_path / "out.json").read_text())
    assert (data["runs_launched"], data["runs_reused"]) == (10, 4)


def test_every_printed_command_carries_the_options_given_and_the_resume_ends_as_the_search(tmp_path):
    """The resume line after `bisect --no-reuse ...` keeps --no-reuse and every other option
    (it used to drop them, and the resumed search ended inconclusive); reproduce and explain
    carry those their commands take."""
    given = {"reuse": False, "segments": "off", "stress": "off", "executor": "local", "slots": 1}
    simulation = Simulation([CULPRIT], interrupt_after=4)
    code, text = run_command(tmp_path, simulation, **given)
    assert code == "interrupted"
    assert lines(text)[-1] == ("  bisect-prefetch bisect TMP/exp.yaml --resume --state-dir=TMP/state "
                               "--executor=local --slots=1 --stress=off --segments=off --no-reuse "
                               "--json=TMP/out.json")
    simulation.interrupt_after = None
    code, text = run_command(tmp_path, simulation, resume=True, **given)  # that line, as given
    assert code == 1 and lines(text)[lines(text).index("next steps:") - 2].startswith(
        "verdict: culprit-found")
    assert "resuming: 4 finished run(s) in the journal are reused" in lines(text)
    mask = f"'--mask=keep-only:{CULPRIT}'"
    assert (f"    bisect-prefetch aa TMP/exp.yaml --runs=3 {mask} --state-dir=TMP/state "
            "--executor=local --slots=1 --stress=off --no-reuse") in lines(text)
    assert (f"    bisect-prefetch explain TMP/exp.yaml {mask} --stress=off "
            "--state-dir=TMP/state") in lines(text)


def test_a_bisection_begun_before_several_causes_resumes_as_one_cause(tmp_path):
    second = "fwd:layers.0->layers.1"
    simulation = Simulation([CULPRIT, second], q=0.7, interrupt_after=6)
    assert run_command(tmp_path, simulation)[0] == "interrupted"
    saved = tmp_path / "state" / "sim" / "bisect.json"
    data = json.loads(saved.read_text())
    assert data["search_kind"] == "every-cause"
    del data["search_kind"], data["culprit_sets"]  # as a version before several causes wrote it
    saved.write_text(json.dumps(data))
    simulation.interrupt_after = None
    code, text = run_command(tmp_path, simulation, resume=True)
    assert ("this bisection was begun by a version that searches for one cause: it replays as one "
            "(a new --state-dir searches for every cause)") in lines(text)
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["search_kind"] == "one-cause" and data["culprit_sets"] == []
    assert len(data["minimal_set"]) == 1 and "narrowed" not in text
    # A fresh state dir searches for every cause.
    _, again = run_command(tmp_path / "new", Simulation([CULPRIT, second], q=0.7))
    assert len(json.loads((tmp_path / "new" / "out.json").read_text())["culprit_sets"]) == 2


def test_a_golden_run_that_drifted_is_replaced_and_every_run_read_again(tmp_path):
    # The golden run drifted at step 9: every run differs from it there, all-off too.
    code, text = run_command(tmp_path, Simulation([CULPRIT], golden_drifts_at=9))
    said = lines(text)
    assert ("  the golden run itself drifted at step 9: 2 runs first differed from it there, an "
            "all-off one among them, and none matched it past step 8. They count as clean "
            "through step 8, the golden run as an all-off run that drifted, and the search "
            "reads every run again; running a new golden reference...") in said
    data = json.loads((tmp_path / "out.json").read_text())
    assert (data["verdict"], data["minimal_set"]) == ("culprit-found", [CULPRIT])
    assert data["golden_drifts"] == [{"step": 9, "runs": 2}]
    journal = (tmp_path / "state" / "sim" / "journal.jsonl").read_text()
    assert journal.count('"search-golden1+') == 1


def test_a_stage_that_ends_on_a_run_says_its_verdict_before_the_next_stage(tmp_path):
    code, text = run_command(tmp_path, Simulation([CULPRIT, "fwd:layers.0->layers.1"], q=0.7))
    said = lines(text)
    ended = [i for i, line in enumerate(said) if line.startswith(("  cause 1:", "  two diverged runs"))]
    assert ended, text
    for i in ended:  # the run's own line, then its stage's verdict, then the notice
        assert said[i - 1].startswith("  -> ") and said[i - 2].startswith("    run "), said[i - 2:i + 1]


def test_two_slots(tmp_path):
    code, text = run_command(tmp_path, Simulation([CULPRIT], slots=2))
    assert lines(text) == lines(TWO_SLOTS)
    assert code == 1


def test_segments(tmp_path):
    code, text = run_command(tmp_path, Simulation([CULPRIT], startup_steps=40), segments="auto")
    assert lines(text) == lines(SEGMENTS)
    assert code == 1
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["segments"]["used"] and (data["segments"]["startups"], data["runs_used"]) == (7, 12)
    assert [len(d["schedule"]) for d in data["run_details"] if "schedule" in d] == [3, 3, 3, 3, 2]


def test_segments_where_one_mask_a_run_costs_less(tmp_path):
    """A cheap start-up and drift in most all-on runs: a long golden run would be spent and
    few start-ups saved, so segments auto runs one mask a run, and says why."""
    code, text = run_command(tmp_path, Simulation([CULPRIT], startup_steps=5), segments="auto")
    assert lines(text)[2:9] == [
        "checking that all-on diverges (and how often, for segments)...",
        "    run 1 (4 edges on): diverged at step 18 [0.2s]",
        "  -> diverged at run 1 (step 18)",
        "checking that all-off is consistent...",
        "    run 2 (0 edges on): clean over 20 steps [0.2s]",
        "  -> clean (1 run)",
        "segments: a start-up costs 5 steps' worth of time and drift shows in 0.81 of all-on "
        "runs (1 run): one mask a run costs less (search/segments.py)"]
    assert code == 1
    data = json.loads((tmp_path / "out.json").read_text())
    assert not data["segments"]["used"] and data["segments"]["startups"] == data["runs_used"]
    assert data["minimal_set"] == [CULPRIT]


def test_a_second_bisection_without_resume_is_refused(tmp_path):
    simulation = Simulation([CULPRIT], interrupt_after=2)
    run_command(tmp_path, simulation)
    with pytest.raises(BisectPrefetchError, match="continue it with: bisect-prefetch bisect .* --resume"):
        run_command(tmp_path, simulation)


# -- wording of the facts the transcripts above do not reach ------------------------------------
A, B, C = "fwd:layers.0->layers.1", "bwd:layers.2->layers.1", "fwd:layers.3->layers.4"


@pytest.mark.parametrize("fact, words", [
    (v.Causes(((A,), (B,)), keep_only=((5, 3), (12, 7)), union_clean=9, union_diverged=0),
     f"2 independent causes: {{{A}}} (keep-only diverged, run 5, step 3), {{{B}}} (keep-only "
     "diverged, run 12, step 7); with all of them off (drop-only of the union): 9 runs consistent"),
    (v.Causes(((A,),), keep_only=((5, 3),), union_clean=1, union_diverged=2, remains=True),
     f"one cause: {{{A}}} (keep-only diverged, run 5, step 3); drift remains with it off: another "
     "cause not yet found (2 runs of drop-only of the union diverged)"),
    (v.Causes(((A,), (B, C)), keep_only=((5, 3), (12, 7)), union_clean=8, union_diverged=1,
              background=0.97),
     f"2 independent causes: {{{A}}} (keep-only diverged, run 5, step 3), {{{B},{C}}} (keep-only "
     "diverged, run 12, step 7); drift left with all of them off (1 of 9 runs of drop-only of the "
     "union) is background drift, no further cause, at probability 0.970"),
    (v.EachNeeded((A, B), clean_without=(1, 3)),  # runs without A, without B
     f"each edge of the set is needed: 3 runs enabling {A} without {B} and 1 run enabling {B} "
     f"without {A} stayed consistent"),
    (v.EachNeeded((A, B, C), clean_without=(20, 18, 25), chance=0.012),
     f"each edge of the set is needed: runs with the rest of the set but not the edge stayed "
     f"consistent ({A}: 20, {B}: 18, {C}: 25); the chance that one of them was not needed after "
     "all is 0.012"),
    (v.DropOnlyDiverges((A,), all_off_clean=4),
     f"drop-only:{A} still diverges while all-off stayed consistent (4 runs): another set of "
     "edges causes drift too"),
    (v.DropOnlyFailed((A, B), errors=3), f"drop-only:{A},{B} could not be run (3 failed)"),
    (v.DropOnlyNotRun((A,)), f"drop-only:{A} was not run: the run budget ran out"),
    (v.Stopped("all-unresolved", edges=(), chance=0.5),
     "stopped: every informative mask is unresolved; best guess no edge (drift without prefetch) "
     "at probability 0.500"),
    (v.BackgroundRuledOut((B,), runs=5, chance=1 - 0.05 ** (1 / 5), strength=0.3),
     f"all-off and drop-only:{B} after the search: 5 runs, all consistent: drift without prefetch "
     "at a per-run chance of 0.451 or more is ruled out at 95% (the answer's: 0.3; "
     "search.all_off_runs: auto would rule out drift as strong as the answer's)"),
    (v.BackgroundRuledOut((B,), runs=11, chance=1 - 0.05 ** (1 / 11), strength=0.3),
     f"all-off and drop-only:{B} after the search: 11 runs, all consistent: drift without prefetch "
     "at a per-run chance of 0.238 or more is ruled out at 95%; as strong as the answer's (0.3), "
     "it would have shown at 98.0%"),
    (v.Background(runs=13, divergences=1, chance=0.0282),
     "all-off diverged too (1 of 13 runs): drift without prefetch at a per-run chance of about 0.0282, "
     "and the set's stands clearly above it"),
    (v.Stopped("keep-only-never-completed", edges=(B,), chance=0.96),
     "stopped: keep-only of the answer never completed a run; best guess {" + B + "} at "
     "probability 0.960"),
])
def test_fact_wording(fact, words):
    assert bisect_verdict_words.fact_line(fact, confidence=0.95) == words


def test_stage_titles():
    assert bisect_words.stage_title(STAGE_CHECK_OFF, "all-off", (A,), AFTER_DROP_ONLY_DIVERGED) == (
        "drop-only still diverges: checking that all-off is consistent")
    assert bisect_words.stage_title(KEEP_ONLY, "x", (A, B), None) == (
        f"double checking the answer: keep-only:{A},{B} should diverge")
    # Before any answer is confirmed, keep-only of the leading set is a stage of its own.
    assert bisect_words.stage_title(STAGE_LEADING, "x", (A,), None) == (
        f"checking that the leading set is enough: keep-only:{A} should diverge")
    assert bisect_words.stage_title(STAGE_LEADING, "all-off", (), None) == (
        "checking the leading answer, drift without prefetch: all-off should diverge")
    # An answer of none: drift without prefetch or several causes; no cause left after one.
    assert bisect_words.stage_title(STAGE_CHECK_OFF, "all-off", (), BACKGROUND_PARITY) == (
        "drift without prefetch, or several causes? checking that all-off diverges as often as "
        "the other runs")
    assert bisect_words.stage_title(STAGE_CALIBRATE, "all-on", (), NO_CAUSE_HERE) == (
        "no cause left among these edges? checking that all-on stays consistent")


if __name__ == "__main__":
    # `python -m tests.commands.test_bisect_transcripts` prints every transcript as the search decides now:
    # after a change of its decisions, check them and paste them into the constants above.
    import tempfile

    def show(name: str, text: str) -> None:
        print(f"{name} = \"\"\"\\\n" + "\n".join(lines(text)) + "\n\"\"\"\n")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        show("CULPRIT_FOUND", run_command(root / "a", Simulation([CULPRIT]))[1])
        show("NO_DRIFT", run_command(root / "b", Simulation([]), max_runs=16)[1])
        show("NOT_PREFETCH", run_command(root / "c", Simulation([], background=0.9))[1])
        show("INCONCLUSIVE", run_command(root / "d", Simulation(["fwd:layers.0->layers.1"]),
                                         max_runs=4)[1])
        simulation = Simulation([CULPRIT], interrupt_after=4)
        show("INTERRUPTED", run_command(root / "e", simulation)[1])
        simulation.interrupt_after = None
        show("RESUMED", run_command(root / "e", simulation, resume=True)[1])
        show("TWO_SLOTS", run_command(root / "f", Simulation([CULPRIT], slots=2))[1])
        show("SEGMENTS", run_command(root / "g", Simulation([CULPRIT], startup_steps=40),
                                     segments="auto")[1])
