"""A verdict below the confidence asked says so: on the verdict line, and in bisect.json
(`confidence_met: false`, beside `confidence_asked`); an inconclusive verdict never meets it."""

from __future__ import annotations

import pytest

from bisect_prefetch.commands.bisect_record import result_to_json
from bisect_prefetch.commands.bisect_verdict_words import confidence_met
from bisect_prefetch.report.verdict_block import headline
from bisect_prefetch.search.verdict import SearchResult

CALIBRATION = {"runs": 0, "per_run_chance": None, "interval": [0, 1], "interval_confidence": 0.95,
               "hazard_per_step": None}


def result(verdict: str, confidence: float) -> SearchResult:
    return SearchResult(verdict=verdict, minimal_set=[], confidence=confidence, runs_used=12,
                        steps_used=48, evidence=[], calibration=CALIBRATION, facts=[])


@pytest.mark.parametrize("verdict, confidence, asked, met", [
    ("not-prefetch", 0.947, 0.95, False),
    ("not-prefetch", 0.95, 0.95, True),
    ("culprit-found", 0.991, 0.95, True),
    ("inconclusive", 0.99, 0.95, False),
    ("culprit-found", 0.5, None, True),
])
def test_confidence_met(verdict, confidence, asked, met):
    assert confidence_met(result(verdict, confidence), asked) is met


def test_the_verdict_line_says_it_is_below_the_confidence_asked():
    def said(confidence: float, asked: float) -> str:
        found = result("not-prefetch", confidence)
        data = result_to_json(found, "") | {"confidence_asked": asked,
                                            "confidence_met": confidence_met(found, asked)}
        return headline(data)

    assert said(0.947, 0.95) == "verdict: not-prefetch (confidence 0.947, below the 0.95 asked)"
    assert said(0.97, 0.95) == "verdict: not-prefetch (confidence 0.970)"
