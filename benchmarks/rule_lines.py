"""Stock preprocess passes beside the fusionkit rules that take them over, in code lines.

Why: the table of what each backend's taken-over stock pass became (docs/preprocess-rules.md)
must not drift from the code. It is computed here, from the adapters' takeover tables,
the rule registry, the installed ExecuTorch and this tree; ``tests/test_rules_table.py``
compares it with that page.

    python -m benchmarks.rule_lines              # the markdown table
    python -m benchmarks.rule_lines families     # each rule family: shared and per-backend lines

Code lines: no blank, comment-only or docstring lines. A stock pass counts its whole
module and, where it subclasses another pass's rewrite, that one's (detection, rewrite and
re-trace, as ExecuTorch wrote them; only the class where the module is a package ``__init__`` holding other things); a rule counts the
modules of the factories registered ``takes_over=`` that pass, and the rule modules they
import theirs from (constraints and declines included); shared helper modules
(``_common.py`` and other ``_`` modules) are not counted on either side.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import os
import sys
import textwrap
import tokenize
from dataclasses import dataclass

__all__ = ["FamilyRow", "TakeoverRow", "code_lines", "families_markdown", "family_rows",
           "markdown", "rows"]

_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
         tokenize.ENDMARKER, tokenize.ENCODING}


def code_lines(path: str) -> int:
    """Lines of ``path`` holding code: not blank, not only a comment, not a docstring."""
    with open(path, encoding="utf-8") as f:
        return source_code_lines(f.read(), path)


def source_code_lines(src: str, name: str = "<source>") -> int:
    """:func:`code_lines` of a source text."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(src, name)):
        body = getattr(node, "body", None)
        if not isinstance(body, list) or not body:
            continue
        first = body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                and isinstance(first.value.value, str) and first.end_lineno is not None:
            docstrings.update(range(first.lineno, first.end_lineno + 1))
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in _SKIP:
            code.update(range(tok.start[0], tok.end[0] + 1))
    return len(code - docstrings)


@dataclass(frozen=True)
class TakeoverRow:
    """One taken-over stock pass of one backend."""

    backend: str
    stock_pass: str
    stock_module: str
    stock_lines: int
    rule_modules: tuple[str, ...]
    rule_names: tuple[str, ...]
    rule_lines: int


def _stock_class(backend: str, stock_pass: str) -> type:
    if backend == "vulkan":
        from fusionkit.backends.vulkan_adapter.preprocess_rules import STOCK_PASSES

        module, name = STOCK_PASSES[stock_pass].qualname.rsplit(".", 1)
        return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]
    if backend == "arm":
        return getattr(importlib.import_module("executorch.backends.arm._passes"),  # type: ignore[no-any-return]
                       stock_pass)
    return getattr(importlib.import_module("executorch.backends.xnnpack._passes"),  # type: ignore[no-any-return]
                   stock_pass)


def _stock_lines(cls: type) -> int:
    """The pass's module, and those of its stock base classes that hold its rewrite
    (``call``: the pass a backend subclasses);
    only the class itself where it shares a package ``__init__`` with other things
    (``XNNPACKRemoveCloneOpsTransform`` beside the pass manager)."""
    total = 0
    for k in cls.__mro__:
        if not k.__module__.startswith("executorch.backends.") or \
                (k is not cls and "call" not in vars(k)):
            continue  # pass infrastructure (ExportPass, XNNPACKPass), not this rewrite
        path = str(inspect.getsourcefile(k))
        if os.path.basename(path) == "__init__.py":
            total += source_code_lines(textwrap.dedent(inspect.getsource(k)), path)
        else:
            total += code_lines(path)
    return total


def rows() -> list[TakeoverRow]:
    """Every taken-over stock pass of the three adapters, in their tables' order."""
    from fusionkit.backends.arm_adapter import preprocess_rules as arm
    from fusionkit.backends.vulkan_adapter import preprocess_rules as vulkan
    from fusionkit.backends.xnnpack_adapter import preprocess_rules as xnnpack
    from fusionkit.passes.registry import registered

    out = []
    for backend, adapter in (("vulkan", vulkan), ("xnnpack", xnnpack), ("arm", arm)):
        factories = registered(adapter.RULE_SET)
        for stock_pass in adapter.TAKEN_OVER_PASSES:
            cls = _stock_class(backend, stock_pass)
            mine = [f for f in factories if f.takes_over == stock_pass]
            own = [f.make.__module__ for f in mine]
            rule_modules = tuple(dict.fromkeys(
                [*own, *(m for o in own for m in _imported_rule_modules(o))]))
            files = {m: inspect.getsourcefile(importlib.import_module(m)) for m in rule_modules}
            out.append(TakeoverRow(
                backend, stock_pass, cls.__module__, _stock_lines(cls), rule_modules,
                tuple(r.name for f in mine for r in f.rules()),
                sum(code_lines(str(p)) for p in files.values())))
    return out


def _imported_rule_modules(module: str) -> list[str]:
    """The public ``fusionkit.passes`` modules ``module`` imports from (rules it reuses)."""
    path = inspect.getsourcefile(importlib.import_module(module))
    with open(str(path), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.startswith("fusionkit.passes.") \
                and not node.module.rsplit(".", 1)[-1].startswith("_") \
                and node.module != "fusionkit.passes.registry":
            found.append(node.module)
    return found


def _short(module: str) -> str:
    return module.removeprefix("fusionkit.passes.").replace(".", "/") + ".py"


def markdown(table: list[TakeoverRow] | None = None) -> str:
    """The table (docs/preprocess-rules.md): backend, stock pass, rule module(s) and rules, lines each side."""
    table = rows() if table is None else table
    lines = ["| backend | stock pass | fusionkit rules (`passes/`) | stock lines | rule lines |",
             "|---|---|---|---:|---:|"]
    for r in table:
        modules = " + ".join(f"`{_short(m)}`" for m in r.rule_modules)
        n = len(r.rule_names)
        what = (f"{n} rule{'s' if n != 1 else ''}" if n else
                "no rule needed (the module says why)")
        lines.append(f"| {r.backend} | `{r.stock_pass}` | {modules}: {what} | "
                     f"{r.stock_lines} | {r.rule_lines} |")
    by = {b: [r for r in table if r.backend == b] for b in ("vulkan", "xnnpack", "arm")}
    total = ["| **sum** | " + " · ".join(f"{b}: {len(v)} passes" for b, v in by.items())
             + " | | " + " · ".join(str(sum(r.stock_lines for r in v)) for v in by.values())
             + " | " + " · ".join(str(sum(r.rule_lines for r in v)) for v in by.values()) + " |"]
    return "\n".join(lines + total)


#: the backends' rule sets, in table order (a family's users are found in these)
FAMILY_SETS = (("vulkan", "vulkan_preprocess"), ("xnnpack", "xnnpack"), ("arm", "arm"))


@dataclass(frozen=True)
class FamilyRow:
    """One rule family (``passes/families/``): its own lines and, per backend, the lines of
    that backend's own rule modules built on it (the stock pass each takes over)."""

    family: str
    family_lines: int
    #: backend -> (stock pass, its rule module, code lines of that module)
    backends: dict[str, tuple[str, str, int]]


def family_rows() -> list[FamilyRow]:
    """Every module of ``fusionkit.passes.families`` with the backends' modules using it."""
    import pkgutil

    import fusionkit.passes.families as families
    from fusionkit.passes.registry import registered

    out = []
    for info in pkgutil.iter_modules(families.__path__):
        if info.name.startswith("_"):
            continue
        name = f"{families.__name__}.{info.name}"
        users: dict[str, tuple[str, str, int]] = {}
        for backend, rule_set in FAMILY_SETS:
            for f in registered(rule_set):
                module = f.make.__module__
                if f.takes_over and name in _imported_rule_modules(module):
                    path = str(inspect.getsourcefile(importlib.import_module(module)))
                    users[backend] = (f.takes_over, module, code_lines(path))
        path = str(inspect.getsourcefile(importlib.import_module(name)))
        out.append(FamilyRow(name, code_lines(path), users))
    return out


def families_markdown(table: list[FamilyRow] | None = None) -> str:
    """The table of rule families: shared lines, and each backend's own."""
    table = family_rows() if table is None else table
    backends = [b for b, _ in FAMILY_SETS]
    lines = ["| family (`passes/`) | shared lines | " + " | ".join(backends) + " |",
             "|---|---:|" + "---|" * len(backends)]
    for r in table:
        cells = [f"`{r.backends[b][0]}`: `{_short(r.backends[b][1])}`, {r.backends[b][2]} lines"
                 if b in r.backends else "—" for b in backends]
        lines.append(f"| `{_short(r.family)}` | {r.family_lines} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(0, root)
    print(families_markdown() if sys.argv[1:] == ["families"] else markdown())
