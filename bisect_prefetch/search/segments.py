"""Segments: several masks in one training run, each one trial of the search.

Why. A run pays its start-up (launch, rendezvous, model build, compile) once,
and a run that stays clean under one mask has told all it can about that mask
after some steps. A mask changes only when parameters are unsharded, not what
is computed, and every run is compared with one golden all-off trajectory, so
the mask may change between steps inside a run: each step tests the mask it
ran under, and a run ends at its first divergence or at the step cap. Start-ups
are then paid about once per divergence instead of once per trial.

Planning (`plan_run`). The segments of a run are planned before it starts,
each as if those before it came back clean: the mask of segment k+1 matters
only if segments 1..k were clean, so planning them ahead is exactly what a
live choice would do, with no channel from the orchestrator into the job. A
copy of the search records each planned segment as clean and is asked for the
next.

Lengths (`Lengths`). A check (all-on in calibration, all-off, keep-only,
drop-only, the reduce stage) runs a full run's steps, so every count of clean
runs the checks rely on (issue 12's guarantees: background controls, drop-only
runs, calibration) stays a count of full runs. A search segment runs
`segment_steps` steps and counts as that share of a run: a clean one adds its
share of a run to the clean runs of its edges (the posterior's constant
per-step hazard), a diverged one a divergence, and the budget counts shares.

Reading a run (`record_run`). Segments wholly before the first differing step
t were clean; the one holding t diverged; later ones never ran. Drift in step
t-1's backward shows in step t's loss, so where t is the first step of a
segment, the divergence counts against both masks (their union, the weaker
evidence) and a notice says so. A failed run tells nothing: its first segment
takes the failure, the rest are cancelled.

Cost model (`lengths_for`). A search costs start-ups x S (a start-up's time in
steps, measured) + steps, and segments are used only where the model says they
cost less than one mask a run; elsewhere the cap is one run (cap == steps_per_run:
one mask a run). Both ways run the same trials, a full run's steps each, so only
what differs is counted, in runs of T steps at a per-run chance q (measured on
all-on runs; CHANCE where none was):
- K = ln(alpha/2) / ln(1 - q) background control runs (about 10 at q = 0.3);
- M other trials: CHECK_RUNS of checks and SEARCH_RUNS of search at q = 0.3 on 67
  edges, the search scaled by the bits that name one set or pair of the graph's
  edges, all scaled by the bits a run tells at q against 0.3 (Z-channel capacity);
- one mask a run: a start-up for each of the M + K - 1 runs besides the golden one,
  and K - 1 control runs' steps;
- a cap of C runs: the golden run again at C runs (a start-up and C x T steps),
  which stands in for C control runs, so max(0, K - C) control runs are left; of
  the M + K - C trials a run holds E = (1 - (1-p)^C) / p, a trial diverging at
  p = q/2 (a trial's mask enables the culprit about half the time), each start-up.
C is the cheapest in 2..CONTROL_RUNS + GOLDEN_SHARE x (M + K) (past the controls the
golden run adds at most that share of the search's runs); where no C costs less
than one mask a run, one mask a run. Where drift shows in most runs (q high) few
trials are clean and few controls are needed: a long golden run is spent and
segments save few start-ups, so one mask a run wins unless a start-up is dear. A
start-up that costs nothing gets one mask a run, and so does drift without prefetch
(all-off drifted): a golden run many runs long would drift itself, and such a search
ends soon (not-prefetch) or must measure that drift run by run. A search segment is a full run's
steps (SEGMENT_SHARE): shorter segments were measured to cost steps and save no
start-ups under the search's unknown q. bench_search: docs/segments.md.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.search.interface import Search
from bisect_prefetch.search.oracle import RunResult
from bisect_prefetch.search.runlog import Ask, matched_steps
from bisect_prefetch.search.stats import z_channel_capacity
from bisect_prefetch.vocab import (
    DROP_ONLY,
    KEEP_ONLY,
    OK,
    STAGE_CALIBRATE,
    STAGE_CHECK_OFF,
    STAGE_LEADING,
    STAGE_REDUCE,
    Mask,
)

# A search segment's share of a run. 20 searches at q = 0.3, S = 50, cap 500 (same
# seeds): segments of 20, 50 and 100 steps took 5205, 4952 and 4700 median steps
# (one mask a run: 4700) for 14.5, 14 and 14 start-ups: a short segment tells less
# per step about a q the search does not know, and diverges no sooner per step.
SEGMENT_SHARE = 1.0
MIN_SEGMENT_STEPS = 2
# What one mask a run takes at q = 0.3 on 67 edges (bench_search, mean runs by stage):
# background controls, other checks (calibration, all-off, keep-only, drop-only), search.
CONTROL_RUNS = 10
CHECK_RUNS = 7
SEARCH_RUNS = 33
EXPECTED_EDGES = 67
CHANCE = 0.3  # the per-run chance the cost model assumes where no all-on run measured one
CONTROL_ALPHA = 0.05  # the background controls' strength: K = ln(alpha/2) / ln(1 - q) runs
MASK_SHARE = 0.5  # the share of trials whose mask enables the culprit
GOLDEN_SHARE = 0.1  # the golden run's steps past CONTROL_RUNS: at most this share of the search's
FULL_LENGTH_STAGES = (STAGE_CALIBRATE, STAGE_CHECK_OFF, STAGE_LEADING, KEEP_ONLY, DROP_ONLY, STAGE_REDUCE)
SEGMENTS_MODES = ("auto", "off")


@dataclass(frozen=True)
class Lengths:
    """How long a run's segments are: a check a full run, a search segment `segment_steps`."""

    steps_per_run: int
    segment_steps: int
    cap_steps: int

    def __post_init__(self) -> None:
        if not 1 <= self.segment_steps <= self.steps_per_run <= self.cap_steps:
            raise BisectPrefetchError(
                f"segment lengths must satisfy 1 <= segment ({self.segment_steps}) <= run "
                f"({self.steps_per_run}) <= cap ({self.cap_steps}) steps")

    def of(self, ask: Ask) -> int:
        return self.steps_per_run if ask.stage in FULL_LENGTH_STAGES else self.segment_steps


def lengths_for(steps_per_run: int, startup_steps: float, edges: int = EXPECTED_EDGES,
                chance: float | None = None, background: bool = False) -> Lengths:
    """The cost model (module docstring): segment length and step cap for runs of
    `steps_per_run` steps whose start-up costs `startup_steps` steps' worth of time, on a
    graph of `edges` edges, at a per-run chance of drift `chance` (None: CHANCE); a cap of
    one run (one mask a run) wherever segments would not cost less, and where all-off
    drifted too (`background`)."""
    segment = min(steps_per_run, max(MIN_SEGMENT_STEPS, round(SEGMENT_SHARE * steps_per_run)))
    one_mask = Lengths(steps_per_run, segment, steps_per_run)
    if startup_steps <= 0 or background:
        return one_mask
    q = min(max(CHANCE if chance is None else chance, 0.05), 0.95)
    controls = max(1.0, math.log(CONTROL_ALPHA / 2) / math.log(1 - q))  # K, in runs
    trials = ((CHECK_RUNS + SEARCH_RUNS * _set_bits(edges) / _set_bits(EXPECTED_EDGES))
              * z_channel_capacity(CHANCE) / z_channel_capacity(q))  # M, in runs
    most = max(2, math.floor(CONTROL_RUNS + GOLDEN_SHARE * (trials + controls)))
    costs = {cap: _segments_cost(cap, steps_per_run, startup_steps, q, controls, trials)
             for cap in range(2, most + 1)}
    cap = min(costs, key=costs.__getitem__)
    one_mask_cost = startup_steps * (trials + controls - 1) + steps_per_run * (controls - 1)
    if costs[cap] >= one_mask_cost:
        return one_mask
    return Lengths(steps_per_run, segment, cap * steps_per_run)


def _segments_cost(cap: int, steps: int, startup: float, q: float, controls: float,
                   trials: float) -> float:
    """What a cap of `cap` runs costs beyond the trials' own steps (module docstring)."""
    left = max(0.0, controls - cap)  # control runs the golden run does not stand in for
    diverging = MASK_SHARE * q * trials / (trials + left)  # p, a trial's chance to end a run
    per_run = (1 - (1 - diverging) ** cap) / diverging  # E, trials a run holds
    return startup * (trials + left) / per_run + steps * left + startup + cap * steps


def _set_bits(edges: int) -> float:
    """Bits that name one edge or one pair of the graph (at least one bit)."""
    return max(1.0, math.log2(edges + edges * (edges - 1) / 2))


@dataclass(frozen=True)
class Segment:
    ask: Ask  # its mask, stage and share of a full run
    first_step: int  # 1-based training step of the run
    steps: int

    @property
    def last_step(self) -> int:
        return self.first_step + self.steps - 1


@dataclass(frozen=True)
class Schedule:
    """A run's masks by step: the segments in order, back to back from step 1."""

    segments: tuple[Segment, ...]

    @property
    def steps(self) -> int:
        return self.segments[-1].last_step

    @property
    def masks(self) -> list[tuple[int, Mask]]:
        """(first step, mask) of each segment: what the plan file carries."""
        return [(s.first_step, s.ask.mask) for s in self.segments]

    def holding(self, step: int) -> int:
        """Index of the segment that ran `step` (the last one for a step past the end)."""
        return next((i for i, s in enumerate(self.segments) if step <= s.last_step), len(self.segments) - 1)


def plan_run(search: Search, lengths: Lengths) -> Schedule | None:
    """The next run's segments, proposed to the search (in flight until recorded or
    cancelled); None: nothing to run now."""
    search.plan_trials(lengths.segment_steps / lengths.steps_per_run)
    first = search.pending
    if first is None:
        return None
    ahead = copy.deepcopy(search)  # the search as if each planned segment came back clean
    segments: list[Segment] = []
    step, ask = 1, first
    while ask is not None and step <= lengths.cap_steps:
        steps = min(lengths.of(ask), lengths.cap_steps - step + 1)
        ask = replace(ask, share=steps / lengths.steps_per_run)
        segments.append(Segment(ask, step, steps))
        ahead.propose(ask)
        if ahead.done:  # asking for it settled the search (not-prefetch once all-off is asked)
            break
        ahead.record(ask.mask, RunResult(OK, False, None, steps), hint=None, matched=step + steps - 1)
        step += steps
        ask = None if ahead.done else ahead.pending
    for segment in segments:
        search.propose(segment.ask)
    return Schedule(tuple(segments))


def record_run(search: Search, schedule: Schedule, result: RunResult) -> None:
    """A finished run of the schedule: each segment's own result, in order (module docstring),
    until the search reaches its verdict (with runs of other slots recorded since it was
    planned, it may before the planned segments end)."""
    segments = schedule.segments
    if not result.completed:
        for segment in segments[1:]:
            search.cancel(segment.ask.mask)
        search.record(segments[0].ask.mask, result)
        return
    at = result.first_diff_step if result.diverged else None
    matched = matched_steps(result)  # of the golden run, by the whole run
    diverged = schedule.holding(at) if at is not None else len(segments)
    # Drift first seen at a segment's first step may come from the step before it.
    since = diverged - 1 if at is not None and diverged > 0 and at == segments[diverged].first_step else diverged
    for k, segment in enumerate(segments):
        if search.done:
            return
        if k < since:
            steps = min(segment.steps, max(result.steps - segment.first_step + 1, 0))
            if steps == 0:  # a clean run that stopped before this segment
                search.cancel(segment.ask.mask)
                continue
            search.record(segment.ask.mask, RunResult(OK, False, None, steps), hint=None,
                          startup=k == 0, matched=matched)
        elif k > diverged:
            search.cancel(segment.ask.mask)
    if at is None or search.done:
        return
    own = segments[since]
    steps = at - own.first_step + 1
    outcome = RunResult(result.outcome, True, steps, steps, result.unit)
    if since == diverged:
        search.record(own.ask.mask, outcome, startup=since == 0, matched=matched)
        return
    later = segments[diverged]
    search.cancel(own.ask.mask)
    search.cancel(later.ask.mask)
    both = replace(later.ask, mask=own.ask.mask | later.ask.mask, share=own.ask.share + later.ask.share)
    search.notices.append({"event": "diverged-at-switch", "step": at,
                           "masks": [sorted(own.ask.mask), sorted(later.ask.mask)]})
    search.propose(both)
    search.record(both.mask, outcome, startup=since == 0, matched=matched)
