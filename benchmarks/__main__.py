"""`make bench`: every benchmark, one after another, each printing its own figures."""

import importlib
import sys
import time

BENCHES = ["bench_metrics", "bench_search", "bench_adapter", "bench_audit", "bench_workloads",
           "bench_digest_steps", "bench_executors", "bench_allocation", "bench_race", "bench_torchtitan", "bench_scale",
           "bench_reuse", "bench_explain"]


def main() -> int:
    only = sys.argv[1:]
    for name in BENCHES:
        if only and name not in only:
            continue
        print(f"== {name} ==", flush=True)
        start = time.perf_counter()
        module = importlib.import_module(f"benchmarks.{name}")
        module.main()
        print(f"== {name} done in {time.perf_counter() - start:.1f} s ==\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
