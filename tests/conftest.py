"""Shared fixtures: the tiny models are built once per cache (a couple of minutes the first time)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


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
