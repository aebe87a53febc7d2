"""What the loaded Vulkan runtime actually has: operators and shader variants, probed.

The 1.5.1 partitioner delegates what *its* Python registry lists, and the Vulkan
preprocess adds the ops its fusions create; a device runtime built from another tree
may lack some of them (the public tree has no ``aten.logical_not.default``, and no
``llama.sdpa_with_kv_cache.default`` under that name), and then the program is refused
at load (``Missing operator: ...``). Nothing here is a hand-made list:

* :func:`candidate_operators`: every op the partitioner's registry lists and every op
  fusionkit's Vulkan rules (transform passes, preprocess) can create (:mod:`.rule_ops`,
  read from the rules' replacements), by the name the payload gives it.
* :func:`operators` asks the runtime about each candidate whose name the library does
  not contain (a registered operator's name is in it: ``VK_REGISTER_OP`` stringifies
  it; one found only as the tail of a longer name is asked about too): one tiny program
  per operator (the same
  one-op Vulkan graph with the operator's name in it), all run in a child process;
  the runtime answers ``Missing operator: NAME`` for an operator it lacks and goes on
  to the operator's own argument checks for one it has.
* :func:`shader_names` reads the runtime's shader registry: the names its
  ``spv.cpp`` registers, as stored in the library.

Both are cached next to the runtime (``probe.json``, keyed by the library's sha256),
so a process pays for the probe once per runtime.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import re
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

from fusionkit import resolve_op

from . import runtime_location as loc

__all__ = ["PROBE_VERSION", "RuntimeInventory", "UncheckedInventory", "cached_inventory",
           "candidate_operators", "inventory", "operators", "shader_names"]

#: 5: the candidates include the ops the rules create and the registry's string keys; a
#: name found in the library only as the tail of a longer name is asked about
PROBE_VERSION = 5
_MISSING = re.compile(r"Missing operator: (\S+)")
_SHADER = re.compile(rb"[a-z][a-z0-9_]{2,80}")


@dataclasses.dataclass(frozen=True)
class RuntimeInventory:
    """The operators and shaders a runtime library has."""

    library_sha256: str
    #: operator name (as a Vulkan payload names it) -> present, for every
    #: :func:`candidate_operators` name
    operators: dict[str, bool]
    shaders: frozenset[str]

    def missing_operators(self) -> list[str]:
        return sorted(k for k, v in self.operators.items() if not v)

    def has_operator(self, name: str) -> bool:
        """Unprobed names count as present (the probe covers the partitioner's registry
        and what the rules create)."""
        return self.operators.get(name, True)

    def describe(self) -> str:
        """How a reason names this runtime."""
        return f"the Vulkan runtime probed (library sha256 {self.library_sha256[:12]})"

    def named(self) -> str:
        """How the partitioner's kept-off reasons name this runtime."""
        return f"the Vulkan runtime (probed, library sha256 {self.library_sha256[:12]})"

    @functools.cached_property
    def fingerprint(self) -> tuple[str, tuple[str, ...]]:
        """The library and the operators recorded missing: two inventories with the same
        fingerprint answer every question alike (computed once per inventory)."""
        return self.library_sha256, tuple(sorted(k for k, v in self.operators.items() if not v))


@dataclasses.dataclass(frozen=True)
class UncheckedInventory(RuntimeInventory):
    """A cached probe read without :func:`cached_inventory`'s staleness check, which is
    made on the first answer that depends on it. A stale probe (not asked about every
    :func:`candidate_operators` name) is, for :func:`cached_inventory`, no inventory: every
    operator present. Only an operator recorded missing answers differently, so the check
    (every rule of :data:`~.rule_ops.RULE_SETS` built and read, the registry's op libraries
    imported: tens of milliseconds) waits for the first such answer, and is made once."""

    def has_operator(self, name: str) -> bool:
        return self.operators.get(name, True) or self.stale

    def missing_operators(self) -> list[str]:
        return [] if self.stale else super().missing_operators()

    @functools.cached_property
    def stale(self) -> bool:
        """Whether :func:`cached_inventory` would say None for this probe."""
        return _stale(self.operators)


def _sha(path: Path) -> str:
    return loc.library_sha256(path)


def _registry_names() -> set[str]:
    """The payload names of the 1.5.1 partitioner's registry: its op objects' names, and
    each overload of an op it lists by ``"ns::name"`` string (the llama KV-cache ops)."""
    from executorch.backends.vulkan.op_registry import vulkan_supported_ops

    from .rule_ops import payload_names

    names: set[str] = set()
    for key in vulkan_supported_ops:
        if not isinstance(key, str):
            names.add(getattr(key, "__name__", str(key)))
            continue
        ns, _, name = key.partition("::")
        try:
            packet = resolve_op(f"{ns}.{name}.default")._overloadpacket
        except Exception:  # the op's library is not importable here: nothing to ask
            continue
        for overload in packet.overloads():
            names.update(payload_names(getattr(packet, overload)))
    return {n for n in names if n.count(".") >= 1}


def candidate_operators() -> list[str]:
    """The payload names of every operator the 1.5.1 partitioner can delegate and every
    operator fusionkit's Vulkan rules can create (:func:`.rule_ops.created_operators`)."""
    from .rule_ops import created_operators

    return sorted(_registry_names() | set(created_operators()))


def shader_names(path: Path) -> frozenset[str]:
    """Shader names in the library's registry: NUL-terminated identifiers that look like
    the generated variants (``<op>_<...>`` with a storage or dtype part)."""
    data = path.read_bytes()
    found = set()
    for chunk in data.split(b"\0"):
        if _SHADER.fullmatch(chunk) and (b"texture" in chunk or b"buffer" in chunk):
            found.add(chunk.decode())
    return frozenset(found)


def _probe_programs(names: list[str]) -> list[bytes]:
    """One .pte per name: a one-op Vulkan graph (``abs`` lowered by stock ExecuTorch) whose
    operator is renamed."""
    import torch
    from executorch.backends.vulkan import vulkan_preprocess as vp
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    class Abs(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.abs()

    captured: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
    original = vp.serialize_vulkan_graph

    def capture(graph: Any, *args: Any, **kwargs: Any) -> bytes:
        captured.append((graph, args, kwargs))
        return original(graph, *args, **kwargs)

    vp.serialize_vulkan_graph = capture  # scoped to this one lowering, restored below
    try:
        edge = to_edge_transform_and_lower(torch.export.export(Abs(), (torch.randn(4, 4),)),
                                           partitioner=[VulkanPartitioner()])
    finally:
        vp.serialize_vulkan_graph = original
    (graph, args, kwargs), = captured
    (_, lowered, _), = get_lowered_submodules(edge.exported_program().graph_module)
    out = []
    for name in names:
        g = copy.deepcopy(graph)
        g.chain[0] = dataclasses.replace(g.chain[0], name=name)
        lowered._processed_bytes = original(g, *args, **kwargs)
        out.append(bytes(edge.to_executorch().buffer))
    return out


def operators(path: Path | None = None, *, timeout: float = 60.0,
              only: Iterable[str] | None = None) -> dict[str, bool]:
    """Operator name -> whether the runtime at ``path`` has it (probed, see the module);
    ``only``: just these candidates (what a cached probe was not asked about)."""
    from . import runtime as rt  # (loads and runs the library: imported by a probe only)

    path = path or loc.find_runtime()
    if path is None:
        raise rt.RuntimeNotFoundError("no real Vulkan runtime to probe: bash scripts/vulkan-runtime")
    # an operator is registered under its name (VK_REGISTER_OP stringifies it): a name
    # the library does not contain is asked about, and so is one found only as the tail
    # of a longer name ("custom_sdpa.default" in "llama.custom_sdpa.default"); the
    # others are present
    data = path.read_bytes()
    every = candidate_operators() if only is None else list(only)
    present = {n: True for n in every if _contains_name(data, n)}
    names = [n for n in every if n not in present]
    results = rt.run_many_in_child([rt.Job(p, None) for p in _probe_programs(names)],
                                   timeout=timeout)
    for name, res in zip(names, results, strict=True):
        said = _MISSING.search(res.stderr or "") or _MISSING.search(res.message or "")
        present[name] = not (said and said.group(1) == name)
    return present


def _contains_name(data: bytes, name: str) -> bool:
    """``name`` occurs in ``data`` not preceded by a name character (then it is the tail
    of another name, not a registration of its own)."""
    return re.search(rb"(?<![\w.])" + re.escape(name.encode()), data) is not None


def _cache_file(path: Path) -> Path:
    return path.parent / "probe.json"


@cache
def _inventory(path: Path, sha: str) -> RuntimeInventory:
    cache_file = _cache_file(path)
    try:
        rec = json.loads(cache_file.read_text())
        if rec.get("version") == PROBE_VERSION and rec.get("sha256") == sha:
            unasked = [n for n in candidate_operators() if n not in rec["operators"]]
            if not unasked:
                return RuntimeInventory(sha, rec["operators"], frozenset(rec["shaders"]))
            # a rule now creates an op the cached probe was not asked about: ask only that
            inv = RuntimeInventory(sha, {**rec["operators"], **operators(path, only=unasked)},
                                   frozenset(rec["shaders"]))
            _write_cache(cache_file, inv)
            return inv
    except (OSError, ValueError, KeyError):
        pass
    inv = RuntimeInventory(sha, operators(path), shader_names(path))
    _write_cache(cache_file, inv)
    return inv


def _write_cache(cache_file: Path, inv: RuntimeInventory) -> None:
    try:
        tmp = cache_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": PROBE_VERSION, "sha256": inv.library_sha256,
                                   "operators": inv.operators, "shaders": sorted(inv.shaders)},
                                  indent=1))
        tmp.replace(cache_file)
    except OSError:  # a read-only cache: the probe is redone next process
        pass


def _stale(operators: dict[str, bool]) -> bool:
    """The probe was not asked about an op the rules now create (``inventory()`` asks)."""
    return any(n not in operators for n in candidate_operators())


def _read_cache(path: Path) -> UncheckedInventory | None:
    """The probe cached for the library at ``path`` (its version and sha256 checked; the
    staleness not yet: :class:`UncheckedInventory`), or None."""
    try:
        rec = json.loads(_cache_file(path).read_text())
    except (OSError, ValueError):
        return None
    if rec.get("version") != PROBE_VERSION or rec.get("sha256") != _sha(path):
        return None
    return UncheckedInventory(rec["sha256"], rec.get("operators", {}), frozenset(rec["shaders"]))


def cached_inventory(path: Path | None = None, *, check_stale: bool = True
                     ) -> RuntimeInventory | None:
    """The inventory if this runtime was already probed (never probes: cheap); None when
    its probe is stale. ``check_stale=False``: an :class:`UncheckedInventory`, which
    answers as this function would and makes the staleness check only when an answer
    depends on it (an operator recorded missing)."""
    path = path or loc.find_runtime()
    if path is None:
        return None
    unchecked = _read_cache(path)
    if unchecked is None or not check_stale:
        return unchecked
    if unchecked.stale:
        return None
    return RuntimeInventory(unchecked.library_sha256, unchecked.operators, unchecked.shaders)


def inventory(path: Path | None = None) -> RuntimeInventory | None:
    """The inventory of the runtime found (None: there is none); probed once per runtime."""
    path = path or loc.find_runtime()
    if path is None:
        return None
    return _inventory(path, _sha(path))


if __name__ == "__main__":  # python3 -m fusionkit.backends.vulkan_adapter.runtime_probe
    inv = inventory()
    if inv is None:
        raise SystemExit("no real Vulkan runtime: bash scripts/vulkan-runtime")
    missing = inv.missing_operators()
    print(f"{len(inv.operators)} operators probed, {len(missing)} missing: {', '.join(missing)}")
    print(f"{len(inv.shaders)} shader variants")
