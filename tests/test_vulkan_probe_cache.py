"""A cached probe is stale once a rule creates an op it was not asked about.

Found in CI: a new rule (the asymmetric int8 fold) created ``sub.Tensor`` / ``sum.dim_IntList``
/ ``mul.Tensor``; the cached probe (same library, same probe version) had never been asked
about them, so the probe-aware partitioner and delegation check judged them missing.
``cached_inventory`` (which never probes) now says None for such a cache, and
``inventory`` asks the runtime about the new names only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fusionkit.backends.vulkan_adapter import runtime_probe as rp


def _write(lib: Path, operators: dict[str, bool]) -> None:
    lib.with_name("probe.json").write_text(json.dumps({
        "version": rp.PROBE_VERSION, "sha256": rp._sha(lib), "operators": operators,
        "shaders": ["binary_add_texture3d_float"]}))


def test_a_cache_that_misses_a_candidate_is_stale_and_only_that_is_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tmp_path / "libvulkan_backend.so"
    lib.write_bytes(b"not really a library")
    every = rp.candidate_operators()
    new = every[-1]
    _write(lib, {n: True for n in every if n != new})
    assert rp.cached_inventory(lib) is None

    asked: list[Any] = []

    def fake_operators(path: Path, *, only: Any = None, **_: Any) -> dict[str, bool]:
        asked.append(list(only) if only is not None else None)
        return {n: False for n in only}

    monkeypatch.setattr(rp, "operators", fake_operators)
    rp._inventory.cache_clear()
    inv = rp._inventory(lib, rp._sha(lib))
    assert asked == [[new]]  # the cached answers kept, only the new name asked
    assert inv.operators[new] is False and inv.operators[every[0]] is True
    cached = rp.cached_inventory(lib)  # written back: no longer stale
    assert cached is not None and cached.operators == inv.operators
    rp._inventory.cache_clear()


def test_an_unchecked_probe_answers_as_the_checked_one(tmp_path: Path) -> None:
    lib = tmp_path / "libvulkan_backend.so"
    lib.write_bytes(b"not really a library")
    every = rp.candidate_operators()
    gone = every[0]
    # complete: an operator recorded missing is missing
    _write(lib, {n: n != gone for n in every})
    unchecked = rp.cached_inventory(lib, check_stale=False)
    checked = rp.cached_inventory(lib)
    assert isinstance(unchecked, rp.UncheckedInventory) and checked is not None
    assert not unchecked.stale
    for inv in (unchecked, checked):
        assert not inv.has_operator(gone) and inv.has_operator(every[1])
        assert inv.missing_operators() == [gone]
    # stale: cached_inventory says None (every operator present), and so does the
    # unchecked one, once an answer depends on it
    _write(lib, {n: n != gone for n in every[:-1]})
    unchecked = rp.cached_inventory(lib, check_stale=False)
    assert rp.cached_inventory(lib) is None
    assert isinstance(unchecked, rp.UncheckedInventory) and unchecked.has_operator(every[1])
    assert "stale" not in vars(unchecked)  # not judged yet: no answer depended on it
    assert unchecked.has_operator(gone) and unchecked.missing_operators() == []
    assert unchecked.stale
