"""Seconds as a person reads them: the one format every command and report prints."""

from __future__ import annotations

import math


def duration(s: float) -> str:
    """'42 s', '3.5 min', '2.1 h'; 'n/a' when not finite."""
    if not math.isfinite(s):
        return "n/a"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"
