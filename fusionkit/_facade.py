"""Regenerate the facade's ``TYPE_CHECKING`` imports from :data:`fusionkit.public_names.EXPORTS`.

Why generated: type checkers need static imports, users need one lazy table;
writing both by hand let them drift. ``python -m fusionkit._facade`` rewrites the
block between the markers in ``fusionkit/__init__.py`` (one line per module, its names
sorted: ruff's import sorting and unused-import checks are off in that file, which holds
nothing but this table); ``--check`` exits 1 if it is stale (the architecture test runs the
same comparison).
"""

from __future__ import annotations

import sys
from pathlib import Path

BEGIN = "# --- generated from EXPORTS by `python -m fusionkit._facade`; do not edit by hand ---"
END = "# --- end of generated imports ---"
INIT = Path(__file__).with_name("__init__.py")


def generated_block(exports: dict[str, tuple[str, str]]) -> str:
    by_module: dict[str, list[str]] = {}
    for name, (module, _) in exports.items():
        by_module.setdefault(module, []).append(name)
    lines = [f"    from {module} import {', '.join(sorted(names))}"
             for module, names in sorted(by_module.items())]
    return "\n".join([BEGIN, "if TYPE_CHECKING:", *lines, END])


def render(text: str, exports: dict[str, tuple[str, str]]) -> str:
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + generated_block(exports) + tail


def main(argv: list[str]) -> int:
    from fusionkit.public_names import EXPORTS

    text = INIT.read_text()
    new = render(text, EXPORTS)
    if "--check" in argv:
        return int(new != text)
    INIT.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
