"""Commands: the face of opdflow. cli.py registers each group with one line.

May import every folder; nothing imports commands/ but cli.py.
"""
