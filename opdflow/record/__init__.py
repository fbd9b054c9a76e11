"""Record: what a run leaves behind: its directory, checkpoints, spans, trackers, student.

rundir.py is the run directory (config.json, metrics.parquet, heldout.parquet,
events.jsonl, summary.json); checkpoint.py writes and reads checkpoints (DCP shards,
committed atomically, written in the background); profiler.py collects every stage's
spans into spans.parquet; trackers.py sends metrics to TensorBoard, W&B or MLflow beside
metrics.parquet; export.py writes the finished run's student as a Hugging Face checkpoint.

May import: opdflow.core (actor names), opdflow.config, opdflow.errors, opdflow.inputs
(the student's tokenizer for export), opdflow.testbed (a tiny student rebuilt for export);
torch, transformers and ray lazily. Imported by stages/, analysis/, driver/, study/ and commands/.
"""
