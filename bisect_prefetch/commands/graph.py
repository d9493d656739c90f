"""`bisect-prefetch graph` and `masks`: the prefetch edges of a policy or a real job, and a preset's mask.

A graph comes from a static policy (--policy, --layers) or from an
experiment: static, or learned by one short recorded run in the state dir
(runs/state.py). Narration goes to its own console (stderr in the CLI): stdout
carries the graph itself, pipe-able JSON.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from bisect_prefetch import graph as graphs
from bisect_prefetch.commands.common import write_text
from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.experiment import load_experiment
from bisect_prefetch.files import check_writable
from bisect_prefetch.runs.discover import static_graph
from bisect_prefetch.runs.state import open_state
from bisect_prefetch.runs.workloads import require_prefetch_graph
from bisect_prefetch.select import preset_mask


def load_graph(experiment_path: Path | None, policy: str | None, layers: int | None, *,
               state_dir: Path, narrate: Console | None = None) -> graphs.PrefetchGraph:
    """The graph of an experiment file, or of a static policy with a layer count."""
    if experiment_path is not None:
        if policy is not None:
            raise BisectPrefetchError("give an experiment file or --policy, not both")
        experiment = load_experiment(experiment_path)
        if experiment.graph.source == "static":
            return static_graph(experiment)
        require_prefetch_graph(experiment)
        with open_state(experiment, state_dir, console=narrate) as opened:
            return opened.graph()
    if policy is None or layers is None:
        raise BisectPrefetchError("give an experiment file, or --policy NAME and --layers N")
    return graphs.from_policy(policy, layers)


def graph(experiment_path: Path | None, *, policy: str | None, layers: int | None, fmt: str,
          out: Path | None, state_dir: Path, console: Console, narrate: Console) -> int:
    """Print (or write) the graph in a format: text, json, dot, mermaid, png (a file)."""
    g = load_graph(experiment_path, policy, layers, state_dir=state_dir, narrate=narrate)
    if fmt == "png":
        if out is None:
            raise BisectPrefetchError("--format png needs --out FILE")
        check_writable(out)
        graphs.render_png(g, out)
        console.print(f"wrote {out}", markup=False)
        return 0
    text = graphs.RENDERERS[fmt](g)
    if out is not None:
        write_text(out, text + "\n", console)
    else:
        print(text)
    return 0


def masks(experiment_path: Path | None, *, policy: str | None, layers: int | None, preset: str,
          state_dir: Path, console: Console, narrate: Console) -> int:
    """Which edges a preset enables and disables."""
    g = load_graph(experiment_path, policy, layers, state_dir=state_dir, narrate=narrate)
    ids = g.edge_ids()
    mask = preset_mask(preset, ids)
    enabled = [e for e in ids if e in mask]
    disabled = [e for e in ids if e not in mask]
    console.print(f"{preset}: {len(enabled)} enabled, {len(disabled)} disabled", markup=False)
    console.print("enabled:", markup=False)
    for e in enabled:
        console.print(f"  + {e}", markup=False)
    console.print("disabled:", markup=False)
    for e in disabled:
        console.print(f"  - {e}", markup=False)
    return 0
