"""What `init` writes reads back as written: text from the command or the job (a line
break YAML knows, a right-to-left override, a crafted key) stays inside its comment, and a
literal `{steps}` in an argument is written `{{steps}}` by the user and stays literal."""

from __future__ import annotations

import pytest
import yaml

from bisect_prefetch.experiment.init_file import (
    MetricsChoice,
    _check_read_back,
    find_placeholders,
    render_experiment,
)
from bisect_prefetch.runs.workloads import render_argv
from bisect_prefetch.vocab import placeholders_in

HOSTILE = ["\u2028name: injected", "\nguard: size-one", "\u0085steps: 1", "x\u202egnp.exe",
           "\r\nseed: 9"]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_text_in_arguments_and_logs_stays_in_its_comment(text):
    argv = ["python", "train.py", f"--steps={1}", f"--note={text}", "--seed", f"7{text}"]
    choice = MetricsChoice("jsonl", ["loss"], found_in=f"the job's {text}", sample=f"loss {text}",
                           left_out=[f"tps{text}"], todo=f"check {text}")
    written = render_experiment(name="job", placeholders=find_placeholders(argv), metrics=choice,
                                steps=5, seed=0, graph_note=f"note {text}")
    loaded = yaml.safe_load(written)
    assert loaded["command"] == ["python", "train.py", "--steps={steps}", f"--note={text}", "--seed",
                                 f"7{text}"]
    assert (loaded["name"], loaded["steps"], loaded["seed"], loaded["guard"]) == ("job", 5, 0, "none")
    comments = [line for line in written.splitlines() if line.lstrip().startswith("#")]
    assert all(c.isprintable() for line in comments for c in line)


def test_a_file_that_reads_back_otherwise_is_refused():
    with pytest.raises(ValueError, match="guard reads back as 'size-one'"):
        _check_read_back("name: job\nguard: size-one\n", {"name": "job", "guard": "none"})


def test_double_braces_are_a_literal_placeholder():
    argv = ["python", "train.py", "--steps", "{steps}", "--name=run_{{steps}}_{{seed}}", "--x={y}"]
    assert render_argv(argv, {"steps": 3, "seed": 1}) == [
        "python", "train.py", "--steps", "3", "--name=run_{steps}_{seed}", "--x={y}"]
    assert placeholders_in("--name=run_{{steps}}") == set()
    assert placeholders_in("{config}/{{seed}}") == {"config"}
    # init leaves a user's escaped placeholder alone: no steps argument found in it
    found = find_placeholders(["python", "train.py", "--tag={{steps}}"])
    assert found.found("steps") is None
