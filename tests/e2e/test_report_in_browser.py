"""The HTML report of a bisection with two causes, opened in a real browser.

Debian's chromium (installed by `make browser`, .ci/install-chromium) driven by playwright
from the package index, at 1280x800 as an engineer opens it: the verdict and every cause of
the JSON on the first screen, the guard check and each cause's keep-only reproduce command
within the first 1,600 px, the page at most 4,000 px tall as it opens, and the run count it
states the JSON's `runs_launched`. The state dir is a real `bisect` command's (the whole-
transcript tests' simulated oracle answers the runs), whose graph discovery run, recorded
before it, found every unit's shard group of size 1; an `aa --guard size-one` group journaled
after it is the guard check's result.
"""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import pytest

from bisect_prefetch.commands import bisect as command
from bisect_prefetch.experiment import load_experiment
from bisect_prefetch.graph import from_policy
from bisect_prefetch.report.html import build_report
from bisect_prefetch.runs.discover import DISCOVERY_STEPS
from bisect_prefetch.runs.execute import Runner
from bisect_prefetch.runs.outcome import RunOutcome
from bisect_prefetch.runs.store import StateDir
from bisect_prefetch.vocab import GRAPH_FILE, probe_rank_file
from tests.commands.test_bisect_transcripts import CULPRIT, READ_NOTHING, STEPS, Simulation
from tests.conftest import console

sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
SECOND = "fwd:layers.0->layers.1"
WIDTH, SCREEN = 1280, 800


def _experiment(tmp_path: Path) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(f"""
name: sim
command: [python, -c, "pass"]
metrics: {{format: jsonl, names: [loss]}}
graph: {{source: runtime}}
steps: {STEPS}
seed: 1
search: {{confidence: 0.95, max_runs: 200}}
""")
    return path


def _journal(state: StateDir, runner: Runner, key, run_id: str, **fields) -> None:
    out = RunOutcome(run_id=run_id, outcome="ok", reason="", steps_done=fields.pop("steps"),
                     launched=runner.reuse_check.launched,
                     manifest=READ_NOTHING | {"env": runner.reuse_check.env}, **fields)
    state.append(key, out.to_record())


def _discovered_size_one(experiment_path: Path, root: Path) -> None:
    """The graph discovery run, as the adapter leaves it: every unit's shard group of size 1
    (a (dp_shard=1, tp=2) mesh), so every edge targets a size-one unit."""
    graph = from_policy("fsdp2-chain", 3).to_dict()
    for node in graph["nodes"]:
        node["shard_size"] = 1
    with StateDir(root, "sim") as state:
        runner = Runner(load_experiment(experiment_path), state).open()
        key = runner.key("discover", mask=None, guard="none", steps=DISCOVERY_STEPS, index=0,
                         stress=False)
        run_id, run_dir = state.new_run_dir("discover")
        (run_dir / GRAPH_FILE).write_text(json.dumps(graph))
        (run_dir / probe_rank_file(0)).write_text(json.dumps({"rank": 0}))
        _journal(state, runner, key, run_id, steps=DISCOVERY_STEPS)


def _guard_checked(experiment_path: Path, root: Path, edges: list[str], runs: int) -> None:
    """`aa --guard size-one` with every edge on, after the bisection: consistent."""
    with StateDir(root, "sim") as state:
        runner = Runner(load_experiment(experiment_path), state).open()
        reference = None
        for index in range(runs):
            key = runner.key("aa", mask=frozenset(edges), guard="size-one", steps=STEPS,
                             index=index)
            run_id, _ = state.new_run_dir("aa")
            _journal(state, runner, key, run_id, steps=STEPS, reference=reference)
            reference = reference or run_id


@pytest.fixture(scope="module")
def two_causes(tmp_path_factory) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("two-causes")
    experiment, root = _experiment(tmp), tmp / "state"
    _discovered_size_one(experiment, root)
    code = command.bisect(experiment, confidence=None, max_runs=None, resume=False,
                          state_dir=root, console=console(io.StringIO()), reuse=True,
                          oracle_for=Simulation([CULPRIT, SECOND], q=0.7))  # its discovery run
    assert code == 1
    data = json.loads((root / "sim" / "bisect.json").read_text())
    _guard_checked(experiment, root, sorted(data["graph"]["edges"][i]["id"]
                                            for i in range(len(data["graph"]["edges"]))), 3)
    return build_report(root / "sim"), data


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (make browser installs it)")
def test_the_first_screen_answers_with_every_cause_and_its_next_steps(two_causes):
    page_path, data = two_causes
    assert [c["edges"] for c in data["culprit_sets"]] == [[CULPRIT], [SECOND]]
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": SCREEN})
            page.goto(page_path.as_uri())
            height = page.evaluate("document.documentElement.scrollHeight")
            print(f"page height as it opens: {height} px")

            def bottom(selector: str) -> float:
                box = page.locator(selector).bounding_box()
                assert box is not None, selector
                return box["y"] + box["height"]

            verdict = page.locator(".verdict").inner_text()
            assert verdict.startswith("verdict: culprit-found, 2 independent causes")
            assert bottom(".verdict") <= SCREEN
            for number, cause in enumerate(data["culprit_sets"], start=1):
                row = page.locator(f"#cause-{number}")
                assert all(edge in row.inner_text() for edge in cause["edges"])
                assert "yes" in row.inner_text()  # size-one, from the discovery run's audit
                assert bottom(f"#cause-{number}") <= SCREEN
            steps = {(s["step"], s["cause"]): s for s in data["next_steps"]}
            guard = page.locator("ol.steps li", has_text="check the size-one guard")
            assert "consistent over 3 runs with the guard on" in guard.inner_text()
            box = guard.bounding_box()
            assert box["y"] + box["height"] <= 2 * SCREEN
            for number in (1, 2):
                command_text = steps[("reproduce", number)]["command"]
                pre = page.locator("ol.steps pre", has_text=command_text)
                assert f"keep-only:{data['culprit_sets'][number - 1]['edges'][0]}" in command_text
                box = pre.bounding_box()
                assert box["y"] + box["height"] <= 2 * SCREEN
            assert height <= 4000
            stated = re.match(r"runs: (\d+) launched", page.locator(".counts").inner_text())
            assert stated and int(stated[1]) == data["runs_launched"]
        finally:
            browser.close()
