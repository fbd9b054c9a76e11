"""Cluster: what a run needs from Ray and the machines, with no stage logic.

connection.py connects to Ray (an embedded loopback cluster by default, a real one by
address); placement.py reserves stages' actors in placement groups and gives each actor
its options, and `fit` places a pipeline on a described cluster without Ray
(clusterfile.py reads a cluster launcher file); startup.py tells an actor that cannot be
placed from one that failed to start; supervisor.py turns a dead or stuck stage into a
restart or a clear error, restarts.py records each restart, and nodes.py turns Ray's node
table into the run's node-loss events.

May import: opdflow.core (actor names), opdflow.config, opdflow.errors; ray (lazily).
Imported by memory/ (placement, cluster files), stages/ (start-up), driver/, study/ and
commands/.
"""
