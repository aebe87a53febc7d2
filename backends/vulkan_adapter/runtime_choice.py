"""Which Vulkan runtime a verdict is judged against: :data:`AUTO`'s resolution.

:func:`use_runtime` sets one for a block; otherwise :data:`AUTO` is the runtime
``scripts/vulkan-runtime`` installed, once probed (its cached probe, never probing). Kept
apart from :mod:`.delegation` so that ``check()`` and the simulator, which :mod:`.delegation`
reaches, can resolve it too (:func:`~.wheel_inventory.effective_inventory`).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .runtime_probe import RuntimeInventory

__all__ = ["AUTO", "runtime_inventory", "use_runtime"]

#: "the runtime in effect": :func:`use_runtime`'s, else the installed one once probed
AUTO = "auto"
_RUNTIME: contextvars.ContextVar[Any] = contextvars.ContextVar("fusionkit_vulkan_runtime",
                                                               default=AUTO)


@contextlib.contextmanager
def use_runtime(inventory: RuntimeInventory | None) -> Iterator[None]:
    """In this block (this thread or task), fusions are judged against ``inventory``
    (None: the 1.5.1 registry is trusted) wherever :data:`AUTO` would look it up: the
    transform passes' and preprocess's delegation checks. E.g. around a whole lowering,
    for a device runtime probed elsewhere."""
    token = _RUNTIME.set(inventory)
    try:
        yield
    finally:
        _RUNTIME.reset(token)


def runtime_inventory(runtime: Any = AUTO) -> RuntimeInventory | None:
    """``runtime`` resolved: an inventory or None as given; :data:`AUTO`: the one
    :func:`use_runtime` set, else the installed runtime's cached probe (never probes)."""
    if isinstance(runtime, str):
        runtime = _RUNTIME.get()
    if isinstance(runtime, str):
        return _installed_inventory()
    return runtime


#: (runtime override, what the cache dir is made of) -> (the library found, its probe
#: file's stamp, inventory)
_INSTALLED: dict[tuple[str | None, ...], tuple[Any, Any, Any]] = {}
#: the variables :func:`.runtime_location.find_runtime` and its ``cache_dir`` read
_RUNTIME_VARIABLES = ("FUSIONKIT_VULKAN_RUNTIME", "FUSIONKIT_CACHE", "XDG_CACHE_HOME", "HOME")


def _installed_inventory() -> RuntimeInventory | None:
    """The installed runtime's cached probe. Finding the runtime hashes its library, so it
    is found once per process (per ``FUSIONKIT_VULKAN_RUNTIME``); its probe file is
    re-read when it changes (a probe made later in the process is seen)."""
    import os

    from . import runtime_location as loc
    from .runtime_probe import cached_inventory

    # read at every check: a dict lookup per variable, not a path built
    key = tuple(os.environ.get(v) for v in _RUNTIME_VARIABLES)
    found = _INSTALLED.get(key)
    path = loc.find_runtime() if found is None else found[0]
    if path is None:
        _INSTALLED[key] = (None, None, None)
        return None
    try:
        st = (path.parent / "probe.json").stat()
        stamp: Any = (st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = None
    if found is not None and found[1] == stamp:
        return found[2]  # type: ignore[no-any-return]
    # its staleness is judged when an answer depends on it (an operator recorded missing)
    inventory = cached_inventory(path, check_stale=False)
    _INSTALLED[key] = (path, stamp, inventory)
    return inventory
