"""The shipped rule set builds on a cold interpreter and is consistent."""

from __future__ import annotations

import subprocess
import sys

from fusionkit import RuleIndex
from fusionkit.passes import rule_set


def test_builtin_rules_have_unique_names_and_index() -> None:
    rules = rule_set("builtin")
    names = [r.name for r in rules]
    assert len(set(names)) == len(names) and "rms_norm" in names
    index = RuleIndex(rules)  # raises on duplicate names
    from fusionkit.targets import resolve_op

    for r in rules:  # every rule is found under each op its root can be
        for key in r.root_keys:
            assert r in index.for_target(resolve_op(key))


def test_builtin_rules_build_in_a_fresh_interpreter() -> None:
    # op names such as dim_order_ops._to_dim_order_copy only exist once the
    # library registering them is imported; building the rules must do that
    code = "from fusionkit.passes import rule_set; print(len(rule_set('builtin')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip().splitlines()[-1]) == len(rule_set("builtin"))
