"""Errors a person can fix, in a leaf module every folder may import.

Kept apart from the schema so that the recipe grammar, the runtime and the analyses raise
the same error as the config without importing the config (and so no import circle can
form through it). It imports nothing from opdflow.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A pipeline or configuration problem a person can fix; the message says what and how."""
