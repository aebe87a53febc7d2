"""The ``fusionkit`` command.

Exit status: 0 success, 1 problems found (``check``), 2 a user's mistake (bad
spec, bad MODEL, bad arguments) — reported in one line, never as a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main"]

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2


class UserError(Exception):
    """A mistake in what the user gave us: printed as one line, exit status 2."""


_QUIETED = False


def _quiet_imports() -> None:
    """Keep third-party import chatter (torchao, executorch) off the user's screen."""
    global _QUIETED
    if _QUIETED:
        return
    _QUIETED = True
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    import logging

    logging.getLogger("torch").setLevel(logging.ERROR)
    # torchao prints "Failed to load ..." for optional CUDA kernels straight to
    # the C-level stderr; silence fd 2 only while the heavy imports happen.
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            import executorch.exir
            import torch  # noqa: F401

            try:
                # sets the *root* logger to INFO when imported: import it now, then undo that
                import executorch.backends.vulkan.partitioner.vulkan_partitioner  # noqa: F401
                import torchao  # noqa: F401
            except Exception:
                pass
            logging.getLogger().setLevel(logging.WARNING)
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _progress(msg: str) -> None:
    print(f"… {msg}", file=sys.stderr, flush=True)


def _load_rules(paths: Sequence[str], args: argparse.Namespace) -> list[Any]:
    """Rules of the spec files; Python they name is imported only with --trust / --allow-module."""
    if not paths:
        return []
    for p in paths:
        if not Path(p).is_file():
            raise UserError(f"{p}: no such file")
    _quiet_imports()
    from fusionkit.specs import SpecError, load_specs

    try:
        return load_specs(paths, trust=args.trust, allow_modules=args.allow_module)
    except (SpecError, ValueError) as e:
        raise UserError(str(e)) from None


def _spec_consent(parser: argparse.ArgumentParser) -> None:
    """--trust / --allow-module: consent to import the Python code a spec names."""
    parser.add_argument("--trust", action="store_true",
                        help="import the Python code the specs name (custom checks, Python "
                             "replacements); without it such a reference is an error")
    parser.add_argument("--allow-module", action="append", default=[], metavar="PREFIX",
                        help="import Python code the specs name only from modules PREFIX and "
                             "PREFIX.* (repeatable)")


def _load_model(spec: str) -> Any:
    if spec.endswith(".pt2") and not Path(spec).exists():
        raise UserError(f"{spec}: no such file")
    _quiet_imports()
    from fusionkit.app.model_loader import ModelError, load_model

    try:
        return load_model(spec)
    except ModelError as e:
        raise UserError(str(e)) from None


# ---------------------------------------------------------------------------- commands


def _exit_status(args: argparse.Namespace, found: Any) -> int:
    """``--strict``: exit 1 when a rule's own code raised (a decline with step ``error``:
    a constraint, a check or the replacement raised), else 0."""
    return EXIT_PROBLEMS if getattr(args, "strict", False) and found.errors else EXIT_OK


def cmd_explain(args: argparse.Namespace) -> int:
    if args.at and not args.rule:
        raise UserError("--at needs --rule: which rule to ask about at that node")
    rules = _load_rules(args.spec, args)
    model = _load_model(args.model)

    from fusionkit.app.lowering import adapter_rules, edge_program
    from fusionkit.app.present import explain_json, explain_rows, why_not_text
    from fusionkit.app.term import Style, table
    from fusionkit.authoring.near_miss import why_not
    from fusionkit.find.finder import MatchSet, find_matches

    edge = edge_program(model.exported)
    all_rules = [*adapter_rules(args.backend), *rules]
    if args.rule:
        names = [r.name for r in all_rules]
        if args.rule not in names:
            raise UserError(f"--rule {args.rule}: no such rule{_did_you_mean(args.rule, names)} "
                            f"(rules: {', '.join(names)})")
    # asked about one rule: every near miss of it, however early it failed
    ms = find_matches(edge, all_rules, all_near_misses=args.all_near_misses or bool(args.rule))
    if args.rule and args.at:
        try:
            verdict = why_not(edge, args.rule, args.at, rules=all_rules, matches=ms)
        except KeyError as e:
            raise UserError(f"--at {args.at}: {e.args[0]}") from None
        if args.html:
            _write_html(args.html, [verdict], f"{model.name}: {args.rule} at {args.at}")
        print(json.dumps(verdict.record(), indent=2) if args.json else why_not_text(verdict))
        return _exit_status(args, ms)
    if args.rule:  # the other rules still run (they may claim nodes first); only R is shown
        ms = MatchSet([m for m in ms.accepted if m.rule.name == args.rule],
                      [d for d in ms.declined if d.rule == args.rule])
    checked = _verify_matched(all_rules, ms, args.backend, args.cases) if args.verify else None
    if args.html:
        _write_html(args.html, ms, f"{model.name}: "
                    + (args.rule if args.rule else f"{args.backend} rules"), checked)
    if args.json:
        found = explain_json(ms)
        if checked is not None:
            found["verification"] = {n: v.to_dict() for n, v in checked.items()}
        print(json.dumps(found, indent=2))
        return _exit_status(args, ms)
    st = Style()
    errors = len(ms.errors)
    which = (f"rule {args.rule}" if args.rule else
             f"{args.backend} rules{' + specs' if rules else ''}")
    print(st.bold(f"{model.name}: {len(ms.accepted)} fused, {len(ms.declined) - errors} declined, "
                  f"{errors} rule error{'' if errors == 1 else 's'} ({which})"))
    rows = explain_rows(ms)
    if rows:
        print(table(["rule", "verdict", "root", "step", "node", "reason"], rows))
    if checked is not None:
        from fusionkit.app.verify_job import verification_text

        print(verification_text(list(checked.values())))
    return _exit_status(args, ms)


def _verify_matched(rules: Sequence[Any], ms: Any, backend: str, cases: int) -> dict[str, Any]:
    """``explain --verify``: the verification of each rule that fused or declined a match,
    as ``fusionkit verify --backend BACKEND --cases N`` gives it: the registered rule (not
    the adapter's copy with its checks) and whether it fires on ``backend``."""
    from fusionkit.app.firing import plain_rule
    from fusionkit.app.verify_job import verify_targets

    if cases < 1:
        raise UserError(f"--cases {cases}: give at least 1 case per rule")
    names = {m.rule.name for m in ms.accepted} | {d.rule for d in ms.declined}
    chosen: dict[str, Any] = {}
    for r in rules:
        if r.name in names and r.name not in chosen:
            chosen[r.name] = plain_rule(r, backend)
    # one worker process for them all: a case that crashes a kernel is that rule's verdict
    checked = verify_targets(list(chosen.values()), cases=cases, backend=backend,
                             progress=_progress)
    return {v.rule: v for v in checked}


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def _write_html(path: str, what: Any, title: str, verifications: Any = None) -> None:
    from fusionkit.app.html_report import GraphvizMissing, Item, items_of, write_html

    items = items_of(what) if not isinstance(what, list) else [Item.of(w) for w in what]
    try:
        write_html(path, items, title, verifications)
    except GraphvizMissing as e:
        raise UserError(str(e)) from None
    except OSError as e:
        raise UserError(f"--html {path}: {e.strerror or e}") from None
    print(f"wrote {path} ({len(items)} drawings)", file=sys.stderr)


def _output_file(option: str, path: str) -> None:
    """An output file the command will write, checked before the work that makes it."""
    out = Path(path)
    if out.is_dir():
        raise UserError(f"{option} {path}: a directory; give the file to write")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"{option} {path}: no such directory {str(parent)!r}")
    if not os.access(parent, os.W_OK):
        raise UserError(f"{option} {path}: directory {str(parent)!r} is not writable")


def cmd_lower(args: argparse.Namespace) -> int:
    _output_file("-o", args.output)
    if args.etrecord:
        _output_file("--etrecord", args.etrecord)
    if args.model_explorer:
        _model_explorer_check(args.model_explorer)
    rules = _load_rules(args.spec, args)
    model = _load_model(args.model)
    from fusionkit.app.lowering import lower
    from fusionkit.app.present import lower_text

    result = lower(model.exported, args.backend, rules, progress=_progress,
                   etrecord=bool(args.etrecord or args.model_explorer))
    try:
        Path(args.output).write_bytes(result.pte)
    except OSError as e:
        raise UserError(f"-o {args.output}: {e.strerror or e}") from None
    if args.etrecord:
        try:
            result.etrecord.save(args.etrecord)
        except OSError as e:
            raise UserError(f"--etrecord {args.etrecord}: {e.strerror or e}") from None
    viewer = _model_explorer_write(args, result) if args.model_explorer else None
    if args.json:
        print(json.dumps({"output": args.output, "bytes": len(result.pte),
                          **({"etrecord": args.etrecord} if args.etrecord else {}),
                          **({"model_explorer": {"directory": args.model_explorer,
                                                 "command": viewer.command}} if viewer else {}),
                          "seconds": result.seconds, **result.report.to_dict(),
                          "preprocess": result.preprocess}, indent=2))
        return _exit_status(args, result.report)
    print(lower_text(result.report, result.preprocess, args.backend))
    print(f"wrote {args.output} ({len(result.pte):,} bytes) in "
          f"{sum(result.seconds.values()):.1f} s")
    if args.etrecord:
        print(f"wrote {args.etrecord} (ETRecord: the graphs before and after the rules; "
              "ExecuTorch's Inspector names a fused op's replaced nodes)")
    if viewer:
        marked = sum(len(v) for v in viewer.verdicts.values())
        amiss = f"; {len(viewer.unplaced)} on nodes it does not draw" if viewer.unplaced else ""
        print(f"wrote {viewer.directory}/ for Model Explorer (the graphs before and after the "
              f"rules, {marked} nodes marked fused or declined{amiss}); open it with\n"
              f"  {viewer.command}")
    return _exit_status(args, result.report)


def _model_explorer_check(directory: str) -> None:
    """``--model-explorer DIR``: Model Explorer installed, DIR a directory or makeable."""
    from fusionkit.integration.model_explorer import INSTALL, missing

    lacking = missing()
    if lacking:
        raise UserError(f"--model-explorer needs Model Explorer ({lacking} is not installed): "
                        f"{INSTALL}")
    if Path(directory).exists() and not Path(directory).is_dir():
        raise UserError(f"--model-explorer {directory}: not a directory")


def _model_explorer_write(args: argparse.Namespace, result: Any) -> Any:
    from fusionkit.integration.model_explorer import write

    try:
        return write(args.model_explorer, result.etrecord, result.report,
                     name=Path(args.output).stem or "model")
    except OSError as e:
        raise UserError(f"--model-explorer {args.model_explorer}: {e.strerror or e}") from None


def _read_pte(path: str) -> Any:
    """The .pte the user named, or one line saying why it is not one."""
    _quiet_imports()
    from fusionkit.app.pte_file import PteError, read_pte

    try:
        return read_pte(path)
    except PteError as e:
        raise UserError(str(e)) from None


#: the delegates ``check`` reads (Vulkan payloads: what the Vulkan runtime would abort on)
_CHECKED_BACKENDS = ("VulkanBackend",)


def cmd_check(args: argparse.Namespace) -> int:
    pte = _read_pte(args.file)
    from fusionkit.app.pte_file import BACKEND_NAMES
    from fusionkit.backends.vulkan_adapter import PayloadError, check

    try:
        problems = check(pte.data)
    except PayloadError as e:
        raise UserError(f"{args.file}: a Vulkan payload cannot be read: {e}") from None
    checked = {b: n for b, n in pte.delegates.items() if b in _CHECKED_BACKENDS}
    unread = {b: n for b, n in pte.delegates.items() if b not in _CHECKED_BACKENDS}
    if args.json:
        print(json.dumps({"file": args.file, "delegates": dict(pte.delegates),
                          "checked": checked, "not_checked": unread,
                          "problems": [str(p) for p in problems]}, indent=2))
        return EXIT_PROBLEMS if problems else EXIT_OK

    def say(counts: dict[str, int]) -> str:
        return ", ".join(f"{n} {BACKEND_NAMES.get(b, b)} ({b})" for b, n in counts.items())

    for p in problems:
        print(f"{args.file}: {p}")
    if checked:
        verdict = (f"{len(problems)} problem(s) the runtime aborts on" if problems
                   else "no problems found")
        print(f"{args.file}: checked {say(checked)} payload(s): {verdict}")
    else:
        print(f"{args.file}: nothing checked: `fusionkit check` reads Vulkan payloads only, "
              f"and this program has {pte.backends_text()}")
    if unread and checked:
        print(f"{args.file}: not checked: {say(unread)} (`fusionkit check` reads Vulkan "
              "payloads only)")
    return EXIT_PROBLEMS if problems else EXIT_OK


def cmd_simulate(args: argparse.Namespace) -> int:
    rules = _load_rules(args.spec, args)
    model = _load_model(args.model)
    import logging

    import executorch.backends.vulkan.serialization.vulkan_graph_builder  # noqa: F401

    from fusionkit.app.simulate_job import simulate_model
    from fusionkit.app.term import table

    logging.getLogger().setLevel(logging.WARNING)  # that import set the root logger to INFO

    report = simulate_model(model.exported, model.module, model.example_inputs, rules=rules,
                            stock=args.stock, seed=args.seed, progress=_progress)
    if args.json:
        print(json.dumps({"model": model.name, **report.to_dict()}, indent=2))
    elif report.error is not None:
        print(f"{model.name}: the Vulkan runtime would stop: {report.error}")
    else:
        rows = [(o.index, "x".join(map(str, o.shape)) or "-", o.dtype, f"{o.max_abs_error:.3g}",
                 f"{o.atol:g}+{o.rtol:g}*|eager|", "ok" if o.ok else "TOO LARGE")
                for o in report.outputs]
        print(table(["output", "shape", "dtype", "max |simulated - eager|", "tolerance", "verdict"],
                    rows))
        for d in report.delegates:
            ran = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in d.ops.items())
            err = (f"max |delegate - eager partition| {d.max_abs_error:.3g}"
                   if d.max_abs_error is not None else f"no eager reference ({d.reference_note})")
            print(f"{d.label}: {sum(d.ops.values())} ops ran [{', '.join(d.families)}]: {ran}; "
                  f"{err}")
        print(f"{model.name}: simulated {'stock ExecuTorch' if args.stock else 'fusionkit'}'s "
              f"Vulkan program on random inputs (seed {args.seed}): "
              + ("all outputs within tolerance" if report.ok else "outputs differ"))
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def cmd_run(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise UserError(f"--timeout {args.timeout:g}: give a number of seconds above 0")
    pte = None
    if args.model.endswith(".pte"):
        pte = _read_pte(args.model)
        if args.method not in pte.methods:
            raise UserError(f"--method {args.method}: {args.model} has no such method "
                            f"(methods: {', '.join(pte.methods) or 'none'})")
    _quiet_imports()
    if args.backend == "arm":
        return _run_arm(args)
    from fusionkit.app.run_job import print_report, run_file, run_model
    from fusionkit.backends.vulkan_adapter.runtime import RuntimeNotFoundError

    try:
        if pte is not None:
            report = run_file(pte.data, args.model, method=args.method,
                              timeout=args.timeout)
        else:
            model = _load_model(args.model)
            report = run_model(model.exported, model.module, model.example_inputs,
                               rules=_load_rules(args.spec, args), stock=args.stock,
                               seed=args.seed, timeout=args.timeout, progress=_progress)
    except RuntimeNotFoundError as e:
        raise UserError(str(e)) from None
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print_report(report)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def _run_arm(args: argparse.Namespace) -> int:
    from fusionkit.app.arm_run_job import print_arm_report, run_arm_file, run_arm_model

    if args.spec:
        raise UserError("--spec: the Arm adapter runs its own rule set only")
    if args.model.endswith(".pte"):
        pte = _read_pte(args.model)
        if "TOSABackend" not in pte.delegates:
            raise UserError(f"{args.model}: no Arm TOSA delegate to run (this program has "
                            f"{pte.backends_text()})")
        report = run_arm_file(pte.data, args.model, seed=args.seed)
    else:
        model = _load_model(args.model)
        report = run_arm_model(model.exported, model.module, model.example_inputs,
                               stock=args.stock, integer=args.integer, seed=args.seed,
                               progress=_progress)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print_arm_report(report)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def cmd_bisect(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise UserError(f"--timeout {args.timeout:g}: give a number of seconds above 0")
    for flag, value in (("--atol", args.atol), ("--rtol", args.rtol)):
        if value is not None and not value >= 0:
            raise UserError(f"{flag} {value:g}: give a tolerance of 0 or more")
    if args.simulator and args.backend != "vulkan":
        raise UserError(f"--simulator: the Vulkan payload simulator; --backend is {args.backend}")
    rules = _load_rules(args.spec, args)
    model = _load_model(args.model)
    from fusionkit.app.bisect_job import EQUAL, FOUND, bisect_model, bisect_text

    report = bisect_model(model.exported, model.module, model.example_inputs, args.backend,
                          name=model.name, rules=rules, seed=args.seed, atol=args.atol,
                          rtol=args.rtol, simulator=args.simulator, timeout=args.timeout,
                          progress=None if args.json else _progress)
    import shlex

    again = [args.model, *(a for s in args.spec for a in ("--spec", s)),
             *(["--trust"] if args.trust else []),
             *(a for m in args.allow_module for a in ("--allow-module", m))]
    print(json.dumps(report.to_dict(), indent=2) if args.json
          else bisect_text(report, shlex.join(again)))
    return EXIT_OK if report.outcome in (FOUND, EQUAL) else EXIT_PROBLEMS


def cmd_verify(args: argparse.Namespace) -> int:
    _quiet_imports()
    import logging

    from fusionkit.app.verify_job import (
        VerifyTargetError,
        load_targets,
        print_report,
        status_of,
        verify_targets,
    )

    logging.getLogger("fusionkit").setLevel(logging.ERROR)
    if args.cases < 1:
        raise UserError(f"--cases {args.cases}: give at least 1 case per rule")
    try:
        rules = load_targets(args.targets, lambda paths: _load_rules(paths, args))
    except VerifyTargetError as e:
        raise UserError(str(e)) from None
    if args.rule:
        names = [r.name for r in rules]
        if args.rule not in names:
            raise UserError(f"--rule {args.rule}: no such rule{_did_you_mean(args.rule, names)} "
                            f"(rules: {', '.join(names)})")
        rules = [r for r in rules if r.name == args.rule]
    results = verify_targets(rules, cases=args.cases, backend=args.backend,
                             progress=None if args.json else _progress)
    if args.json:
        print(json.dumps([v.to_dict() for v in results], indent=2))
    else:
        print_report(results)
    return status_of(results)


def cmd_specs_validate(args: argparse.Namespace) -> int:
    for p in args.files:
        if not Path(p).is_file():
            raise UserError(f"{p}: no such file")
    _quiet_imports()
    from fusionkit.specs import SpecError, validate_specs

    try:  # imports only what --trust / --allow-module allow; other references: form only
        summaries = validate_specs(args.files, trust=args.trust, allow_modules=args.allow_module)
    except (SpecError, ValueError) as e:
        raise UserError(str(e)) from None
    names = [n for s in summaries for n in s.rules]
    for s in summaries:
        print(f"{s.file}: ok")
        for r in s.references:
            state = ("imported" if r.imported else
                     "well-formed, not imported (--trust or --allow-module to import and check it)")
            print(f"  {r.file}:{r.line}: {r.path}: {r.ref}: {state}")
    print(f"{len(names)} rule(s): {', '.join(names)}")
    return EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    _quiet_imports()  # the schema is derived from the vocabulary, which imports the DSL (torch)
    from fusionkit.specs import json_schema

    print(json.dumps(json_schema(), indent=2))
    return EXIT_OK


def cmd_exec(args: argparse.Namespace) -> int:
    from fusionkit.app.exec_job import ExecUsageError, parse_backends, run_exec

    if args.report:  # checked before the command runs, not after
        _output_file("--report", args.report)
    try:
        backends = parse_backends(args.backend)
        return run_exec(backends, args.module, args.program, report=args.report)
    except ExecUsageError as e:
        raise UserError(str(e)) from None


def _split_exec_argv(argv: list[str]) -> tuple[list[str], str | None, list[str]]:
    """``exec``'s own options, then ``-m MODULE ARGS...`` or ``[--] COMMAND ARGS...``: what
    follows the module or command is the program's, never the launcher's (as ``python -m``)."""
    own: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return own, None, argv[i + 1:]
        if a == "-m":
            if i + 1 >= len(argv):
                raise UserError("-m: give the module to run (-m MODULE [ARGS...])")
            return own, argv[i + 1], argv[i + 2:]
        if a in ("--backend", "--report"):
            if i + 1 >= len(argv):
                raise UserError(f"{a}: needs a value")
            own += [a, argv[i + 1]]
            i += 2
            continue
        if a.startswith(("--backend=", "--report=")) or a in ("-h", "--help"):
            own.append(a)
            i += 1
            continue
        if a.startswith("-"):
            raise UserError(f"exec: unknown option {a!r} (the command goes after `--`)")
        return own, None, argv[i:]
    return own, None, []


def cmd_demo(args: argparse.Namespace) -> int:
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise UserError(f"--out {args.out}: a file, not a directory")
    if args.model is not None and args.model.endswith(".pt2") and not Path(args.model).exists():
        raise UserError(f"{args.model}: no such file")
    _quiet_imports()
    from fusionkit.app.demo_job import run_demo
    from fusionkit.app.model_loader import ModelError

    try:
        return run_demo(args.model, out_dir=Path(args.out) if args.out else None)
    except ModelError as e:
        raise UserError(str(e)) from None


# ------------------------------------------------------------------------------ parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fusionkit", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="lower the built-in demo model (or MODEL) and explain what happened")
    d.add_argument("model", nargs="?", default=None, help=".pt2 file or package.module:factory")
    d.add_argument("--out", help="directory to write the .pte files to")
    d.set_defaults(fn=cmd_demo)

    lo = sub.add_parser("lower", help="lower MODEL through a fusionkit adapter")
    lo.add_argument("model", help=".pt2 file or package.module:factory")
    lo.add_argument("--backend", choices=["vulkan", "xnnpack"], required=True)
    lo.add_argument("--spec", action="append", default=[], metavar="FILE", help="extra YAML spec")
    _spec_consent(lo)
    lo.add_argument("-o", "--output", required=True, help="where to write the .pte")
    lo.add_argument("--etrecord", metavar="FILE",
                    help="also write an ETRecord for ExecuTorch's devtools (Inspector)")
    lo.add_argument("--model-explorer", metavar="DIR",
                    help="also write Model Explorer's inputs to DIR: the graphs before and after "
                         "the rules, overlays marking what fused and what declined and why "
                         "(needs ai-edge-model-explorer)")
    lo.add_argument("--json", action="store_true", help="print the report as JSON")
    lo.add_argument("--strict", action="store_true",
                    help="exit 1 when a rule's own code raised (a decline with step error)")
    lo.set_defaults(fn=cmd_lower)

    ex = sub.add_parser("explain", help="every accepted and declined match, without lowering")
    ex.add_argument("model", help=".pt2 file or package.module:factory")
    ex.add_argument("--backend", choices=["vulkan", "xnnpack"], default="vulkan")
    ex.add_argument("--spec", action="append", default=[], metavar="FILE", help="extra YAML spec")
    _spec_consent(ex)
    ex.add_argument("--json", action="store_true")
    ex.add_argument("--strict", action="store_true",
                    help="exit 1 when a rule's own code raised (a decline with step error)")
    ex.add_argument("--rule", help="only this rule's matches and every near miss of it; "
                    "with --at, why it did not fire at that node")
    ex.add_argument("--at", metavar="NODE", help="with --rule: at this node (an edge-program "
                    "node name)")
    ex.add_argument("--all-near-misses", action="store_true",
                    help="report every structural near miss, however early it failed")
    ex.add_argument("--html", metavar="FILE",
                    help="also write a self-contained page drawing each match as a graph")
    ex.add_argument("--verify", action="store_true",
                    help="also verify each rule that fused or declined a match (fusionkit "
                    "verify --backend BACKEND): equal, different (with a counterexample) or "
                    "cannot check, and whether it fires on the backend")
    ex.add_argument("--cases", type=int, default=8,
                    help="with --verify: cases to compare per rule (default 8)")
    ex.set_defaults(fn=cmd_explain)

    ch = sub.add_parser("check", help="static checks of a .pte (Vulkan prepacked arguments)")
    ch.add_argument("file")
    ch.add_argument("--json", action="store_true")
    ch.set_defaults(fn=cmd_check)

    si = sub.add_parser("simulate", help="lower MODEL for Vulkan and run the .pte's Vulkan "
                        "payloads on the CPU against eager, on random inputs")
    si.add_argument("model", help=".pt2 file or package.module:factory")
    si.add_argument("--spec", action="append", default=[], metavar="FILE", help="extra YAML spec")
    _spec_consent(si)
    si.add_argument("--stock", action="store_true",
                    help="lower with stock ExecuTorch's VulkanPartitioner instead of fusionkit's")
    si.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    si.add_argument("--json", action="store_true")
    si.set_defaults(fn=cmd_simulate)

    ru = sub.add_parser("run", help="run a .pte (or lower MODEL and run it) on ExecuTorch's "
                        "real Vulkan runtime, beside check() and the simulator; --backend "
                        "arm: on the TOSA reference model beside eager")
    ru.add_argument("model", help=".pte file, or .pt2 / package.module:factory to lower first")
    ru.add_argument("--backend", choices=["vulkan", "arm"], default="vulkan")
    ru.add_argument("--int", dest="integer", action="store_true",
                    help="(arm, MODEL) lower for TOSA-1.0+INT after pt2e int8 quantization "
                    "(judged against the fake-quantized model)")
    ru.add_argument("--method", default="forward", help="method of a .pte to run")
    ru.add_argument("--stock", action="store_true",
                    help="(MODEL) lower with stock ExecuTorch's partitioner (Vulkan, TOSA)")
    ru.add_argument("--spec", action="append", default=[], metavar="FILE", help="extra YAML spec")
    _spec_consent(ru)
    ru.add_argument("--seed", type=int, default=0, help="(MODEL) seed of the random inputs")
    ru.add_argument("--timeout", type=float, default=300.0, help="seconds before the run is "
                    "stopped")
    ru.add_argument("--json", action="store_true")
    ru.set_defaults(fn=cmd_run)

    bi = sub.add_parser("bisect", help="when MODEL lowered for a backend differs from eager "
                        "on its runtime, find the one applied match whose removal makes it equal")
    bi.add_argument("model", help=".pt2 file or package.module:factory")
    bi.add_argument("--backend", choices=["vulkan", "xnnpack", "arm"], required=True)
    bi.add_argument("--spec", action="append", default=[], metavar="FILE", help="extra YAML spec")
    _spec_consent(bi)
    bi.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    bi.add_argument("--atol", type=float, help="absolute tolerance of float outputs against "
                    "eager (default: run's, per dtype)")
    bi.add_argument("--rtol", type=float, help="relative tolerance of float outputs")
    bi.add_argument("--simulator", action="store_true", help="(vulkan) run on the payload "
                    "simulator even when the real runtime is there")
    bi.add_argument("--timeout", type=float, default=300.0, help="seconds before one run on the "
                    "real Vulkan runtime is stopped")
    bi.add_argument("--json", action="store_true")
    bi.set_defaults(fn=cmd_bisect)

    ve = sub.add_parser("verify", help="check that each rule's replacement computes what its "
                        "pattern computes, on generated operands its constraints admit")
    ve.add_argument("targets", nargs="+", metavar="SPEC.yaml|module:rules|RULE_SET",
                    help="a YAML spec, package.module:name (a Rule, a list, or a callable "
                    "returning them) or a registered rule set (vulkan, xnnpack, ...)")
    _spec_consent(ve)
    ve.add_argument("--rule", help="only the rule of this name")
    ve.add_argument("--cases", type=int, default=20, help="cases to compare per rule")
    ve.add_argument("--backend", choices=["vulkan", "xnnpack"],
                    help="judge whether each rule fires on this backend, as explain does "
                    "(default: the backends whose rule sets hold it; a spec's rule: any backend)")
    ve.add_argument("--json", action="store_true")
    ve.set_defaults(fn=cmd_verify)

    sp = sub.add_parser("specs", help="work with YAML fusion specs")
    spsub = sp.add_subparsers(dest="specs_command", required=True)
    v = spsub.add_parser("validate", help="check spec files completely; Python they name is "
                         "checked for form only unless --trust / --allow-module")
    v.add_argument("files", nargs="+")
    _spec_consent(v)
    v.set_defaults(fn=cmd_specs_validate)

    xc = sub.add_parser("exec", help="run a Python program (a pipeline you do not own) with "
                        "fusionkit's adapters installed; its exit code passes through",
                        usage="fusionkit exec [--backend vulkan,xnnpack,arm] [--report FILE.json] "
                        "(-m MODULE [ARGS...] | [--] COMMAND [ARGS...])")
    xc.add_argument("--backend", default="vulkan,xnnpack,arm",
                    help="the adapters to install, comma-separated (default: all three)")
    xc.add_argument("--report", metavar="FILE.json", help="also write what fusionkit did as JSON")
    xc.set_defaults(fn=cmd_exec, module=None, program=[])

    sc = sub.add_parser("schema", help="print the JSON Schema of spec files")
    sc.set_defaults(fn=cmd_schema)
    return p


#: commands that need no ExecuTorch internals (a spec's schema and validation): every other
#: one first checks that the installed ExecuTorch is a supported release
_STANDALONE_COMMANDS = frozenset({"specs", "schema", "exec"})


def _require_supported_executorch(command: str) -> None:
    """Refuse an unsupported ExecuTorch in one line, before any export or lowering."""
    from fusionkit.integration.versions import UnsupportedExecuTorchError, require_supported

    try:
        require_supported(f"fusionkit {command}")
    except UnsupportedExecuTorchError as e:
        raise UserError(str(e)) from None


#: set by a script that changes directory before it runs the command (``scripts/demo``):
#: the user's directory, where relative paths and ``module:factory`` are theirs
CWD_VARIABLE = "FUSIONKIT_CWD"


def _enter_user_directory() -> None:
    """Run in the directory the user ran the script from (the variable is consumed, so the
    processes this one starts do not inherit it)."""
    where = os.environ.pop(CWD_VARIABLE, None)
    if not where:
        return
    try:
        os.chdir(where)
    except OSError as e:
        raise UserError(f"{CWD_VARIABLE}={where}: {e.strerror or e}") from None


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    exec_program: tuple[str | None, list[str]] | None = None
    if raw[:1] == ["exec"]:
        try:
            own, module, command = _split_exec_argv(raw[1:])
        except UserError as e:
            print(f"fusionkit: error: {e}", file=sys.stderr)
            return EXIT_USAGE
        raw, exec_program = ["exec", *own], (module, command)
    args = build_parser().parse_args(raw)
    if exec_program is not None:
        args.module, args.program = exec_program
    try:
        _enter_user_directory()
        if args.command not in _STANDALONE_COMMANDS:
            _require_supported_executorch(args.command)
        return int(args.fn(args))
    except UserError as e:
        print(f"fusionkit: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
