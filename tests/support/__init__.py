"""What tests share besides fixtures: real batches, run directories, process and socket
readers, tracker readers and a liveness wait. Imported as `support.NAME` (pytest puts tests/
on sys.path); nothing here is a fake: each helper drives or reads a real component.

- batches: rollout batches sampled by the tiny student.
- processes: stopping the process group a test started.
- report_runs: run and sweep directories with known numbers, written through RunDir.
- sockets: what a process tree listens on and talks to (loopback checks).
- tracker_readers: reading back what W&B, MLflow and TensorBoard wrote locally.
- waiting: polling until a condition holds, with a liveness limit.
"""
