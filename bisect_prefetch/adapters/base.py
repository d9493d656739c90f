"""What every framework adapter does the same way: units and their names, the sources of
prefetches, edges, the graph file, plan agreement, the step boundaries and digests.

A framework adapter (fsdp2, hyper_parallel) subclasses FrameworkAdapter and supplies what
is its engine's own: discovery (it calls ``name_unit`` for each unit it finds and
``add_edge`` as it learns edges), ``unit_rows()`` (each unit's graph order and shard
size), the tensors to digest (``find_digest_params``, ``gradient``, ``value``,
``measure``) and its patches, which route each prefetch through ``Session.prefetch``
from inside ``prefetching_from(source)``, tell ``root_forward_begins()`` where a step's
forward starts, and feed ``recording_order()`` while it records. ``check_hashes`` takes
every rank's plan hash once the adapter has them.

Standard library only (the framework is the subclass's business), Python 3.9.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from bisect_prefetch import vocab
from bisect_prefetch.vocab import VALUE_SUFFIX

from .optimizers import hook_optimizers
from .units import UNKNOWN_NAME, is_layer, node_kind, record_graph

DigestColumns = tuple[list[str], list[str], list[float], list[float]]
# One unit's graph row: (name, order in the first forward or None, shard size).
UnitRow = tuple[str, Any, Any]


class FrameworkAdapter:
    """The engine-independent half of an adapter (see the module docstring)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.edges: dict[str, dict[str, Any]] = {}
        self.graph_dirty = False
        self.roots: list[Any] = []  # the engine's root objects, in discovery order
        self.units: list[Any] = []  # the engine's unit objects, in discovery order
        self.unit_names: dict[int, str] = {}  # id(unit object) -> unit name
        self._local = threading.local()
        self._digest_key: tuple[str, int] | None = None
        self._digest_params: list[tuple[str, Any]] = []
        # What the digests covered, for the run's record of its signals (the probe).
        self.digest_summary: dict[str, Any] = {}
        session.add_update_listener(self.on_update)
        session.add_step_end_listener(self.on_step_end)
        session.add_exit_listener(self.on_exit)
        hook_optimizers(session.clock)

    # -- units and the sources of prefetches ----------------------------------------------
    def name_unit(self, unit: Any, name: str) -> None:
        if id(unit) not in self.unit_names:
            self.unit_names[id(unit)] = name
            self.units.append(unit)

    def name_of(self, unit: Any) -> str:
        if unit is None:
            return UNKNOWN_NAME
        return self.unit_names.get(id(unit), UNKNOWN_NAME)

    def sources(self) -> list[Any]:
        """This thread's stack of running hooks: the last is the source of a prefetch now."""
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    @contextlib.contextmanager
    def prefetching_from(self, source: Any) -> Iterator[None]:
        """Around a hook that may prefetch: it is the source of the prefetches inside."""
        sources = self.sources()
        sources.append(source)
        try:
            yield
        finally:
            sources.pop()

    def root_forward_begins(self) -> None:
        """A root's forward begins (before it unshards anything): a new step's."""
        self.session.forwards += 1
        self.session.clock.forward_begins()

    def recording_order(self) -> Any:
        """The session's order log while it still records (the first steps), else None."""
        order = self.session.order
        return order if order is not None and order.steps_left > 0 else None

    # -- the graph --------------------------------------------------------------------
    def add_edge(self, phase: str, src: str, dst: str, *, implicit: bool = False) -> str:
        edge = vocab.edge_id(phase, src, dst)
        if edge not in self.edges:
            self.edges[edge] = {"id": edge, "phase": phase, "src": src, "dst": dst,
                                "implicit": implicit}
            self.graph_dirty = True
        return edge

    def unit_rows(self) -> list[UnitRow]:
        """(name, order, shard size) of every unit."""
        raise NotImplementedError

    def graph_nodes(self) -> list[dict[str, Any]]:
        rows = self.unit_rows()
        names = [name for name, _, _ in rows]
        first_layer = min((order for name, order, _ in rows
                           if order is not None and is_layer(name)), default=None)
        nodes = [{"name": name, "kind": node_kind(name, order, names, first_layer),
                  "order": order, "shard_size": size} for name, order, size in rows]
        nodes.sort(key=lambda n: (n["order"] is None, n["order"] or 0))
        return nodes

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
        """Whether the adapter has found the job's units (no digests, no graph before)."""
        return bool(self.roots)

    def settle(self, *, at_exit: bool) -> None:
        """What the engine's adapter finishes before the graph is written (step end, exit)."""

    def on_step_end(self, step: int) -> None:
        if self.ready():
            self.settle(at_exit=False)
            if self.graph_dirty:
                self.write_graph()

    def on_exit(self) -> None:
        if self.ready():
            self.settle(at_exit=True)
            if self.graph_dirty:
                self.write_graph()

    # -- digests ----------------------------------------------------------------------
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

    def digest_params(self, glob: str) -> list[tuple[str, Any]]:
        """(name, parameter) of the parameters matching ``glob`` (cached per unit count)."""
        key = (glob, len(self.units))  # another root adds units: look again
        if self._digest_key != key:
            self._digest_key = key
            self._digest_params = self.find_digest_params(glob)
        return self._digest_params

    def find_digest_params(self, glob: str) -> list[tuple[str, Any]]:
        """(name, the engine's parameter object) of every parameter matching ``glob``."""
        raise NotImplementedError

    def gradient(self, param: Any) -> Any:
        """The parameter's local gradient shard now, or None (it took no part)."""
        raise NotImplementedError

    def value(self, param: Any) -> Any:
        """The parameter's local value shard now, or None."""
        raise NotImplementedError

    def measure(self, names: list[str], tensors: list[Any]) -> DigestColumns:
        """(names, digests, norms, max abs) of these tensors (an empty one is left out)."""
        raise NotImplementedError

    def tensor_digests(self, glob: str, step: int) -> DigestColumns:
        """Each matching parameter's local gradient shard, then each one's local value shard.

        A gradient that is None this step (the parameter took no part) is left out of the
        step's records; its value is still digested.
        """
        params = self.digest_params(glob)
        names: list[str] = []
        tensors: list[Any] = []
        for suffix, read in (("", self.gradient), (VALUE_SUFFIX, self.value)):
            for name, param in params:
                tensor = read(param)
                if tensor is not None:
                    names.append(name + suffix)
                    tensors.append(tensor)
        return self.measure(names, tensors)

    def nothing_digested_reason(self) -> str:
        """Why a step's digests may hold no tensor, in the engine's words (for the probe)."""
        return "the adapter found no parameter tensors to digest"

    def note_digests(self, names: list[str], step: int) -> None:
        summary = self.digest_summary
        if not summary:
            summary.update(parameters=0, gradients=0, first_step=step, steps=0,
                           coverage="every element", fewest_tensors=len(names))
            self.session.probe_extra["digests"] = summary
        gradients = sum(not n.endswith(VALUE_SUFFIX) for n in names)
        summary["parameters"] = max(summary["parameters"], len(names) - gradients)
        summary["gradients"] = max(summary["gradients"], gradients)
        # A step with no tensor digested compares nothing: no "bitwise" claim may rest on it.
        summary["fewest_tensors"] = min(summary["fewest_tensors"], len(names))
        if not names:
            summary["nothing_digested"] = self.nothing_digested_reason()
        summary["steps"] += 1
        summary["last_step"] = step
