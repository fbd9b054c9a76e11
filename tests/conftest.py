"""Shared fixtures: the tiny models are built once per cache (a couple of minutes the first time).

Tiers (docs/TESTING.md): every test gets its folder's marker (unit, integration, ray,
multinode, vllm), and a test of tests/unit that is neither slow nor gpu is also `fast`:
`python -m pytest -m fast` is the loop a contributor runs after every change.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
FOLDERS = ("unit", "integration", "ray", "multinode", "vllm")
"""Folders whose name is a marker (pyproject.toml declares them)."""

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    """The folder's marker on each test; `fast` on the unit tests not marked slow or gpu."""
    for item in items:
        parts = item.path.resolve().relative_to(TESTS).parts
        folder = parts[0] if len(parts) > 1 else ""
        if folder in FOLDERS:
            item.add_marker(folder)
        if folder == "unit" and not any(item.get_closest_marker(m) for m in ("slow", "gpu")):
            item.add_marker("fast")


@pytest.fixture(scope="session")
def tiny():
    """The default tiny build (tokenizer, student, teacher, parquet prompts)."""
    from opdflow.config import TaskSpec, TinyModelSpec
    from opdflow.testbed.zoo import ensure_tiny

    return ensure_tiny(TinyModelSpec(), TaskSpec())


@pytest.fixture(scope="session")
def tokenizer(tiny):
    from opdflow.inputs.models import load_tokenizer

    return load_tokenizer(tiny.tokenizer)
