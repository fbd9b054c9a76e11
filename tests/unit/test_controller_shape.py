"""The controller fits on one screen: `run_pipeline` is at most 50 lines, closures none.

Its parts live with the state they own (rollouts.py, recorder.py, healing.py); a loop that
grows again is what this catches. Read from the source (ast): it imports nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

CONTROLLER = Path(__file__).resolve().parents[2] / "opdflow" / "driver" / "controller.py"
MAX_LINES = 50


def _run_pipeline() -> ast.FunctionDef:
    tree = ast.parse(CONTROLLER.read_text())
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run_pipeline")


def test_run_pipeline_fits_on_one_screen():
    fn = _run_pipeline()
    lines = fn.end_lineno - fn.lineno + 1  # as inspect.getsource counts them
    assert lines <= MAX_LINES, (
        f"{CONTROLLER.name}: run_pipeline is {lines} lines (at most {MAX_LINES}); move the "
        "new detail into the object that owns its state (Rollouts, StepRecorder, Healer)"
    )


def test_run_pipeline_holds_no_closures():
    fn = _run_pipeline()
    inner = [
        n.name
        for n in ast.walk(fn)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n is not fn
    ]
    assert not inner, f"closures in run_pipeline: {inner}"
