"""``fusionkit exec``: run a program someone else wrote with fusionkit's adapters installed.

Python's convention for putting a library into a command you do not own is a launcher in
front of it (``coverage run``, ``ddtrace-run``, ``opentelemetry-instrument``). This one
runs the command in a child process whose ``PYTHONPATH`` starts with
:mod:`fusionkit.app.exec_boot`: every Python process of the command installs the named
adapters when it first imports ExecuTorch (:mod:`fusionkit.app.exec_child`), and at exit
records what fusionkit did. The launcher then prints one short summary per backend on
stderr, writes the JSON report on request, and exits with the command's own exit code
(128 + N for a command killed by signal N, as a shell says it).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fusionkit.app.exec_child import ADAPTER_MODULES, BACKENDS_VARIABLE, REPORT_DIR_VARIABLE

__all__ = ["BOOT_DIR", "ExecUsageError", "child_command", "parse_backends", "run_exec", "summarize"]

#: the directory put first on the command's PYTHONPATH (its ``sitecustomize``)
BOOT_DIR = Path(__file__).resolve().parent / "exec_boot"


class ExecUsageError(ValueError):
    """A mistake in the launcher's own arguments (one line, exit 2)."""


def parse_backends(text: str) -> list[str]:
    names = [b.strip() for b in text.split(",") if b.strip()]
    unknown = [b for b in names if b not in ADAPTER_MODULES]
    if unknown or not names:
        raise ExecUsageError(f"--backend {text!r}: unknown backend {', '.join(unknown) or '(none)'};"
                             f" choose from {', '.join(ADAPTER_MODULES)}")
    return list(dict.fromkeys(names))


def _module_exists(name: str) -> bool:
    """Whether ``python -m name``, run from the current directory, would find it, without
    importing (running) any package on the way."""
    parts = name.split(".")
    if not all(p.isidentifier() for p in parts):
        return False
    search: list[str] | None = [os.getcwd(), *sys.path[1:]]
    for i in range(len(parts)):
        fullname = ".".join(parts[:i + 1])
        try:
            spec = importlib.machinery.PathFinder.find_spec(fullname, search)
        except (ImportError, KeyError):  # a namespace package's path needs its parent
            return _imported_parent_has(name)
        if spec is None and i == 0:  # built in, frozen, or an editable install's finder
            try:
                spec = importlib.util.find_spec(fullname)
            except (ImportError, ValueError):
                spec = None
        if spec is None:
            return False
        search = list(spec.submodule_search_locations or []) or None
        if search is None and i < len(parts) - 1:
            return False
    return True


def _imported_parent_has(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def child_command(module: str | None, command: Sequence[str]) -> list[str]:
    """The argv to run: ``-m module args``, a ``.py`` script (run by this Python), or any
    program found on PATH. Raises :class:`ExecUsageError` naming what is wrong."""
    if module is not None:
        if not _module_exists(module):
            raise ExecUsageError(f"-m {module}: no module named {module!r} (looked from "
                                 f"{os.getcwd()})")
        return [sys.executable, "-m", module, *command]
    if not command:
        raise ExecUsageError("no command: give `-m MODULE [ARGS...]` or `-- COMMAND [ARGS...]`")
    first = command[0]
    if first.endswith(".py"):
        if not os.path.isfile(first):
            raise ExecUsageError(f"{first}: no such file (looked from {os.getcwd()})")
        return [sys.executable, *command]
    if shutil.which(first) is None:
        raise ExecUsageError(f"{first}: command not found")
    return list(command)


def summarize(records: Sequence[dict[str, Any]], backends: Sequence[str]) -> dict[str, Any]:
    """The processes' records summed: per backend, fused and declined by rule, the top
    decline reasons, whether it was installed in every process that imported ExecuTorch."""
    out: dict[str, Any] = {"processes": len(records), "backends": {},
                           "fusionkit_seconds": sum(r.get("fusionkit_seconds", 0.0)
                                                    for r in records),
                           # the calls that installed the adapters (the first lowering step)
                           "installed_by": sorted({r["installed_by"] for r in records
                                                   if r.get("installed_by")})}
    for name in [*backends, "user"]:
        fused: Counter[str] = Counter()
        declined: Counter[str] = Counter()
        reasons: Counter[str] = Counter()
        errors: list[str] = []
        placed: Counter[tuple[str, str]] = Counter()
        installed = 0
        for r in records:
            if r.get("installed", {}).get(name):
                installed += 1
            if name in r.get("errors", {}):
                errors.append(r["errors"][name])
            part = r.get("backends", {}).get(name, {})
            fused.update(part.get("fused", {}))
            for p in part.get("placed", []):
                placed[(p["what"], p["why"])] += p["count"]
            for rule, by_reason in part.get("declined", {}).items():
                for reason, n in by_reason.items():
                    declined[rule] += n
                    reasons[f"{rule}: {reason}"] += n
        if name == "user" and not fused and not declined:
            continue
        out["backends"][name] = {
            "installed_in": installed,
            "fused": dict(fused.most_common()),
            "declined": dict(declined.most_common()),
            "top_decline_reasons": [{"reason": k, "count": v} for k, v in reasons.most_common(3)],
            "decline_reasons": [{"reason": k, "count": v} for k, v in reasons.most_common()],
            "install_errors": sorted(set(errors)),
            "placed": [{"what": w, "why": y, "count": n} for (w, y), n in placed.most_common()],
        }
    return out


def _summary_lines(summary: dict[str, Any]) -> list[str]:
    if summary["processes"] == 0:
        return ["fusionkit exec: no process of the command imported ExecuTorch: "
                "fusionkit did nothing"]
    lines = []
    for name, b in summary["backends"].items():
        n_fused, n_declined = sum(b["fused"].values()), sum(b["declined"].values())
        if b["install_errors"] and not b["installed_in"]:
            lines.append(f"fusionkit exec: {name}: not installed ({b['install_errors'][0]})")
            continue
        fused = ", ".join(f"{k} {v}" for k, v in list(b["fused"].items())[:6])
        line = f"fusionkit exec: {name}: {n_fused} fused" + (f" ({fused})" if fused else "")
        line += f", {n_declined} declined"
        lines.append(line)
        for r in b["top_decline_reasons"]:
            lines.append(f"    {r['count']} x {r['reason'][:160]}")
        if b.get("placed"):
            n_placed = sum(p["count"] for p in b["placed"])
            lines.append(f"  {name}: {n_placed} node(s) placed by fusionkit after the "
                         "partitioner:")
            for p in b["placed"][:5]:
                lines.append(f"    {p['count']} x {p['what']}: {p['why'][:120]}")
    return lines


def run_exec(backends: Sequence[str], module: str | None, command: Sequence[str],
             report: str | None = None) -> int:
    """Run the command under fusionkit; returns its exit code (see the module docstring)."""
    argv = child_command(module, command)
    with tempfile.TemporaryDirectory(prefix="fusionkit-exec-") as report_dir:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(BOOT_DIR), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
        env[BACKENDS_VARIABLE] = ",".join(backends)
        env[REPORT_DIR_VARIABLE] = report_dir
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the child gets ^C itself
        try:
            code = subprocess.call(argv, env=env)
        finally:
            signal.signal(signal.SIGINT, previous)
        records = []
        for p in sorted(Path(report_dir).glob("*.json")):
            try:
                records.append(json.loads(p.read_text(encoding="utf-8")))
            except (OSError, ValueError):
                continue
    summary = summarize(records, backends)
    summary["command"] = argv
    summary["exit_code"] = 128 - code if code < 0 else code
    for line in _summary_lines(summary):
        print(line, file=sys.stderr)
    if report:
        Path(report).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return int(summary["exit_code"])
