"""The README's table of stock preprocess passes and the rules taking them over is the
one ``python -m benchmarks.rule_lines`` computes (no drift), and its line counts count
code, not docstrings or comments."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import rule_lines  # noqa: E402


def test_code_lines_count_code_only(tmp_path: Path) -> None:
    src = textwrap.dedent('''\
        """Module docstring,
        two lines."""
        # a comment

        import os  # trailing comment counts: the line holds code


        def f(x):
            """Docstring."""
            y = (x +
                 1)
            return "not a docstring"


        class C:
            """Doc."""
            z = 1
        ''')
    path = tmp_path / "m.py"
    path.write_text(src)
    # import, def, y = (x + / 1), return, class, z = 1
    assert rule_lines.code_lines(str(path)) == 7


def test_every_taken_over_pass_is_a_row_with_its_rule_modules() -> None:
    from fusionkit.backends.arm_adapter import preprocess_rules as arm
    from fusionkit.backends.vulkan_adapter import preprocess_rules as vulkan
    from fusionkit.backends.xnnpack_adapter import preprocess_rules as xnnpack

    adapters = {"vulkan": vulkan, "xnnpack": xnnpack, "arm": arm}
    table = rule_lines.rows()
    assert [(r.backend, r.stock_pass) for r in table] == \
        [(b, p) for b, a in adapters.items() for p in a.TAKEN_OVER_PASSES]
    for r in table:
        assert r.stock_lines > 0 and r.rule_modules, r
        assert all(m.startswith("fusionkit.passes.") for m in r.rule_modules), r
        # the rules counted are the ones the adapter runs in the stock pass's place
        adapter = adapters[r.backend]
        assert tuple(x.name for x in adapter.rules_for(r.stock_pass)) == r.rule_names


def test_the_documented_table_is_the_computed_one() -> None:
    doc = (ROOT / "docs" / "preprocess-rules.md").read_text()
    table = rule_lines.markdown()
    assert table in doc, (
        "docs/preprocess-rules.md's table of taken-over preprocess passes is stale: replace "
        "it with the output of `python -m benchmarks.rule_lines`:\n" + table)
    readme = (ROOT / "README.md").read_text()
    passes = {b: sum(1 for r in rule_lines.rows() if r.backend == b)
              for b in ("vulkan", "xnnpack", "arm")}
    assert (f"{sum(passes.values())} ExecuTorch 1.5.1 passes (Vulkan {passes['vulkan']}, "
            f"XNNPACK {passes['xnnpack']}, Arm {passes['arm']})") in " ".join(readme.split())


def test_rule_families_are_shared_and_counted() -> None:
    """``python -m benchmarks.rule_lines families``: the conv + batch norm family is used by
    the three backends' rule modules, each holding a fraction of the shared lines."""
    table = {r.family: r for r in rule_lines.family_rows()}
    bn = table["fusionkit.passes.families.conv_batch_norm"]
    assert {b: p for b, (p, _, _) in bn.backends.items()} == {
        "vulkan": "FuseBatchNormPass", "xnnpack": "FuseBatchNormPass",
        "arm": "FuseBatchNorm2dPass"}
    assert all(0 < n < bn.family_lines / 5 for _, _, n in bn.backends.values()), bn
    text = rule_lines.families_markdown()
    assert text.count("\n") == len(table) + 1 and "`families/conv_batch_norm.py`" in text
