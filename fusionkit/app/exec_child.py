"""The child side of ``fusionkit exec``: adapters installed at the first lowering step.

Why lazily: the launcher puts this into every Python process of the command it runs (its
``sitecustomize``, :mod:`fusionkit.app.exec_boot`), and most processes a pipeline starts
never lower a program. Importing fusionkit's adapters eagerly would import torch and
ExecuTorch into each of them, and would hold fusionkit's modules through an exporter's own
``torch.export``. Instead a post-import hook watches the modules whose attributes the
adapters replace: as each finishes importing, those attributes are armed
(:mod:`fusionkit.app.install_triggers`), and the first call of any of them installs the
adapters, before that call runs. Nothing else changes in the process.

At exit the process writes what fusionkit did (per rule: fused; per rule and reason:
declined; the adapters installed or why not) to the launcher's report directory, one
JSON file per process; :mod:`fusionkit.app.exec_job` sums them.

This module imports only the standard library until the adapters install.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.abc
import json
import os
import sys
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

from fusionkit.app.install_triggers import PATCHED_BY, InstallTriggers, resolve

__all__ = ["ADAPTER_MODULES", "BACKENDS_VARIABLE", "BACKEND_RULE_SETS", "REPORT_DIR_VARIABLE", "start"]

#: the environment the launcher hands its command
BACKENDS_VARIABLE = "FUSIONKIT_EXEC_BACKENDS"
REPORT_DIR_VARIABLE = "FUSIONKIT_EXEC_REPORT_DIR"

#: backend name -> the adapter module whose ``install()`` puts fusionkit in
ADAPTER_MODULES: dict[str, str] = {
    "vulkan": "fusionkit.backends.vulkan_adapter",
    "xnnpack": "fusionkit.backends.xnnpack_adapter",
    "arm": "fusionkit.backends.arm_adapter",
}


class _State:
    def __init__(self, backends: Sequence[str], report_dir: str | None) -> None:
        self.backends = list(backends)
        self.report_dir = report_dir
        self.installing = False
        self.installed: dict[str, bool] = dict.fromkeys(self.backends, False)
        self.errors: dict[str, str] = {}
        self.triggers = InstallTriggers(self.try_install)
        #: module -> the attribute paths armed when it finishes importing
        self.watched: dict[str, list[str]] = {}
        for name in self.backends:
            for module, path in PATCHED_BY.get(name, ()):
                if path not in self.watched.setdefault(module, []):
                    self.watched[module].append(path)
        self.listening = False  # subscribed to fusionkit.events (once per process)
        #: (backend, rule) -> matches fused; (backend, rule) -> reason -> declines
        self.fused: Counter[tuple[str, str]] = Counter()
        self.declined: dict[tuple[str, str], Counter[str]] = {}
        self._owners: dict[str, str] | None = None
        #: seconds fusionkit's searches and applications took in this process
        self.seconds = 0.0
        self._seen_declines: set[tuple[str, str, str, str]] = set()
        #: (backend, what, why) -> partition changes an adapter made (:func:`events.placed`)
        self.placed: Counter[tuple[str, str, str]] = Counter()
        self.lock = threading.RLock()

    @property
    def done(self) -> bool:
        return all(self.installed.values())

    # ------------------------------------------------------------------ the adapters

    def try_install(self) -> None:
        """Install every adapter not installed yet; an adapter that fails keeps its error
        for the report, and the program runs on with stock ExecuTorch."""
        with self.lock:
            if self.installing or self.done:
                return
            self.installing = True
            try:
                for name in self.backends:
                    if self.installed[name]:
                        continue
                    try:
                        importlib.import_module(ADAPTER_MODULES[name]).install()
                    except Exception as e:  # the program runs on, with stock ExecuTorch
                        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                        self.errors[name] = f"{type(e).__name__}: {first}"[:300]
                    else:
                        self.installed[name] = True
                        self.errors.pop(name, None)
                if any(self.installed.values()):
                    self._listen()
            finally:
                self.installing = False

    def arm(self, module: Any) -> None:
        """Arm the watched attributes of ``module``, which has just finished importing."""
        for path in self.watched.get(getattr(module, "__name__", ""), ()):
            found = resolve(module, path)
            if found is not None:
                self.triggers.arm(*found)

    def _listen(self) -> None:
        from fusionkit import events

        if self.listening:
            return
        self.listening = True
        events.listen(self.on_decided, self.on_applied)
        events.listen_placements(self.on_placed)

    # ------------------------------------------------------------------ the record

    def owner(self, rule: str) -> str:
        """The backend whose rule sets hold ``rule`` (``user`` for a rule of nobody's);
        the sets are read at the first event, while the interpreter is whole."""
        if self._owners is None:
            self._owners = _rule_owners(self.backends)
        return self._owners.get(rule, "user")

    def on_decided(self, match_set: Any, seconds: float) -> None:
        self.seconds += seconds
        for d in match_set.declined:
            key = (d.rule, d.root.name, str(d.step), d.reason)
            with self.lock:
                if key in self._seen_declines:  # the same decline seen again (the
                    continue                   # partitioner's look, then preprocess)
                self._seen_declines.add(key)
                reason = f"{d.step}: {d.reason}"[:200]
                per = self.declined.setdefault((self.owner(d.rule), d.rule), Counter())
                per[reason] += 1

    def on_applied(self, matches: Sequence[Any], seconds: float) -> None:
        self.seconds += seconds
        with self.lock:
            for m in matches:
                self.fused[(self.owner(m.rule.name), m.rule.name)] += 1

    def on_placed(self, backend: str, what: str, why: str) -> None:
        with self.lock:
            self.placed[(backend, what, why[:300])] += 1

    def record(self) -> dict[str, Any]:
        per: dict[str, dict[str, Any]] = {}
        for name in [*self.backends, "user"]:
            per[name] = {"fused": {}, "declined": {}, "placed": []}
        for (backend, what, why), n in self.placed.items():
            if backend in per:
                per[backend]["placed"].append({"what": what, "why": why, "count": n})
        for (owner, rule), n in self.fused.items():
            per[owner]["fused"][rule] = n
        for (owner, rule), reasons in self.declined.items():
            per[owner]["declined"][rule] = dict(reasons)
        if not per["user"]["fused"] and not per["user"]["declined"]:
            del per["user"]
        return {
            "pid": os.getpid(),
            "argv": list(sys.argv),
            "executorch_imported": self.executorch_imported,
            "installed_by": self.triggers.fired_by,
            "installed": dict(self.installed),
            "errors": dict(self.errors),
            "fusionkit_seconds": self.seconds,
            "backends": per,
        }

    @property
    def executorch_imported(self) -> bool:
        return "executorch" in sys.modules

    def write(self) -> None:
        if not self.report_dir or not self.executorch_imported:
            return
        try:
            path = os.path.join(self.report_dir, f"{os.getpid()}.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(self.record(), f)
        except Exception:  # the program's own exit is never disturbed
            pass


#: backend -> the rule sets (``fusionkit.passes.registry``) its adapter runs
BACKEND_RULE_SETS: dict[str, tuple[str, ...]] = {
    "vulkan": ("vulkan", "vulkan_preprocess"),
    "xnnpack": ("xnnpack",),
    "arm": ("arm",),
}


def _rule_owners(backends: Sequence[str]) -> dict[str, str]:
    """Rule name -> the backend whose rule sets hold it (the first listed wins); the
    quantize step's rules belong to the first backend, every adapter installing the step."""
    try:
        from fusionkit.passes.registry import rule_set
    except Exception:
        return {}
    owners: dict[str, str] = {}
    for name in backends:
        for set_name in BACKEND_RULE_SETS.get(name, ()):
            try:
                for r in rule_set(set_name):
                    owners.setdefault(r.name, name)
            except Exception:
                continue
    if not backends:
        return owners
    try:
        from fusionkit.backends import quantize_step

        for rule in quantize_step.rule_names():
            owners.setdefault(rule, backends[0])
    except Exception:
        pass
    return owners


_STATE: _State | None = None


class _WatchedImports(importlib.abc.MetaPathFinder):
    """Finds nothing itself: marks the loader of each watched module so that its
    attributes are armed the moment it has finished executing -- before any other module
    can bind them by name."""

    def __init__(self, state: _State) -> None:
        self._state = state
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        state = self._state
        if fullname not in state.watched or state.triggers.fired or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.discard(fullname)
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_and_arm(module: Any) -> None:
            exec_module(module)
            state.arm(module)

        try:  # the loader object is this module's own: its class and checks are unchanged
            loader.exec_module = exec_and_arm
        except (AttributeError, TypeError):
            pass
        return spec


def start() -> None:
    """Set the launcher's adapters to install at the first call of anything they patch;
    at exit, write the record. Called by the launcher's ``sitecustomize``; does nothing
    unless the launcher's environment variable names backends."""
    global _STATE
    names = [b for b in os.environ.get(BACKENDS_VARIABLE, "").split(",") if b in ADAPTER_MODULES]
    if not names or _STATE is not None:
        return
    _STATE = _State(names, os.environ.get(REPORT_DIR_VARIABLE))
    if any(m in sys.modules for m in _STATE.watched):  # imported before us (a .pth file):
        _STATE.triggers.fire("start-up")               # names may be bound already
    else:
        sys.meta_path.insert(0, _WatchedImports(_STATE))
    atexit.register(_STATE.write)
