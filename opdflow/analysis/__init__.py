"""Analysis: reading runs and measuring engines, outside the training loop.

One run-directory reader (runs.py) feeds the run's summary (summary.py, with what faults
cost in faults.py), quality comparisons, calibration of the noise floor, the sweep table
(throughput.py), the report and the simulator. The report is report.py (the page) over
curves.py (held-out curves), bottleneck.py (the bottleneck rule) and plots.py (its
figures); the simulator is simulator.py (the schedule, through the controller's own launch
rule and policies) over stage_times.py (what a measured run's stages cost), lengths.py
(response lengths) and machine.py (FIFO servers sharing cores). admission.py, measure.py,
attribution.py and gradient_error.py measure a recipe's mismatch without training.

May import: opdflow.core, opdflow.config, opdflow.compute, opdflow.inputs, opdflow.record
(the run directory), opdflow.engines, opdflow.errors; torch lazily. Imported by driver/
(the summary), study/, commands/ and the benches.
"""
