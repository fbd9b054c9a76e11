"""Inputs: the models, tokenizer, prompts and answers a run reads, from local paths.

models.py resolves and checks the student and teacher checkpoints (building the tiny ones
on demand when a pipeline names "tiny") and loads models and tokenizers; data.py reads
parquet prompt files (DAPO-Math-17k's schema among them) and samples each step's prompts;
grader.py checks answers (exact, or math-verify's equivalence). The same code serves the
tiny testbed and real checkpoints; nothing here downloads anything.

May import: opdflow.config, opdflow.errors, opdflow.testbed (the tiny build); torch and
transformers lazily. Imported by record/, engines/, stages/, analysis/, driver/ and
commands/.
"""
