"""The shape of the house: no import circles, one public face, nothing public lost.

The import graph is read from the sources (every ``import`` statement, at module
level, under ``TYPE_CHECKING`` and inside functions alike: a circle of lazy
imports is still a circle of concepts). ``from fusionkit import X`` counts as an
import of the module that defines ``X`` (the facade re-exports lazily).
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from typing import Any

import pytest

import fusionkit

ROOT = Path(__file__).resolve().parent.parent
#: source folder -> installed package (pyproject's package-dir)
PACKAGE_DIRS = {"fusionkit": "fusionkit", "passes": "fusionkit.passes",
                "backends": "fusionkit.backends"}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder, package in PACKAGE_DIRS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if not _is_package(importer):
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(importer: str, tree: ast.AST) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(importer, node)
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                if sub in MODULES:
                    out.add(sub)
                elif module == "fusionkit" and alias.name in fusionkit.EXPORTS:
                    out.add(fusionkit.EXPORTS[alias.name][0])
                else:
                    out.add(module)
    return {t for t in out if t in MODULES and t != importer and t != "fusionkit"}


def import_graph() -> dict[str, set[str]]:
    return {name: _targets(name, ast.parse(path.read_text(), str(path)))
            for name, path in MODULES.items() if name != "fusionkit"}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    assert import_cycles(import_graph()) == []


#: which folders may import which: the core never reaches up into the application,
#: the adapters or the shipped rules
LAYERS = {
    "core": ("fusionkit",),
    "integration": ("fusionkit.integration",),
    "specs": ("fusionkit.specs",),
    "passes": ("fusionkit.passes",),
    "backends": ("fusionkit.backends",),
    "app": ("fusionkit.app",),
}


def _layer(module: str) -> str:
    for layer in ("integration", "specs", "passes", "backends", "app"):
        if any(module == p or module.startswith(p + ".") for p in LAYERS[layer]):
            return layer
    return "core"


ALLOWED = {
    "core": {"core"},
    "integration": {"core", "integration"},
    "specs": {"core", "specs"},
    "passes": {"core", "passes", "integration"},
    "backends": {"core", "integration", "passes", "backends"},
    "app": {"core", "integration", "specs", "passes", "backends", "app"},
}


def test_layers_import_only_downwards() -> None:
    bad = [(m, t) for m, targets in import_graph().items() for t in targets
           if _layer(t) not in ALLOWED[_layer(m)]]
    assert bad == []


def test_rule_modules_use_only_the_public_face() -> None:
    core = {m for m in MODULES if _layer(m) == "core" and m != "fusionkit"}
    bad = [(m, t) for m, targets in import_graph().items() if m.startswith("fusionkit.passes.")
           and m != "fusionkit.passes.registry" for t in targets
           if t in core and t not in {e[0] for e in fusionkit.EXPORTS.values()}]
    assert bad == []


#: what users import today (names that move are listed in CHANGELOG.md)
PUBLIC_API = {
    "fusionkit": [
        "Rule", "op", "capture", "through", "ref", "replace_with", "FusionPass", "find_matches",
        "Rewriter", "FusionError", "CheckContext", "Constraint", "Custom", "PrepackableConstant",
        "GraphLeaf", "UserInput", "DtypeIn", "Rank", "StaticShape", "SameDtype", "ShapeRelation",
        "ReducesLastDim", "ScalarRange", "broadcasts_over_last_dim",
        "named_shape_relation", "CASTS", "Pattern", "lit", "where", "any_value",
        "any_float", "scalar", "one_of", "int_list", "seq", "outputs", "also", "CallOp",
        "PythonReplacement", "RuleError", "Match", "MatchSet", "RuleIndex",
        "FusionReport", "ProgramInputs", "ConstantRef", "ConstantKind", "op_key", "MatchResult",
    ],
    "fusionkit.integration": ["CompactConstantsPass", "compact_tensor", "tensor_bytes",
                              "pack_int4"],
    "fusionkit.specs": ["load_specs", "load_spec_text", "rules_to_yaml"],
    "fusionkit.passes": ["rule_set", "rule_set_names"],
    "fusionkit.passes.registry": ["register_rules", "rule_set", "rule_set_names"],
    "fusionkit.backends.vulkan_adapter": [
        "VulkanPartitioner", "transform_passes", "check", "simulate", "install", "uninstall",
        "TAKEN_OVER_PATTERNS", "decode_payload", "FusedOpNotDelegatedError",
    ],
    "fusionkit.backends.xnnpack_adapter": [
        "XnnpackPartitioner", "transform_passes", "install", "uninstall",
    ],
}


@pytest.mark.parametrize("module", sorted(PUBLIC_API))
def test_public_names_exist(module: str) -> None:
    mod = importlib.import_module(module)
    missing = [n for n in PUBLIC_API[module] if not hasattr(mod, n)]
    assert missing == []


def test_every_facade_name_is_documented_in_one_line() -> None:
    assert set(fusionkit.__all__) == set(fusionkit.EXPORTS)
    for name, (module, doc) in fusionkit.EXPORTS.items():
        assert doc and "\n" not in doc, name
        assert getattr(importlib.import_module(module), name) is getattr(fusionkit, name)


def test_inspection_is_not_imported_by_the_adapter() -> None:
    import subprocess
    import sys

    code = ("import sys, fusionkit.backends.vulkan_adapter as v; "
            "print(any(m.startswith('fusionkit.backends.vulkan_adapter.inspect') "
            "for m in sys.modules)); v.check; "
            "print('fusionkit.backends.vulkan_adapter.inspect.prepack_check' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


def test_the_facade_imports_are_generated_from_the_one_table() -> None:
    from fusionkit import _facade

    text = _facade.INIT.read_text()
    assert _facade.render(text, fusionkit.EXPORTS) == text, \
        "fusionkit/__init__.py is stale: run `python -m fusionkit._facade`"
    assert fusionkit.__all__ == sorted(fusionkit.EXPORTS)
    lines = len(text.splitlines())
    assert lines <= 120, f"the facade is {lines} lines: the table and its imports, no more"


def test_every_package_folder_is_installed() -> None:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    assert on_disk - listed == set(), "add these packages to pyproject.toml"
    assert listed - on_disk == set()


def test_the_core_is_grouped_by_phase() -> None:
    """Only the facade and its table of public names, the ground modules (program arguments,
    what a placeholder is, op keys, the result type, the check vocabulary, strict mode, the
    listeners), the rule,
    the pass and its report sit on top."""
    top = {p.stem for p in (ROOT / "fusionkit").glob("*.py")}
    assert top == {"__init__", "_facade", "program", "program_inputs", "targets", "result",
                   "public_names", "vocabulary", "rule", "engine", "fusion_pass", "report",
                   "strict", "events"}


#: the core's layers, bottom-up: a module imports only from its own layer or below
#: (``fusionkit.X`` is a top-level module or a folder)
CORE_LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"events", "program", "program_inputs", "public_names", "result", "strict",
               "targets", "vocabulary"}),                              # ground: no rule, no graph edit
    frozenset({"match"}),                                   # structural matching
    frozenset({"check"}),                                   # operand checks
    frozenset({"edit"}),                                    # graph editing (the Rewriter)
    frozenset({"rule"}),                                    # a rule: pattern, checks, rewrite
    frozenset({"find"}),                                    # the one phase: find and decide
    frozenset({"apply", "report"}),                         # apply accepted matches; report
    frozenset({"engine", "fusion_pass", "integration"}),    # the engine, the pass; plumbing
    frozenset({"authoring"}),                               # rules from code; verify
    frozenset({"specs"}),                                   # YAML
    frozenset({"app", "_facade"}),                          # the command line
)


def _core_layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "fusionkit" or len(parts) < 2:
        return None
    for i, layer in enumerate(CORE_LAYERS):
        if parts[1] in layer:
            return i
    return None


def test_every_core_module_has_a_layer() -> None:
    core = [m for m in MODULES if m.startswith("fusionkit.") and m.split(".")[1]
            not in ("passes", "backends")]
    assert [m for m in core if _core_layer(m) is None] == []


def test_no_core_import_runs_back_up_a_layer() -> None:
    """Lazy and ``TYPE_CHECKING`` imports count: a concept that needs a higher one is in
    the wrong layer, whenever the import runs."""
    up = sorted(f"{a} -> {t}" for a, targets in import_graph().items()
                for t in targets if (la := _core_layer(a)) is not None
                and (lt := _core_layer(t)) is not None and lt > la)
    assert up == []


def test_no_private_name_crosses_a_package() -> None:
    """``from fusionkit.x.y import _name`` only inside the package that defines it: what
    another package needs is public (named without ``_``) or a verb of the Rewriter."""
    crossing: list[str] = []
    for name, path in MODULES.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                    and node.module.startswith("fusionkit") \
                    and not node.module.startswith(package + ".") and node.module != package:
                crossing += [f"{name}: {node.module}.{a.name}" for a in node.names
                             if a.name.startswith("_") and not a.name.startswith("__")]
    assert crossing == []


# ------------------------------------------------------- the match phase is one pipeline

#: the stages of the match phase, in the order ``fusionkit.find.finder.find_matches`` (the
#: pipeline) calls them (``executable``: what the target can run, prepared once before the
#: candidates are decided); ``pattern`` and ``memo`` are what the stages share
MATCH_STAGES = ("targets", "gates", "matcher", "executable", "decide")
MATCH_SHARED = frozenset({"pattern", "memo"})


def match_phase_calls(run: Any) -> list[tuple[str, str]]:
    """``(caller, callee)``: the module names (``finder``, ``gates``, ...) of every Python
    call from one file of the phase (``fusionkit/find/``, ``fusionkit/match/``,
    ``fusionkit/targets.py``) into another while ``run()`` runs."""
    import sys

    places = (str(ROOT / "fusionkit" / "match") + "/", str(ROOT / "fusionkit" / "find") + "/",
              str(ROOT / "fusionkit" / "targets.py"))
    calls: list[tuple[str, str]] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call" or frame.f_back is None:
            return
        callee, caller = frame.f_code.co_filename, frame.f_back.f_code.co_filename
        if callee.startswith(places) and caller.startswith(places) and callee != caller:
            calls.append((Path(caller).stem, Path(callee).stem))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def pipeline_order(calls: list[tuple[str, str]]) -> list[str]:
    """The stages the pipeline calls, in order, a run of calls into one stage counted once."""
    order: list[str] = []
    for caller, callee in calls:
        if caller == "finder" and callee not in MATCH_SHARED and order[-1:] != [callee]:
            order.append(callee)
    return order


def test_the_walk_finds_a_planted_back_and_forth() -> None:
    calls = [("finder", "gates"), ("gates", "targets"), ("finder", "targets"),
             ("finder", "pattern"), ("finder", "gates"), ("finder", "matcher"),
             ("matcher", "finder")]
    assert pipeline_order(calls) == ["gates", "targets", "gates", "matcher"]


def test_following_a_pass_the_match_phase_reads_top_to_bottom() -> None:
    """Walking ``FusionPass.call`` on a small program (a match fused, a near miss declined,
    gates skipping searches): the pipeline calls each stage file once, in
    :data:`MATCH_STAGES` order, and no stage calls back into the pipeline."""
    import torch
    from executorch.exir import to_edge

    from fusionkit import FusionPass, PrepackableConstant, Rule, capture, op, ref, replace_with

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 8))
            self.b = torch.nn.Parameter(torch.randn(8))

        def forward(self, x: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return torch.mm(x, self.w) + self.b, torch.mm(x, self.w) + e, torch.relu(x) + e

    ep = to_edge(torch.export.export(Net().eval(), (torch.randn(4, 8), torch.randn(8)))
                 ).exported_program()
    addmm = Rule("addmm", op("aten.add.Tensor", op("aten.mm.default", capture("x"),
                                                   capture("w")), capture("b")),
                 replace_with("aten.addmm.default", ref("b"), ref("x"), ref("w")),
                 constraints=[PrepackableConstant("b")])
    p = FusionPass([addmm])
    calls = match_phase_calls(lambda: p.call(ep))
    assert p.report.to_dict()["rules"][0]["fused"] == 1 and p.report.declined  # it decided
    assert pipeline_order(calls) == list(MATCH_STAGES)
    assert {caller for caller, callee in calls if callee == "finder"} == set()
    graph = import_graph()
    stage_modules = {"targets": "fusionkit.targets", "decide": "fusionkit.find.decide",
                     "executable": "fusionkit.find.executable",
                     **{s: f"fusionkit.match.{s}" for s in ("gates", "matcher", *MATCH_SHARED)}}
    assert set(stage_modules.values()) <= set(MODULES)
    assert [m for m in stage_modules.values() if "fusionkit.find.finder" in graph[m]] == []


def test_benchmarks_have_no_import_circle_and_use_no_private_names() -> None:
    graph: dict[str, set[str]] = {}
    private: list[tuple[str, str]] = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        name = f"benchmarks.{path.stem}"
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks"):
                module = node.module or ""
                deps.add(module)
                private += [(name, f"{module}.{a.name}") for a in node.names
                            if a.name.startswith("_")]
        graph[name] = deps - {name}
    assert import_cycles(graph) == []
    assert private == []


# ------------------------------------------------- behaviour on the pattern node classes

#: the pattern node classes of fusionkit.match.pattern
PATTERN_NODES = frozenset({"Capture", "Named", "Value", "Alt", "Through", "Seq", "Also",
                           "Outputs", "Op"})
#: modules that still test pattern node classes one by one, and why (none left: a module
#: listed here must still do so, or leave the list)
NODE_DISPATCH_ALLOWED: dict[str, str] = {}


def _pattern_node_dispatch(module: str, tree: ast.AST) -> list[str]:
    """``isinstance(p, <node class>)`` / ``type(p) is <node class>`` in one module's code."""
    names: set[str] = set()  # local names of node classes
    modules: set[str] = set()  # local names of the pattern module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            for a in node.names:
                if source in ("fusionkit.match.pattern", "fusionkit") and a.name in PATTERN_NODES:
                    names.add(a.asname or a.name)
                if source == "fusionkit.match" and a.name == "pattern":
                    modules.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            modules.update(a.asname or a.name for a in node.names
                           if a.name == "fusionkit.match.pattern" and a.asname)

    def is_node_class(e: ast.expr) -> bool:
        if isinstance(e, ast.Tuple):
            return any(is_node_class(x) for x in e.elts)
        if isinstance(e, ast.Name):
            return e.id in names
        return (isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name)
                and e.value.id in modules and e.attr in PATTERN_NODES)

    found: list[str] = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "isinstance" and len(node.args) == 2
                and is_node_class(node.args[1])):
            found.append(f"{module}:{node.lineno} isinstance")
        elif (isinstance(node, ast.Compare) and isinstance(node.left, ast.Call)
              and isinstance(node.left.func, ast.Name) and node.left.func.id == "type"
              and any(is_node_class(c) for c in node.comparators)):
            found.append(f"{module}:{node.lineno} type() is")
    return found


def test_the_dispatch_finder_finds_a_planted_isinstance_chain() -> None:
    code = ("from fusionkit.match import pattern as P\nfrom fusionkit.match.pattern import Op\n"
            "def f(p):\n    if isinstance(p, (P.Alt, P.Seq)):\n        return 1\n"
            "    return type(p) is Op or isinstance(p, int)\n")
    assert _pattern_node_dispatch("m", ast.parse(code)) == ["m:4 isinstance", "m:6 type() is"]


def test_no_isinstance_dispatch_on_pattern_nodes_outside_their_classes() -> None:
    """Walking a pattern goes through the node classes (``accept`` on a ``PatternVisitor``,
    ``children()``, ``captures()``, ...): adding a node kind is not an edit in five files."""
    offenders: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        if module == "fusionkit.match.pattern":
            continue
        found = _pattern_node_dispatch(module, ast.parse(path.read_text(), str(path)))
        if found:
            offenders[module] = found
    unexpected = {m: f for m, f in offenders.items() if m not in NODE_DISPATCH_ALLOWED}
    assert unexpected == {}, "dispatch through PatternVisitor / the node's own methods"
    stale = set(NODE_DISPATCH_ALLOWED) - set(offenders)
    assert stale == set(), f"{sorted(stale)} no longer test node classes: remove from the list"


def test_one_module_names_the_executorch_versions() -> None:
    """Only ``fusionkit.integration.versions`` defines the supported and tested ExecuTorch
    releases; hooks and the adapters re-export the same objects."""
    defined = []
    for module, path in MODULES.items():
        for node in ast.parse(path.read_text(), str(path)).body:
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) else [])
            defined += [f"{module}.{t.id}" for t in targets
                        if isinstance(t, ast.Name) and "EXECUTORCH" in t.id]
    assert sorted(defined) == [f"fusionkit.integration.versions.{n}_EXECUTORCH"
                               for n in ("MAIN", "SUPPORTED", "TESTED")]
    from fusionkit.backends import vulkan_adapter, xnnpack_adapter
    from fusionkit.integration import hooks
    from fusionkit.integration.versions import TESTED_EXECUTORCH

    assert vulkan_adapter.TESTED_EXECUTORCH is xnnpack_adapter.TESTED_EXECUTORCH is TESTED_EXECUTORCH
    assert hooks.TESTED_EXECUTORCH is TESTED_EXECUTORCH


# ------------------------------------------------------------- one type says "why not"

#: a class says "why not" when its name ends like one of these, or it declares a
#: ``reason`` field (a class-level annotation or an ``__init__`` parameter)
WHY_NOT_NAME = re.compile(r"(Failure|Decline|Refusal|Blame|WhyNot|NotRunnable|NearMiss|Verdict"
                          r"|Reason)$")
#: classes that say why not without being a MatchResult: (converts, why). One that
#: ``converts`` has a ``result(...)`` method annotated to return a MatchResult (subclass).
NOT_RESULTS: dict[str, tuple[bool, str]] = {
    "fusionkit.backends.quantize_step_report.Decline": (
        False, "a line of the quantize step's fold report kept in the prepared module's "
               "meta, plain data (node names, no nodes) so it outlives the lifted program"),
    "fusionkit.apply.rewrite.ApplyFailure": (
        True, "a failed apply: the match and the exception itself (rollback and strict mode "
              "re-raise it); .result() is its MatchResult"),
    "fusionkit.find.executable.NotRunnable": (
        True, "the verdict ReplacementCheck memoises by metadata, shared by matches alike, so "
              "it names no rule, root or node; .result(rule, root) is one match's"),
    "fusionkit.backends.vulkan_adapter.runtime_support.KeptOff": (
        False, "a node the Vulkan partitioner left to the CPU and the probed runtime's fact "
               "(missing shader, operator, ...): no rule was tried, so no match to report"),
    "fusionkit.backends.vulkan_adapter.runtime_support.Unrunnable": (
        False, "a node whose op neither the probed Vulkan runtime nor the CPU runtime has "
               "(UnrunnableOpError): the preprocess rules' declines are in its reason, as "
               "their own MatchResults say them; it is a fact of the runtimes, no match"),
    "fusionkit.integration.parameter_subgraphs.DeclinedFold": (
        False, "a backend's constant-only argument the pre-partitioning folder left computed "
               "(it reads a user input, a symbolic size, a quantize...): no rule was tried, "
               "so no match to report; the partitioner then judges the node"),
    "fusionkit.authoring.verify.Verification": (
        False, "verify's verdict on a whole rule (equal / different / cannot check) over many "
               "generated programs: whether the replacement computes what the pattern does, "
               "not why a rule did not fire at one node; it has no root, node or step"),
    "fusionkit.authoring.verify.Counterexample": (
        False, "the operands on which a replacement computes something else (part of a "
               "Verification): values and outputs, not a match's refusal"),
    "fusionkit.authoring.prove.Proof": (
        False, "part of a Verification: whether the solver proved a rule's programs equal for "
               "every value and size, what the proof covers or why there is none; no match"),
    "fusionkit.authoring.prove.Outcome": (
        False, "what the solver said of two programs (proved, a model, or why it could not "
               "tell); verify makes it a Proof, never a match's refusal"),
    "fusionkit.app.html_report.Item": (
        False, "one drawing of the HTML page, made from a Match or a MatchResult (Item.of); "
               "never handed to users as a verdict"),
}


def _says_why_not(c: ast.ClassDef) -> bool:
    if WHY_NOT_NAME.search(c.name):
        return True
    fields = {s.target.id for s in c.body
              if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    for s in c.body:
        if isinstance(s, ast.FunctionDef) and s.name == "__init__":
            fields |= {a.arg for a in (*s.args.posonlyargs, *s.args.args, *s.args.kwonlyargs)}
    return "reason" in fields


def why_not_types_that_are_no_result(modules: dict[str, Path]) -> list[str]:
    """``module.Class`` of every class in ``modules`` (but ``fusionkit.result``) that says
    why not and is neither a :class:`~fusionkit.result.MatchResult` nor in :data:`NOT_RESULTS`."""
    from fusionkit.result import MatchResult

    found: list[str] = []
    for module, path in modules.items():
        if module == "fusionkit.result":
            continue
        for c in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(c, ast.ClassDef) or not _says_why_not(c):
                continue
            qual = f"{module}.{c.name}"
            cls = getattr(importlib.import_module(module), c.name, None)  # None: nested
            if qual in NOT_RESULTS or (isinstance(cls, type) and issubclass(cls, MatchResult)):
                continue
            found.append(qual)
    return found


def test_the_why_not_finder_finds_planted_types(tmp_path: Path) -> None:
    import importlib.util
    import sys

    path = tmp_path / "planted_why_not.py"
    path.write_text(
        "from dataclasses import dataclass\nfrom fusionkit.result import MatchResult\n"
        "@dataclass(frozen=True)\nclass OddRefusal:\n    step: str\n    message: str\n"
        "class Verdictless:\n    def __init__(self, node, reason):\n        self.reason = reason\n"
        "class SubResult(MatchResult):\n    pass\n"
        "class Unrelated:\n    reasons: list\n")
    spec = importlib.util.spec_from_file_location("planted_why_not", path)
    assert spec is not None and spec.loader is not None
    planted = importlib.util.module_from_spec(spec)
    sys.modules["planted_why_not"] = planted
    try:
        spec.loader.exec_module(planted)
        assert why_not_types_that_are_no_result({"planted_why_not": path}) == [
            "planted_why_not.OddRefusal", "planted_why_not.Verdictless"]
    finally:
        del sys.modules["planted_why_not"]


def test_every_why_not_type_is_a_match_result_or_says_why_not() -> None:
    """What users read as "why not" is :class:`~fusionkit.result.MatchResult` (issue 22):
    a class in fusionkit/, passes/ or backends/ that carries a reason is one, or converts
    to one with ``.result()``, or is listed in NOT_RESULTS with why."""
    import typing

    from fusionkit.result import MatchResult

    assert why_not_types_that_are_no_result(MODULES) == [], \
        "subclass MatchResult, or give it a .result() and list it in NOT_RESULTS with why"
    for qual, (converts, why) in NOT_RESULTS.items():
        module, name = qual.rsplit(".", 1)
        cls = getattr(importlib.import_module(module), name)  # a stale entry fails here
        assert isinstance(cls, type) and not issubclass(cls, MatchResult) and why, qual
        if converts:
            made = typing.get_type_hints(cls.result).get("return")
            assert isinstance(made, type) and issubclass(made, MatchResult), (qual, made)


# ------------------------------------------------------ backend knowledge with its backend

#: ExecuTorch backends fusionkit has no adapter for: their names have no place in the core
#: either (fusionkit's own adapters and their delegates' namespaces are added below)
OTHER_BACKENDS = frozenset({"qualcomm", "qnn", "coreml", "mps", "arm", "ethos", "tosa",
                            "cadence", "mediatek", "openvino", "samsung", "nxp", "webgpu",
                            "mlx"})


def backend_names() -> frozenset[str]:
    """Every backend name, lower case: fusionkit's adapters (``backends/<name>_adapter``),
    the delegates their modules describe to the core and the op namespaces those delegates
    own (``et_vk``), and :data:`OTHER_BACKENDS`."""
    from fusionkit.find.executable import DELEGATE_ONLY_NAMESPACES
    from fusionkit.targets import load_delegate_descriptions

    load_delegate_descriptions()
    adapters = {p.name.removesuffix("_adapter") for p in (ROOT / "backends").iterdir()
                if p.is_dir() and p.name.endswith("_adapter")}
    return frozenset({*adapters, *OTHER_BACKENDS, *DELEGATE_ONLY_NAMESPACES,
                      *(d.lower() for d in DELEGATE_ONLY_NAMESPACES.values())})


def _words(text: str) -> set[str]:
    """``et_vk.rms_norm`` -> et_vk, rms_norm, et, vk, rms, norm; ``XNNPACKQuantizer`` ->
    xnnpack, quantizer; ``vulkan_supported_ops`` -> vulkan, supported, ops (lower case)."""
    chunks = [c for c in re.split(r"[^A-Za-z0-9_]+", text) if c]
    parts = [w for c in chunks for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+", c)]
    return {w.lower() for w in (*chunks, *parts)}


def backend_names_in_code(module: str, tree: ast.AST, names: frozenset[str]) -> list[str]:
    """``module:line name`` for each identifier or string literal of the code that holds a
    backend name as a word. Docstrings (and any other bare string statement) and comments
    are prose: they may name a backend as an example."""
    prose = {id(s.value) for s in ast.walk(tree) if isinstance(s, ast.Expr)
             and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)}
    found: list[str] = []
    for node in ast.walk(tree):
        texts: list[str | None] = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            texts = [] if id(node) in prose else [node.value]
        elif isinstance(node, ast.Name):
            texts = [node.id]
        elif isinstance(node, ast.Attribute):
            texts = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            texts = [node.name]
        elif isinstance(node, ast.arg):
            texts = [node.arg]
        elif isinstance(node, ast.keyword):
            texts = [node.arg]
        elif isinstance(node, ast.alias):
            texts = [node.name, node.asname]
        elif isinstance(node, ast.ImportFrom):
            texts = [node.module]
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            texts = list(node.names)
        for text in texts:
            for name in sorted(_words(text or "") & names):
                found.append(f"{module}:{getattr(node, 'lineno', 0)} {name}")
    return sorted(set(found), key=lambda f: (int(f.split(":")[1].split()[0]), f))


def test_the_backend_name_finder_finds_planted_names() -> None:
    code = ('"""Fuses for Vulkan, or XNNPACK (a docstring: prose)."""\n'
            "from executorch.backends.vulkan import op_registry\n"
            "import executorch.exir as xnnpack_exir\n"
            "NAMESPACES = {'et_vk': 1}  # a comment on Vulkan: prose\n"
            "class XnnpackThing:\n"
            "    'a class docstring naming Vulkan'\n"
            "    def f(self, use_qnn: bool = False) -> str:\n"
            "        return g(backend='CoreML', params='warm') + f'on {self}: Vulkan'\n"
            "def native_layer_norm(param, dumps, harm):\n"
            "    return param.VulkanBackend\n")
    names = frozenset({"vulkan", "xnnpack", "et_vk", "qnn", "coreml", "arm", "mps"})
    assert backend_names_in_code("m", ast.parse(code), names) == [
        "m:2 vulkan", "m:3 xnnpack", "m:4 et_vk", "m:5 xnnpack", "m:7 qnn", "m:8 coreml",
        "m:8 vulkan", "m:10 vulkan"]
    assert {"vulkan", "xnnpack", "et_vk"} <= backend_names()


def test_no_backend_names_in_the_core() -> None:
    """Backend knowledge lives with its backend (issue 22 item 5): the code of fusionkit/
    (but fusionkit/app/, the CLI above the adapters) names no backend. A backend tells the
    core what it must know with ``fusionkit.register_delegate`` (passes/vulkan_delegate.py)."""
    names = backend_names()
    core = {m: p for m, p in MODULES.items() if p.is_relative_to(ROOT / "fusionkit")
            and not p.is_relative_to(ROOT / "fusionkit" / "app")}
    assert len(core) > 40
    found = [f for m, p in core.items()
             for f in backend_names_in_code(m, ast.parse(p.read_text(), str(p)), names)]
    assert found == [], "move it to the backend (passes/<backend>*, backends/<backend>_adapter)"


def test_a_delegates_ops_are_judged_with_nothing_but_fusionkit_imported() -> None:
    """The core finds what a delegate told it through the ``fusionkit.delegates`` entry point:
    a user's rule creating ``et_vk`` ops, in a fresh interpreter that imported only
    ``fusionkit``, resolves the op and has it assumed delegated, as when the knowledge sat in
    the core. Failing here after a pull: ``bash scripts/bootstrap`` (re-installs the package)."""
    import subprocess
    import sys
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    code = (
        "import sys, torch\n"
        "from executorch.exir import to_edge\n"
        "from fusionkit import Rule, capture, find_matches, op, ref, replace_with\n"
        "from fusionkit.targets import delegate_entry_points as points\n"
        "print(sorted({(e.name, e.value) for e in points()}))\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x): return torch.relu(x) + 1\n"
        "ep = to_edge(torch.export.export(M(), (torch.rand(2, 5),))).exported_program()\n"
        "print(any(m.startswith('fusionkit.passes') for m in sys.modules))\n"
        "for target in ('et_vk.rms_norm.default', 'aten.silu.default'):\n"
        "    rule = Rule('r', op('aten.relu.default', capture('x')),\n"
        "                replace_with(target, ref('x'), *([ref('x'), 1e-6] if 'et_vk' in target"
        " else [])))\n"
        "    ms = find_matches(ep, [rule], strict=False)\n"
        "    print(len(ms.accepted), [str(d.step) for d in ms.declined])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0] == str(sorted(declared["fusionkit.delegates"].items())), \
        "the installed entry points are stale: run `bash scripts/bootstrap`"
    # nothing but fusionkit imported; et_vk assumed delegated, silu (no CPU kernel) declined
    assert lines[1:] == ["False", "1 []", "0 ['executable']"]


# ------------------------------------------------------------- the project speaks of itself

#: where the project's own words are: code, tests, benchmarks and their records, docs
WORDING_DIRS = ("fusionkit", "passes", "backends", "benchmarks", "scripts", "tests", "docs", ".ci")
WORDING_SUFFIXES = {".py", ".md", ".txt", ".toml", ".yaml", ".yml", ".sh", ""}
#: README.md and CHANGELOG.md are rewritten apart from this scan; this file names the words
WORDING_EXCLUDED = {"tests/test_architecture.py"}
_HISTORY = re.compile(r"\bsession\b|found by a trial", re.IGNORECASE)
_CODE_SPANS = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of what a file says in words: a Python file's comments and strings
    (not its identifiers: ``RuntimeSession`` is a name), any other file whole; code spans
    in backticks left out. A string that is exactly ``session`` is pytest's fixture scope."""
    import io
    import tokenize

    text = path.read_text(errors="replace")
    if path.suffix != ".py":
        return [(text.count("\n", 0, m.start()) + 1, m.group(0))
                for m in _HISTORY.finditer(_CODE_SPANS.sub("", text))]
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.STRING and tok.string.strip("'\"") == "session":
            continue
        if tok.type in (tokenize.COMMENT, tokenize.STRING):
            out += [(tok.start[0], m.group(0))
                    for m in _HISTORY.finditer(_CODE_SPANS.sub("", tok.string))]
    return out


def test_the_project_speaks_of_itself_not_of_its_history() -> None:
    """No comment, docstring, message or doc tells when or in which sitting something was
    found ("session 10", "found by a trial"): it states the fact and its evidence (a test,
    a runtime message). Dated benchmark records are named by date and content."""
    found = []
    for folder in WORDING_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            rel = path.relative_to(ROOT).as_posix()
            if (not path.is_file() or path.suffix not in WORDING_SUFFIXES
                    or rel in WORDING_EXCLUDED or "__pycache__" in rel):
                continue
            found += [f"{rel}:{line}: {word}" for line, word in _prose(path)]
    for name in ("README.md", "CHANGELOG.md"):
        if name not in WORDING_EXCLUDED:
            found += [f"{name}:{line}: {word}" for line, word in _prose(ROOT / name)]
    assert found == []
    runs = [p.name for p in (ROOT / "benchmarks" / "results").iterdir()
            if re.search(r"-s\d+-", p.name)]
    assert runs == []
