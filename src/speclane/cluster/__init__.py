"""Engine replicas behind one endpoint: routing, shared lane counters, faults (docs/design.md,
"Replicas"). Only ``ray_actors.py`` (and ``launch.py``, which uses it) imports Ray."""
