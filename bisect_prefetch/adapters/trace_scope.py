"""Where an op runs, for the op tracer: its module, its unit, its phase's hook, and the
prefetch whose work it is.

Imported only by adapters/op_trace.py, inside a torch job. Standard library only (torch's
autograd node comes in from the tracer). Python 3.9.

- The module an op runs in: the innermost module whose forward is running (the tracer's
  global module hooks push and pop it); in backward, the module whose forward created the
  autograd node being run (``remember`` ties a node's sequence number to its module when
  a forward op may have created it).
- The unit (an FSDP state, named as the graph names it): the unit whose own hook runs now
  (``Session.unit_hook``: its pre- or post-forward, its pre-backward, its post-backward,
  its wait for an unshard), else the innermost unit holding the op's module. Targeted
  tracing records only the ops of a few units.
- The prefetch whose work an op is: the edge whose prefetch is running (issued by it, its
  listeners' work included), or the edge whose unshard a unit is waiting on and copying
  out now (FSDP2's copy-out; with a shard group of size one, the whole unshard).
"""

from __future__ import annotations

from typing import Any

ROOT = "root"  # the root module's (empty) name, as the graph names the root unit
ISSUED, COPY_OUT, WINDOW, READ = "issued", "copy-out", "window", "read"  # an op and an edge


class Scopes:
    """The tracer's record of where the job is (see the module docstring)."""

    def __init__(self) -> None:
        self.module_names: dict[Any, str] = {}  # module -> fully qualified name
        self.module_stack: list[str] = []
        self.seq_module: dict[int, str] = {}  # autograd sequence number -> forward's module
        self.unit_of_module: dict[Any, str] = {}  # an FSDP unit's module -> the unit's name
        self.unit_by_name: dict[str, str] = {}  # the unit's module name -> the unit's name
        self._unit_cache: dict[str, str | None] = {}
        self.hook_units: list[str | None] = []  # the unit whose own hook runs now (a stack)
        self.edges: list[tuple[str, str] | None] = []  # (edge, ISSUED|COPY_OUT), a stack

    # -- names ----------------------------------------------------------------------------
    def name_modules(self, names: dict[Any, str]) -> None:
        self.module_names = names

    def name_units(self, units: dict[Any, str]) -> None:
        """Each unit's modules -> the unit's name (from the framework adapter), once the
        modules have their names."""
        self.unit_of_module = dict(units)
        self.unit_by_name = {self.name(m): unit for m, unit in units.items()}
        self._unit_cache = {}

    def name(self, module: Any) -> str:
        name = self.module_names.get(module)
        if name is None:
            return type(module).__name__
        return name or ROOT

    def unit_of(self, module_name: str | None) -> str | None:
        """The innermost unit holding a module (by name); None where none does."""
        if module_name is None:
            return None
        cached = self._unit_cache.get(module_name, False)
        if cached is not False:
            return cached
        found, name = None, module_name
        while True:
            found = self.unit_by_name.get(name)
            if found is not None or name == ROOT:
                break
            name = name.rpartition(".")[0] or ROOT
        if found is None:
            found = self.unit_by_name.get(ROOT)
        self._unit_cache[module_name] = found
        return found

    # -- where an op runs -------------------------------------------------------------------
    def module(self, node: Any, counter: int) -> str | None:
        """The op's module (None in backward where no traced forward made its node).
        counter: autograd's next sequence number, in forward."""
        if node is not None:
            return self.seq_module.get(node._sequence_nr())
        if not self.module_stack:
            return None
        module = self.module_stack[-1]
        # The node this op may have created has the sequence number just below the counter.
        self.seq_module.setdefault(counter - 1, module)
        return module

    def unit(self, node: Any) -> str | None:
        """The unit an op runs for (see the module docstring)."""
        if self.hook_units:
            return self.hook_units[-1]
        if node is not None:
            return self.unit_of(self.seq_module.get(node._sequence_nr()))
        return self.unit_of(self.module_stack[-1]) if self.module_stack else None

    def edge(self) -> tuple[str, str] | None:
        """(edge id, ISSUED or COPY_OUT) of the prefetch whose work runs now, or None."""
        return self.edges[-1] if self.edges else None

    def step_ended(self) -> None:
        self.seq_module.clear()
