"""Strict mode: whether a rule's own code raising is reported or re-raised.

By default an exception inside a rule (a constraint, a value predicate, a custom
check, a replacement) is a *decline* with step ``error``: a user's lowering must
not die because one rule has a bug. Strict mode re-raises instead, so rule bugs
cannot hide — the test suite turns it on for every test through the
``FUSIONKIT_STRICT`` environment variable.
"""

from __future__ import annotations

import os

__all__ = ["STRICT_ENV", "strict_mode"]

#: environment variable that turns strict mode on (``1``/``true``/``yes``) when no
#: explicit ``strict=`` argument is given
STRICT_ENV = "FUSIONKIT_STRICT"


def strict_mode(strict: bool | None = None) -> bool:
    """``strict`` if given, else what :data:`STRICT_ENV` says (off when unset)."""
    if strict is not None:
        return strict
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes", "on")
