"""`bisect-prefetch init -- COMMAND...`: the argument finder, the log reader, the file it writes
(which `aa` takes unchanged), and one line with exit 2 for bad input.

The tests run small jobs of their own (tmp_path scripts printing torchtitan or jsonl lines);
on the user's FSDP2 script (examples/fsdp2_train.py) under torchrun:
tests/e2e/test_init_on_a_users_fsdp2_script.py.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from bisect_prefetch.cli import main
from bisect_prefetch.experiment import load_experiment
from bisect_prefetch.experiment.init_file import MetricsChoice, find_placeholders, render_experiment
from bisect_prefetch.metrics.detect import is_timing, readings

TITAN_LINE = ("\x1b[31mstep: {step:2d}  \x1b[32mloss: {loss:8.5f}  \x1b[33mgrad_norm:  0.8131  "
              "\x1b[34mmemory:  0.41GiB(1.05%)  tps: {tps}  tflops: 0.00  mfu: 0.00%\x1b[39m")


# -- the arguments that set steps, seed and port ---------------------------------------------
@pytest.mark.parametrize(
    ("argv", "expect", "marked"),
    [
        (["python", "train.py", "--steps", "100"], ["python", "train.py", "--steps", "{steps}"],
         {"steps": "100"}),
        (["python", "train.py", "--steps=100", "--seed=7"],
         ["python", "train.py", "--steps={steps}", "--seed={seed}"], {"steps": "100", "seed": "7"}),
        (["torchrun", "--nproc-per-node", "2", "--rdzv-endpoint", "localhost:29500", "-m",
          "torchtitan.train", "--training.steps", "10", "--debug.seed", "42"],
         ["torchrun", "--nproc-per-node", "2", "--rdzv-endpoint", "localhost:{port}", "-m",
          "torchtitan.train", "--training.steps", "{steps}", "--debug.seed", "{seed}"],
         {"port": "localhost:29500", "steps": "10", "seed": "42"}),
        (["torchrun", "--rdzv_endpoint=10.0.0.1:1234", "t.py", "--max_steps", "5"],
         ["torchrun", "--rdzv_endpoint=10.0.0.1:{port}", "t.py", "--max_steps", "{steps}"],
         {"port": "10.0.0.1:1234", "steps": "5"}),
        (["torchrun", "--master_port", "29500", "t.py", "--max-steps", "5", "--random-seed", "-1"],
         ["torchrun", "--master_port", "{port}", "t.py", "--max-steps", "{steps}",
          "--random-seed", "{seed}"], {"port": "29500", "steps": "5", "seed": "-1"}),
        (["msrun", "--master-port=8118", "run.py", "--train-iters", "20"],
         ["msrun", "--master-port={port}", "run.py", "--train-iters", "{steps}"],
         {"port": "8118", "steps": "20"}),
        # Hydra-style keys and an environment assignment before the program
        (["env", "MASTER_PORT=29500", "python", "train.py", "trainer.max_steps=100", "seed=3"],
         ["env", "MASTER_PORT={port}", "python", "train.py", "trainer.max_steps={steps}",
          "seed={seed}"], {"port": "29500", "steps": "100", "seed": "3"}),
        # look-alikes stay: warmup steps, eval steps, a seed that is no number, a path
        (["python", "train.py", "--warmup-steps", "5", "--eval_steps=10", "--steps-per-epoch", "3",
          "--seed", "abc", "--out", "steps"],
         ["python", "train.py", "--warmup-steps", "5", "--eval_steps=10", "--steps-per-epoch", "3",
          "--seed", "abc", "--out", "steps"], {}),
        # a `{steps}` in the user's own argv is the job's text: it stays literal
        (["python", "train.py", "--steps", "{steps}", "--name=run_{seed}", "--seed", "3"],
         ["python", "train.py", "--steps", "{{steps}}", "--name=run_{{seed}}", "--seed", "{seed}"],
         {"seed": "3"}),
    ],
)
def test_the_arguments_that_set_steps_seed_and_port_get_placeholders(argv, expect, marked):
    found = find_placeholders(argv)
    assert found.argv == expect
    assert {m.kind: m.value for m in found.marked} == marked
    assert found.original == argv


def test_what_the_finder_says_about_ports_and_values_it_leaves():
    standalone = find_placeholders(["torchrun", "--standalone", "--nproc_per_node=2", "t.py"])
    assert standalone.launcher == "torchrun" and standalone.standalone
    assert not standalone.needs_port()
    bare = find_placeholders([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                              "t.py"])
    assert bare.launcher == "torch.distributed.run" and bare.needs_port()
    assert not find_placeholders(["python", "t.py"]).needs_port()
    odd = find_placeholders(["torchrun", "--rdzv-endpoint", "$HOST", "t.py", "--steps", "0"])
    assert odd.argv[2] == "$HOST" and odd.argv[-1] == "0"
    assert odd.notes == ["--rdzv-endpoint $HOST: no :PORT at its end, left as it is",
                         "--steps 0: not a positive whole number, left as it is"]


def _written(tmp_path: Path, argv: list[str], **kwargs) -> Path:
    choice = MetricsChoice("torchtitan", ["loss", "grad_norm"], found_in="the job's stdout.log",
                           sample="step:  1  loss:  8.15051", left_out=["tps"])
    text = render_experiment(name="job", placeholders=find_placeholders(argv), metrics=choice,
                             steps=kwargs.pop("steps", 10), seed=kwargs.pop("seed", 0), **kwargs)
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def test_the_file_loads_as_an_experiment_with_todos_where_nothing_was_found(tmp_path):
    odd = ["torchrun", "--nproc_per_node=2", "my train.py", "--cfg", "{\"a\": [1, 2]}", "#x", "'q'"]
    experiment = load_experiment(_written(tmp_path, odd))
    assert experiment.command == odd  # every word exactly, however YAML must quote it
    text = (tmp_path / "job.yaml").read_text()
    assert "# TODO: no argument that sets the number of training steps was found" in text
    assert "# TODO: torchrun starts several processes that meet at a port" in text
    assert "{steps}" in text and "{seed}" in text and "{port}" in text  # what they mean
    assert experiment.metrics.names == ["loss", "grad_norm"]

    marked = load_experiment(_written(tmp_path, ["torchrun", "--standalone", "t.py", "--steps",
                                                 "10", "--seed", "5"], seed=5))
    assert marked.command == ["torchrun", "--standalone", "t.py", "--steps", "{steps}", "--seed",
                              "{seed}"]
    assert (marked.steps, marked.seed) == (10, 5)
    assert "TODO" not in (tmp_path / "job.yaml").read_text()


# -- which parsers read a log --------------------------------------------------------------
def test_a_torchtitan_log_with_colours_is_read_and_timing_is_left_out(tmp_path):
    log = tmp_path / "titan.log"
    log.write_text("starting\n" + "\n".join(TITAN_LINE.format(step=s, loss=8.0 / s, tps=90 + s)
                                            for s in (1, 2, 3)) + "\n")
    best = readings([log])[0]
    assert (best.fmt, best.lines, best.steps) == ("torchtitan", 3, 3)
    assert best.names == ["loss", "grad_norm"] and best.left_out == ["tps", "tflops"]
    assert best.sample.startswith("step:  1  loss:  8.00000")


def test_a_jsonl_log_gives_every_numeric_field_loss_first(tmp_path):
    log = tmp_path / "m.jsonl"
    log.write_text("".join(json.dumps({"step": s, "lr": 1e-3, "grad_norm": 0.5, "loss": 2.0 / s,
                                       "step_time_ms": 10 + s, "tag": "x"}) + "\n"
                           for s in (1, 2)))
    (best,) = readings([log])
    assert best.fmt == "jsonl" and best.names == ["loss", "grad_norm", "lr"]
    assert best.left_out == ["step_time_ms"]
    assert [n for n in ("tps", "mfu", "memory", "elapsed_time", "tokens_per_second") if is_timing(n)] \
        == ["tps", "mfu", "memory", "elapsed_time", "tokens_per_second"]
    assert not any(is_timing(n) for n in ("loss", "grad_norm", "lr", "loss_scale", "timestep_loss"))


def test_two_parsers_reading_one_log_is_said_and_the_better_one_chosen(tmp_path, capsys):
    log = tmp_path / "both.log"
    log.write_text("".join(f" iteration {s}/ 10 | lm loss: 2.{s} | step: {s}  loss: 2.{s}  "
                           f"grad_norm: 0.{s}\n" for s in (1, 2)))
    found = readings([log])
    assert [r.fmt for r in found] == ["torchtitan", "megatron"]
    job = _job(tmp_path, "titan")
    code = main(["init", "--log", str(log), "--out", str(tmp_path / "e.yaml"), "--state-dir",
                 str(tmp_path / "state"), "--", sys.executable, str(job), "--steps", "4"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "also read by megatron (2 line(s), loss): chose torchtitan, it reads more metrics" in out


# -- the command, on small jobs of the test's own ---------------------------------------------
GRAPH = """
import argparse, json, os
# What the adapter would find in an FSDP job, written here (this job has no torch): 2 units, 1 edge.
if "BISECT_PREFETCH_PLAN" in os.environ:
    out = json.load(open(os.environ["BISECT_PREFETCH_PLAN"]))["out_dir"]
    nodes = [{"name": f"layers.{i}", "kind": "layer", "order": i, "shard_size": 2} for i in (0, 1)]
    edges = [{"id": "bwd:layers.1->layers.0", "phase": "bwd", "src": "layers.1", "dst": "layers.0"}]
    json.dump({"nodes": nodes, "edges": edges}, open(os.path.join(out, "graph.rank0.json"), "w"))
"""
JOB = GRAPH + """
p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=4)
p.add_argument("--seed", type=int, default=0)
a = p.parse_args()
for s in range(1, a.steps + 1):
    loss = 8.0 / s + a.seed * 1e-3 + NOISE
    print(LINE, flush=True)
"""
LINES = {
    "titan": "TITAN.format(step=s, loss=loss, tps=90 + s)",
    "jsonl": 'json.dumps({"step": s, "loss": loss, "grad_norm": 0.5, "step_time_ms": 9.5 + s})',
    # torchtitan's logger writes to stderr
    "titan_stderr": 'TITAN.format(step=s, loss=loss, tps=90 + s), file=__import__("sys").stderr',
}


def _job(tmp_path: Path, kind: str, *, noise: bool = False) -> Path:
    path = tmp_path / f"{kind}_job.py"
    text = textwrap.dedent(JOB).replace("LINE", LINES[kind]).replace(
        "NOISE", "int.from_bytes(os.urandom(2), 'big') * 1e-5" if noise else "0")
    path.write_text(f"TITAN = {TITAN_LINE!r}\n" + text)
    return path


def _init(tmp_path: Path, *argv: str, out: str = "exp.yaml") -> tuple[int, Path]:
    path = tmp_path / out
    code = main(["init", "--out", str(path), "--state-dir", str(tmp_path / "state"), *argv])
    return code, path


def _aa(tmp_path: Path, path: Path, *argv: str) -> tuple[int, dict]:
    result = tmp_path / "aa.json"
    code = main(["aa", str(path), "--state-dir", str(tmp_path / "state"), "--json", str(result),
                 *argv])
    return code, json.loads(result.read_text())


def test_init_on_a_torchtitan_style_job_writes_what_aa_takes_unchanged(tmp_path, capsys):
    job = _job(tmp_path, "titan")
    code, path = _init(tmp_path, "--", sys.executable, str(job), "--steps", "6", "--seed", "2")
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    assert "-> steps: --steps 6 -> {steps}; seed: --seed 2 -> {seed}; port: none needed" in lines
    assert ("-> metrics: torchtitan lines in the job's stdout.log: loss, grad_norm (not compared: "
            "tps, tflops, they differ run to run)") in lines
    assert ("-> all-off A/A: identical at the printed precision (loss (5 decimals), grad_norm "
            "(4 decimals)) over 3 steps (2 runs)") in lines
    assert lines[-3:] == ["next: A/A with every edge on, then the bisection:",
                          f"  bisect-prefetch aa {path} --runs 3 --state-dir {tmp_path / 'state'}",
                          f"  bisect-prefetch bisect {path} --state-dir {tmp_path / 'state'}"]
    experiment = load_experiment(path)
    assert experiment.command == [sys.executable, str(job), "--steps", "{steps}", "--seed", "{seed}"]
    assert (experiment.steps, experiment.seed, experiment.metrics.format) == (6, 2, "torchtitan")
    assert experiment.metrics.names == ["loss", "grad_norm"] and experiment.metrics.files is None
    code, result = _aa(tmp_path, path, "--runs", "2")
    assert code == 0 and result["verdict"] == "consistent"
    assert result["metrics"]["loss"]["steps_compared"] == 6


def test_init_with_a_jsonl_log_writes_what_aa_takes_unchanged(tmp_path, capsys):
    log = tmp_path / "saved.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s, "grad_norm": 0.5,
                                       "step_time_ms": 9.0 + s}) + "\n" for s in (1, 2, 3)))
    job = _job(tmp_path, "jsonl")
    code, path = _init(tmp_path, "--log", str(log), "--steps", "2", "--", sys.executable, str(job),
                       "--steps=5")
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"-> metrics: jsonl lines in {log}: loss, grad_norm (not compared: step_time_ms" in out
    assert "over 2 steps (2 runs)" in out
    experiment = load_experiment(path)
    assert experiment.command[-1] == "--steps={steps}" and experiment.steps == 5
    assert (experiment.metrics.format, experiment.metrics.files) == ("jsonl", "stdout.log")
    assert _aa(tmp_path, path, "--runs", "2")[0] == 0


def test_a_command_without_a_steps_argument_is_stopped_and_gets_a_todo(tmp_path, capsys):
    job = tmp_path / "endless.py"
    job.write_text(textwrap.dedent(GRAPH) + "import itertools, time\nfor s in itertools.count(1):\n"
                   f"    print({TITAN_LINE!r}.format(step=s, loss=1.0, tps=1), flush=True)\n"
                   "    time.sleep(0.05)\n")
    code, path = _init(tmp_path, "--", sys.executable, str(job))
    out = capsys.readouterr().out
    assert code == 0, out
    assert "running your command as given, stopped after 2 steps' metric lines" in out
    assert "-> all-off A/A: not run: mark the argument that sets the steps with {steps}" in out
    text = path.read_text()
    assert "# TODO: no argument that sets the number of training steps was found" in text
    assert load_experiment(path).command == [sys.executable, str(job)]


def test_runs_that_differ_with_every_edge_off_end_init_with_exit_1(tmp_path, capsys):
    job = _job(tmp_path, "titan", noise=True)
    code, path = _init(tmp_path, "--", sys.executable, str(job), "--steps", "3")
    out = capsys.readouterr().out
    assert code == 1, out
    assert "-> all-off A/A: the runs differ at step 1 with every prefetch edge off" in out
    assert "bisect cannot find an edge yet" in out
    assert path.is_file()  # written: the user fixes the job, then checks with aa


def _one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.out + captured.err
    return lines[0]


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    failing = tmp_path / "failing.py"
    failing.write_text("raise ValueError('no such dataset: c4')\n")
    code, path = _init(tmp_path, "--", sys.executable, str(failing), "--steps", "3")
    assert code == 2 and not path.exists()
    line = _one_line_error(capsys)
    assert "your command failed (exit code 1): ValueError: no such dataset: c4" in line

    assert _init(tmp_path, "--", str(tmp_path / "nothing-here"))[0] == 2
    assert "command not found or not executable" in _one_line_error(capsys)

    silent = tmp_path / "silent.py"
    silent.write_text("print('hello')\n")
    assert _init(tmp_path, "--", sys.executable, str(silent), "--steps", "2")[0] == 2
    assert "printed no metric line any parser reads" in _one_line_error(capsys)

    not_a_log = tmp_path / "notes.txt"
    not_a_log.write_text("nothing to read\nstep: none\n")
    assert _init(tmp_path, "--log", str(not_a_log), "--", sys.executable, str(silent))[0] == 2
    assert f"no parser reads {not_a_log}" in _one_line_error(capsys)
    assert _init(tmp_path, "--log", str(tmp_path / "absent.log"), "--", "python")[0] == 2
    assert "log not found" in _one_line_error(capsys)

    assert _init(tmp_path, "--", "python", out="no-such-dir/exp.yaml")[0] == 2
    assert "no directory" in _one_line_error(capsys)

    assert _init(tmp_path)[0] == 2
    assert "give your training command after --" in _one_line_error(capsys)

    taken = tmp_path / "taken.yaml"
    taken.write_text("mine\n")
    assert _init(tmp_path, "--", sys.executable, str(silent), out="taken.yaml")[0] == 2
    assert "taken.yaml exists: give --force to replace it" in _one_line_error(capsys)
    assert taken.read_text() == "mine\n"


def test_force_replaces_an_existing_file(tmp_path, capsys):
    (tmp_path / "exp.yaml").write_text("old\n")
    job = _job(tmp_path, "titan")
    code, path = _init(tmp_path, "--force", "--", sys.executable, str(job), "--steps", "3")
    assert code == 0, capsys.readouterr().out
    assert load_experiment(path).metrics.format == "torchtitan"


def test_a_steps_argument_the_job_does_not_honour_is_said(tmp_path, capsys):
    job = tmp_path / "deaf.py"  # takes --steps, trains 5 steps whatever it says
    job.write_text(textwrap.dedent(GRAPH) + "import sys\nfor s in range(1, 6):\n"
                   f"    print({TITAN_LINE!r}.format(step=s, loss=1.0, tps=1), flush=True)\n")
    code, path = _init(tmp_path, "--", sys.executable, str(job), "--steps", "100")
    assert code == 2 and not path.exists()
    assert "your command trained past step 2 with --steps 2" in _one_line_error(capsys)


def test_init_with_a_saved_torchtitan_log_with_colours(tmp_path, capsys):
    log = tmp_path / "titan.log"
    log.write_text("[rank0]: starting\n" + "\n".join(
        TITAN_LINE.format(step=s, loss=8.15051 / s, tps=98 + s) for s in (1, 2)) + "\n")
    job = _job(tmp_path, "titan")
    code, path = _init(tmp_path, "--log", str(log), "--", sys.executable, str(job), "--steps", "8")
    out = capsys.readouterr().out
    assert code == 0, out
    assert (f"-> metrics: torchtitan lines in {log}: loss, grad_norm (not compared: tps, tflops, "
            "they differ run to run)") in out
    assert "-> 2 units, 1 edges" in out  # a discovery run, as no run showed the graph yet
    assert "-> all-off A/A: identical at the printed precision" in out
    text = path.read_text()
    assert "e.g.: step: 1 loss: 8.15051 grad_norm: 0.8131" in text
    assert load_experiment(path).metrics.names == ["loss", "grad_norm"]


def test_metric_lines_on_stderr_are_found_there_and_the_file_says_so(tmp_path, capsys):
    job = _job(tmp_path, "titan_stderr")
    code, path = _init(tmp_path, "--", sys.executable, str(job), "--steps", "4")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "-> metrics: torchtitan lines in the job's stderr.log: loss, grad_norm" in out
    assert load_experiment(path).metrics.files == "stderr.log"
    assert _aa(tmp_path, path, "--runs", "2")[0] == 0


FAKE_MSRUN = """
import os, subprocess, sys
# msrun's flags as the test needs them: --worker_num=N, --log_dir=DIR (or --log_dir DIR);
# each worker gets RANK_ID and, with a log dir, its own worker_<rank>.log there.
args, workers, log_dir = sys.argv[1:], 1, None
while args and args[0].startswith("--"):
    flag = args.pop(0)
    if flag.startswith("--worker_num="):
        workers = int(flag.split("=", 1)[1])
    elif flag.startswith("--log_dir="):
        log_dir = flag.split("=", 1)[1]
    elif flag == "--log_dir":
        log_dir = args.pop(0)
procs = []
for rank in range(workers):
    out = open(os.path.join(log_dir, f"worker_{rank}.log"), "w") if log_dir else None
    procs.append(subprocess.Popen([sys.executable, *args], stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "RANK_ID": str(rank)}))
sys.exit(max(proc.wait() for proc in procs))
"""


def test_init_on_an_msrun_command_gives_each_worker_its_own_log(tmp_path, capsys):
    msrun = tmp_path / "bin" / "msrun"
    msrun.parent.mkdir()
    msrun.write_text(textwrap.dedent(FAKE_MSRUN))
    job = _job(tmp_path, "titan")  # every rank prints its lines
    code, path = _init(tmp_path, "--", sys.executable, str(msrun), "--worker_num=2",
                       "--master_port=8118", str(job), "--steps", "4")
    out = capsys.readouterr().out
    assert code == 0, out
    assert ("-> msrun: each worker logs to its own file under the run dir "
            "(--log_dir={rank_log_dir}); metrics are read from rank_logs/worker_*.log") in out
    experiment = load_experiment(path)
    assert experiment.command == [sys.executable, str(msrun), "--log_dir={rank_log_dir}",
                                  "--worker_num=2", "--master_port={port}", str(job),
                                  "--steps", "{steps}"]
    assert experiment.metrics.files == "rank_logs/worker_*.log"
    assert "-> all-off A/A: identical at the printed precision" in out

    # A job whose rank 0 alone prints: its log alone (an empty one would be missing metrics).
    rank0 = tmp_path / "rank0_job.py"
    rank0.write_text(job.read_text().replace(
        "    print(", "    if os.environ.get('RANK_ID') == '0': print(", 1))
    code, path = _init(tmp_path, "--force", "--", sys.executable, str(msrun), "--worker_num=2",
                       str(rank0), "--steps", "4", out="rank0.yaml")
    out = capsys.readouterr().out
    assert code == 0, out
    assert load_experiment(path).metrics.files == "rank_logs/worker_0.log"


def test_an_msrun_log_dir_of_the_users_becomes_the_runs_own():
    from bisect_prefetch.runs.rank_logs import per_rank_logs

    for given, expect in ((["--log_dir=/logs"], ["--log_dir={rank_log_dir}"]),
                          (["--log_dir", "/logs"], ["--log_dir", "{rank_log_dir}"])):
        p = find_placeholders(["msrun", "--worker_num=2", *given, "run.py", "--steps", "9"])
        assert per_rank_logs(p)
        assert p.argv == ["msrun", "--worker_num=2", *expect, "run.py", "--steps", "{steps}"]
    torchrun = find_placeholders(["torchrun", "t.py"])
    assert not per_rank_logs(torchrun) and torchrun.argv == ["torchrun", "t.py"]
