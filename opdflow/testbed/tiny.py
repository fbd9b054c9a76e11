"""The worked-solutions testbed: the tiny task and models on which OPD visibly works.

The demo (pipelines/tiny_cpu.py) and the study (`opdflow study run`) both start from it, so
they train the same cached models and read the same way. Responses write out every column
("3+9+0=12,2+5+1=08,1+4+0=05:582", ~31 tokens), so a wrong early token shifts every later
prefix. The teacher trains 200 steps; the student is that teacher fine-tuned 30 steps to
drop carries on 3 problems in 4 (models.tiny.student = "carry_blind"): close to its teacher
in weights and wrong exactly where OPD's per-token teacher signal can show it the carry.
"""

from __future__ import annotations

from opdflow.config import PipelineConfig


def worked() -> PipelineConfig:
    """The config defaults on the worked testbed: its task, its models, lr 2e-4, 32 new tokens.

    Staleness, the importance weight, steps and evaluation stay the defaults: callers set them.
    """
    cfg = PipelineConfig(name="tiny-worked")
    cfg.train.lr = 2e-4
    cfg.data.task.worked = True
    cfg.engine.max_new_tokens = 32
    tiny = cfg.models.tiny
    tiny.student = "carry_blind"
    tiny.teacher_steps = 200
    tiny.batch_size = 64
    tiny.label_smoothing = 0.01  # ~0.99 per right token: 31-token responses stay sampleable
    return cfg
