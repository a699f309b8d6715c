"""Code-generation benchmarks run in the sandbox: every completion is untrusted code.

`humaneval` evaluates HumanEval samples (the reference harness's JSONL format) and reports
pass@k. The modules here import the executor; `execbox.cli` imports them only when a command
needs them.
"""
