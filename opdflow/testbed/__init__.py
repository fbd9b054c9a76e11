"""Testbed: what opdflow builds itself to run without real models, data or machines.

The tiny worked-solutions task and the tiny student and teacher models that opdflow
trains, builds and caches itself (training.py, zoo.py, task.py, tokenizer.py, tiny.py).
netcluster.py (over raynode.py and netns.py) is the testbed for many machines: a real
multi-node Ray cluster on one Linux machine, each node in its own network and mount
namespace, for trying and testing runs across nodes (standard library only). Nothing here
downloads anything.

May import: opdflow.core, opdflow.config, opdflow.errors; torch and transformers (lazily
where possible). Imported by inputs/ (a "tiny" model is built on demand), record/,
memory/, stages/, analysis/, driver/ and commands/.
"""
