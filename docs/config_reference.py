"""Writes docs/CONFIG.md, every pipeline field with its default and docstring.

The config dataclasses are the reference: each field has a docstring under it, so the page
is generated from them rather than written twice. `python docs/config_reference.py`
rewrites the page; tests/unit/test_docs.py fails when the page and the dataclasses differ.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import sys
import textwrap
import typing
from pathlib import Path

PAGE = Path(__file__).with_name("CONFIG.md")

HEADER = """# Configuration: every field

A pipeline file's function returns one `opdflow.config.PipelineConfig`; every field below
can also be set from the command line (`--set train.lr=2e-4`) and is written to the run's
`config.json`. Defaults are those of `PipelineConfig()`; pipeline files change many of
them. Generated from the config dataclasses' field docstrings by
`python docs/config_reference.py` (tests/unit/test_docs.py checks it is current): edit
the docstrings, not this page.
"""


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass and of its dataclass bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, after in zip(body, [*body[1:], None], strict=True):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            if (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    return docs


def rows(obj: object, prefix: str) -> list[tuple[str, str, str]]:
    """(dotted name, default, docstring) of every leaf field under `obj`, depth first."""
    cls = type(obj)
    docs = field_docs(cls)
    out: list[tuple[str, str, str]] = []
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            out.extend(rows(value, f"{name}."))
        else:
            out.append((name, default_text(value), docs.get(f.name, "")))
    return out


def default_text(value: object) -> str:
    """A default as it would be written in a pipeline file or after --set."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    return json.dumps(value, default=str)


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    """The whole page."""
    from opdflow.config import PipelineConfig

    config = PipelineConfig()
    top_docs = field_docs(PipelineConfig)
    hints = typing.get_type_hints(PipelineConfig)
    lines = [HEADER]
    top = [f for f in dataclasses.fields(config) if not dataclasses.is_dataclass(hints[f.name])]
    sections = [f for f in dataclasses.fields(config) if dataclasses.is_dataclass(hints[f.name])]
    lines.append("Sections: " + ", ".join(f"[`{f.name}`](#{f.name})" for f in sections) + ".\n")
    lines.append("## Top level\n")
    lines.append("| field | default | what it is |")
    lines.append("|---|---|---|")
    for f in top:
        value = default_text(getattr(config, f.name))
        lines.append(f"| `{f.name}` | `{cell(value)}` | {cell(top_docs.get(f.name, ''))} |")
    for f in sections:
        section = getattr(config, f.name)
        lines.append(f"\n## {f.name}\n")
        lines.append(f"{cell(top_docs.get(f.name, ''))} (`{type(section).__name__}`)\n")
        lines.append("| field | default | what it is |")
        lines.append("|---|---|---|")
        for name, value, doc in rows(section, f"{f.name}."):
            lines.append(f"| `{name}` | `{cell(value)}` | {cell(doc)} |")
    return "\n".join(lines) + "\n"


def undocumented() -> list[str]:
    """Dotted names of fields without a docstring."""
    from opdflow.config import PipelineConfig

    return [name for name, _, doc in rows(PipelineConfig(), "") if not doc]


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    PAGE.write_text(render())
    print(f"wrote {PAGE}")
