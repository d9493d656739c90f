"""Run a callback right after the job imports a given module.

The adapter must cost nothing in jobs that never import torch (or
hyper_parallel), so it never imports a framework itself: it waits for the job
to do so. ``when_imported(name, callback)`` calls ``callback(module)`` once,
as soon as module ``name`` has finished executing (before the job's import
statement returns), or at once if it is already imported.

How: a ``sys.meta_path`` finder that, for a watched name only, asks the other
finders for the spec and wraps its loader so that ``exec_module`` runs the
callbacks afterwards; the module's ``__loader__`` and ``__spec__.loader`` are
put back to the real loader once it has run. Other imports pass through
untouched. A callback that raises an Exception is reported on stderr and never
breaks the job's import; one that raises SystemExit (an adapter refusing the job's
engine under a plan: adapters/__init__.py) ends the job there. Standard library only.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Callable
from types import ModuleType

Callback = Callable[[ModuleType], None]


def _run_callbacks(name: str, module: ModuleType, callbacks: list[Callback]) -> None:
    for callback in callbacks:
        try:
            callback(module)
        except Exception:
            print(
                f"bisect-prefetch: callback after importing {name} failed:\n"
                f"{traceback.format_exc()}",
                file=sys.stderr,
                flush=True,
            )


# Plain classes, not importlib.abc subclasses: importing importlib.abc costs ~6 ms at
# every process start, and the import system only needs these methods.
class _LoaderThatNotifies:
    """Delegates to the real loader, then runs the callbacks on the new module."""

    def __init__(self, loader, name: str, callbacks: list[Callback]):
        self._loader = loader
        self._name = name
        self._callbacks = callbacks

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # Put the real loader back first: some code inspects __loader__.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _run_callbacks(self._name, module, self._callbacks)

    def __getattr__(self, attr):  # get_code, is_package, get_resource_reader, ...
        return getattr(self._loader, attr)


class _PostImportFinder:
    def __init__(self) -> None:
        self.callbacks: dict[str, list[Callback]] = {}
        self._lock = threading.Lock()

    def find_spec(self, fullname, path, target=None):
        callbacks = self.callbacks.get(fullname)
        if not callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        with self._lock:
            # Each callback runs once: the first import that finds the module takes them.
            taken = self.callbacks.pop(fullname, [])
        if taken:
            spec.loader = _LoaderThatNotifies(spec.loader, fullname, taken)
        return spec


_finder = _PostImportFinder()


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once module ``name`` is imported (now if it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        _run_callbacks(name, module, [callback])
        return
    with _finder._lock:
        _finder.callbacks.setdefault(name, []).append(callback)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
