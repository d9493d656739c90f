"""What every framework adapter does the same way: edges, the graph file, plan agreement,
the step boundaries and digests. A framework adapter (fsdp2, hyper_parallel) subclasses
FrameworkAdapter and supplies ``graph_nodes()`` and ``tensor_digests(glob, step)``; it
calls ``add_edge`` as it learns edges, ``check_hashes`` once it has every rank's plan hash,
and tells ``self.session.clock`` where the root's forward begins and backward ends.

Standard library only (the framework is the subclass's business), Python 3.9.
"""

from __future__ import annotations

from typing import Any

from bisect_prefetch import vocab
from bisect_prefetch.vocab import VALUE_SUFFIX

from .optimizers import hook_optimizers
from .units import record_graph

DigestColumns = tuple[list[str], list[str], list[float], list[float]]


class FrameworkAdapter:
    """The engine-independent half of an adapter (see the module docstring)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.edges: dict[str, dict[str, Any]] = {}
        self.graph_dirty = False
        # What the digests covered, for the run's record of its signals (the probe).
        self.digest_summary: dict[str, Any] = {}
        session.add_update_listener(self.on_update)
        session.add_step_end_listener(self.on_step_end)
        session.add_exit_listener(self.on_exit)
        hook_optimizers(session.clock)

    # -- the graph --------------------------------------------------------------------
    def add_edge(self, phase: str, src: str, dst: str, *, implicit: bool = False) -> str:
        edge = vocab.edge_id(phase, src, dst)
        if edge not in self.edges:
            self.edges[edge] = {"id": edge, "phase": phase, "src": src, "dst": dst,
                                "implicit": implicit}
            self.graph_dirty = True
        return edge

    def graph_nodes(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def write_graph(self) -> None:
        self.graph_dirty = False
        record_graph(self.session, nodes=self.graph_nodes(), edges=self.edges)

    # -- plan agreement ---------------------------------------------------------------
    def check_hashes(self, hashes: list[str]) -> None:
        """Record every rank's plan hash; different plans stop the job.

        Ranks with different masks would issue collectives in different orders and hang.
        """
        self.session.probe_extra["plan_hashes"] = hashes
        if len(set(hashes)) > 1:
            self.session.note_error(f"ranks run with different plans: {hashes}")
            self.session.write_probe()
            raise RuntimeError(f"bisect-prefetch: ranks run with different plans: {hashes}")

    # -- steps ------------------------------------------------------------------------
    def ready(self) -> bool:
        """Whether the adapter has found the job's units (no digests before that)."""
        return True

    def on_update(self, step: int) -> None:
        """The optimizer is about to apply this step's gradients: digest them, and the values."""
        plan = self.session.plan
        recorder = self.session.recorder
        if plan is None or recorder is None or not plan.digest_glob or not self.ready():
            return
        if step % plan.digest_every:
            return
        names, digests, norms, peaks = self.tensor_digests(plan.digest_glob, step)
        recorder.digest_columns(step, names, digests, norms, peaks)
        self.note_digests(names, step)

    def tensor_digests(self, glob: str, step: int) -> DigestColumns:
        """(names, digests, norms, max abs) of the gradients and values to digest now."""
        raise NotImplementedError

    def note_digests(self, names: list[str], step: int) -> None:
        summary = self.digest_summary
        if not summary:
            summary.update(parameters=0, gradients=0, first_step=step, steps=0,
                           coverage="every element")
            self.session.probe_extra["digests"] = summary
        gradients = sum(not n.endswith(VALUE_SUFFIX) for n in names)
        summary["parameters"] = max(summary["parameters"], len(names) - gradients)
        summary["gradients"] = max(summary["gradients"], gradients)
        summary["steps"] += 1
        summary["last_step"] = step

    def on_step_end(self, step: int) -> None:
        if self.graph_dirty:
            self.write_graph()

    def on_exit(self) -> None:
        if self.graph_dirty:
            self.write_graph()

