"""Commands: the face of opdflow. cli.py registers each group with one line.

options.py declares the options and arguments several commands share (--set among them),
so each is declared once and means the same everywhere.

May import every folder; nothing imports commands/ but cli.py.
"""
