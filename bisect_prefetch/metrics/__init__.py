"""Training metrics: log parsers, run comparison, gradient digests."""

from bisect_prefetch.metrics.compare import (
    CompareResult,
    GroupResult,
    MetricDiff,
    StreamingComparator,
    compare_group,
    compare_paths,
    compare_series,
    compare_trajectories,
    same_bits,
)
from bisect_prefetch.metrics.digests import (
    DigestRecord,
    DigestResult,
    compare_digest_files,
    compare_digests,
    format_digest_line,
    parse_digest_line,
    read_digests,
)
from bisect_prefetch.metrics.lines import parse_jsonl_line
from bisect_prefetch.metrics.loading import (
    FORMATS,
    detect_format,
    load_files,
    load_run,
    load_runs,
    parse_file,
    run_files,
)
from bisect_prefetch.metrics.trajectory import ParseResult, Series, Trajectory

__all__ = [
    "FORMATS",
    "CompareResult",
    "DigestRecord",
    "DigestResult",
    "GroupResult",
    "MetricDiff",
    "ParseResult",
    "Series",
    "StreamingComparator",
    "Trajectory",
    "compare_digest_files",
    "compare_digests",
    "compare_group",
    "compare_paths",
    "compare_series",
    "compare_trajectories",
    "detect_format",
    "format_digest_line",
    "load_files",
    "load_run",
    "load_runs",
    "parse_digest_line",
    "parse_file",
    "parse_jsonl_line",
    "read_digests",
    "run_files",
    "same_bits",
]
