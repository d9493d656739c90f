"""Experiment and matrix files, by the names the rest of the package imports.

The models are experiment/model.py's, the YAML loading (its limits and error
wording, overrides) experiment/yaml_reader.py's, the matrix experiment/matrix.py's;
this module gathers their public names.
"""

from __future__ import annotations

from bisect_prefetch.experiment.matrix import Cell, Matrix, expectation_met, load_matrix
from bisect_prefetch.experiment.model import (
    ExecutorConfig,
    Experiment,
    Fault,
    GraphSource,
    Metrics,
    Record,
    Search,
    Stress,
    Workload,
    arg_max,
    check_steps_settable,
    check_stress_fits,
    exec_bytes,
    parse_steps_window,
    segments_unfit,
    steps_fixed,
    stress_fits,
    with_segments,
    with_stress,
)
from bisect_prefetch.experiment.yaml_reader import apply_overrides, load_experiment, with_overrides

__all__ = [
    "Cell", "ExecutorConfig", "Experiment", "Fault", "GraphSource", "Matrix", "Metrics", "Record",
    "Search", "Stress", "Workload", "apply_overrides", "arg_max", "check_steps_settable", "check_stress_fits",
    "exec_bytes", "parse_steps_window", "expectation_met", "load_experiment", "load_matrix", "segments_unfit",
    "steps_fixed", "stress_fits", "with_overrides", "with_segments", "with_stress",
]
