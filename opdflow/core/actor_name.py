"""How a stage's actors are named, one spelling everywhere: generator[i], learner[i], teacher.

Events, metrics, spans, restarts, the node watch, placement fits and the simulator all
name an actor by `actor_name`, and find its stage by `stage_of`. A generator replica is
always `generator[i]` (replicas come and go), a data-parallel learner's ranks
`learner[i]`, every other actor (and a single learner) its stage's name.
"""

from __future__ import annotations

import re


def actor_name(stage: str, index: int = 0, count: int = 1) -> str:
    """The name of actor `index` of `count` of `stage`: generator[i]; the ranks of a learner
    of more than one, learner[i]; the others (and a single learner) the stage's name."""
    return f"{stage}[{index}]" if stage == "generator" or count > 1 else stage


def stage_of(name: str) -> str:
    """'generator[1]' -> 'generator' (also the 'generator/1' of spans recorded by older runs)."""
    return re.split(r"[\[/]", name, maxsplit=1)[0]
