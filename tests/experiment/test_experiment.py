"""Experiment and matrix files: what loads, and the one-line errors for what does not."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import (
    apply_overrides,
    load_experiment,
    load_matrix,
    with_overrides,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

FULL = """
name: fsdp2-demo
workload:
  builtin: fsdp2
  layers: 8
  world_size: 2
  fault: {edge: "bwd:layers.5->layers.4", hazard: 0.05}
metrics: {format: jsonl, names: [loss, grad_norm]}
graph: {source: runtime}
steps: 30
seed: 1234
timeout_s: 600
guard: none
search: {confidence: 0.95, max_runs: 200}
"""


def _write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _error(path: Path) -> str:
    with pytest.raises(BisectPrefetchError) as info:
        load_experiment(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_full_example_loads(tmp_path):
    exp = load_experiment(_write(tmp_path, FULL))
    assert exp.name == "fsdp2-demo"
    assert exp.workload.fault.edge == "bwd:layers.5->layers.4"
    assert exp.workload.fault.hazard == 0.05
    assert (exp.metrics.format, exp.metrics.files) == ("jsonl", None)  # metrics.jsonl (run_files)
    assert exp.world_size() == 2
    assert exp.base_dir == tmp_path.resolve()


def test_search_defaults_to_a_scaled_budget_and_auto_all_off_runs(tmp_path):
    plain = load_experiment(_write(tmp_path, "name: x\ncommand: [a]\n"))
    assert (plain.search.max_runs, plain.search.all_off_runs) == (None, "auto")
    counted = load_experiment(_write(tmp_path, "name: x\ncommand: [a]\nsearch: {all_off_runs: 1}\n"))
    assert counted.search.all_off_runs == 1


def test_command_experiment_resolves_config_next_to_the_file(tmp_path):
    (tmp_path / "train.yaml").write_text("training: {seed: 1}\n")
    exp = load_experiment(_write(tmp_path, """
        name: mf
        command: [msrun, "--worker_num=2", run_mindformer.py, --config, "{config}"]
        config: train.yaml
        overrides: {training.seed: 42}
        env: {HCCL_DETERMINISTIC: true, OMP_NUM_THREADS: 2}
        metrics: {format: mindformers}
        graph: {source: static, policy: mindformers, layers: 4}
    """))
    assert exp.config_path() == (tmp_path / "train.yaml").resolve()
    assert exp.env == {"HCCL_DETERMINISTIC": "true", "OMP_NUM_THREADS": "2"}
    assert (exp.metrics.format, exp.metrics.files) == ("mindformers", None)  # the job's stdout


def test_unknown_key_names_the_key_and_the_allowed_ones(tmp_path):
    message = _error(_write(tmp_path, FULL + "stpes: 3\n"))
    assert "unknown key 'stpes'" in message
    assert "allowed: name, workload, command" in message


def test_unknown_nested_key_lists_that_level(tmp_path):
    text = FULL.replace("hazard: 0.05}", "hazard: 0.05, where: 1}")
    message = _error(_write(tmp_path, text))
    assert "unknown key 'workload.fault.where' (allowed: edge, hazard, mode)" in message


def test_wrong_type_names_the_key_and_the_value(tmp_path):
    message = _error(_write(tmp_path, FULL.replace("layers: 8", "layers: eight")))
    assert "workload.layers" in message and "'eight'" in message


def test_malformed_yaml(tmp_path):
    message = _error(_write(tmp_path, "name: x\nworkload: [\n"))
    assert "malformed YAML" in message and "line" in message


def test_not_a_mapping(tmp_path):
    assert "mapping" in _error(_write(tmp_path, "- a\n- b\n"))


def test_missing_file(tmp_path):
    assert "cannot read" in _error(tmp_path / "nope.yaml")


@pytest.mark.parametrize("text, needle", [
    ("name: x\n", "exactly one of workload"),
    ("name: x\nworkload: {builtin: fsdp2}\ncommand: [a]\n", "exactly one of workload"),
    ("name: x\ncommand: []\n", "must not be empty"),
    ("name: x\ncommand: [a]\noverrides: {a.b: 1}\n", "overrides need a config"),
    ("name: ../escape\ncommand: [a]\n", "name"),
    ("name: x\nworkload: {builtin: tensorflow}\n", "workload.builtin"),
    ("name: x\nworkload: {builtin: fsdp2, fault: {edge: e, hazard: 2}}\n", "hazard"),
    ("name: x\nworkload: {builtin: fsdp2, fault: {edge: e}}\n", "needs a hazard"),
    ("name: x\nworkload: {builtin: fsdp2, fault: {edge: 'fwd:a->b', mode: race, hazard: 0.1}}\n",
     "takes no hazard"),
    ("name: x\nworkload: {builtin: fsdp2, fault: {edge: 'bwd:a->b', mode: race}}\n",
     "forward edges only"),
    ("name: x\nworkload: {builtin: mindspore, fault: {edge: 'fwd:a->b', mode: race}}\n",
     "fsdp2 workload only"),
    ("name: x\nworkload: {builtin: fsdp2, compute_ms: -5}\n", "workload.compute_ms"),
    ("name: x\nworkload: {builtin: fsdp2, compute_ms: .nan}\n", "workload.compute_ms"),
    ("name: x\nworkload: {builtin: fsdp2, compute_ms: soon}\n", "workload.compute_ms"),
    ("name: x\nworkload: {builtin: mindspore, compute_ms: 30}\n", "compute_ms: options of the fsdp2"),
    ("name: x\nworkload: {builtin: fsdp2, world_size: 2, tp: 4}\n", "tp 4 must divide world_size 2"),
    ("name: x\nworkload: {builtin: mindspore, tp: 2}\n", "tp: options of the fsdp2"),
    ("name: x\nworkload: {builtin: fsdp2, world_size: 2, tp: 2, fault: {edge: 'fwd:a->b', "
     "mode: race}}\n", "needs an all-gather to race"),
    ("name: x\ncommand: [a]\nmetrics: {format: regex}\n", "metrics.pattern"),
    ("name: x\ncommand: [a]\ngraph: {source: static}\n", "graph.policy"),
    ("name: x\ncommand: [a]\nguard: always\n", "guard"),
    ("name: x\ncommand: [a]\nsteps: 0\n", "steps"),
    ("name: x\ncommand: [a]\nsearch: {all_off_runs: 0}\n", "all_off_runs"),
    ("name: x\ncommand: [a]\nsearch: {all_off_runs: sometimes}\n", "all_off_runs"),
])
def test_invalid_experiments(tmp_path, text, needle):
    assert needle in _error(_write(tmp_path, text))


def test_compute_ms_is_accepted_and_changes_the_fingerprint_only_when_set(tmp_path):
    plain = load_experiment(_write(tmp_path, FULL))
    assert plain.workload.compute_ms == 0
    timed = load_experiment(_write(tmp_path, FULL.replace("layers: 8", "layers: 8\n  compute_ms: 30")))
    assert timed.workload.compute_ms == 30
    assert timed.fingerprint() != plain.fingerprint()  # other timing: other runs
    zero = with_overrides(plain, {"workload.compute_ms": 0})
    assert zero.fingerprint() == plain.fingerprint()  # unset keeps earlier runs' hash
    assert "greater than or equal to 0" in _error(
        _write(tmp_path, FULL.replace("layers: 8", "layers: 8\n  compute_ms: -1")))


def test_tensor_parallel_mode_is_passed_to_the_workload_and_keys_runs_only_when_set(tmp_path):
    from bisect_prefetch.runs.workloads import argv_template

    plain = load_experiment(_write(tmp_path, FULL))
    assert plain.workload.tp == 1 and "--tp" not in argv_template(plain, steps=3)
    split = with_overrides(plain, {"workload.tp": 2})
    assert argv_template(split, steps=3)[-2:] == ["--tp", "2"]
    assert split.fingerprint() != plain.fingerprint()  # another topology: other runs
    assert with_overrides(plain, {"workload.tp": 1}).fingerprint() == plain.fingerprint()
    traced = with_overrides(plain, {"record.trace": "2-3", "record.trace_units": ["layers.4"]})
    assert traced.fingerprint() != with_overrides(plain, {"record.trace": "2-3"}).fingerprint()


def test_apply_overrides_sets_dotted_keys_on_a_copy():
    data = {"workload": {"builtin": "fsdp2", "world_size": 2}, "steps": 30}
    out = apply_overrides(data, {"workload.world_size": 1, "steps": 5, "graph.source": "runtime"})
    assert out == {"workload": {"builtin": "fsdp2", "world_size": 1}, "steps": 5,
                   "graph": {"source": "runtime"}}
    assert data["workload"]["world_size"] == 2


def test_apply_overrides_through_a_scalar_is_an_error():
    with pytest.raises(BisectPrefetchError, match="steps is not a mapping"):
        apply_overrides({"steps": 3}, {"steps.x": 1})


def test_with_overrides_validates_again(tmp_path):
    exp = load_experiment(_write(tmp_path, FULL))
    small = with_overrides(exp, {"workload.world_size": 1, "steps": 4})
    assert small.workload.world_size == 1 and small.steps == 4
    assert small.base_dir == exp.base_dir
    assert small.fingerprint() != exp.fingerprint()
    with pytest.raises(BisectPrefetchError, match="unknown key 'workload.wrld_size'"):
        with_overrides(exp, {"workload.wrld_size": 1})


def test_fingerprint_ignores_steps_and_search_settings(tmp_path):
    exp = load_experiment(_write(tmp_path, FULL))
    same = with_overrides(exp, {"steps": 3, "search.max_runs": 5, "timeout_s": 9})
    assert same.fingerprint() == exp.fingerprint()
    assert with_overrides(exp, {"seed": 1}).fingerprint() != exp.fingerprint()


MATRIX = """
experiment: exp.yaml
cells:
  - {name: baseline, mask: all-off, runs: 3, expect: consistent}
  - {name: single, overrides: {workload.world_size: 1}, mask: [bwd, "fwd:*"], guard: size-one,
     runs: 2, expect: any}
"""


def test_matrix_with_an_experiment_path(tmp_path):
    _write(tmp_path, FULL)
    matrix = load_matrix(_write(tmp_path, MATRIX, "matrix.yaml"))
    assert [c.name for c in matrix.cells] == ["baseline", "single"]
    assert matrix.cells[0].mask_specs() == ["all-off"]
    assert matrix.cells[1].mask_specs() == ["bwd", "fwd:*"]
    assert matrix.experiment_for(matrix.cells[1]).workload.world_size == 1
    assert matrix.experiment_for(matrix.cells[0]).workload.world_size == 2


def test_matrix_with_an_embedded_experiment(tmp_path):
    embedded = {"experiment": yaml.safe_load(FULL),
                "cells": [{"name": "a", "mask": "all-on", "runs": 2, "expect": "diverged"}]}
    matrix = load_matrix(_write(tmp_path, yaml.safe_dump(embedded), "m.yaml"))
    assert matrix.experiment.name == "fsdp2-demo"


@pytest.mark.parametrize("cells, needle", [
    ("[{name: a, mask: all-on, runs: 2, expect: maybe}]", "cells.0.expect"),
    ("[{name: a, mask: all-on, runs: 2, expect: any, colour: red}]", "unknown key 'cells.0.colour'"),
    ("[{name: a, mask: all-on, expect: any}]", "missing key 'cells.0.runs'"),
    ("[{name: a, mask: all-on, runs: 2, expect: any}, {name: a, mask: all-off, runs: 2, expect: any}]",
     "used twice"),
    ("[{name: a, overrides: {workload.nope: 1}, mask: all-on, runs: 2, expect: any}]",
     "cell 'a'"),
    ("[]", "cells"),
])
def test_invalid_matrices(tmp_path, cells, needle):
    _write(tmp_path, FULL)
    path = _write(tmp_path, f"experiment: exp.yaml\ncells: {cells}\n", "m.yaml")
    with pytest.raises(BisectPrefetchError) as info:
        load_matrix(path)
    assert needle in str(info.value)


@pytest.mark.parametrize("name", ["fsdp2.yaml", "fsdp2-fault.yaml", "fsdp2-race.yaml"])
def test_shipped_configs_load(name):
    exp = load_experiment(CONFIGS / name)
    assert exp.workload.builtin == "fsdp2"
    assert (exp.workload.fault is not None) == (name != "fsdp2.yaml")


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
experiment_like = st.fixed_dictionaries(
    {"name": st.sampled_from(["x", "", "a b"])},
    optional={
        "workload": st.dictionaries(
            st.sampled_from(["builtin", "layers", "world_size", "fault", "extra"]), yaml_values,
            max_size=4),
        "command": yaml_values,
        "steps": yaml_values,
        "metrics": yaml_values,
        "env": yaml_values,
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=experiment_like | yaml_values)
def test_fuzzed_experiments_load_or_fail_cleanly(tmp_path, data):
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(data))
    try:
        load_experiment(path)
    except BisectPrefetchError as exc:
        assert "\n" not in str(exc)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=60))
def test_fuzzed_text_loads_or_fails_cleanly(tmp_path, text):
    path = tmp_path / "fuzz.yaml"
    path.write_text(text)
    try:
        load_experiment(path)
    except BisectPrefetchError as exc:
        assert "\n" not in str(exc)
