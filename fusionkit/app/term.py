"""Terminal output: colour only on a TTY (and never with NO_COLOR); the core's table renderer."""

from __future__ import annotations

import os
import sys
from typing import TextIO

from fusionkit.report import text_table

__all__ = ["Style", "table"]

#: the one table renderer (plain text; colour is applied to cells by the caller)
table = text_table


class Style:
    """ANSI styling that switches itself off when the stream is not a terminal."""

    def __init__(self, stream: TextIO | None = None) -> None:
        stream = stream or sys.stdout
        self.enabled = (hasattr(stream, "isatty") and stream.isatty()
                        and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb")

    def _wrap(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.enabled else text

    def bold(self, t: str) -> str:
        return self._wrap("1", t)

    def green(self, t: str) -> str:
        return self._wrap("32", t)

    def red(self, t: str) -> str:
        return self._wrap("31", t)

    def dim(self, t: str) -> str:
        return self._wrap("2", t)
