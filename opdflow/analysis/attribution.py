"""Per-layer attribution of a recipe's mismatch, and the greedy BF16 escape search.

For each decoder layer l: D with the recipe on layer l alone ("only"), and on every layer
but l ("all but"); a layer's share is its "only" D over the sum of them (clipped at 0).
For KV recipes also keys-only and values-only. Then the escape search: keep layers in
BF16 greedily by share, largest first, until D falls under the budget; it reports the
set and the D it reaches. D is the exact KL where the vocabulary allows it, else k1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from opdflow.analysis.measure import Measurement, MeasureSession
from opdflow.config import PipelineConfig


@dataclass(frozen=True)
class LayerRow:
    """One decoder layer's part in a recipe's mismatch."""

    layer: int
    only: Measurement
    """The recipe applied to this layer alone."""
    all_but: Measurement
    """The recipe applied to every layer but this one."""
    share: float
    """max(D_only, 0) / sum over layers of max(D_only, 0)."""


@dataclass(frozen=True)
class Attribution:
    """Where a recipe's mismatch comes from, and the escape that brings it under budget."""

    recipe: str
    full: Measurement
    bf16: Measurement
    layers: tuple[LayerRow, ...]
    kv_split: tuple[Measurement, ...]
    """keys-only and values-only measurements (KV recipes; empty otherwise)."""
    budget: float
    escape_layers: tuple[int, ...]
    """Layers kept in BF16 by the greedy search (in the order they were added)."""
    escape: Measurement
    """The recipe with those layers escaped."""
    escape_path: tuple[Measurement, ...]
    """Each step of the greedy search."""

    @property
    def reached(self) -> bool:
        return self.escape.d <= self.budget


def attribute(
    cfg: PipelineConfig,
    recipe: str,
    budget: float | None = None,
    num_prompts: int = 16,
    responses_per_prompt: int = 2,
    seed: int = 0,
    on_progress: Callable[[str], None] | None = None,
    session: MeasureSession | None = None,
) -> Attribution:
    """Attribute `recipe`'s D to layers; budget defaults to a tenth of the full recipe's D."""
    from opdflow.core.recipe import parse_recipe, with_parts

    parsed = parse_recipe(recipe)
    s = session or MeasureSession(
        cfg, num_prompts, responses_per_prompt, seed, log=on_progress or (lambda _m: None)
    )
    cache: dict[str, Measurement] = {}

    def measure(r) -> Measurement:
        text = r.text if not isinstance(r, str) else parse_recipe(r).text
        if text not in cache:
            cache[text] = s.measure(text)
        return cache[text]

    full, bf16 = measure(parsed), measure("bf16")
    n = s.num_layers
    only = [measure(with_parts(parsed, layers=[i])) for i in range(n)]
    all_but = [measure(with_parts(parsed, bf16_layers=[i])) for i in range(n)]
    positive = [max(m.d, 0.0) for m in only]
    total = sum(positive) or 1.0
    rows = tuple(LayerRow(i, only[i], all_but[i], positive[i] / total) for i in range(n))
    kv_split: tuple[Measurement, ...] = ()
    if parsed.kv_part is not None:
        kv_split = tuple(
            measure(with_parts(parsed, keys_only=k, values_only=not k)) for k in (True, False)
        )
    if budget is None:
        budget = full.d / 10
    order = sorted(range(n), key=lambda i: -rows[i].share)
    escaped: list[int] = []
    path: list[Measurement] = []
    current = full
    for layer in order:
        if current.d <= budget:
            break
        escaped.append(layer)
        current = measure(with_parts(parsed, bf16_layers=sorted(escaped)))
        path.append(current)
    return Attribution(
        parsed.text, full, bf16, rows, kv_split, budget, tuple(escaped), current, tuple(path)
    )
