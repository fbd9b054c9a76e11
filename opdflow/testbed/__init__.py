"""Testbed and inputs: the models, tokenizer and data a run reads.

The tiny worked-solutions task and the tiny student and teacher models that opdflow trains,
builds and caches itself (training.py, zoo.py, task.py, tokenizer.py, tiny.py), and the
loaders that read real checkpoints and parquet prompt files from local paths with the same
code (models.py, data.py, grader.py). Nothing here downloads anything. netcluster.py (over
raynode.py and netns.py) is the testbed for many machines: a real multi-node Ray cluster on one Linux
machine, each node in its own network and mount namespace, for trying and testing runs
across nodes (standard library only).

May import: opdflow.core, opdflow.config, opdflow.errors, torch and transformers (lazily
where possible). Imported by stages/, analysis/, driver/ and commands/.
"""
