"""A handler for `execbox.testing.FakeSandbox` that answers the trivial programs the tests
above the sandbox send (`print('x')`, `time.sleep(0.5)`, `open('a', 'w').write('b')`) from
their literal statements (imports, prints, sleeps, writes, `name = literal`), running nothing. Any other statement fails the test: a
test that needs code to really run belongs with the real sandbox."""

from __future__ import annotations

import ast
import time

from execbox import ErrorInfo, Status
from execbox.testing import FakeResult, FakeRun


def literal_handler(run: FakeRun) -> FakeResult:
    try:
        tree = ast.parse(run.code)
    except SyntaxError as exc:
        return FakeResult(
            exit_code=1,
            stderr=f"SyntaxError: {exc.msg}\n",
            error=ErrorInfo(type="SyntaxError", message=exc.msg, line=exc.lineno),
        )
    files: dict[str, bytes] = {}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Assign):  # a literal bound to a name: nothing to show
            ast.literal_eval(node.value)
            continue
        call = node.value if isinstance(node, ast.Expr) else None
        if not isinstance(call, ast.Call):
            raise AssertionError(f"the fake sandbox runs no {ast.unparse(node)!r}")
        name = ast.unparse(call.func)
        args = [ast.literal_eval(a) for a in call.args]
        if name == "print":
            keywords = {k.arg: ast.unparse(k.value) for k in call.keywords}
            end = ast.literal_eval(keywords.get("end", "'\\n'"))
            run.write(
                " ".join(str(a) for a in args) + end, stderr=keywords.get("file") == "sys.stderr"
            )
        elif name == "time.sleep":
            deadline = time.monotonic() + args[0]
            while time.monotonic() < deadline and not run.cancelled:
                time.sleep(0.01)
        elif (
            isinstance(call.func, ast.Attribute)
            and call.func.attr == "write"
            and isinstance(call.func.value, ast.Call)
            and ast.unparse(call.func.value.func) == "open"
        ):
            path = ast.literal_eval(call.func.value.args[0])
            files[path] = args[0].encode() if isinstance(args[0], str) else args[0]
        else:
            raise AssertionError(f"the fake sandbox runs no {ast.unparse(node)!r}")
    return FakeResult(artifacts=files, status=Status.ok)
