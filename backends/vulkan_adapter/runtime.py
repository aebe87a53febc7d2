"""ExecuTorch's real Vulkan runtime: find it, load it once, run programs — safely in a child.

The simulator (:mod:`.inspect.simulator`) is a model of the runtime; this module runs
the runtime itself: ``libexecutorch_backend_vulkan.so`` (ExecuTorch's
``backends/vulkan/runtime``, built against the wheel's ``libexecutorch.so``; get it with
``bash scripts/vulkan-runtime``), loaded with ``RTLD_GLOBAL`` next to the wheel's
``portable_lib`` so that ``VulkanBackend`` is registered, on Mesa's lavapipe (a CPU
Vulkan driver) unless ``VK_ICD_FILENAMES`` names another.

A program the runtime rejects often *aborts the process* (a failed ``VK_CHECK_COND``
is an uncaught C++ exception), so :func:`run_in_child` / :func:`run_many_in_child`
run programs in a child process and return either the outputs or the runtime's own
message (``prepack_standard ... (graph.val_is_tref(tensor_data)) is false!``); the
caller, a CLI or a test run, never dies. :func:`run` runs in this process, for
programs already known to load.

Where the library is looked for: ``$FUSIONKIT_VULKAN_RUNTIME`` (a path), then the cache
that ``scripts/vulkan-runtime`` fills, ``${FUSIONKIT_CACHE:-~/.cache/fusionkit}/
vulkan-runtime/executorch-<ver>_torch-<ver>_*/`` (its SHA256SUMS re-checked).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

if __package__:
    from .runtime_location import LIBRARY, RUNTIME_ENV, cache_dir, find_runtime
    from .runtime_location import library_sha256 as library_sha256  # (re-exported)
else:  # run as a file in the runtime's child process (runpy.run_path): its sibling by path
    import runpy

    _location = runpy.run_path(str(Path(__file__).with_name("runtime_location.py")))
    LIBRARY, RUNTIME_ENV = _location["LIBRARY"], _location["RUNTIME_ENV"]
    cache_dir, find_runtime = _location["cache_dir"], _location["find_runtime"]
    library_sha256 = _location["library_sha256"]

__all__ = [
    "LAVAPIPE_ICD",
    "LIBRARY",
    "UNINITIALIZED_STATE_OPS",
    "Job",
    "LoadedRuntime",
    "RunResult",
    "RuntimeNotFoundError",
    "RuntimeSession",
    "cache_dir",
    "child_environment",
    "device_name",
    "find_runtime",
    "load",
    "load_cpu_kernels",
    "run",
    "run_in_child",
    "run_many_in_child",
    "uninitialized_state",
]

LAVAPIPE_ICD = "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json"
#: what the child prints on stderr before each program, to cut its stderr per program
_MARK = "@@fusionkit-vulkan-run "


class RuntimeNotFoundError(RuntimeError):
    """No usable real Vulkan runtime: the message says how to get one."""


def _require_runtime() -> Path:
    path = find_runtime()
    if path is None:
        where = os.environ.get(RUNTIME_ENV) or str(cache_dir())
        raise RuntimeNotFoundError(
            f"no real Vulkan runtime for executorch {version('executorch')} (looked in {where}); "
            "get one with `bash scripts/vulkan-runtime --source DIR` (an ExecuTorch checkout: "
            "`bash scripts/executorch-source VERSION DIR`) or `--prebuilt DIR`. Without it, "
            "`fusionkit simulate` and `check()` model the runtime on the CPU.")
    return path


def child_environment(path: Path | None = None) -> dict[str, str]:
    """The environment a process needs to load the runtime: its path and a Vulkan driver
    (lavapipe when ``VK_ICD_FILENAMES`` is unset)."""
    env = dict(os.environ)
    env[RUNTIME_ENV] = str(path or _require_runtime())
    if "VK_ICD_FILENAMES" not in env and os.path.isfile(LAVAPIPE_ICD):
        env["VK_ICD_FILENAMES"] = LAVAPIPE_ICD
    return env


@dataclasses.dataclass(frozen=True)
class LoadedRuntime:
    """The runtime loaded into this process."""

    path: Path
    #: the Vulkan device programs run on (``vulkaninfo --summary``), e.g. "llvmpipe (LLVM ...)"
    device: str
    backends: tuple[str, ...]


@functools.cache
def device_name() -> str:
    """The Vulkan device the loader picks under this environment (``vulkaninfo --summary``)."""
    exe = shutil.which("vulkaninfo")
    if exe is None:
        return "unknown (vulkaninfo not installed: apt-get install vulkan-tools)"
    env = dict(os.environ)
    if "VK_ICD_FILENAMES" not in env and os.path.isfile(LAVAPIPE_ICD):
        env["VK_ICD_FILENAMES"] = LAVAPIPE_ICD
    try:
        out = subprocess.run([exe, "--summary"], capture_output=True, text=True, timeout=60,
                             env=env).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown (vulkaninfo: {e})"
    names = [line.split("=", 1)[1].strip() for line in out.splitlines()
             if line.strip().startswith("deviceName")]
    return names[0] if names else "none (vulkaninfo lists no device)"


_LOADED: LoadedRuntime | None = None


def load_cpu_kernels() -> None:
    """The CPU kernels a delegated program's other nodes run on: the wheel's portable ones
    and its quantized ones (``quantized_decomposed::*``, which the quantized part of a
    program left to the CPU calls; ExecuTorch's quantized runners link them too), and the
    LLM custom ops' (``llama::*``, which export_llm's runners link). The partitioner keeps a
    node off the delegate only if these run it (:mod:`.runtime_support`)."""
    try:
        import executorch.kernels.quantized  # (registers them with portable_lib)
    except ImportError:  # a wheel without them: the portable kernels only
        pass
    try:
        import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (llama::*)
    except Exception:  # a wheel without them (or without their library)
        pass


def load() -> LoadedRuntime:
    """Load the runtime into this process, once; raises :class:`RuntimeNotFoundError` when
    there is none or it does not register an available ``VulkanBackend``."""
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    path = _require_runtime()
    if "VK_ICD_FILENAMES" not in os.environ and os.path.isfile(LAVAPIPE_ICD):
        os.environ["VK_ICD_FILENAMES"] = LAVAPIPE_ICD
    from executorch.extension.pybindings import portable_lib  # loads libexecutorch.so first

    ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    load_cpu_kernels()
    backends = tuple(portable_lib._get_registered_backend_names())
    if "VulkanBackend" not in backends:
        raise RuntimeNotFoundError(f"{path} loaded but registered no VulkanBackend ({backends})")
    if not portable_lib._is_available("VulkanBackend"):
        raise RuntimeNotFoundError(
            f"{path}: VulkanBackend is registered but not available: no Vulkan device "
            f"(VK_ICD_FILENAMES={os.environ.get('VK_ICD_FILENAMES')!r}; "
            "apt-get install mesa-vulkan-drivers for lavapipe)")
    _LOADED = LoadedRuntime(path, device_name(), backends)
    return _LOADED


#: Vulkan payload ops whose runtime makes state it never initialises: the ops with an
#: ``uninitialized_state`` condition in :mod:`.inspect.runtime_conditions` (one table for
#: the simulator, ``check()`` and these runners; a condition added there isolates here).
#: ``SDPA.cpp`` (``sdpa_with_kv_cache_impl``, ``compute_attn_weight_with_kv_cache_impl``)
#: makes the k/v caches with ``graph.add_tensor_like(k_cache_data, ...)``: the constant's
#: sizes and dtype, never its bytes. So the caches start as whatever device memory the
#: allocator hands out: zeros in a process that has freed no graph (lavapipe's fresh
#: pages), the data a freed graph left there after one. A program reading cache positions
#: it has not written yet (eager: the buffers' initial zeros) is right in a fresh process
#: and wrong after another program was freed (found: a KV-cache program run at position 3
#: equal to eager alone, 1.8 off after the same program at position 0 - its caches held
#: the first run's k/v). The unfused ``update_cache`` + ``llama.custom_sdpa`` prepack the
#: caches from the constants (``et_vk.prepack``) and are not affected.
#: (Not defined in the child, which runs this file alone - stdlib, torch and executorch
#: only - and runs the jobs it is given: the parent chose them.)
if __package__:
    from .inspect.runtime_conditions import UNINITIALIZED_STATE_OPS

    #: the op names as the payload's flatbuffer holds them (UTF-8, contiguous): a program
    #: whose bytes hold none of them has none of the ops, and is not decoded
    _UNINITIALIZED_STATE_NAMES = tuple(sorted(n.encode() for n in UNINITIALIZED_STATE_OPS))


def uninitialized_state(pte: bytes) -> list[str]:
    """The ops of ``pte``'s Vulkan delegates whose state the runtime does not initialise
    (:data:`UNINITIALIZED_STATE_OPS`), in payload order; [] when there are none or the
    bytes are not a readable program (the runtime then says what is wrong with them).
    :class:`RuntimeSession` and :func:`run_many_in_child` run such a program in a child
    that has run nothing else, so its result does not depend on what ran before it.

    Cheap for a program without them: an op's name is stored verbatim in its payload, so
    bytes that hold none of the names are answered without decoding; the payloads are
    decoded only when a name is there (it may be a constant's bytes or another op's name,
    ``llama.sdpa_with_kv_cache.default``, which the decode tells apart)."""
    try:
        data = pte if isinstance(pte, (bytes, bytearray)) else bytes(pte)
    except Exception:  # not bytes: nothing to isolate for, as the decode would say
        return []
    if not any(name in data for name in _UNINITIALIZED_STATE_NAMES):
        return []
    return _uninitialized_state_decoded(bytes(data))


def _uninitialized_state_decoded(pte: bytes) -> list[str]:
    """:func:`uninitialized_state` by decoding every payload (no byte search first)."""
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import DataLocation

    from .inspect.payload import decode_payload

    try:  # the .pte's inline Vulkan payloads (prepack_check.vulkan_delegates reads the same;
        # not imported here: check() resolves the installed runtime, which imports this)
        program = deserialize_pte_binary(bytes(pte)).program
        payloads = [bytes(program.backend_delegate_data[d.processed.index].data)
                    for plan in program.execution_plan for d in plan.delegates
                    if d.id == "VulkanBackend" and d.processed.location == DataLocation.INLINE]
        chains = [decode_payload(p).graph.chain for p in payloads]
    except Exception:  # not a program the inspector reads: nothing to isolate for
        return []
    return [c.name for chain in chains for c in chain if c.name in UNINITIALIZED_STATE_OPS]


def run(pte: bytes, inputs: Sequence[Any], method: str = "forward") -> list[Any]:
    """Run ``method`` of ``pte`` in *this* process. A program the runtime aborts on kills
    the process: use :func:`run_in_child` for anything not known to load. A program with
    :func:`uninitialized_state` run here after another program was freed may read that
    program's data as its initial KV caches; the child runners isolate it."""
    load()
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    module = _load_for_executorch_from_buffer(pte)  # ``pte`` stays alive while it runs
    return list(module.run_method(method, tuple(inputs)))


# ------------------------------------------------------------------------- child runs


@dataclasses.dataclass(frozen=True)
class Job:
    """One program to run: its bytes, inputs (None: random ones from the method's meta)."""

    pte: bytes
    inputs: Sequence[Any] | None = None
    method: str = "forward"


@dataclasses.dataclass
class RunResult:
    """What one program did on the real runtime."""

    #: "ok", "error" (the runtime refused it: a load or execute error), "abort" (the
    #: child process died on it), "timeout"
    status: str
    outputs: list[Any] | None = None
    #: the inputs it ran on (the given ones, or the random ones drawn)
    inputs: list[Any] | None = None
    #: the runtime's own message (one line) when not ok
    message: str | None = None
    #: the runtime's stderr while this program ran (tail)
    stderr: str = ""
    seconds: float = 0.0
    device: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


#: stderr lines that carry the runtime's reason, best first
_REASON_KEYS = ("what():", "is false!", "Could not find ShaderInfo", "Missing operator",
                "Exception", "Error", "error", "Aborted", "Segmentation")


def _reason(stderr: str, fallback: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for key in _REASON_KEYS:
        hits = [ln for ln in lines if key in ln]
        if hits:
            line = hits[0] if key != "what():" else hits[0].split("what():", 1)[1].strip()
            return line[:500]
    return (lines[-1] if lines else fallback)[:500]


def run_in_child(pte_bytes: bytes, inputs: Sequence[Any] | None = None, method: str = "forward",
                 *, timeout: float = 120.0) -> RunResult:
    """Run one program on the real runtime in a child process (see :func:`run_many_in_child`)."""
    return run_many_in_child([Job(pte_bytes, inputs, method)], timeout=timeout)[0]


def run_many_in_child(jobs: Sequence[Job], *, timeout: float = 120.0,
                      startup_timeout: float = 180.0, isolate: bool = True) -> list[RunResult]:
    """Run ``jobs`` in order in as few child processes as possible (one import of torch and
    the runtime per child): a job that aborts its child is reported with the runtime's
    message and the remaining jobs go on in a fresh child. A job with
    :func:`uninitialized_state` starts a fresh child unless it is the first of one
    (``isolate=False``: it does not, for tests of the runtime itself). ``timeout`` bounds
    each job, ``startup_timeout`` the child's imports. Raises
    :class:`RuntimeNotFoundError` when there is no runtime."""
    import torch

    env = child_environment()
    results: list[RunResult | None] = [None] * len(jobs)
    with tempfile.TemporaryDirectory(prefix="fusionkit-vkrun-") as tmp:
        work = Path(tmp)
        for i, job in enumerate(jobs):
            (work / f"{i}.pte").write_bytes(job.pte)
            torch.save({"inputs": None if job.inputs is None else list(job.inputs),
                        "method": job.method}, work / f"{i}.job")
        pending = list(range(len(jobs)))
        fresh = {i for i, job in enumerate(jobs) if isolate and uninitialized_state(job.pte)}
        while pending:
            # up to the next job that needs a child of its own
            cut = next((k for k in range(1, len(pending)) if pending[k] in fresh), len(pending))
            done = _one_child(work, pending[:cut], env, timeout, startup_timeout, results)
            pending = [i for i in pending if results[i] is None]
            if not done:  # the child made no progress at all: report the rest as it
                break
    return [r if r is not None else RunResult("abort", message="the child never started")
            for r in results]


def _one_child(work: Path, pending: list[int], env: dict[str, str], timeout: float,
               startup_timeout: float, results: list[RunResult | None]) -> bool:
    """Run ``pending`` in one child until it ends; fill ``results``; False if none started."""
    import torch

    (work / "todo").write_text(" ".join(map(str, pending)))
    err_path = work / "stderr"
    # the child runs this file on its own (stdlib + torch + executorch only): importing the
    # fusionkit package there would cost time and tie the child to the whole tree
    code = f"import runpy; runpy.run_path({__file__!r})['_child_main']({str(work)!r})"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                                stdout=err, stderr=err, env=env)
        t_start = time.monotonic()
        current: int | None = None
        t_current = t_start
        timed_out = False
        while proc.poll() is None:
            time.sleep(0.05)
            started = [i for i in pending if (work / f"{i}.started").exists()]
            now = time.monotonic()
            if started and started[-1] != current:
                current, t_current = started[-1], now
            limit = startup_timeout if current is None else timeout
            if now - (t_start if current is None else t_current) > limit:
                proc.kill()  # our own child, by its handle
                proc.wait()
                timed_out = True
                break
    stderr = err_path.read_text(errors="replace")
    segments = _segments(stderr)
    any_started = False
    for i in pending:
        res_path = work / f"{i}.result"
        if res_path.exists():
            any_started = True
            rec = torch.load(res_path, weights_only=False)
            results[i] = RunResult(rec["status"], rec.get("outputs"), rec.get("inputs"),
                                   rec.get("message"), _tail(segments.get(i, "")),
                                   rec.get("seconds", 0.0), rec.get("device", ""))
        elif (work / f"{i}.started").exists():
            any_started = True
            seg = segments.get(i, "")
            if timed_out:
                results[i] = RunResult("timeout", message=f"no result within {timeout:g} s",
                                       stderr=_tail(seg), seconds=timeout)
            else:
                rc = proc.returncode
                how = f"signal {-rc}" if rc < 0 else f"exit status {rc}"
                results[i] = RunResult("abort", message=_reason(seg, f"the runtime died ({how})"),
                                       stderr=_tail(seg))
            break  # the jobs after it never ran: the caller starts a new child
    if not any_started:
        why = (f"the child did not start within {startup_timeout:g} s" if timed_out
               else _reason(segments.get(-1, stderr), f"exit status {proc.returncode}"))
        for i in pending:
            results[i] = RunResult("abort", message=f"the runtime could not start: {why}",
                                   stderr=_tail(stderr))
    return any_started


class RuntimeSession:
    """One child process kept for many programs, run one at a time as they come (a test
    module's programs, a CLI's): the runtime loads once per child, not per program.
    A program that kills the child comes back as ``abort`` with the runtime's message and
    the next program starts a fresh child; one past ``timeout`` is killed (``timeout``).
    A program with :func:`uninitialized_state` (the fused KV-cache op, whose caches the
    runtime does not initialise) runs in a fresh child unless the current one has run
    nothing yet, so that it does not read a freed program's data (``isolate=False``: it
    does not, for tests of the runtime itself).
    Raises :class:`RuntimeNotFoundError` at construction when there is no runtime. Use as
    a context manager, or call :meth:`close`."""

    def __init__(self, *, timeout: float = 120.0, startup_timeout: float = 180.0,
                 isolate: bool = True) -> None:
        self.env = child_environment()
        self.timeout, self.startup_timeout = timeout, startup_timeout
        self._tmp = tempfile.TemporaryDirectory(prefix="fusionkit-vkruntime-")
        self.work = Path(self._tmp.name)
        self._proc: subprocess.Popen[bytes] | None = None
        self._t_start = 0.0
        self._next = 0
        self.isolate = isolate
        #: programs run in the current child
        self._ran = 0
        #: child processes started so far (1 unless a program killed one or needed a
        #: fresh one: :func:`uninitialized_state`)
        self.children = 0

    def __enter__(self) -> RuntimeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        (self.work / "ready").unlink(missing_ok=True)
        (self.work / "stop").unlink(missing_ok=True)
        (self.work / "first").write_text(str(self._next))
        code = (f"import runpy; runpy.run_path({__file__!r})['_child_main']"
                f"({str(self.work)!r}, serve=True)")
        with open(self.work / "stderr", "ab") as err:  # markers keep the jobs apart
            self._proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                                          stdout=err, stderr=err, env=self.env)
        self._t_start = time.monotonic()
        self._ran = 0
        self.children += 1

    def run(self, pte: bytes, inputs: Sequence[Any] | None = None,
            method: str = "forward") -> RunResult:
        """Run one program (``inputs`` None: random ones from the method's meta)."""
        import torch

        if self.isolate and self._ran and self._proc is not None and uninitialized_state(pte):
            self._stop()  # a child that has run nothing: no freed graph's data in its caches
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        self._ran += 1
        proc = self._proc
        assert proc is not None
        i, work = self._next, self.work
        self._next += 1
        (work / f"{i}.pte").write_bytes(pte)
        torch.save({"inputs": None if inputs is None else list(inputs), "method": method},
                   work / f".{i}.job")
        (work / f".{i}.job").rename(work / f"{i}.job")
        t_started: float | None = None
        while True:
            if (work / f"{i}.result").exists():
                rec = torch.load(work / f"{i}.result", weights_only=False)
                seg = _segments((work / "stderr").read_text(errors="replace")).get(i, "")
                self._forget(i)
                return RunResult(rec["status"], rec.get("outputs"), rec.get("inputs"),
                                 rec.get("message"), _tail(seg), rec.get("seconds", 0.0),
                                 rec.get("device", ""))
            now = time.monotonic()
            if t_started is None and (work / f"{i}.started").exists():
                t_started = now
            if proc.poll() is not None:
                self._proc = None
                stderr = (work / "stderr").read_text(errors="replace")
                rc = proc.returncode
                how = f"signal {-rc}" if rc < 0 else f"exit status {rc}"
                self._forget(i)
                if t_started is None and not (work / f"{i}.started").exists():
                    why = _reason(_segments(stderr).get(-1, stderr), f"the child died ({how})")
                    return RunResult("abort", message=f"the runtime could not start: {why}",
                                     stderr=_tail(stderr))
                seg = _segments(stderr).get(i, "")
                return RunResult("abort", message=_reason(seg, f"the runtime died ({how})"),
                                 stderr=_tail(seg))
            waited, limit = ((now - t_started, self.timeout) if t_started is not None else
                             (now - self._t_start, self.startup_timeout + self.timeout))
            if waited > limit:
                proc.kill()  # our own child, by its handle
                proc.wait()
                self._proc = None
                self._forget(i)
                what = (f"no result within {self.timeout:g} s" if t_started is not None else
                        f"the child did not start within {waited:.0f} s")
                stderr = (work / "stderr").read_text(errors="replace")
                return RunResult("timeout", message=what, seconds=waited, stderr=_tail(stderr))
            time.sleep(0.005)

    def _forget(self, i: int) -> None:
        for suffix in ("pte", "job", "started", "result"):
            (self.work / f"{i}.{suffix}").unlink(missing_ok=True)

    def _stop(self) -> None:
        """Stop the child (it finishes the program it runs)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            (self.work / "stop").touch()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()  # our own child, by its handle
                proc.wait()

    def close(self) -> None:
        """Stop the child (it finishes the program it runs) and remove the work files."""
        self._stop()
        self._tmp.cleanup()


def _segments(stderr: str) -> dict[int, str]:
    """stderr per job index (-1: before the first job)."""
    out: dict[int, list[str]] = {-1: []}
    key = -1
    for line in stderr.splitlines():
        if line.startswith(_MARK):
            key = int(line[len(_MARK):].strip())
            out[key] = []
            continue
        out.setdefault(key, []).append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _random_inputs(module: Any, method: str) -> list[Any]:
    """Inputs drawn from the method's meta: normal floats, small non-negative integers."""
    import torch

    meta = module.method_meta(method)
    g = torch.Generator().manual_seed(0)
    out = []
    for k in range(meta.num_inputs()):
        info = meta.input_tensor_meta(k)
        dtype = _SCALAR_TYPES.get(int(info.dtype()), torch.float32)
        shape = tuple(info.sizes())
        if dtype.is_floating_point:
            out.append(torch.randn(shape, generator=g).to(dtype))
        elif dtype == torch.bool:
            out.append(torch.randint(0, 2, shape, generator=g).bool())
        else:
            out.append(torch.randint(0, 4, shape, generator=g).to(dtype))
    return out


_SCALAR_TYPES: dict[int, Any] = {}


def _child_main(work_dir: str, serve: bool = False) -> None:
    """The child: load the runtime, then run each job of ``todo`` (``serve``: each job
    ``<n>.job`` as it appears, from ``first`` on, until ``stop``), writing each result at
    once."""
    parent = os.getppid()  # before the runtime loads (seconds): a parent may die meanwhile
    import torch

    global _SCALAR_TYPES
    _SCALAR_TYPES = {0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32,
                     4: torch.int64, 5: torch.float16, 6: torch.float32, 7: torch.float64,
                     11: torch.bool, 15: torch.bfloat16}
    work = Path(work_dir)
    loaded = load()
    if not serve:
        for i in map(int, (work / "todo").read_text().split()):
            if not (work / f"{i}.result").exists():
                _run_job(work, i, loaded)
        return
    i = int((work / "first").read_text())
    (work / "ready").touch()
    while True:
        while not (work / f"{i}.job").exists():
            # a parent that died (killed, or exited without close()) never writes ``stop``:
            # the child is re-parented, or its work directory goes with the parent's cleanup
            if (work / "stop").exists() or os.getppid() != parent or not work.is_dir():
                return
            time.sleep(0.005)
        _run_job(work, i, loaded)
        i += 1


def _run_job(work: Path, i: int, loaded: LoadedRuntime) -> None:
    """Run job ``i`` of ``work`` (``<i>.pte``, ``<i>.job``); write ``<i>.result``."""
    import torch
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    sys.stderr.write(f"\n{_MARK}{i}\n")
    sys.stderr.flush()
    (work / f"{i}.started").touch()
    job = torch.load(work / f"{i}.job", weights_only=False)
    t0 = time.perf_counter()
    rec: dict[str, Any] = {"device": loaded.device}
    inputs = job["inputs"]
    try:
        # the module reads the buffer when the method first loads: keep it alive
        pte = (work / f"{i}.pte").read_bytes()
        module = _load_for_executorch_from_buffer(pte)
        if inputs is None:
            inputs = _random_inputs(module, job["method"])
        rec["inputs"] = list(inputs)
        rec["outputs"] = list(module.run_method(job["method"], tuple(inputs)))
        rec["status"] = "ok"
    except Exception as e:  # the runtime refused it (load or execute error)
        sys.stderr.flush()
        rec["status"] = "error"
        rec["python_error"] = f"{type(e).__name__}: {e}"
    rec["seconds"] = time.perf_counter() - t0
    if rec["status"] == "error":
        err = (work / "stderr").read_text(errors="replace")
        seg = _segments(err).get(i, "")
        said = _reason(seg, "") if seg.strip() else ""
        py = rec["python_error"].strip()
        rec["message"] = (py if not said or said in py else f"{said} ({py[:300]})")[:800]
    tmp = work / f".{i}.result"
    torch.save(rec, tmp)
    tmp.rename(work / f"{i}.result")
