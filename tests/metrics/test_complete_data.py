"""A run counts only with complete data: every configured metric, every
step, every rank that logs, in every run; several values for one step in a log without
ranks are said once and never taken for a divergence.

Each job is a few lines that import nothing of ours: the second run of a group (a marker
file tells) loses what the test names.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bisect_prefetch.cli import main

JOB = """
import json, os, sys
spec = json.loads(sys.argv[1])  # what the second run leaves out
marker = sys.argv[2]
second = os.path.exists(marker)
open(marker, "a").close()
out = json.load(open(os.environ["BISECT_PREFETCH_PLAN"]))["out_dir"]
with open(os.path.join(out, "metrics.jsonl"), "a") as f:
    for step in range(1, 6):
        for rank in spec.get("ranks", [None]):
            if second and [rank, step] in spec.get("drop", []):
                continue
            record = {"step": step, "loss": 1.0 / step}
            if rank is not None:
                record["rank"] = rank
            if not (second and spec.get("no_grad_norm")) and [rank, step] not in spec.get("no_grad_norm_at", []):
                record["grad_norm"] = 2.0
            for _ in range(spec.get("repeat", 0)):  # several ranks into one log without ranks
                f.write(json.dumps({"step": step, "loss": 9.0, "grad_norm": 2.0}) + "\\n")
            f.write(json.dumps(record) + "\\n")
"""


def _experiment(tmp_path: Path, spec: dict) -> Path:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(JOB))
    marker = tmp_path / "marker"
    marker.unlink(missing_ok=True)
    argv = [sys.executable, str(script), json.dumps(spec), str(marker)]
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(f"""
        name: complete
        command: {json.dumps(argv)}
        metrics: {{format: jsonl, names: [loss, grad_norm]}}
        graph: {{source: static, policy: fsdp2-chain, layers: 2}}
        steps: 5
        timeout_s: 30
    """))
    return path


def _aa(tmp_path: Path, spec: dict, capsys) -> tuple[int, str]:
    state = tmp_path / "state"
    # all-on: the job runs without an FSDP engine, so no mask could switch an edge off
    code = main(["aa", str(_experiment(tmp_path, spec)), "--runs", "2", "--mask", "all-on",
                 "--state-dir", str(state)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.parametrize(("spec", "said"), [
    ({"no_grad_norm": True}, "grad_norm never logged"),
    ({"drop": [[None, 2], [None, 3], [None, 4]]}, "rank 0 loss lacks step(s) 2-4"),
    ({"ranks": [0, 1], "drop": [[1, 3], [1, 4], [1, 5]]}, "rank 1 loss stops at step 2 of 5"),
])
def test_a_run_missing_data_is_never_consistent(tmp_path, capsys, spec, said):
    code, out = _aa(tmp_path, spec, capsys)
    assert code == 2, out
    assert "-> consistent" not in out
    assert said in out
    # compare of the same run dirs says the same: a finding, never identical
    runs = sorted((tmp_path / "state" / "complete" / "runs").iterdir())
    assert main(["compare", str(runs[0]), str(runs[1])]) == 1


def test_a_metric_missing_in_every_run_is_no_verdict(tmp_path, capsys):
    code, out = _aa(tmp_path, {"no_grad_norm_at": [[None, s] for s in range(1, 6)]}, capsys)
    assert code == 2
    assert "grad_norm never logged" in out


def test_repeated_steps_without_ranks_are_said_once_never_a_divergence(tmp_path, capsys):
    code, out = _aa(tmp_path, {"repeat": 1}, capsys)
    assert code == 0, out
    assert "-> consistent (2 runs" in out
    assert out.count("value(s) for steps logged before") == 1
    assert "give each its own log: torchrun --log-dir {rank_log_dir} --redirects 3" in out
    runs = sorted((tmp_path / "state" / "complete" / "runs").iterdir())
    assert main(["compare", str(runs[0]), str(runs[1])]) == 0


def test_a_log_counting_steps_from_zero_says_so(tmp_path, capsys):
    script = tmp_path / "zero.py"
    script.write_text(textwrap.dedent("""
        import json, os
        out = json.load(open(os.environ["BISECT_PREFETCH_PLAN"]))["out_dir"]
        with open(os.path.join(out, "metrics.jsonl"), "w") as f:
            for step in range(5):
                f.write(json.dumps({"step": step, "loss": 1.0}) + "\\n")
    """))
    path = tmp_path / "zero.yaml"
    path.write_text(textwrap.dedent(f"""
        name: zero
        command: {json.dumps([sys.executable, str(script)])}
        metrics: {{format: jsonl, names: [loss]}}
        graph: {{source: static, policy: fsdp2-chain, layers: 2}}
        steps: 5
    """))
    code = main(["aa", str(path), "--mask", "all-off", "--state-dir", str(tmp_path / "state")])
    out = capsys.readouterr()
    assert code == 2
    assert "the job's steps start at 0, the tool's at 1: log step + 1" in out.err
    assert "stops at step 4 of 5" in out.err


# Any loss of a step, a rank's step or a metric in the second run: aa never exits 0.
LOSSES = st.one_of(
    st.builds(lambda s: {"ranks": [0, 1], "drop": [[r, step] for r, step in s]},
              st.sets(st.tuples(st.sampled_from([0, 1]), st.integers(1, 5)), min_size=1, max_size=4)
              .map(sorted)),
    st.builds(lambda s: {"drop": [[None, step] for step in s]},
              st.sets(st.integers(1, 5), min_size=1, max_size=5).map(sorted)),
    st.just({"no_grad_norm": True}),
    st.just({"ranks": [0, 1], "no_grad_norm": True}),
)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=LOSSES)
def test_property_lost_data_never_exits_0(tmp_path_factory, capsys, spec):
    tmp_path = tmp_path_factory.mktemp("lost")
    code, out = _aa(tmp_path, spec, capsys)
    assert code != 0, (spec, out)
