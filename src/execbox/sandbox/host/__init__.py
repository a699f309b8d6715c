"""The sandbox's host side, in the caller's process: the zygote processes, the slot pool, a
slot, the output pump, the session channel and the host probe (`execbox doctor`)."""
