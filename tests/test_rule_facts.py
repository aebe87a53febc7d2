"""A rule is one object carrying its facts: what ``fusionkit.verify`` needs travels with it.

A check says how to draw its operands (``Constraint.operand_hints``), a rule says where its
backend runs it and what its backend's ops compute (``Rule.program_form``,
``Rule.module_scope``, ``Rule.semantics``), and whether fusionkit ships it (``Rule.shipped``,
set by the rule set). None of it is looked up by a check's or a rule's name, so renaming a
check keeps its hints, and no string-keyed registry of rule facts is left to fill.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from fusionkit import (
    Custom,
    DtypeIn,
    GraphLeaf,
    OperandHint,
    OpSemantics,
    PrepackableConstant,
    ProgramForm,
    Rank,
    Rule,
    ScalarRange,
    capture,
    op,
    ref,
    replace_with,
)
from fusionkit.authoring.verify import EQUAL, _hints_of, verify
from fusionkit.passes.registry import registered, rule_set, rule_set_names

ROOT = Path(__file__).resolve().parents[1]
X = capture("x")

#: every module-level dict a ``register*`` function fills, and what it is keyed by: none by a
#: check's or a rule's name (a renamed check or rule would silently lose what it holds)
REGISTRIES: dict[tuple[str, str], str] = {
    ("passes/registry.py", "_FACTORIES"): "a rule factory's qualified name (the rule sets)",
    ("fusionkit/check/operand_dtypes.py", "_TABLE"): "an op key (a delegate's operand dtypes)",
    ("fusionkit/find/executable.py", "_SUPPORTED_OPS"): "a delegate's name (its operator registry)",
    ("fusionkit/find/executable.py", "_DELEGATE_ONLY"): "an op namespace (only a delegate runs it)",
    ("fusionkit/targets.py", "_OP_LIBRARIES"): "an op namespace (the module registering its ops)",
    ("fusionkit/vocabulary.py", "CONSTRAINTS"): "a constraint's YAML key",
    ("fusionkit/vocabulary.py", "_BY_CLASS"): "a constraint class",
}


def _module_dicts(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and (
                isinstance(value, (ast.Dict, ast.DictComp))
                or (isinstance(value, ast.Call) and getattr(value.func, "id", "") in ("dict", "defaultdict"))):
            names.add(target.id)
    return names


def _filled_by_register_functions(tree: ast.Module, dicts: set[str]) -> set[str]:
    filled: set[str] = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not fn.name.startswith(
                ("register", "_register")):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Name) and node.value.id in dicts:
                filled.add(node.value.id)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("setdefault", "update", "__setitem__") \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in dicts:
                filled.add(node.func.value.id)
    return filled


def test_no_string_keyed_registry_of_rule_facts_remains() -> None:
    """Every module-level dict a ``register*`` function fills (read from the sources of
    ``fusionkit/``, ``passes/``, ``backends/``) is one of the known registries, none keyed by
    a check's or a rule's name; the verifier's former ones are gone."""
    found: set[tuple[str, str]] = set()
    for folder in ("fusionkit", "passes", "backends"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            rel = str(path.relative_to(ROOT))
            found |= {(rel, name) for name in _filled_by_register_functions(tree, _module_dicts(tree))}
    assert found - set(REGISTRIES) == set(), "a new registry: say what it is keyed by (not a name)"
    gone = ("OPERAND_HINTS", "METADATA_SEMANTICS", "KERNEL_REFERENCES", "NODE_SEMANTICS",
            "OP_CONTEXTS", "MODULE_SCOPES", "PROGRAM_FORMS", "REFERENCE_IS_NOT_THE_KERNEL",
            "FORM_NAMESPACES", "CHECK_HINTS")
    import fusionkit.authoring.verify as verify_module

    assert [n for n in gone if hasattr(verify_module, n)] == []
    assert not (ROOT / "fusionkit" / "authoring" / "semantics.py").exists()
    text = "\n".join(p.read_text() for folder in ("passes", "backends") for p in (ROOT / folder).rglob("*.py"))
    for verb in ("register_operand_hints", "register_kernel_reference", "register_metadata_semantics",
                 "register_node_semantics", "register_op_context", "register_module_scope",
                 "register_program_form", "register_reference_caveat"):
        assert f"{verb}(" not in text, verb


def _renamed(rule: Rule) -> Rule:
    return dataclasses.replace(rule, constraints=[
        dataclasses.replace(c, name=f"renamed_{c.name}") if isinstance(c, Custom) else c
        for c in rule.constraints])


def _hints(rule: Rule) -> tuple[dict[str, OperandHint], list[Any]]:
    return _hints_of(rule, None)


SHIPPED = [r for f in registered() for r in f.rules()]


def test_renaming_every_check_of_every_shipped_rule_keeps_its_hints() -> None:
    """The hints belong to the check object: every shipped rule, its checks renamed, draws
    its operands exactly as before (the same hints, the same joint functions)."""
    with_hints = 0
    for rule in SHIPPED:
        before, after = _hints(rule), _hints(_renamed(rule))
        assert before == after, rule.name
        with_hints += bool(before[0] or before[1])
    assert with_hints >= 30  # (38 of the 65 when written)


def _zero_shift(ctx: Any, x: Any, shift: Any) -> str | None:
    got = ctx.inputs.constant(shift)
    t = None if got is None else got.tensor
    if t is None or bool((t != 0).any()):
        return f"`{shift.name}` is not a constant of zeros"
    if tuple(torch.broadcast_shapes(tuple(x.meta["val"].shape), tuple(t.shape))) != tuple(x.meta["val"].shape):
        return f"`{shift.name}` broadcasts `{x.name}` to another shape"
    return None


@pytest.mark.parametrize("name", ["zero_shift", "renamed"])
def test_a_checks_own_hints_make_its_case_under_any_name(name: str) -> None:
    """x + shift -> x when shift is a constant of zeros: the check carries the hint that
    makes such a shift, and the rule verifies whatever the check is called."""
    check = Custom(_zero_shift, name, hints={"shift": OperandHint(constant=True, fill="zeros")})
    rule = Rule("zero_shift", op("aten.add.Tensor", X, capture("shift")),
                replace_with("aten.mul.Tensor", ref("x"), 1.0),
                [check, DtypeIn("x", {torch.float32}), DtypeIn("shift", {torch.float32})])
    assert verify(rule, cases=2, max_examples=15).status == EQUAL


def test_a_check_refuses_hints_for_captures_it_does_not_read() -> None:
    with pytest.raises(ValueError, match="hints for \\['y'\\], which it does not read"):
        Custom(lambda ctx, x: None, "only_x", hints={"y": OperandHint(constant=True)})


def test_the_built_in_constraints_say_how_to_draw_their_operands() -> None:
    assert PrepackableConstant("w").operand_hints() == {"w": OperandHint(constant=True)}
    assert GraphLeaf("x").operand_hints() == {"x": OperandHint(constant=False)}
    assert DtypeIn("x", {torch.float16, torch.float32}).operand_hints() == {
        "x": OperandHint(dtypes=(torch.float32, torch.float16))}  # (float32 first)
    assert Rank("x", {3, 2}).operand_hints() == {"x": OperandHint(ranks=(2, 3))}
    assert ScalarRange("eps", 0.0, 1.0).operand_hints() == {"eps": OperandHint(bounds=(0.0, 1.0))}


def test_the_verifiers_facts_are_on_the_shipped_rules() -> None:
    """What the registries held is now on the rules of the backends that state it."""
    by_name = {r.name: r for r in SHIPPED}
    assert by_name["xnnpack_linear_module"].module_scope is torch.nn.Linear
    assert by_name["causal_sdpa"].program_form is not None
    assert "llama.custom_sdpa.default" in by_name["causal_sdpa"].semantics.kernel_references
    affine = by_name["arm_fold_dyt_affine_into_conv"]
    assert affine.program_form is not None and "tosa" in affine.program_form.namespaces
    assert "aten.convolution.default" in affine.program_form.node_semantics
    assert "tosa" in by_name["arm_fuse_consecutive_slices"].semantics.op_contexts
    assert "XNN_FUSED_ACTIVATION" in by_name["xnnpack_fuse_relu"].semantics.metadata
    assert "et_vk.q8ta_conv2d.default" in by_name["quantized_convolution"].semantics.reference_caveats
    # another backend's rule carries none of it
    assert by_name["xnnpack_conv1d_as_conv2d"].program_form is None
    assert by_name["xnnpack_conv1d_as_conv2d"].semantics == OpSemantics()


def test_shipped_is_stated_not_inferred_from_the_caller() -> None:
    """A rule is shipped when fusionkit's rule sets make it (their factories, also called
    directly), never because of the module that built it."""
    assert "_getframe" not in (ROOT / "fusionkit" / "rule.py").read_text()
    assert all(r.shipped for r in SHIPPED)
    from fusionkit.passes.rms_norm import rms_norm_rule

    assert rms_norm_rule().shipped
    mine = Rule("neg", op("aten.neg.default", X), replace_with("aten.neg.default", ref("x")))
    assert not mine.shipped and Rule("neg", mine.pattern, mine.replacement, shipped=True).shipped


def test_rule_set_names_say_what_they_hold() -> None:
    """``shipped``: every rule fusionkit ships (each factory's); ``vulkan_patterns``: the ports
    of ExecuTorch's Vulkan pattern registry and the portable RMSNorm; ``builtin`` is kept as
    its older name."""
    names = rule_set_names()
    assert "shipped" in names and "vulkan_patterns" in names and "builtin" not in names
    assert len(rule_set("shipped")) == len(SHIPPED)
    assert [r.name for r in rule_set("builtin")] == [r.name for r in rule_set("vulkan_patterns")]
    every_set = {r.name for n in names if n != "shipped" for r in rule_set(n)}
    assert {r.name for r in rule_set("shipped")} == every_set


def test_a_program_form_and_semantics_are_rule_keywords() -> None:
    form = ProgramForm(lambda ep: None, namespaces=["ns"])
    rule = Rule("neg", op("aten.neg.default", X), replace_with("aten.neg.default", ref("x")),
                program_form=form, semantics=OpSemantics(reference_caveats={"ns.op.default": "why"}))
    assert rule.program_form is form and form.namespaces == frozenset({"ns"})
    both = rule.semantics | OpSemantics(kernel_references={"ns.op.default": abs})
    assert set(both.reference_caveats) == set(both.kernel_references) == {"ns.op.default"}


def test_the_verifiers_core_names_no_backend_namespace() -> None:
    """What a backend's ops need (their kernels, contexts, operand layouts, the kernels never
    to run) comes from the rule: no string of ``verify.py``'s code names a backend's ops."""
    path = ROOT / "fusionkit" / "authoring" / "verify.py"
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
               and isinstance(n.value, str) and id(n) not in docstrings]
    named = [s for s in strings for ns in ("et_vk", "tosa", "llama", "xnnpack", "vulkan")
             if s == ns or s.startswith(f"{ns}.")]
    assert named == []
