"""The isolation boundary: jail steps, seccomp, cgroups, the zygote, workspace in and out.

Modules here except `host` and `probe` use the standard library only: the zygote imports them
inside the runtime image, where execbox's own dependencies are not installed.
"""
