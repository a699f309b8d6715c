"""The isolation boundary, in two layers.

`inside`: the code that runs in the runtime image's interpreter (the zygotes, the supervisor,
the jail steps, the program and session interpreter). Standard library only, enforced by
tests/sandbox/test_layers.py: execbox's own dependencies are not installed in the image.
`host`: the code that runs in the caller's process (start the zygotes, keep slots staged, pump
a run's bytes, the session channel, `execbox doctor`). It may import `inside`, never the
reverse.
"""
