"""What each command shows, computed from the objects the API returned. Pure: no I/O, no clock.

One module a view: ``devices`` (one row per device across every profile and mode), ``nodes`` (one
row per node and profile serving it), ``diagnosis`` (``why``: a profile's conditions, its agent
pods' trouble and what to do next); ``objects`` holds what they share: the readers of the API's
objects (profiles, nodes, pods, reports) and the ``Inputs`` each command lists once.
"""
