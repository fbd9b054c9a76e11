"""Study: the paper's claims as a plan of runs, their results, and a written verdict.

plan.py lists the arms and runs of a study; runner.py trains them in one session, decides
admission first and probes gradients; results.py turns finished run directories into
results and judges each run against its standard; claims.py reads each of the paper's
findings off the results (one function per claim); doc.py writes them out as a document
with figures.

May import: opdflow.analysis, opdflow.core, opdflow.config, opdflow.cluster,
opdflow.record, opdflow.driver (the session the runner trains in), opdflow.testbed.
Imported by commands/study.py.
"""
