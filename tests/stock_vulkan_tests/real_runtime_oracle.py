"""ExecuTorch's real Vulkan runtime as the oracle of its own Vulkan delegate suite.

Used by ``stock_vulkan_tests.simulator_runtime_plugin`` when ``FUSIONKIT_DELEGATE_REAL=1``.
Each call of ``TestVulkanBackend.run_delegated_model_and_check_output`` is recorded —
the program's bytes, every input set the test runs (``sample_inputs`` and each of
``test_inputs``), the eager outputs and the test's own tolerances — together with what
the simulator (the runtime the test runs on) did on each. At the end of the test run
:func:`run_recorded` runs them all on the real runtime in one child process (a
fresh child only after an abort: the runtime load, not the programs, is the cost) and
judges each as the suite would: ``ok`` equal to eager under the test's
``torch.allclose(atol, rtol)``, ``wrong`` ran but differs, ``refused`` the runtime stopped
(its own message). The simulator *agrees* when it predicted the same outcome.

With ``FUSIONKIT_DELEGATE_STATIC=1`` each recorded program is also judged by the static
tools a user without Vulkan has: ``check()`` plain and given the probed runtime's
inventory (per program), and the simulator given that inventory (per input set). The CI
shards leave it off (it costs seconds per test); ``tests/vulkan_delegate_stock.py --real``
turns it on.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

ENABLED = os.environ.get("FUSIONKIT_DELEGATE_REAL") == "1"
#: tests whose programs are not recorded (comma-separated names)
SKIP = frozenset(filter(None, os.environ.get("FUSIONKIT_DELEGATE_REAL_SKIP", "").split(",")))
STATIC = os.environ.get("FUSIONKIT_DELEGATE_STATIC") == "1"
RECORDS: list[dict[str, Any]] = []


def _flat(inputs: Any) -> list[Any]:
    from torch.utils import _pytree as pytree

    return [x.clone() if hasattr(x, "clone") else x for x in pytree.tree_leaves(inputs)]


def close(got: Sequence[Any] | None, rec: dict[str, Any]) -> tuple[bool, float | None]:
    """The suite's ``assert_outputs_equal`` on ``got``; with the largest |got - eager|."""
    import torch

    if got is None:
        return False, None
    ref = rec["ref"]
    if rec["single"]:
        pairs = [(got[0], ref[0])] if got else []
    elif len(got) != len(ref):
        return False, None
    else:
        pairs = list(zip(got, ref, strict=True))[: 1 if rec["first_output_only"] else None]
    if not pairs:
        return False, None
    worst = 0.0
    ok = True
    for g, w in pairs:
        try:
            same = bool(torch.allclose(g, w, atol=rec["atol"], rtol=rec["rtol"], equal_nan=True))
            if g.numel():
                diff = (g.double() - w.double()).abs().nan_to_num(0.0)
                worst = max(worst, float(diff.max()))
        except (RuntimeError, TypeError):  # shapes or dtypes the suite would also reject
            return False, None
        ok = ok and same
    return ok, worst


def _simulated(call: Any, rec: dict[str, Any]) -> str:
    if call is None:
        return "not run"  # the test stopped before this input set
    if isinstance(call, Exception):  # a condition under which the runtime computes garbage
        garbage = getattr(getattr(call, "condition", None), "effect", None) == "garbage"
        return "wrong" if garbage else "refused"
    return "ok" if close(call, rec)[0] else "wrong"


def record(test: str, original: Callable[..., Any], case: Any, et_program: Any,
           args: Sequence[Any], kwargs: dict[str, Any], sim_calls: Sequence[Any]) -> None:
    """Keep what one ``run_delegated_model_and_check_output`` call ran (after it ran)."""
    import torch

    if test in SKIP:
        return
    bound = inspect.signature(original).bind(case, et_program, *args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    model, sets = a["model"], [a["sample_inputs"], *(a.get("test_inputs") or [])]
    pte = bytes(et_program.buffer)
    static = _static_check(et_program) if STATIC else {}
    for k, inputs in enumerate(sets):
        with torch.no_grad():
            ref = model(*inputs)
        single = not isinstance(ref, (tuple, list))
        rec = {"test": test, "run": k, "pte": pte, "inputs": _flat(inputs),
               "ref": [ref] if single else list(ref), "single": single,
               "atol": a["atol"], "rtol": a["rtol"],
               "first_output_only": bool(a.get("first_output_only"))}
        rec["sim"] = _simulated(sim_calls[k] if k < len(sim_calls) else None, rec)
        if STATIC:
            rec.update(static, sim_probed=_simulate_probed(et_program, inputs, rec))
        RECORDS.append(rec)


_INVENTORY: list[Any] = []


def _inventory() -> Any:
    """The probed inventory, read once per test run (the cache file may be rewritten
    while a shard runs: a re-probe reads as absent until it is written)."""
    from fusionkit.backends.vulkan_adapter.runtime_probe import cached_inventory

    if not _INVENTORY:
        inv = cached_inventory()
        if inv is None:
            return None
        _INVENTORY.append(inv)
    return _INVENTORY[0]


def _static_check(et_program: Any) -> dict[str, Any]:
    """``check()``'s problems on the program, plain and given the probed inventory."""
    import fusionkit.backends.vulkan_adapter as va

    out: dict[str, Any] = {}
    inv = _inventory()
    for key, given in (("check", None), ("check_probed", inv)):
        if key == "check_probed" and given is None:
            out[key] = None  # no probe cached: nothing to say
            continue
        try:
            out[key] = [str(p) for p in va.check(et_program, runtime=given)]
        except Exception as e:  # a crash of check() is a finding, not a lost record
            out[key] = [f"check() raised {type(e).__name__}: {str(e)[:200]}"]
    return out


def _simulate_probed(et_program: Any, inputs: Any, rec: dict[str, Any]) -> str:
    """What the simulator given the probed inventory predicts for one input set."""
    from torch.utils import _pytree as pytree

    from fusionkit.backends.vulkan_adapter import simulate
    from fusionkit.backends.vulkan_adapter.inspect.simulator import SimulationError, unload

    inv = _inventory()
    if inv is None:
        return "no probe"
    try:
        out = simulate(et_program, *_flat(inputs), runtime=inv)
        return _simulated(list(pytree.tree_leaves(out)), rec)
    except SimulationError as e:
        return _simulated(e, rec)
    except Exception as e:  # the simulator crashing is a finding too
        return f"simulator raised {type(e).__name__}"
    finally:
        unload(et_program)


def run_recorded(timeout: float = 120.0) -> dict[str, Any]:
    """Run every recorded program on the real runtime; the JSON-able verdicts."""
    from fusionkit.backends.vulkan_adapter import runtime as rt

    if not RECORDS:
        return {"real": [], "real_seconds": 0.0}
    t0 = time.perf_counter()
    try:
        results = rt.run_many_in_child([rt.Job(r["pte"], r["inputs"]) for r in RECORDS],
                                       timeout=timeout)
    except rt.RuntimeNotFoundError as e:
        return {"real_error": str(e)}
    out = []
    for rec, res in zip(RECORDS, results, strict=True):
        if res.ok:
            equal, worst = close(res.outputs, rec)
            real = "ok" if equal else "wrong"
        else:
            real, worst = "refused", None
        out.append({"test": rec["test"], "run": rec["run"], "real": real,
                    "status": res.status, "message": res.message, "max_abs_err": worst,
                    "sim": rec["sim"], "seconds": res.seconds, "device": res.device,
                    "pte_bytes": len(rec["pte"]),
                    "pte_sha256": hashlib.sha256(rec["pte"]).hexdigest(),
                    **{k: rec[k] for k in ("check", "check_probed", "sim_probed") if k in rec}})
    return {"real": out, "real_seconds": time.perf_counter() - t0,
            "device": next((r["device"] for r in out if r["device"]), "")}
