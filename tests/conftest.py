"""Shared test setup: a pinned console width, and the helpers several test files use.

Test files import helpers from here (`from tests.conftest import ...`), never
from each other: stand-in experiments and process checks for the reliability
tests, FSDP2 workload runs for the adapter tests, a Markdown table parser.

rich decides line breaks and table layout by the console width; a terminal's
width (pytest -s) or a CI runner's would change every transcript. All of
them render at WIDTH: the CLI's console, consoles the tests make
(`console()`), and the processes tests start (COLUMNS is inherited).
"""

from __future__ import annotations

import functools
import io
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

from bisect_prefetch.judge.audit import FAILING_KINDS
from bisect_prefetch.metrics.trajectory import Series, Trajectory
from tests.slurm_cluster import slurm_cluster  # noqa: E402,F401  (a real Slurm, session-wide)

WIDTH = 160  # the CLI's own width outside a terminal (cli.py)
os.environ["COLUMNS"] = str(WIDTH)  # before any Console is made, here or in a child process


@pytest.fixture(autouse=True)
def _pinned_console_width(monkeypatch):
    from bisect_prefetch import cli

    monkeypatch.setattr(cli.console, "width", WIDTH)


def console(out: io.StringIO) -> Console:
    """A console that writes plain text to out at the pinned width, as the CLI does in a pipe."""
    return Console(file=out, width=WIDTH, highlight=False, color_system=None)


def parse_markdown_table(text: str) -> list[dict[str, str]]:
    """Rows of the first pipe table in text, as header -> cell text (escapes undone)."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert len(lines) >= 2, text

    def cells(line: str) -> list[str]:
        out, cur, i = [], "", 1
        while i < len(line):
            ch = line[i]
            if ch == "\\" and i + 1 < len(line):
                cur += line[i + 1]
                i += 2
                continue
            if ch == "|":
                out.append(cur.strip())
                cur = ""
            else:
                cur += ch
            i += 1
        return out

    headers = cells(lines[0])
    assert all(set(c) <= set("-: ") for c in cells(lines[1]))
    return [dict(zip(headers, cells(line), strict=True)) for line in lines[2:]]


def trajectory(records) -> Trajectory:
    """A Trajectory from (rank, step, {metric: value}) records, in their order."""
    steps: dict[tuple[int, str], list[int]] = {}
    values: dict[tuple[int, str], list[float]] = {}
    for rank, step, metrics in records:
        for name, value in metrics.items():
            steps.setdefault((rank, name), []).append(step)
            values.setdefault((rank, name), []).append(value)
    per_rank: dict[int, dict] = {}
    for (rank, name), s in steps.items():
        per_rank.setdefault(rank, {})[name] = Series(s, values[(rank, name)])
    return Trajectory(per_rank)


# -- stand-in experiments, state snapshots, leftover processes ----------------------------
FAKE_JOB = Path(__file__).resolve().parent / "jobs" / "fake_job.py"
NAME = "fake"


def write_experiment(tmp_path: Path, argv: list[str], *, steps: int = 8, timeout_s: float = 30,
                     metrics_format: str = "jsonl", file_name: str = "exp.yaml",
                     extra: str = "") -> Path:
    """An experiment named `fake` running argv, on a static 2-layer graph."""
    path = tmp_path / file_name
    path.write_text(textwrap.dedent(f"""
        name: {NAME}
        command: {json.dumps(argv)}
        metrics: {{format: {metrics_format}, names: [loss]}}
        graph: {{source: static, policy: fsdp2-chain, layers: 2}}
        steps: {steps}
        timeout_s: {timeout_s}
    """) + extra)
    return path


def fake_job_experiment(tmp_path: Path, mode: str = "clean", **kw) -> Path:
    """An experiment running tests/jobs/fake_job.py in a mode (clean, crash, hang, ...).

    Its command takes `{steps}` (the job reads the count from its plan, the same number),
    so the tool may give its runs any length, as it does a job whose command says `{steps}`."""
    return write_experiment(tmp_path, [sys.executable, str(FAKE_JOB), mode, "--steps={steps}"],
                            **kw)


def script_experiment(tmp_path: Path, body: str, *args: str, **kw) -> Path:
    """An experiment running a small Python script written here."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(body))
    return write_experiment(tmp_path, [sys.executable, str(script), *args], **kw)


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under root with its bytes (None for a directory), except the lock file.

    The lock file holds the pid of whoever locked last; it is not state.
    """
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
        if p.name != "lock"
    }


def job_processes(marker: str) -> list[int]:
    """Live processes (not zombies) whose environment mentions marker: none may outlive a test."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if marker.encode() in (proc / "environ").read_bytes():
                if "\nState:\tZ" not in (proc / "status").read_text():
                    pids.append(int(proc.name))
        except OSError:
            continue
    return pids


# Words a shell would expand, split or run: a job must receive each exactly as given.
HOSTILE_WORDS = ["$(touch pwned)", "pa$$word", "cost: $5", "${oc.env:X}", "\\$HOME", "`id`",
                 "a 'single' \"double\"", "two  spaces", "new\nline", "", "$MASTER_ADDR"]


# -- the FSDP2 reference workload under torchrun -------------------------------------------
REPO = Path(__file__).resolve().parents[1]
SITE = REPO / "bisect_prefetch" / "adapters" / "site"
LAYERS = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_plan(run_dir: Path, **fields) -> Path:
    plan = {
        "version": 1,
        "experiment": "test",
        "run_id": run_dir.name,
        "out_dir": str(run_dir),
        "mask": None,
        "guard": "none",
        "record": {"graph": True, "probe": True, "digests": None, "digest_every": 1},
        "fault": None,
        "seed": 1234,
        "steps": 30,
    }
    plan.update(fields)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def run_fsdp2(
    run_dir: Path,
    *,
    steps: int,
    nproc: int = 2,
    plan: Path | None = None,
    extra_args: tuple[str, ...] = (),
    timeout: float = 120,
) -> subprocess.CompletedProcess:
    """Launch the workload under torchrun; kill the whole process group on timeout."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("BISECT_PREFETCH_PLAN", None)
    if plan is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(SITE), str(REPO)])
        env["BISECT_PREFETCH_PLAN"] = str(plan)
    command = [
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc_per_node={nproc}", f"--master_port={free_port()}",
        "-m", "bisect_prefetch.workloads.fsdp2",
        "--layers", str(LAYERS), "--steps", str(steps), "--seed", "1234", *extra_args,
    ]  # fmt: skip
    run_dir.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        command, cwd=run_dir, env=env, text=True, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    result = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    assert result.returncode == 0, f"workload failed:\n{stderr[-4000:]}"
    return result


def oracle_run(oracle, mask):
    """One run of mask through a real oracle's slot operations, as the one loop runs it
    (commands/bisect_loop.drive): the failed attempts it retries are heard first, then the
    run's result."""
    oracle.request(mask)
    while (heard := oracle.finished()).retried:
        pass
    return heard.result


def run_json(folder: Path, *argv: str) -> tuple[int, dict | None]:
    """A command through the CLI with --state-dir and --json in folder: its exit code and
    its JSON (None where it wrote none)."""
    from bisect_prefetch.cli import main

    out = folder / f"{argv[0]}.json"
    out.unlink(missing_ok=True)
    code = main([*argv, "--state-dir", str(folder / "state"), "--json", str(out)])
    return code, json.loads(out.read_text()) if out.exists() else None


def read_jsonl(path: Path) -> list[dict]:
    """Records sorted by (step, rank, param): ranks append in any order."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return sorted(records, key=lambda r: (r["step"], r["rank"], r.get("param", "")))


def rank_lines(run_dir: Path, name: str) -> list[str]:
    """The lines of every rank's NAME.rank<R>.jsonl in a run dir (metrics, digests), rank by rank."""
    paths = sorted(Path(run_dir).glob(f"{name}.rank*.jsonl"), key=lambda p: (len(p.name), p.name))
    return [line for path in paths for line in path.read_text().splitlines() if line.strip()]


def read_ranks(run_dir: Path, name: str) -> list[dict]:
    """rank_lines, each parsed, sorted by (step, rank, param) as read_jsonl sorts."""
    records = [json.loads(line) for line in rank_lines(run_dir, name)]
    return sorted(records, key=lambda r: (r["step"], r["rank"], r.get("param", "")))


def read_probe(run_dir: Path, rank: int = 0) -> dict:
    return json.loads((run_dir / f"probe.rank{rank}.json").read_text())


def failing_findings(audit: dict) -> set[tuple[str, str]]:
    """An audit result's findings of the kinds that fail it, as (kind, edge)."""
    return {(f["kind"], f["edge"]) for f in audit["findings"] if f["kind"] in FAILING_KINDS}


def step_outcomes(probe: dict) -> dict[int, dict[str, set[str]]]:
    """Per step of the probe: outcome -> the edges that had it at least once."""
    return {entry["step"]: {outcome: set(entry[outcome])
                            for outcome in ("issued", "noop", "masked", "guarded")}
            for entry in probe["steps"]}


# -- the folder decides speed -----------------------------------------------------------
# Every test under tests/e2e is slow (real training processes, a real Slurm, a browser) and
# every other test fast: `make test-fast` is the suite without tests/e2e, and the fast tests
# run first (here, and in `make test` before tests/e2e starts). No test is marked slow by
# hand (tests/test_speed_by_folder.py).
E2E = Path(__file__).resolve().parent / "e2e"


def in_e2e(path: Path) -> bool:
    return E2E in Path(path).resolve().parents


# tests/e2e on 2 workers (`-n 2 --dist loadscope`, as `make test` runs it): the tests of one
# file go to one worker (they share module fixtures), the files that start a Slurm all to one
# (munged is the machine's, and a cluster stops it at its end), and the longest groups first,
# so that both workers end about together (seconds measured one worker alone: the Slurm
# files about 200, each of the others about 100).
E2E_LONGEST_FIRST = ("slurm", "test_mindformers", "test_two_causes", "test_bisect")


def e2e_group(path: str | Path) -> str:
    stem = Path(path).stem
    return "slurm" if stem.startswith("test_slurm") else stem


def _run_order(item) -> tuple[int, int]:
    """The fast tests first, then tests/e2e, its longest groups first."""
    if not in_e2e(item.path):
        return (0, 0)
    group = e2e_group(item.path)
    return (1, E2E_LONGEST_FIRST.index(group) if group in E2E_LONGEST_FIRST else len(E2E_LONGEST_FIRST))


def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadscope":
        return None  # xdist's own
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the order of pytest_collection_modifyitems

    class ByE2EGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return e2e_group(nodeid.split("::")[0])

    return ByE2EGroup(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if in_e2e(item.path):
            item.add_marker(pytest.mark.slow)
    items.sort(key=_run_order)  # stable: each group keeps its order


# A fast test that starts a real training run fails: the commands it starts itself are read
# (a command a CLI subprocess starts in turn is not seen). Training is a launcher, a
# reference workload's training module, or a training script of this repository.
TRAINING_MODULES = {"torch.distributed.run", "mindspore.parallel.cluster.run",
                    "bisect_prefetch.workloads.fsdp2", "bisect_prefetch.workloads.mindspore",
                    "bisect_prefetch.workloads.hsdp_double_torch"}
TRAINING_LAUNCHERS = {"torchrun", "msrun"}


@functools.cache
def training_scripts() -> frozenset[Path]:
    """examples/, the MindFormers job, and the test jobs that import torch or mindspore."""
    jobs = [p for p in (REPO / "tests" / "jobs").glob("*.py")
            if any(f"import {engine}" in p.read_text() or f"from {engine}" in p.read_text()
                   for engine in ("torch", "mindspore"))]
    examples = (REPO / "examples").glob("*.py")
    mindformers = (REPO / "bisect_prefetch" / "workloads" / "mindformers_job").glob("*.py")
    return frozenset(p.resolve() for p in (*jobs, *examples, *mindformers))


def _real_launcher(word: str) -> bool:
    """torchrun or msrun from PATH or an installed one; a stand-in script of a test's own
    (tests/commands/test_init.py's msrun) imports neither engine."""
    path = Path(word)
    if path.name not in TRAINING_LAUNCHERS:
        return False
    try:
        return path.name == word or any(f"{how} {engine}" in path.read_text()
                                        for how in ("import", "from")
                                        for engine in ("torch", "mindspore"))
    except (OSError, UnicodeDecodeError):
        return False


def starts_training(argv, scripts: frozenset[Path]) -> bool:
    """Whether a command (a list of words, or one string) runs a real training job."""
    words = [argv] if isinstance(argv, (str, bytes, os.PathLike)) else list(argv)
    for word in map(os.fsdecode, words):
        if word in TRAINING_MODULES or _real_launcher(word):
            return True
        if word.endswith(".py") and Path(word).resolve() in scripts:
            return True
    return False


@pytest.fixture(autouse=True)
def _no_training_in_fast_tests(request, monkeypatch):
    if in_e2e(request.node.path):
        yield
        return
    scripts, started = training_scripts(), []
    original = subprocess.Popen.__init__

    def watched(self, args, *rest, **kwargs):
        if starts_training(args, scripts):
            started.append(args)
            pytest.fail(f"a fast test started a real training run (move it to tests/e2e): {args}")
        original(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", watched)
    yield
    assert not started, f"a fast test started a real training run (move it to tests/e2e): {started}"


# -- a green CI means the real engines ran ----------------------------------------
# Under CI (CI=true) and in `make test` (BISECT_PREFETCH_NO_SKIPS=1) a skipped test fails with
# its reason: a half-failed install (torch or MindSpore that does not import, no msrun, no
# unshare) must not pass. By hand, `pytest` or `make test-fast` may skip.
NO_SKIPS = os.environ.get("CI") == "true" or os.environ.get("BISECT_PREFETCH_NO_SKIPS") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if NO_SKIPS and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped where no skip is allowed (CI=true or make test): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    # a module-level importorskip skips the whole file at collection
    outcome = yield
    report = outcome.get_result()
    if NO_SKIPS and report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped where no skip is allowed (CI=true or make test): {reason}"


# -- who writes which file of a run dir (docs/contract.md, "What is written where") ---------
# Written by the orchestrator (the tool), or once by the batch script / Slurm for the job
# (stdout.log, stderr.log: one open file the launcher or Slurm holds, the ranks' console).
ORCHESTRATOR_FILES = {"plan.json", "status.json", "env.json", "graph.json", "probe.json", "stdout.log",
                      "stderr.log", "job.sbatch", "job_exit_code"}
ORCHESTRATOR_DIRS = {"adapter", "rank_logs"}
RANK_FILE = r"(?P<kind>[a-z]+)\.rank(?P<rank>\d+)(?P<other>\.[^.]+)?\.(?P<ext>jsonl|json)"
# Every process of a job (a rank, a launcher's agent, a forked worker) names its manifest by
# host and pid (adapters/manifest.py).
PROCESS_FILE = r"(?P<kind>manifest)\.(?!rank\d+\.)(?P<host>.+)-(?P<pid>\d+)\.jsonl"


def run_dir_writers(run_dir: Path, ranks: int) -> dict[str, str]:
    """Every file of a run dir -> its one writer ("orchestrator" or "rank R"); fails on a file
    no single process owns: a name of neither kind, a rank file a second process wrote
    (NAME.rank<R>.<host>-<pid>.jsonl), or rank records inside another rank's file."""
    import re

    writers = {}
    for path in sorted(Path(run_dir).iterdir()):
        name = path.name
        if path.is_dir():
            assert name in ORCHESTRATOR_DIRS, f"{name}/: written by whom?"
            writers[name + "/"] = "orchestrator"
            continue
        if name in ORCHESTRATOR_FILES:
            writers[name] = "orchestrator"
            continue
        if p := re.fullmatch(PROCESS_FILE, name):
            writers[name] = f"process {p['host']}-{p['pid']}"
            continue
        m = re.fullmatch(RANK_FILE, name)
        assert m is not None, f"{name}: written by whom?"
        assert m["other"] is None, f"{name}: a second process claimed rank {m['rank']}"
        rank = int(m["rank"])
        assert rank < ranks, name
        if m["ext"] == "jsonl":
            claimed = {json.loads(line).get("rank", rank) for line in path.read_text().splitlines()
                       if line.strip()}
        else:
            claimed = {json.loads(path.read_text()).get("rank", rank)}
        assert claimed <= {rank}, f"{name} holds records of ranks {sorted(claimed)}"
        writers[name] = f"rank {rank}"
    return writers
