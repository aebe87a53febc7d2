"""Where the real Vulkan runtime library is, and its sha256: what a lowering asks.

The delegation check of every lowering asks whether a runtime is installed and what its
cached probe says (:func:`~.runtime_probe.cached_inventory`); that needs only this, not
:mod:`.runtime`, which loads and runs the library (:mod:`.runtime` re-exports these).

Where the library is looked for: ``$FUSIONKIT_VULKAN_RUNTIME`` (a path), then the cache
that ``scripts/vulkan-runtime`` fills, ``${FUSIONKIT_CACHE:-~/.cache/fusionkit}/
vulkan-runtime/executorch-<ver>_torch-<ver>_*/`` (its SHA256SUMS re-checked).
"""

from __future__ import annotations

import hashlib
import os
from importlib.metadata import PackageNotFoundError
from pathlib import Path

from fusionkit.integration.versions import distribution_version as _version

__all__ = ["LIBRARY", "RUNTIME_ENV", "cache_dir", "find_runtime", "library_sha256"]

LIBRARY = "libexecutorch_backend_vulkan.so"
RUNTIME_ENV = "FUSIONKIT_VULKAN_RUNTIME"


def cache_dir() -> Path:
    """Where ``scripts/vulkan-runtime`` keeps runtimes."""
    base = os.environ.get("FUSIONKIT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fusionkit")
    return Path(base) / "vulkan-runtime"


def _sha_ok(entry: Path) -> bool:
    sums = entry / "SHA256SUMS"
    lib = entry / LIBRARY
    if not (sums.is_file() and lib.is_file()):
        return False
    want = {line.split()[-1].lstrip("*"): line.split()[0]
            for line in sums.read_text().splitlines() if line.strip()}.get(LIBRARY)
    return want == library_sha256(lib)


#: (path, mtime_ns, size) -> sha256: a library is hashed once per process while unchanged
_SHA256: dict[tuple[str, int, int], str] = {}


def library_sha256(path: Path) -> str:
    """The sha256 of the file at ``path`` (finding the runtime and checking its probe both
    ask; the library is megabytes: hashing it is ~16 ms of every process's first lowering).
    Remembered in the process, and next to the file (``<name>.sha256``) for its exact
    stat: size, mtime, inode and ctime, which any write, rename or chmod changes and no
    program can set back; a file whose stat differs is hashed again."""
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    sha = _SHA256.get(key)
    if sha is None:
        stamp = f"{st.st_size} {st.st_mtime_ns} {st.st_ino} {st.st_ctime_ns}"
        memo = path.with_name(path.name + ".sha256")
        try:
            recorded, sha = memo.read_text().rsplit(" ", 1)
            if recorded != stamp or len(sha) != 64:
                sha = None
        except (OSError, ValueError):
            sha = None
        if sha is None:
            sha = hashlib.sha256(path.read_bytes()).hexdigest()
            try:
                memo.write_text(f"{stamp} {sha}")
            except OSError:  # a read-only cache: hashed again next process
                pass
        _SHA256[key] = sha
    return sha


def find_runtime() -> Path | None:
    """The runtime library for the installed executorch/torch, or None."""
    explicit = os.environ.get(RUNTIME_ENV)
    if explicit:
        return Path(explicit) if Path(explicit).is_file() else None
    try:
        prefix = f"executorch-{_version('executorch')}_torch-{_version('torch').split('+')[0]}_"
    except PackageNotFoundError:
        return None
    root = cache_dir()
    if not root.is_dir():
        return None
    entries = sorted((d for d in root.iterdir() if d.name.startswith(prefix) and d.is_dir()),
                     key=lambda d: d.stat().st_mtime, reverse=True)
    for entry in entries:
        if _sha_ok(entry):
            return entry / LIBRARY
    return None
