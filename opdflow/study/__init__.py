"""Study: the paper's claims as a plan of runs, their results, and a written verdict.

plan.py lists the arms and runs of a study; results and the judging of each claim turn run
directories into verdicts; doc.py writes them out as a document with figures.

May import: opdflow.analysis, opdflow.core, opdflow.config. Imported by commands/study.py.
"""
