"""A simulated oracle with a known answer, and simulated searches scored against it.

Culprit rule: one edge; several causes any of which is enough (`together=False`),
each one edge or edges joined by "+" that are needed together (`A+B`); or several
edges needed together (`together=True`). While the rule holds for a
mask, each step of a run diverges with chance `hazard`; optional background
drift does so whatever the mask, and in the golden run too: drifted at step g, it
differs from every run by step g (until the search sees it and asks for a new golden
run, search/golden_drift.py). A diverging run stops at its first difference.

Random streams: each culprit edge (or the set needed together), the background
and run failures draw from their own generator, seeded from (seed, trial, name),
and a stream draws only in runs where it is in play. So another search policy
meets the same noise: the k-th run that enables a culprit first differs at the
same step whatever ran before it.

Slots: `slots` runs at once, each taking the share of a full run it ran (a
diverged run stops at its first difference) and its start-up (`startup_cost` steps); whenever a slot frees, the search
proposes the next run from everything finished and in flight (protocol.py), and
results fold in in the order they finish. Wall-clock ("rounds") is in units of
one full run; runs still in flight when the verdict comes are cancelled and
count as runs.

Hints: with `hint_accuracy` C, the first diverged run carries a localized unit:
the target of a culprit edge with chance C, else a unit drawn evenly from the
graph's (its own stream).

Where the runs go: each trial's `runs_by_step` (and `runs_by_step_mean` over the
trials) counts the search's runs per protocol stage, the background controls of
all_off_runs="auto" apart from the other all-off runs.

The baselines the benchmark compares with live in benchmarks/baselines.py; any
callable (edge_ids, oracle, *, q, alpha) -> Outcome can be passed as `method`.
"""

from __future__ import annotations

import heapq
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.graph import from_policy
from bisect_prefetch.search.causes import CauseSearch, Search
from bisect_prefetch.search.hints import HintPrior, edge_ends
from bisect_prefetch.search.oracle import AnswersAtOnce, RunResult
from bisect_prefetch.search.protocol import Bisection
from bisect_prefetch.search.runlog import BACKGROUND_CONTROL
from bisect_prefetch.search.segments import (
    SEGMENTS_MODES,
    Lengths,
    Schedule,
    lengths_for,
    plan_run,
    record_run,
)
from bisect_prefetch.search.stats import hazard_for_chance, per_run_chance
from bisect_prefetch.select import select
from bisect_prefetch.vocab import (
    ERROR,
    OK,
    STAGES,
    STOPPED_EARLY,
    VERDICT_FOUND,
    VERDICT_INCONCLUSIVE,
    VERDICT_NO_DRIFT,
    VERDICT_NOT_PREFETCH,
    Mask,
)

# The tool's search, and (for comparison) its one-cause search alone (protocol.Bisection).
METHODS = ("search", "one-cause")
# Joins the edges of one cause needed together, in a culprit (`--culprit A+B`).
TOGETHER = "+"


def _stream(seed: int, trial: int, name: str) -> np.random.Generator:
    # crc32, not hash(): the same name must give the same stream in every process.
    return np.random.default_rng([seed, trial, zlib.crc32(name.encode())])


class SimulatedOracle(AnswersAtOnce):
    """Runs nothing: draws each run's first differing step from the culprit rule, and
    answers the slot operations of search/oracle.py at once (AnswersAtOnce)."""

    def __init__(
        self,
        culprits: Sequence[str],
        *,
        together: bool = False,
        hazard: float,
        steps: int,
        background: float = 0.0,
        error_rate: float = 0.0,
        seed: int = 0,
        trial: int = 0,
    ) -> None:
        if steps < 1:
            raise BisectPrefetchError(f"--steps must be at least 1, got {steps}")
        for name, value in (("--hazard", hazard), ("background hazard", background)):
            if not 0.0 <= value < 1.0:
                raise BisectPrefetchError(f"{name} must be in [0, 1), got {value}")
        self.culprits = list(culprits)
        self.together = together
        self.hazard = hazard
        self.steps = steps
        self.background = background
        self.error_rate = error_rate
        # One stream per culprit edge, or one for the set when it acts only as a whole.
        rules = ([tuple(self.culprits)] if together and self.culprits
                 else [tuple(c.split(TOGETHER)) for c in self.culprits])
        self._rules = [(set(rule), _stream(seed, trial, "culprit:" + ",".join(rule))) for rule in rules]
        self._background = _stream(seed, trial, "background")
        self._errors = _stream(seed, trial, "errors")
        self._golden = _stream(seed, trial, "golden")
        self.golden_diff: int | None = None  # the golden run's own background drift (run_golden)
        self.golden_steps = steps
        self.runs = 0

    def run_golden(self, steps: int) -> None:
        """The golden run, `steps` long. Background drift hits it too: drifted at step g, it
        differs from every run by step g (what makes its matched steps a control; the search
        tells it from the runs, search/golden_drift.py)."""
        self.golden_steps = steps
        self.golden_diff = self._first_diff(self._golden, self.background, steps)

    def replace_golden(self) -> None:
        """A new golden run, as long: the search found that the last one drifted."""
        self.run_golden(self.golden_steps)

    def _first_diff(self, rng: np.random.Generator, hazard: float, steps: int | None = None) -> int | None:
        if hazard <= 0.0:
            return None
        step = int(rng.geometric(hazard))
        return step if step <= (steps or self.steps) else None

    def run(self, mask: Mask) -> RunResult:
        self.runs += 1
        if self.error_rate and self._errors.random() < self.error_rate:
            return RunResult(ERROR, None, None, 0)
        draws = [self._first_diff(rng, self.hazard) for rule, rng in self._rules if rule <= mask]
        if self.background:
            draws.append(self._first_diff(self._background, self.background))
        draws.append(self.golden_diff)  # the golden run is as long as a run
        diffs = [d for d in draws if d is not None]
        if diffs:
            first = min(diffs)
            return RunResult(STOPPED_EARLY, True, first, first)
        return RunResult(OK, False, None, self.steps)

    def run_schedule(self, schedule: Schedule) -> RunResult:
        """One run of several masks by step: each segment draws its own first difference
        (a constant per-step hazard is memoryless), and the run stops at the first."""
        self.runs += 1
        if self.error_rate and self._errors.random() < self.error_rate:
            return RunResult(ERROR, None, None, 0)
        for segment in schedule.segments:
            mask, steps = segment.ask.mask, segment.steps
            draws = [self._first_diff(rng, self.hazard, steps) for rule, rng in self._rules if rule <= mask]
            if self.background:
                draws.append(self._first_diff(self._background, self.background, steps))
            if self.golden_diff is not None and segment.first_step <= self.golden_diff <= segment.last_step:
                draws.append(self.golden_diff - segment.first_step + 1)
            diffs = [d for d in draws if d is not None]
            if diffs:
                first = segment.first_step + min(diffs) - 1
                return RunResult(STOPPED_EARLY, True, first, first)
        return RunResult(OK, False, None, schedule.steps)


@dataclass(frozen=True)
class Outcome:
    verdict: str
    minimal_set: list[str]
    confidence: float | None  # None: the method claims nothing
    runs: int  # runs started (those cancelled at the verdict included)
    steps: int
    rounds: float  # wall-clock to the verdict, in full runs
    startups: int = 0  # training runs launched, the golden reference included
    golden_steps: int = 0  # the golden references' steps (each as long as the longest run)
    # The search's runs per protocol stage (STAGES), its background controls apart
    # ("background-control", out of check-off), runs cancelled at the verdict as
    # "cancelled"; empty for a baseline.
    runs_by_step: dict[str, int] = field(default_factory=dict)
    culprit_sets: list[list[str]] = field(default_factory=list)  # every cause named (causes.py)


def run_search(edge_ids, oracle: SimulatedOracle, *, slots: int = 1, hint: Callable[[], str] | None = None,
               lengths: Lengths | None = None, startup_cost: float = 0.0, one_cause: bool = False,
               **options) -> Outcome:
    """The tool's own search (causes.CauseSearch; one_cause: protocol.Bisection alone, the
    search before several causes, for comparison) against the oracle, on `slots` slots.

    hint: called once, at the first diverged run, for the unit its localization names.
    lengths: several masks per run (segments.py); None: one mask per run.
    startup_cost: each run's start-up, in steps: wall-clock counts it.
    """
    search = (Bisection if one_cause else CauseSearch)(edge_ids, **options)
    golden_steps = oracle.steps if lengths is None else lengths.cap_steps
    search.golden(golden_steps)
    oracle.run_golden(golden_steps)
    clock, order = 0.0, 0
    running: list[tuple[float, int, float, Mask | Schedule, RunResult]] = []  # a heap by finish time
    runs = steps = 0
    goldens = 1  # golden runs: a new one after one drifted (golden_drift.py)
    while True:
        while len(running) < slots and not search.done:
            if lengths is None:
                ask = search.propose()
                planned = None if ask is None else ask.mask
            else:
                planned = plan_run(search, lengths)
            if planned is None:
                break
            result = oracle.run(planned) if lengths is None else oracle.run_schedule(planned)
            duration = (startup_cost + max(result.steps, 1)) / oracle.steps
            heapq.heappush(running, (clock + duration, order, clock, planned, result))
            order += 1
            runs += 1
        if search.done or not running:
            break
        clock, _, _, planned, result = heapq.heappop(running)
        steps += result.steps
        if hint is not None and result.diverged:
            result, hint = replace(result, unit=hint()), None
        if lengths is None:
            search.record(planned, result, hint=result.unit if result.diverged else None)
        else:
            record_run(search, planned, result)
        if search.golden_drifted and not search.done:  # golden_drift.py: a new golden run
            for _, _, started, _, _ in running:  # compared with the old one: cancelled
                steps += max(0, round((clock - started) * oracle.steps - startup_cost))
            running = []
            oracle.replace_golden()
            search.golden(golden_steps)
            goldens += 1
            clock += (startup_cost + golden_steps) / oracle.steps  # nothing runs beside it
    for _, _, started, _, _ in running:  # cancelled at the verdict: the steps they ran count
        steps += max(0, round((clock - started) * oracle.steps - startup_cost))
    result = search.result()
    return Outcome(result.verdict, result.minimal_set, result.confidence, runs, steps, clock,
                   runs_by_step=_runs_by_step(search), startups=runs + goldens,
                   golden_steps=golden_steps * goldens, culprit_sets=[s["edges"] for s in result.culprit_sets])


def _runs_by_step(search: Search) -> dict[str, int]:
    out = dict.fromkeys((*STAGES, BACKGROUND_CONTROL, "cancelled"), 0)
    for block in search.events:
        out[BACKGROUND_CONTROL if block.context == BACKGROUND_CONTROL else block.stage] += block.runs
    out["cancelled"] = len(search.in_flight)
    return out


# -- simulate --------------------------------------------------------------------------
def draw_culprits(selectors: Sequence[str], edge_ids: Sequence[str], rng: np.random.Generator) -> list[str]:
    """One edge per selector (per part of `A+B`: a cause needed together); a selector
    matching several edges draws one (no repeats). Single edges come in graph order."""
    chosen: list[str] = []
    causes: list[str] = []
    for selector in selectors:
        parts = []
        for part in selector.split(TOGETHER):
            pool = [e for e in select(part, edge_ids) if e not in chosen]
            if not pool:
                raise BisectPrefetchError(f"culprit {selector!r} has no edge left to draw")
            chosen.append(pool[int(rng.integers(len(pool)))])
            parts.append(chosen[-1])
        causes.append(TOGETHER.join(sorted(parts, key=edge_ids.index)))
    return sorted(causes, key=lambda c: edge_ids.index(c.split(TOGETHER)[0]))


def is_correct(outcome: Outcome, culprits: Sequence[str], *, together: bool, background: float) -> bool:
    """No culprit: not-prefetch under background drift, else no-drift-reproduced; culprits
    (background or not): culprit-found naming them: a set needed together exactly; several
    independent ones, each as its own set and no other (a method that names one set only,
    a baseline, is right when it names one of them)."""
    if not culprits:
        return outcome.verdict == (VERDICT_NOT_PREFETCH if background > 0 else VERDICT_NO_DRIFT)
    if outcome.verdict != VERDICT_FOUND:
        return False
    if together:
        return sorted(outcome.minimal_set) == sorted(culprits)
    if not outcome.culprit_sets:  # a baseline's one set
        return len(outcome.minimal_set) == 1 and outcome.minimal_set[0] in culprits
    return sorted(map(sorted, outcome.culprit_sets)) == sorted(sorted(c.split(TOGETHER)) for c in culprits)


def _percentile(values: Sequence[float], p: float) -> float:
    return float(np.percentile(values, p)) if len(values) else 0.0


def simulate(
    policy: str,
    layers: int,
    culprits: Sequence[str],
    *,
    hazard: float,
    stress_factor: float | None = None,
    stress_cost: float = 1.0,
    **settings,
) -> dict:
    """`_simulate`, and with a stress factor the same searches (same seeds) under stress too.

    Stress model: it multiplies the culprit's per-step hazard by ``stress_factor`` (below 1:
    a stress that hides the race; capped at 0.99) and each step's time by ``stress_cost``;
    background drift (no race) stays. The result is the stressed searches', with ``stress``:
    both settings' medians and costs (steps x step-time factor, plus the start-ups) and
    whether stress pays; `bisect --stress auto` would use it only where it raises the hazard.
    """
    if stress_factor is None:
        return _simulate(policy, layers, culprits, hazard=hazard, **settings)
    if stress_factor <= 0:
        raise BisectPrefetchError(f"--stress-factor must be above 0, got {stress_factor}")
    if stress_cost < 1.0:
        raise BisectPrefetchError(f"--stress-cost is a step-time factor of at least 1, got {stress_cost}")
    without = _simulate(policy, layers, culprits, hazard=hazard, **settings)
    stressed_hazard = min(hazard * stress_factor, 0.99)
    stressed = _simulate(policy, layers, culprits, hazard=stressed_hazard, **settings)
    startup = settings.get("startup_cost", 0.0)
    time_without = _percentile([r["steps"] + startup * r["runs"] for r in without["results"]], 50)
    time_with = _percentile([r["steps"] * stress_cost + startup * r["runs"]
                             for r in stressed["results"]], 50)
    stressed["stress"] = {
        "factor": stress_factor, "step_cost": stress_cost,
        "hazard_without": hazard, "hazard_with": stressed_hazard,
        "per_run_chance_without": without["per_run_chance"],
        "per_run_chance_with": stressed["per_run_chance"],
        "accuracy_without": without["accuracy"], "accuracy_with": stressed["accuracy"],
        "runs_median_without": without["runs_median"], "runs_median_with": stressed["runs_median"],
        "steps_median_without": without["steps_median"],
        "steps_median_with": stressed["steps_median"],
        "time_median_without": time_without, "time_median_with": time_with,
        "used": stressed_hazard > hazard,  # what --stress auto would keep
        "pays": stressed_hazard > hazard and time_with < time_without,
    }
    return stressed


def _simulate(
    policy: str,
    layers: int,
    culprits: Sequence[str],
    *,
    together: bool = False,
    hazard: float,
    steps: int,
    trials: int = 100,
    seed: int = 0,
    background: float = 0.0,
    startup_cost: float = 0.0,
    error_rate: float = 0.0,
    confidence: float = 0.95,
    max_runs: int | None = None,
    slots: int = 1,
    hint_accuracy: float | None = None,
    all_off_runs: int | str = "auto",
    segments: str = "off",
    method: str | Callable[..., Outcome] = "search",
) -> dict:
    """Run `trials` simulated searches on one graph and score them (the simulate JSON of docs/contract.md).

    A culprit selector that matches several edges draws one of them per trial
    (`all` draws any edge). `background` is the per-run chance of drift with every
    edge off. `startup_cost` is in steps per run; it only adds to the reported
    cost. `all_off_runs`: as the experiment's search.all_off_runs (a count, or
    "auto"). `method`: one of METHODS, or a baseline callable (benchmarks/baselines.py).
    """
    _check_options(method=method, trials=trials, slots=slots, hint_accuracy=hint_accuracy,
                   background=background, segments=segments)
    edge_ids = from_policy(policy, layers).edge_ids()
    lengths = (lengths_for(steps, startup_cost, len(edge_ids), chance=per_run_chance(hazard, steps),
                           background=background > 0) if segments == "auto" else None)
    units = HintPrior(edge_ids).units
    q = per_run_chance(hazard, steps)
    alpha = 1.0 - confidence
    results = []
    for trial in range(trials):
        truth = draw_culprits(culprits, edge_ids, _stream(seed, trial, "choice"))
        oracle = SimulatedOracle(
            truth, together=together, hazard=hazard, steps=steps,
            background=hazard_for_chance(background, steps) if background else 0.0,
            error_rate=error_rate, seed=seed, trial=trial,
        )
        if method in METHODS:
            hint = _hint_drawer(truth, units, hint_accuracy, _stream(seed, trial, "hint"))
            outcome = run_search(
                edge_ids, oracle, slots=slots, hint=hint, confidence=confidence, max_runs=max_runs,
                steps_per_run=steps, all_off_runs=all_off_runs, lengths=lengths,
                startup_cost=startup_cost, one_cause=method == "one-cause",
            )
        else:
            outcome = method(edge_ids, oracle, q=q, alpha=alpha)
        correct = is_correct(outcome, truth, together=together, background=background)
        results.append(_trial_record(trial, truth, outcome, correct, startup_cost))
    return {
        **_scores(results),
        "slots": slots,
        "hint_accuracy": hint_accuracy,
        "all_off_runs": all_off_runs,
        "background": background,
        "segments": segments,
        "segment_steps": lengths.segment_steps if lengths else steps,
        "cap_steps": lengths.cap_steps if lengths else steps,
        "startup_cost": startup_cost,
        "method": method if isinstance(method, str) else method.__name__,
        "policy": policy,
        "layers": layers,
        "edges": len(edge_ids),
        "per_run_chance": q,
        "seed": seed,
        "results": results,
    }


def _check_options(*, method, trials: int, slots: int, hint_accuracy: float | None, background: float,
                   segments: str) -> None:
    if method not in METHODS and not callable(method):
        raise BisectPrefetchError(f"unknown method {method!r} (the simulator runs the search)")
    if trials < 1:
        raise BisectPrefetchError(f"--trials must be at least 1, got {trials}")
    if slots < 1:
        raise BisectPrefetchError(f"--slots must be at least 1, got {slots}")
    if hint_accuracy is not None and not 0.0 <= hint_accuracy <= 1.0:
        raise BisectPrefetchError(f"--hint-accuracy must be in [0, 1], got {hint_accuracy}")
    if not 0.0 <= background < 1.0:
        raise BisectPrefetchError(f"--background must be in [0, 1), got {background}")
    if segments not in SEGMENTS_MODES:
        raise BisectPrefetchError(f"--segments must be one of {', '.join(SEGMENTS_MODES)}, got {segments!r}")


def _trial_record(trial: int, truth: list[str], outcome: Outcome, correct: bool, startup_cost: float) -> dict:
    """One trial of the simulate JSON's results."""
    return {
        "trial": trial,
        "culprits": truth,
        "verdict": outcome.verdict,
        "minimal_set": outcome.minimal_set,
        "culprit_sets": outcome.culprit_sets,
        "correct": correct,
        "confidence": outcome.confidence,
        "runs": outcome.runs,
        "steps": outcome.steps,
        "rounds": outcome.rounds,
        "startups": outcome.startups,
        "golden_steps": outcome.golden_steps,
        # Cluster time in steps: every start-up, the golden reference's included.
        "cost": outcome.steps + outcome.golden_steps + startup_cost * outcome.startups,
        "runs_by_step": outcome.runs_by_step,
    }


def _scores(results: Sequence[dict]) -> dict:
    """The trials scored: accuracy, what they claimed, and medians of what they cost."""
    trials = len(results)
    runs = [r["runs"] for r in results]
    claims = [r["confidence"] for r in results if r["confidence"] is not None]
    return {
        "trials": trials,
        "accuracy": sum(r["correct"] for r in results) / trials,
        "runs_median": _percentile(runs, 50),
        "runs_p90": _percentile(runs, 90),
        "steps_median": _percentile([r["steps"] for r in results], 50),
        "claimed_confidence": float(np.mean(claims)) if claims else None,
        VERDICT_INCONCLUSIVE: sum(r["verdict"] == VERDICT_INCONCLUSIVE for r in results) / trials,
        "rounds_median": _percentile([r["rounds"] for r in results], 50),
        "rounds_p90": _percentile([r["rounds"] for r in results], 90),
        "startups_median": _percentile([r["startups"] for r in results], 50),
        "cost_median": _percentile([r["cost"] for r in results], 50),
        "runs_by_step_mean": runs_by_step_mean(results),
    }


def runs_by_step_mean(results: Sequence[dict]) -> dict[str, float]:
    """Mean runs per protocol stage over the trials (where the runs go); {} for a baseline."""
    steps = [r["runs_by_step"] for r in results if r["runs_by_step"]]
    return {k: float(np.mean([s[k] for s in steps])) for k in steps[0]} if steps else {}


def _hint_drawer(truth: Sequence[str], units: Sequence[str], accuracy: float | None,
                 rng: np.random.Generator) -> Callable[[], str] | None:
    """The localization the first diverged run carries: a culprit's target with chance accuracy."""
    if accuracy is None or not truth:
        return None

    def draw() -> str:
        if rng.random() < accuracy:
            return edge_ends(truth[int(rng.integers(len(truth)))].split(TOGETHER)[0])[1]
        return units[int(rng.integers(len(units)))]

    return draw
