"""The operators ExecuTorch's Vulkan runtime registers, read from its C++ sources.

The runtime looks an operator up by the name its ``VK_REGISTER_OP(name, fn)`` gave it
(``backends/vulkan/runtime/graph/ops/impl/*.cpp``); an operator the Python partitioner
accepts but no ``VK_REGISTER_OP`` names -- ``aten.logical_not.default``,
``aten.t_copy.default``, ``dim_order_ops._clone_dim_order.default`` in 1.5.1 -- makes the
runtime abort at load (``Missing operator``). The wheel ships no C++, so the list of the
runtime built for an ExecuTorch version is kept here, one file per version
(``runtime_operators/executorch-<version>.txt``, its first line the source commit), and read by
:func:`~..wheel_inventory.wheel_inventory`: without a runtime installed, an op absent from
the list counts as missing, as the probe would find it. A version with no list of its own
takes the newest list kept for its minor series (1.4.0 takes 1.4.1's: the two tags register
the same names); a series with none kept infers nothing.

Regenerate from an ExecuTorch checkout at the runtime's source commit::

    python -m fusionkit.backends.vulkan_adapter.registered_operators CHECKOUT [COMMIT]
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

from fusionkit.integration.versions import release

__all__ = ["kept_version", "operators_registered_in", "registered_operators", "source_commit"]

_HERE = Path(__file__).resolve().parent / "runtime_operators"
#: ``VK_REGISTER_OP(<name>, <function>)``; the macro's own definition names ``name``
_REGISTER = re.compile(r"VK_REGISTER_OP\(\s*([A-Za-z_][\w.]*)\s*,")
_IMPL = "backends/vulkan/runtime/graph/ops"


def operators_registered_in(checkout: Path, commit: str | None = None) -> frozenset[str]:
    """Every name a ``VK_REGISTER_OP`` of the runtime's sources registers: the working tree
    of ``checkout``, or its ``commit`` (read with ``git show``, nothing checked out)."""
    texts: list[str] = []
    if commit is None:
        texts = [p.read_text(errors="replace") for p in sorted((checkout / _IMPL).rglob("*.cpp"))]
    else:
        git = ["git", "-C", str(checkout)]
        listed = subprocess.run([*git, "ls-tree", "-r", "--name-only", commit, _IMPL],
                                capture_output=True, text=True, check=True).stdout.split()
        texts = [subprocess.run([*git, "show", f"{commit}:{p}"], capture_output=True,
                                text=True, check=True).stdout
                 for p in listed if p.endswith(".cpp")]
    return frozenset(m.group(1) for t in texts for m in _REGISTER.finditer(t))


def _file(version: str) -> Path:
    return _HERE / f"executorch-{version}.txt"


def _release(version: str) -> tuple[int, ...]:
    """``"1.4.1+cpu"`` -> ``(1, 4, 1)``; ``()`` for a string that is no version."""
    return release(version) or ()


def kept_version(version: str) -> str | None:
    """The version whose kept list stands for ``version``: its own, else the newest kept for
    its ``major.minor`` series; None when that series has none."""
    if _file(version).is_file():
        return version
    series = _release(version)[:2]
    kept = [p.name.removeprefix("executorch-").removesuffix(".txt")
            for p in _HERE.glob("executorch-*.txt")]
    same = [v for v in kept if len(series) == 2 and _release(v)[:2] == series]
    return max(same, key=_release) if same else None


@functools.cache
def _read(version: str) -> tuple[str, frozenset[str]] | None:
    kept = kept_version(version)
    if kept is None:
        return None
    path = _file(kept)
    lines = [ln.strip() for ln in path.read_text().splitlines()]
    commit = lines[0].removeprefix("# source ").strip() if lines and lines[0].startswith("#") else ""
    return commit, frozenset(ln for ln in lines if ln and not ln.startswith("#"))


def registered_operators(version: str) -> frozenset[str] | None:
    """The runtime's registered operator names for ExecuTorch ``version``; None when no
    list is kept for it (then nothing is inferred: every operator counts as present)."""
    found = _read(version)
    return None if found is None else found[1]


def source_commit(version: str) -> str | None:
    """The ExecuTorch commit the list for ``version`` was read from."""
    found = _read(version)
    return None if found is None else found[0]


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 2:
        print("usage: python -m fusionkit.backends.vulkan_adapter.registered_operators "
              "CHECKOUT [COMMIT]", file=sys.stderr)
        return 2
    checkout = Path(argv[0])
    commit = argv[1] if len(argv) > 1 else None
    names = operators_registered_in(checkout, commit)
    if commit is None:
        commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"],
                                capture_output=True, text=True).stdout.strip() or "working tree"
    print(f"# source {commit}")
    print("\n".join(sorted(names)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
