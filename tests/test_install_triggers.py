"""The install triggers of ``fusionkit exec``: the first call of an armed attribute installs
once, then runs what is installed now; every original comes back unchanged.

The attributes armed are exactly the ones the adapters replace (held to their patch sets
here), so a program under the launcher runs what it would run with the adapters installed
at start-up, while fusionkit's modules stay out of the process until the first lowering
step (``tests/test_exec_launcher.py``).
"""

from __future__ import annotations

import importlib
import threading
import types
from typing import Any

import pytest

from fusionkit.app.install_triggers import PATCHED_BY, InstallTriggers, resolve
from fusionkit.integration.hooks import PatchSet


def _toy() -> tuple[type, types.ModuleType]:
    class Toy:
        def __init__(self, v: int) -> None:
            self.v = v

        def method(self, x: int) -> str:
            return f"stock method {self.v + x}"

        @staticmethod
        def static(x: int) -> str:
            return f"stock static {x}"

        @classmethod
        def klass(cls, x: int) -> str:
            return f"stock class {cls.__name__} {x}"

    module = types.ModuleType("toy_module")
    module.Toy = Toy  # type: ignore[attr-defined]
    module.function = lambda x: f"stock function {x}"  # type: ignore[attr-defined]
    return Toy, module


def _patch_set(toy: type, module: types.ModuleType) -> PatchSet:
    """What an adapter's patch set does to the toy."""
    return PatchSet("fusionkit (toy)", lambda: [
        (toy, "method", lambda self, x: f"fk method {self.v + x}"),
        (toy, "static", staticmethod(lambda x: f"fk static {x}")),
        (toy, "klass", classmethod(lambda cls, x: f"fk class {cls.__name__} {x}")),
        (module, "function", lambda x: f"fk function {x}"),
    ])


@pytest.mark.parametrize("first", ["method", "static", "klass", "function", "bound", "init"])
def test_the_first_call_installs_once_and_every_call_runs_what_is_installed(first: str) -> None:
    toy, module = _toy()
    originals = {n: vars(toy)[n] for n in ("method", "static", "klass", "__init__")}
    original_function = module.function  # type: ignore[attr-defined]
    patches = _patch_set(toy, module)
    installs: list[int] = []

    def install() -> None:
        # every original is back before the patch set looks (it saves and wraps what it finds)
        assert all(vars(toy)[n] is o for n, o in originals.items())
        assert module.function is original_function  # type: ignore[attr-defined]
        installs.append(1)
        patches.install()

    triggers = InstallTriggers(install)
    for owner, name in ((toy, "method"), (toy, "static"), (toy, "klass"), (toy, "__init__"),
                        (module, "function")):
        assert triggers.arm(owner, name)
    bound = module.function  # type: ignore[attr-defined]  # a ``from m import f`` after arming
    assert not installs and triggers.armed == 5
    calls = {
        "method": lambda: toy(1).method(2),
        "static": lambda: toy.static(3),
        "klass": lambda: toy.klass(4),
        "function": lambda: module.function(5),  # type: ignore[attr-defined]
        "bound": lambda: bound(5),
        "init": lambda: toy(1).v,
    }
    got = calls[first]()
    assert installs == [1] and triggers.fired and triggers.armed == 0
    expected = {"method": "fk method 3", "static": "fk static 3", "klass": "fk class Toy 4",
                "function": "fk function 5", "bound": "fk function 5", "init": 1}
    assert got == expected[first]
    assert {k: calls[k]() for k in expected} == expected  # and every later call
    assert installs == [1]
    assert vars(toy)["__init__"] is originals["__init__"]  # not patched: put back
    # the patch set saved the originals, not the triggers: uninstalling restores stock
    patches.uninstall()
    assert all(vars(toy)[n] is o for n, o in originals.items())
    assert module.function is original_function  # type: ignore[attr-defined]
    assert bound(5) == "stock function 5"


def test_disarmed_attributes_are_the_identical_originals() -> None:
    toy, module = _toy()
    before = dict(vars(toy)), module.function  # type: ignore[attr-defined]
    triggers = InstallTriggers(lambda: None)
    for name in ("method", "static", "klass", "__init__"):
        triggers.arm(toy, name)
    triggers.arm(module, "function")
    assert vars(toy)["static"] is not before[0]["static"]
    triggers.disarm()
    assert all(vars(toy)[k] is v for k, v in before[0].items())
    assert module.function is before[1]  # type: ignore[attr-defined]


def test_a_second_thread_at_a_trigger_waits_for_the_install_and_runs_the_installed_code() -> None:
    toy, module = _toy()
    entered, release = threading.Event(), threading.Event()

    patches = _patch_set(toy, module)

    def slow_install() -> None:
        entered.set()
        release.wait(10)
        patches.install()

    triggers = InstallTriggers(slow_install)
    triggers.arm(toy, "static")
    triggers.arm(module, "function")
    bound = module.function  # type: ignore[attr-defined]  # bound by name after arming
    first = threading.Thread(target=lambda: toy.static(1))
    first.start()
    assert entered.wait(10)
    result: list[str] = []
    second = threading.Thread(target=lambda: result.append(bound(2)))
    second.start()
    second.join(0.2)
    assert second.is_alive()  # waiting for the install, not running stock's code
    release.set()
    first.join(10)
    second.join(10)
    assert result == ["fk function 2"]
    patches.uninstall()


def _live_targets(adapter: Any) -> tuple[set[tuple[str, str]], list[Any]]:
    attrs: set[tuple[str, str]] = set()
    dicts: list[Any] = []

    def walk(ps: Any) -> None:
        for owner, name, _ in ps._saved:
            if isinstance(owner, dict):
                dicts.append(owner)
            elif isinstance(owner, type):
                attrs.add((owner.__module__, f"{owner.__qualname__}.{name}"))
            else:
                attrs.add((owner.__name__, name))
        for inc in ps._includes:
            walk(inc)

    walk(adapter.PATCHES)
    return attrs, dicts


@pytest.mark.parametrize("backend", sorted(PATCHED_BY))
def test_the_armed_attributes_are_the_ones_the_adapter_replaces(backend: str) -> None:
    """Every attribute the installed adapter replaced is armed (else a call of it could
    run stock's code under the launcher); nothing is armed that the adapter leaves alone
    (the serde patch only where ExecuTorch can hold weights in files). The one patched
    dict, the Vulkan pattern registry, is read only by armed functions."""
    from fusionkit.integration.spilled_data import spill_supported

    adapter = importlib.import_module(f"fusionkit.backends.{backend}_adapter")
    if adapter.is_installed():
        pytest.skip("installed process-wide already")
    try:
        handle = adapter.install()
    except Exception as e:  # an adapter this ExecuTorch does not support (Arm on 1.4)
        pytest.skip(f"{backend} does not install here: {e}")
    with handle:
        live, dicts = _live_targets(adapter)
    table = set(PATCHED_BY[backend])
    assert live <= table, sorted(live - table)
    extra = table - live
    if not spill_supported():
        extra -= {("executorch.exir.serde.serialize",
                   "GraphModuleSerializer.serialize_lowered_module")}
    assert not extra, sorted(extra)
    for module, path in table:
        if (module, path) in live:
            assert resolve(importlib.import_module(module), path) is not None
    if dicts:
        registry = importlib.import_module("executorch.backends.vulkan.patterns.pattern_registry")
        assert all(d is registry.fusable_patterns for d in dicts)
        readers = {p for m, p in table if m == "executorch.backends.vulkan.patterns"}
        assert readers == {"get_all_fusable_subgraphs", "replace_all_fusable_subgraphs"}
