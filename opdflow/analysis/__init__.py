"""Analysis: reading finished runs and measuring engines, outside the training loop.

One run-directory reader (runs.py) feeds quality comparisons, the admission check,
calibration of the noise floor, throughput curves, the report and the simulator; measure.py,
attribution.py and gradient_error.py measure a recipe's mismatch without training.

May import: opdflow.core, opdflow.compute, opdflow.config, opdflow.runtime (the run
directory), opdflow.testbed, opdflow.engines. Imported by study/, commands/ and the benches.
"""
