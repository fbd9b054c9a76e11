"""Pipeline files: plain Python whose function returns one PipelineConfig, loaded and checked.

`load_pipeline("path.py[:function]", overrides)` imports the file (it must only define
functions), calls the function, applies the `--set` overrides and validates; every failure
is a ConfigError that names the file and function.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import types
from pathlib import Path

from opdflow.config.overrides import apply_overrides
from opdflow.config.pipeline import PipelineConfig
from opdflow.errors import ConfigError


def load_pipeline(spec: str, overrides: list[str] | None = None) -> PipelineConfig:
    """Load `path/to/pipeline.py[:function]` (default function `pipeline`) and validate it."""
    path_text, _, func_name = spec.partition(":")
    func_name = func_name or "pipeline"
    path = Path(path_text)
    if not path.is_file():
        raise ConfigError(
            f"pipeline file {path} not found (give a path such as pipelines/tiny_cpu.py)"
        )
    if path.suffix != ".py":
        raise ConfigError(f"pipeline file {path} must be a Python file (.py)")
    module_name = f"opdflow_pipeline_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"pipeline file {path} cannot be imported")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ConfigError(
            f"pipeline file {path} raised {type(exc).__name__} at import: {exc} "
            "(a pipeline file must only define functions; run it with python to see the traceback)"
        ) from exc
    func = getattr(module, func_name, None)
    if not callable(func):
        funcs = sorted(
            n
            for n, v in vars(module).items()
            if isinstance(v, types.FunctionType) and not n.startswith("_")
        )
        raise ConfigError(
            f"pipeline file {path} has no function {func_name!r}"
            + (f"; its functions: {', '.join(funcs)} (pick one with {path}:NAME)" if funcs else "")
        )
    try:
        cfg = func()
    except ConfigError as exc:
        raise ConfigError(f"{path}:{func_name}: {exc}") from exc
    except Exception as exc:
        raise ConfigError(f"{path}:{func_name}() raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(cfg, PipelineConfig):
        raise ConfigError(
            f"{path}:{func_name}() returned {type(cfg).__name__}, expected opdflow.config.PipelineConfig"
        )
    try:
        return apply_overrides(cfg, list(overrides or []))
    except ConfigError as exc:
        raise ConfigError(f"{path}:{func_name}: {exc}") from exc


def pipeline_functions(path: str | Path) -> list[str]:
    """Names of the public functions of a pipeline file that return a PipelineConfig (for tests/CLI)."""
    tree = ast.parse(Path(path).read_text())
    return [
        n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")
    ]
