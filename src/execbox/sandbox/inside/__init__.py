"""The sandbox's code that runs inside the runtime image: zygotes, supervisors, jail steps, the
program and the session interpreter. Standard library only (and this package): the image has
none of execbox's dependencies. tests/sandbox/test_layers.py enforces it."""
