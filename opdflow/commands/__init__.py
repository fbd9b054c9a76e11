"""Commands: the face of opdflow. cli.py registers each group with one line.

options.py declares the options and arguments several commands share (--set among them),
so each is declared once and means the same everywhere. console.py is what a person sees
of a run (progress line, summary table, one line per run of a batch); the runs themselves
are driver/'s.

May import: opdflow.core, opdflow.config, opdflow.errors, opdflow.inputs, opdflow.compute,
opdflow.cluster, opdflow.record, opdflow.weights, opdflow.engines, opdflow.memory,
opdflow.stages, opdflow.analysis, opdflow.driver, opdflow.study, opdflow.testbed; ray and
torch lazily. Nothing imports commands/ but cli.py.
"""
