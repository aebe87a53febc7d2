"""``fusionkit exec``'s bootstrap: run in every Python process of the launched command.

The launcher puts this directory first on ``PYTHONPATH``. Python imports the first
``sitecustomize`` it finds, so this one also imports the one it shadows (the
environment's own, if any), then hands over to :func:`fusionkit.app.exec_child.start`.
Nothing here may stop the process: any failure is one line on stderr.
"""

import importlib.util
import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    saved, sys.path[:] = sys.path[:], rest
    try:
        mine = sys.modules.pop("sitecustomize", None)
        if importlib.util.find_spec("sitecustomize") is not None:
            importlib.import_module("sitecustomize")
        if mine is not None:
            sys.modules.setdefault("sitecustomize", mine)
    finally:
        sys.path[:] = saved


try:
    _chain()
except Exception as e:  # the shadowed sitecustomize's own failure, as Python would say it
    print(f"fusionkit exec: the environment's sitecustomize failed: {type(e).__name__}: {e}",
          file=sys.stderr)

try:
    from fusionkit.app import exec_child

    exec_child.start()
except Exception as e:
    print(f"fusionkit exec: fusionkit is not in effect in this process "
          f"({type(e).__name__}: {e})", file=sys.stderr)
