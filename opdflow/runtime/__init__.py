"""Runtime: what a run needs from Ray, the machines and the disk, with no stage logic.

The Ray connection (cluster.py), placement of actors on nodes (placement.py, clusterfile.py),
the supervisor and restart record, devices and FSDP sharding, checkpoints, the run
directory, the profiler, experiment trackers and the export of a finished run's student.
Weights versions and their transports are opdflow.weights.

Across nodes: startup.py (an actor that fails to start says why), nodes.py (Ray's node
table as run events: losses, waits, recoveries), interfaces.py (the interface a process
group binds: the node's address, not the hostname's).

May import: opdflow.core, opdflow.config, opdflow.errors, ray, torch. Imported by stages/,
driver/, analysis/ and commands/; never imports them.
"""
