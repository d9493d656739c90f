"""bisect-prefetch's entry into a training job.

The launcher puts this directory first on PYTHONPATH and sets
BISECT_PREFETCH_PLAN. Python then imports this file at start-up, in every
process of the job (torchrun's and msrun's children inherit the environment).
With a plan set, it installs the adapter (bisect_prefetch.adapters.install).
Either way it then runs the sitecustomize this one shadows, if any, found
further down sys.path, so the user's own start-up code still runs. It never
stops the job: any failure is reported on stderr. (Later, at the job's import of
its engine, an adapter that refuses the engine does stop it: adapters/__init__.py.)
"""

import os
import sys
import traceback


def _report(what: str) -> None:
    print(f"bisect-prefetch: {what}:\n{traceback.format_exc()}", file=sys.stderr, flush=True)


def _install_adapter() -> None:
    if not os.environ.get("BISECT_PREFETCH_PLAN"):
        return
    import importlib.util

    if importlib.util.find_spec("bisect_prefetch") is None:
        # Not installed in the job's environment: use the package this file belongs to.
        package_parent = os.path.dirname(os.path.dirname(os.path.dirname(_here)))
        sys.path.append(package_parent)
    from bisect_prefetch.adapters import install

    install()


def _chain_to_shadowed_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    others = [p for p in sys.path if os.path.realpath(p or os.curdir) != _here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
try:
    _install_adapter()
except Exception:
    _report("adapter not installed")
try:
    _chain_to_shadowed_sitecustomize()
except Exception:
    _report("the shadowed sitecustomize failed")
