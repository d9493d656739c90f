"""Hostile input: every failure is one line with a meaningful exit code, input
errors are found when the experiment is loaded (exit 2, no run dir), an overflowing step
number is an unread line, and anything else is a bug with its own exit code and its
traceback in a file.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

from bisect_prefetch import cli
from bisect_prefetch.cli import BUG, main

JOB = """
import json, os
out = json.load(open(os.environ["BISECT_PREFETCH_PLAN"]))["out_dir"]
with open(os.path.join(out, "metrics.jsonl"), "w") as f:
    for step in range(1, 4):
        f.write(json.dumps({"step": step, "loss": 1.0}) + "\\n")
    f.write('{"step": 99999999999999999999999, "loss": 2.0}\\n')
"""


def _experiment(tmp_path: Path, extra: str = "", *, argv: list[str] | None = None) -> Path:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(JOB))
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(f"""
        name: hostile
        command: {json.dumps(argv or [sys.executable, str(script)])}
        metrics: {{format: jsonl, names: [loss]}}
        graph: {{source: static, policy: fsdp2-chain, layers: 1}}  # no edge: no mask to apply
        steps: 3
        timeout_s: 30
    """) + extra)
    return path


def _fails_at_load(tmp_path: Path, capsys, experiment: Path, *extra: str) -> str:
    state = tmp_path / "state"
    code = main(["aa", str(experiment), "--mask", "all-off", "--state-dir", str(state), *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert not (state / "hostile" / "runs").exists() or not any((state / "hostile" / "runs").iterdir())
    return lines[0]


def test_non_utf8_experiment_is_an_input_error(tmp_path, capsys):
    path = tmp_path / "exp.yaml"
    path.write_bytes(b"name: x\n\xff\xfe: 1\n")
    assert "not UTF-8" in _fails_at_load(tmp_path, capsys, path)


@pytest.mark.parametrize(("extra", "said"), [
    ('env: {"A=B": "1"}\n', "env name 'A=B'"),
    ('env: {"1A": "1"}\n', "env name '1A'"),
    ('env: {A: "x\\0y"}\n', "NUL byte"),
    ("timeout_s: .inf\n", "timeout_s"),
])
def test_bad_values_are_found_at_load(tmp_path, capsys, extra, said):
    assert said in _fails_at_load(tmp_path, capsys, _experiment(tmp_path, extra))


@pytest.mark.parametrize("files", ["/tmp/*.jsonl", "../0001-aa-k0/metrics.jsonl"])
def test_metrics_files_outside_the_run_dir_are_refused(tmp_path, capsys, files):
    text = _experiment(tmp_path).read_text().replace(
        "names: [loss]}", f'names: [loss], files: "{files}"}}')
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    assert "inside the run dir" in _fails_at_load(tmp_path, capsys, path)


def test_nul_byte_in_an_argument_is_an_input_error(tmp_path, capsys):
    path = _experiment(tmp_path, argv=[sys.executable, "-c", "pass\u0000"])
    assert "NUL byte" in _fails_at_load(tmp_path, capsys, path)


def test_an_overflowing_step_is_an_unread_line_and_the_run_is_journaled(tmp_path, capsys):
    experiment = _experiment(tmp_path)
    args = ["aa", str(experiment), "--mask", "all-off", "--state-dir", str(tmp_path / "state")]
    assert main(args) == 0, capsys.readouterr()
    assert "reused" not in capsys.readouterr().out
    assert main([*args, "--reuse"]) == 0  # again, taking its runs: from the journal, no crash
    assert "reused" in capsys.readouterr().out


def test_a_long_error_stays_one_bounded_line(tmp_path, capsys):
    keys = "\n".join(f"unknown_key_{i}: 1" for i in range(20000))
    path = _experiment(tmp_path, keys + "\n")
    line = _fails_at_load(tmp_path, capsys, path)
    assert len(line) < 2200


def test_anything_else_is_a_bug_with_its_own_exit_code_and_traceback_file(tmp_path, capsys,
                                                                          monkeypatch):
    # No input of ours crashes any more; a bug is simulated inside a command.
    from bisect_prefetch.commands import compare

    def crash(*args, **kwargs):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(compare, "compare_paths", crash)
    assert cli.main(["compare", str(tmp_path), str(tmp_path)]) == BUG
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "a bug in bisect-prefetch" in lines[0], err
    assert BUG not in (0, 1, 2)
    written = Path(re.search(r"traceback is in (\S+?);", lines[0]).group(1))
    try:
        assert "simulated bug" in written.read_text() and "Traceback" in written.read_text()
    finally:
        written.unlink()


# -- the state dir trusts nothing in it (item 5) ---------------------------------------
def _aa_code(tmp_path: Path, capsys, *extra: str) -> tuple[int, str]:
    code = main(["aa", str(_experiment(tmp_path)), "--mask", "all-off",
                 "--state-dir", str(tmp_path / "state"), *extra])
    captured = capsys.readouterr()
    return code, captured.err


def test_a_lock_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path, capsys):
    mine = tmp_path / "my-notes.txt"
    mine.write_text("precious\n")
    (tmp_path / "state" / "hostile").mkdir(parents=True)
    (tmp_path / "state" / "hostile" / "lock").symlink_to(mine)
    code, err = _aa_code(tmp_path, capsys)
    assert code == 2 and "symlink" in err, err
    assert mine.read_text() == "precious\n"


@pytest.mark.parametrize("kind", ["dangling-link", "fifo"])
def test_a_journal_that_is_no_regular_file_is_refused(tmp_path, capsys, kind):
    state = tmp_path / "state" / "hostile"
    state.mkdir(parents=True)
    target = tmp_path / "elsewhere.jsonl"
    if kind == "fifo":
        os.mkfifo(state / "journal.jsonl")
    else:
        (state / "journal.jsonl").symlink_to(target)
    code, err = _aa_code(tmp_path, capsys)
    assert code == 2 and ("symlink" in err or "not a regular file" in err), err
    assert not target.exists()
    assert not (state / "runs").exists()


def test_an_output_file_may_not_land_on_the_journal(tmp_path, capsys):
    assert _aa_code(tmp_path, capsys)[0] == 0
    journal = tmp_path / "state" / "hostile" / "journal.jsonl"
    before = journal.read_bytes()
    link = tmp_path / "out.json"
    link.symlink_to(journal)
    for out in (journal, link):
        code, err = _aa_code(tmp_path, capsys, "--json", str(out))
        assert code == 2 and "refusing to write" in err, err
        assert journal.read_bytes() == before


def test_new_file_mode_leaves_the_umask_alone():
    from bisect_prefetch.files import new_file_mode

    old = os.umask(0o027)
    try:
        assert new_file_mode() == 0o640
        assert os.umask(0o027) == 0o027  # never changed in between
    finally:
        os.umask(old)


# -- bounded YAML, strict values (items 6 and 8) -------------------------------------------
def _nested_aliases(levels: int) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + f"\noverrides: {{k: *a{levels}}}\n"


@pytest.mark.parametrize(("extra", "said"), [
    (_nested_aliases(8), "aliases expand to"),
    ("loop: &l [*l]\n", "refers to itself"),
    ("steps: 5\n", "duplicate key 'steps'"),
    ("anchor: &a 1\nx: [" + ", ".join(["*a"] * 1001) + "]\n", "more than 1000 aliases"),
])
def test_yaml_that_would_explode_or_mislead_is_refused(tmp_path, capsys, extra, said):
    assert said in _fails_at_load(tmp_path, capsys, _experiment(tmp_path, extra))


def test_steps_true_is_not_one_step(tmp_path, capsys):
    path = _experiment(tmp_path)
    path.write_text(path.read_text().replace("steps: 3", "steps: true"))
    assert "steps" in _fails_at_load(tmp_path, capsys, path)


# -- found at load, before any run dir -------------------------
@pytest.mark.parametrize(("metrics", "said"), [
    ("{format: regex, names: [loss], pattern: 'step (?P<step>\\d+'}", "does not compile"),
    ("{format: regex, names: [loss], pattern: 'loss (?P<loss>\\S+)'}", "(?P<step>"),
    ("{format: regex, names: [loss, grad_norm], pattern: 'step (?P<step>\\d+) (?P<loss>\\S+)'}",
     "no group for grad_norm"),
])
def test_a_regex_pattern_is_compiled_at_load_with_its_groups(tmp_path, capsys, metrics, said):
    path = _experiment(tmp_path)
    path.write_text(path.read_text().replace("{format: jsonl, names: [loss]}", metrics))
    assert said in _fails_at_load(tmp_path, capsys, path)


def test_a_config_placeholder_without_a_config_is_found_at_load(tmp_path, capsys):
    path = _experiment(tmp_path, argv=[sys.executable, str(tmp_path / "job.py"), "--config", "{config}"])
    assert "{config}" in _fails_at_load(tmp_path, capsys, path)


def test_an_argument_too_long_for_exec_is_found_at_load(tmp_path, capsys):
    path = _experiment(tmp_path, argv=[sys.executable, "-c", "pass", "x" * 200_000])
    assert "longer than exec takes" in _fails_at_load(tmp_path, capsys, path)


def test_many_arguments_too_long_for_exec_together_are_found_at_load(tmp_path, capsys):
    from bisect_prefetch.experiment import arg_max

    words = ["x" * 100_000] * (arg_max() // 100_000 + 2)
    path = _experiment(tmp_path, argv=[sys.executable, "-c", "pass", *words])
    assert "more than exec takes" in _fails_at_load(tmp_path, capsys, path)


@pytest.mark.parametrize("layers", ["999999", "100000000"])
def test_static_policy_layers_are_bounded(tmp_path, capsys, layers):
    assert main(["graph", "--policy", "mindformers", "--layers", layers]) == 2
    err = capsys.readouterr().err
    assert "--layers must be between 1 and" in err and "Traceback" not in err
    path = _experiment(tmp_path)
    path.write_text(path.read_text().replace("layers: 1", f"layers: {layers}"))
    assert "graph.layers" in _fails_at_load(tmp_path, capsys, path)


@pytest.mark.parametrize(("extra", "said"), [
    ('executor: {kind: slurm, partition: "gpu\\nsrun rm"}\n', "control character"),
    ('executor: {kind: slurm, sbatch_args: ["--comment=a\\u0007"]}\n', "control character"),
    ('executor: {kind: slurm, time: "01:00\\r"}\n', "control character"),
])
def test_executor_strings_with_control_characters_are_refused(tmp_path, capsys, extra, said):
    assert said in _fails_at_load(tmp_path, capsys, _experiment(tmp_path, extra))


@pytest.mark.parametrize("where", ["directory", "under-a-file", "journal"])
def test_output_paths_are_checked_before_any_run(tmp_path, capsys, where):
    if where == "directory":
        out = tmp_path / "a-dir"
        out.mkdir()
    elif where == "under-a-file":
        (tmp_path / "a-file").write_text("")
        out = tmp_path / "a-file" / "out.json"
    else:
        out = tmp_path / "state" / "hostile" / "journal.jsonl"
    line = _fails_at_load(tmp_path, capsys, _experiment(tmp_path), "--json", str(out))
    assert str(out) in line


# -- a malformed probe record -----------------------------------------
PROBE_JOB = """
import json, os, sys
out = json.load(open(os.environ["BISECT_PREFETCH_PLAN"]))["out_dir"]
with open(os.path.join(out, "metrics.jsonl"), "w") as f:
    for step in range(1, 4):
        f.write(json.dumps({"step": step, "loss": 1.0}) + "\\n")
with open(os.path.join(out, "probe.rank0.json"), "w") as f:
    f.write(sys.argv[1])
"""


@pytest.mark.parametrize("probe", [
    "[1, 2]", "{not json", '{"step_seconds": "x"}', '{"step_seconds": [[1]]}',
    '{"edges": {"fwd:a->b": 5}}', '{"steps": [{"step": "x"}]}', '{"digests": {"steps": "x"}}',
    '{"hyper_parallel": {"units": {"u": {"params": "x"}}}}', '{"rank": "zero"}', "[" * 100_000,
])
def test_a_malformed_probe_makes_the_run_unreadable_never_a_crash(tmp_path, capsys, probe):
    from bisect_prefetch.errors import BisectPrefetchError
    from bisect_prefetch.judge.audit import audit_run_dir

    script = tmp_path / "probe_job.py"
    script.write_text(textwrap.dedent(PROBE_JOB))
    experiment = _experiment(tmp_path, argv=[sys.executable, str(script), probe])
    state = tmp_path / "state"
    code = main(["aa", str(experiment), "--mask", "all-off", "--state-dir", str(state)])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err + out, err
    assert "probe of rank(s) 0 unreadable" in out + err
    # An aa group is no bisection: said in one line (exit 2), the page written all the same.
    assert main(["report", str(state / "hostile")]) == 2
    err = capsys.readouterr().err
    assert "no bisection in" in err and "Traceback" not in err, err
    assert (state / "hostile" / "report.html").is_file()
    run_dir = next((state / "hostile" / "runs").iterdir())
    (run_dir / "graph.json").write_text('{"nodes": [], "edges": []}')
    with pytest.raises(BisectPrefetchError, match="unreadable probe record"):
        audit_run_dir(run_dir)
