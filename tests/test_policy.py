"""The policy check: each profile's verdicts, rule ids and lines, alias resolution, input and
limit caps, and loading profiles from TOML. Pure Python: no sandbox needed."""

from __future__ import annotations

import ast
import textwrap
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from execbox import policy
from execbox.contract import InputFile, Limits, RunRequest
from execbox.errors import UsageError
from execbox.policy import Profile, Verdict, check, load_profiles, scan_imports
from execbox.policy.walk import tree_nodes

MIB = 1 << 20


@pytest.fixture(scope="module")
def shipped() -> dict[str, Profile]:
    return load_profiles()


@pytest.fixture(autouse=True)
def _no_profiles_override(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's own EXECBOX_PROFILES must not change what these tests see.
    monkeypatch.delenv("EXECBOX_PROFILES", raising=False)


def run_check(
    code: str, profiles: dict[str, Profile], profile: str = "data", **request: Any
) -> Verdict:
    return check(RunRequest(code=code, profile=profile, **request), profiles)


def code(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def strict(shipped: dict[str, Profile], **rules: Any) -> dict[str, Profile]:
    """The shipped profiles plus 'strict': data's limits and caps with the given rules, and no
    allowlist, so alias cases are not masked by import.not_allowed."""
    base: dict[str, Any] = {
        "imports_deny": ["subprocess", "ctypes"],
        "calls_deny": ["os.system", "os.exec*", "subprocess.*", "ctypes.*"],
        "writes_outside_workspace": "deny",
        "languages": ["python"],  # these rules read Python only
    }
    table = {**shipped["data"].model_dump(), "name": "strict", **base, **rules}
    return {"strict": Profile.model_validate(table), **shipped}


# -- shipped profiles -------------------------------------------------------------------------


def test_shipped_profiles_are_minimal_data_extended_in_strictness_order(
    shipped: dict[str, Profile],
) -> None:
    assert list(shipped) == ["minimal", "data", "extended"]
    assert all(name == p.name and p.description for name, p in shipped.items())


def test_shipped_profile_limits_are_the_documented_ones(shipped: dict[str, Profile]) -> None:
    m, d, e = shipped["minimal"].limits, shipped["data"].limits, shipped["extended"].limits
    assert (m.timeout_s, m.memory_mib, m.pids, m.disk_mib) == (2, 256, 16, 16)
    assert d == Limits()
    assert (e.timeout_s, e.memory_mib, e.pids, e.disk_mib) == (60, 2048, 256, 1024)
    assert shipped["extended"].max_limits.timeout_s > shipped["data"].max_limits.timeout_s


def test_shipped_code_and_input_caps(shipped: dict[str, Profile]) -> None:
    caps = {
        n: (p.max_code_bytes, p.max_input_bytes, p.max_input_files, p.max_csv_rows)
        for n, p in shipped.items()
    }
    assert caps["minimal"][0] == 64 * 1024
    assert caps["data"] == (MIB, 256 * MIB, 64, 5_000_000)
    assert caps["extended"][0] == 4 * MIB


def test_profiles_toml_is_package_data() -> None:
    assert resources.files("execbox").joinpath("profiles.toml").is_file()
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert '"profiles.toml"' in pyproject


def test_plain_code_is_allowed_under_every_profile(shipped: dict[str, Profile]) -> None:
    for name in shipped:
        v = run_check("import math\nprint(math.sqrt(2))\n", shipped, name)
        assert (v.decision, v.rule, v.message, v.line) == ("allow", None, None, None)


# -- minimal ----------------------------------------------------------------------------------


def test_subprocess_import_on_line_3_is_denied_under_minimal_but_allowed_under_data(
    shipped: dict[str, Profile],
) -> None:
    src = "import math\nx = 1\nimport subprocess\n"
    v = run_check(src, shipped, "minimal")
    assert (v.decision, v.rule, v.line) == ("deny", "import.deny", 3)
    assert v.message is not None
    assert "'subprocess'" in v.message and "'minimal'" in v.message
    assert "choose profile 'data'" in v.message
    assert run_check(src, shipped, "data").decision == "allow"


@pytest.mark.parametrize(
    "src,rule,line",
    [
        ("import ctypes\n", "import.deny", 1),
        ("import multiprocessing\n", "import.deny", 1),
        ("\nimport socket\n", "import.deny", 2),
        ("import os\n\nos.system('ls')\n", "call.deny", 3),
        ("import os\nos.popen('ls')\n", "call.deny", 2),
        ("import os\nos.execv('/bin/sh', ['sh'])\n", "call.deny", 2),
        ("import os\nos.spawnl(os.P_WAIT, '/bin/true')\n", "call.deny", 2),
        ("import os\npid = os.fork()\n", "call.deny", 2),
        ("import numpy\n", "import.not_allowed", 1),
        ("import json\nimport pandas as pd\n", "import.not_allowed", 2),
        ("import importlib\n", "import.not_allowed", 1),
        ("open('/etc/passwd', 'a')\n", "write.outside_workspace", 1),
    ],
)
def test_minimal_denies_processes_native_code_other_libraries_and_outside_writes(
    shipped: dict[str, Profile], src: str, rule: str, line: int
) -> None:
    v = run_check(src, shipped, "minimal")
    assert (v.decision, v.rule, v.line) == ("deny", rule, line)
    assert v.message is not None and "'minimal'" in v.message


# Ways to reach a process through modules the minimal profile allows, as an attacker writes
# them (issue 38, finding 8): attribute chains, constant lookups, namespaces, introspection.
@pytest.mark.parametrize(
    "src,rule,line",
    [
        ("import pathlib\npathlib.os.system('id')\n", "call.deny", 2),
        ("import logging\nlogging.os.execv('/bin/sh', ['sh'])\n", "call.deny", 2),
        ("import sys\nsys.modules['os'].system('id')\n", "call.deny", 2),
        ("from pathlib import os\nos.system('id')\n", "call.deny", 2),
        ("import random\nrandom._os.system('id')\n", "call.deny", 2),
        ("import pathlib\np = pathlib\np.os.system('id')\n", "call.deny", 3),
        ("import pathlib\ngetattr(pathlib, 'os').system('id')\n", "call.deny", 2),
        ("import os\nm = os.sys.modules.get('json')\n", "call.deny", 2),
        ("import sys\nsys.meta_path[0].load_module('posix').system('id')\n", "call.deny", 2),
        ("import uuid\nuuid._get_command_stdout('sh', '-c', 'id')\n", "call.deny", 2),
        ("import os\nos._exit(0)\n", "call.deny", 2),
        ("__import__('os').system('id')\n", "call.deny", 1),
        ("__builtins__.__import__('os').system('id')\n", "call.deny", 1),
        ("exec('import subprocess')\n", "call.deny", 1),
        ("e = eval\ne('1')\n", "call.deny", 1),
        ("g = globals()\n", "call.deny", 1),
        ("import logging.config\nlogging.config.dictConfig({'version': 1})\n", "call.deny", 2),
        (
            "import typing\ndef f(x: \"__import__('os').system('id')\"): pass\n"
            "typing.get_type_hints(f)\n",
            "call.deny",
            3,
        ),
        (
            "import string\nstring.Formatter().get_field('0.__globals__', [len], {})\n",
            "call.deny",
            2,
        ),
        ("import types\ntypes.FunctionType(types.CodeType, {})\n", "call.deny", 2),
        ("import pathlib\nnames = pathlib.__dict__\n", "attribute.deny", 2),
        ("().__class__.__base__.__subclasses__()\n", "attribute.deny", 1),
        ("f = lambda: 0\nf.__globals__['__builtins__']\n", "attribute.deny", 2),
        ("print.__self__.__import__('os')\n", "attribute.deny", 1),
        (
            "try:\n    1 / 0\nexcept Exception as e:\n    e.__traceback__.tb_frame\n",
            "attribute.deny",
            4,
        ),
        ("x = getattr(object, '__subclasses__')\n", "attribute.deny", 1),
        (
            "import operator\noperator.attrgetter('__init__.__globals__')(len)\n",
            "attribute.deny",
            2,
        ),
        ("name = '__sub' + 'classes__'\ngetattr(object, name)()\n", "attribute.computed", 2),
        (
            "import functools\nfunctools.reduce(getattr, ['__init__', '__globals__'], len)\n",
            "attribute.computed",
            2,
        ),
        ("import os\n[os][0].system('id')\n", "module.value", 2),
        ("import pathlib\ndef f(m):\n    return m\nq = f(pathlib)\n", "module.value", 4),
        (
            "import warnings\nw = warnings.catch_warnings()._module\nw.sys.modules['os'].system('id')\n",
            "call.deny",
            3,
        ),
        (
            "import warnings\nw = warnings.catch_warnings()._module\ngetattr(w, 'os').fork()\n",
            "call.deny",
            3,
        ),
        ("import os\nclass C:\n    m = os\nC.m.system('id')\n", "module.value", 3),
        ("import pathlib\nfor m in (pathlib.os,):\n    m.system('id')\n", "module.value", 2),
        ("import pathlib\np = pathlib\nq = [p]\n", "module.value", 3),
        ("x = [__builtins__]\n", "module.value", 1),
        ("help('antigravity')\n", "call.deny", 1),
        ("import io\nio.FileIO('/proc/self/mem', 'r+')\n", "write.outside_workspace", 2),
        (
            "import os\nfd = os.open('/proc/self/mem', os.O_RDWR | os.O_CLOEXEC)\n",
            "write.outside_workspace",
            2,
        ),
    ],
)
def test_minimal_denies_each_way_around_its_rules(
    shipped: dict[str, Profile], src: str, rule: str, line: int
) -> None:
    v = run_check(src, shipped, "minimal")
    assert (v.decision, v.rule, v.line) == ("deny", rule, line), v.message
    assert v.message is not None and "choose profile 'data'" in v.message
    # The sandbox is the boundary: the data profile lets all of it through.
    assert run_check(src, shipped, "data").decision == "allow"


@pytest.mark.parametrize(
    "src",
    [
        "!touch ran\n",
        "x = 1\nfiles = !ls\n",
        "%system id\n",
        "%%bash\nid\n",
        "/exec 'x'\n",
    ],
)
def test_a_session_cell_that_is_not_python_is_denied_under_minimal(
    shipped: dict[str, Profile], src: str
) -> None:
    # IPython runs these (a shell, a magic); the rules would never see what they do.
    v = check(RunRequest(code=src, profile="minimal"), shipped, cell=policy.CellContext())
    assert (v.decision, v.rule) == ("deny", "code.not_python"), v.message
    assert v.message is not None and "choose profile 'data'" in v.message
    # A run is plain Python: its SyntaxError is the run's to report.
    v = check(RunRequest(code=src, profile="minimal"), shipped)
    assert (v.decision, v.rule) == ("allow", "code.syntax")
    assert (
        check(RunRequest(code=src, profile="data"), shipped, cell=policy.CellContext()).decision
        == "allow"
    )


@pytest.mark.parametrize(
    "src",
    [
        "get_ipython().system('id')\n",
        "exit._ip.system('id')\n",
        "__builtin__.eval('1')\n",
    ],
)
def test_a_session_shell_reached_through_ipython_names_is_denied_under_minimal(
    shipped: dict[str, Profile], src: str
) -> None:
    v = check(RunRequest(code=src, profile="minimal"), shipped, cell=policy.CellContext())
    assert (v.decision, v.rule, v.line) == ("deny", "call.deny", 1), v.message


@pytest.mark.parametrize(
    "cells,rule",
    [
        (["import os\n", "os.system('id')\n"], "call.deny"),
        (["import os\nm = os\n", "x = 1\n", "m.system('id')\n"], "call.deny"),
        (["from os import system as run\n", "run('id')\n"], "call.deny"),
        (["import pathlib\n", "q = [pathlib]\n"], "module.value"),
        (["import os\n", "m = os\n", "n = [m]\n"], "module.value"),
    ],
)
def test_a_session_cell_is_checked_with_what_earlier_cells_bound(
    shipped: dict[str, Profile], cells: list[str], rule: str
) -> None:
    context = policy.CellContext()
    for earlier in cells[:-1]:
        v = check(RunRequest(code=earlier, profile="minimal"), shipped, cell=context)
        assert v.decision == "allow", v.message
    v = check(RunRequest(code=cells[-1], profile="minimal"), shipped, cell=context)
    assert (v.decision, v.rule) == ("deny", rule), v.message
    # Control: alone (another session) the last cell names nothing the check knows.
    alone = check(RunRequest(code=cells[-1], profile="minimal"), shipped, cell=policy.CellContext())
    assert alone.decision == "allow", alone.message


def test_a_denied_cell_binds_nothing_for_the_next(shipped: dict[str, Profile]) -> None:
    context = policy.CellContext()
    v = check(
        RunRequest(code="import os\nos.fork()\nx = os\n", profile="minimal"), shipped, cell=context
    )
    assert v.decision == "deny"
    assert context.aliases == {}


def test_a_reached_module_is_named_in_the_message(shipped: dict[str, Profile]) -> None:
    v = run_check("import pathlib\npathlib.os.system('id')\n", shipped, "minimal")
    assert v.message is not None and "os.system" in v.message
    v = run_check("import pathlib\nnames = pathlib.__dict__\n", shipped, "minimal")
    assert v.message is not None and "'__dict__'" in v.message
    v = run_check("getattr(object, input())\n", shipped, "minimal")
    assert v.message is not None and "computed" in v.message and "__globals__" in v.message


def test_minimal_not_allowed_message_names_the_module_and_a_profile_that_allows_it(
    shipped: dict[str, Profile],
) -> None:
    v = run_check("import numpy as np\n", shipped, "minimal")
    assert v.message is not None
    assert "'numpy'" in v.message and "allowlist" in v.message
    assert "choose profile 'data'" in v.message


@pytest.mark.parametrize(
    "src",
    [
        "from __future__ import annotations\nimport math, statistics, json, re\n",
        "import os\nprint(os.path.join('a', 'b'), os.getcwd())\n",
        "import os.path\nprint(os.path.exists('x'))\n",
        "from pathlib import Path\nPath('out.txt').write_text('ok')\n",
        "with open('result.csv', 'w') as fh:\n    fh.write('a')\n",
        "open('/tmp/scratch', 'w').close()\n",
        "open('/workspace/sub/x.txt', 'w').close()\n",
        "print(open('/etc/hosts').read())\n",
        "def system(cmd):\n    return cmd\n\nsystem('ls')\n",
        # Names like modules that are not reached modules, and ordinary classes.
        "import sys\nprint(sys.platform, sys.maxsize)\nsys.setrecursionlimit(10_000)\n",
        "import os\nprint(os.stat('x').st_size, os.sep)\n",
        "import datetime\nprint(datetime.time(1), datetime.datetime.now())\n",
        "import math\nroot = math.sqrt\nroot, sep = math.sqrt, 1\nprint(root(4))\n",
        "class A:\n    def __init__(self):\n        super().__init__()\n        self._x = 1\n\n"
        "    def __repr__(self):\n        return type(self).__name__ + self.__class__.__name__\n",
        "print(getattr(A(), 'name', None), hasattr(int, 'real'))\n",
        "import logging\nlogging.getLogger('x').info('a')\n",
        "import random\nrandom.seed(1)\nx = random.random()\n",
        "import operator\nprint(operator.attrgetter('real')(1))\n",
        "import os\nos = os.path\nos = os.join\n",
        "import datetime\nfrom datetime import date\nt = datetime.datetime\n"
        "print(isinstance(t.now(), (datetime.datetime, datetime.time, date)))\n",
        "import math, pathlib\np = pathlib\nfns = [math.sqrt, math.floor]\nprint(p.Path('x'))\n",
        "import re\nm = re.match('a', 'abc')\nprint(m.string, [m.string])\n",
        "import os\nprint(getattr(os, 'path').join('a', 'b'))\n",
        "import os\nfd = os.open('/etc/hosts', os.O_RDONLY)\nos.close(fd)\n",
        "import os\nfd = os.open('out.txt', os.O_WRONLY | os.O_CREAT)\n",
        "class Clock:\n    def __init__(self):\n        self.time = 0\n        self.string = ''\n"
        "\n    def tick(self):\n        return [self.time, self.string]\n",
    ],
)
def test_minimal_allows_pure_computation_and_workspace_files(
    shipped: dict[str, Profile], src: str
) -> None:
    v = run_check(src, shipped, "minimal")
    assert v.decision == "allow", v.message


# -- data and extended ------------------------------------------------------------------------


def test_data_is_the_request_default(shipped: dict[str, Profile]) -> None:
    v = check(RunRequest(code="import subprocess\n"), shipped)
    assert v.decision == "allow"
    assert v.limits == shipped["data"].limits


@pytest.mark.parametrize("profile", ["data", "extended"])
def test_data_and_extended_leave_processes_native_code_and_writes_to_the_sandbox(
    shipped: dict[str, Profile], profile: str
) -> None:
    src = code("""
        import ctypes, subprocess, os
        import numpy as np, pandas as pd
        subprocess.run(['ls'])
        os.fork()
        open('/proc/self/comm', 'w').write('x')
    """)
    assert run_check(src, shipped, profile).decision == "allow"


def test_extended_gets_more_time_and_memory_by_default(shipped: dict[str, Profile]) -> None:
    v = run_check("print(1)\n", shipped, "extended")
    assert (v.limits.timeout_s, v.limits.memory_mib, v.limits.pids) == (60, 2048, 256)


# -- alias resolution -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "src,rule,line",
    [
        ("import os as o\no.system('ls')\n", "call.deny", 2),
        ("from os import system as s\n\ns('ls')\n", "call.deny", 3),
        ("from os import system\nsystem('ls')\n", "call.deny", 2),
        ("from os import *\nx = 1\nsystem('ls')\n", "call.deny", 3),
        ("from subprocess import *\n", "import.deny", 1),
        ("from subprocess import run\n", "import.deny", 1),
        ("import subprocess.foo\n", "import.deny", 1),
        ("x = 1\n__import__('ctypes')\n", "import.deny", 2),
        ("c = __import__('ctypes.util')\n", "import.deny", 1),
        ("import importlib\n\nm = importlib.import_module('ctypes')\n", "import.deny", 3),
        ("from importlib import import_module as im\nim('subprocess')\n", "import.deny", 2),
        ("__import__('os').system('ls')\n", "call.deny", 1),
        ("o = __import__('os')\n\no.execvp('sh', ['sh'])\n", "call.deny", 3),
        ("import importlib\nimportlib.import_module('os').system('ls')\n", "call.deny", 2),
        ("import os\nrun = os.system\nrun('ls')\n", "call.deny", 2),
        ("import os\ngetattr(os, 'system')('ls')\n", "call.deny", 2),
        ("import os\ndef f():\n    return os.execve\n", "call.deny", 3),
        ("import os\nx = [os.system(c) for c in ['a']]\n", "call.deny", 2),
        # A module reached through another, by a constant lookup, or through a name assigned one.
        ("import pathlib\npathlib.os.system('ls')\n", "call.deny", 2),
        ("import logging\n\nlogging.os.execv('sh', ['sh'])\n", "call.deny", 3),
        ("from pathlib import os\nos.system('ls')\n", "call.deny", 2),
        ("import random\nrandom._os.system('ls')\n", "call.deny", 2),
        ("import posix\nposix.system('ls')\n", "call.deny", 2),
        ("import sys\nsys.modules['os'].system('ls')\n", "call.deny", 2),
        ("import sys\nsys.modules.get('os').system('ls')\n", "call.deny", 2),
        ("import os\nos.sys.modules['os'].system('ls')\n", "call.deny", 2),
        ("import pathlib\npathlib.__dict__['os'].system('ls')\n", "call.deny", 2),
        ("import pathlib\nvars(pathlib)['os'].system('ls')\n", "call.deny", 2),
        ("import os\nglobals()['os'].system('ls')\n", "call.deny", 2),
        ("import pathlib\ngetattr(pathlib, 'os').system('ls')\n", "call.deny", 2),
        ("import pathlib\np = pathlib\np.os.system('ls')\n", "call.deny", 3),
        ("import os\nb = a\na = os\nb.system('ls')\n", "call.deny", 4),
        ("import os\nm, n = os, 1\nm.system('ls')\n", "call.deny", 3),
        ("import os\nif (m := os):\n    m.system('ls')\n", "call.deny", 3),
        ("import os\n\n(m := os).system('ls')\n", "call.deny", 3),
        ("__builtins__.__import__('subprocess')\n", "import.deny", 1),
        ("import asyncio\nasyncio.subprocess.PIPE\n", "import.deny", 2),
        ("import sys\nsys.modules['ctypes']\n", "import.deny", 2),
    ],
)
def test_aliases_are_resolved_to_the_module_or_call_they_name(
    shipped: dict[str, Profile], src: str, rule: str, line: int
) -> None:
    v = run_check(src, strict(shipped), "strict")
    assert (v.decision, v.rule, v.line) == ("deny", rule, line), v.message
    # The analysis looks only for the rules a profile has: each still fires alone.
    alone = strict(
        shipped,
        writes_outside_workspace="allow",
        **({"imports_deny": []} if rule == "call.deny" else {"calls_deny": []}),
    )
    v = run_check(src, alone, "strict")
    assert (v.decision, v.rule, v.line) == ("deny", rule, line), v.message


def test_the_imports_are_reported_whatever_rules_the_profile_has(
    shipped: dict[str, Profile],
) -> None:
    # The executor picks a run's slot (light, heavy, pandas) from them: the default profile,
    # which has no rules, must see every form of import.
    src = code("""
        import json, os.path
        from collections import abc
        def f():
            import numpy as np
        m = __import__('pandas.core')
        import importlib
        n = importlib.import_module('scipy.stats')
        from . import local
    """)
    expected = frozenset({"json", "os", "collections", "numpy", "pandas", "importlib", "scipy"})
    for profiles, profile in ((shipped, "data"), (strict(shipped), "strict")):
        assert run_check(src, profiles, profile).imports == expected


def test_the_node_walk_finds_every_node_ast_walk_finds() -> None:
    # The analysis walks the tree with `tree_nodes`, which skips fields by their declared type: a
    # node it missed would be a rule that never fires. The standard library's own sources
    # cover the grammar; the snippet adds what they may lack.
    snippet = code("""
        match p:
            case {"k": [a, *rest], **kw} if g(a):
                pass
            case Point(x=0) | None:
                pass
        d = {**base, "k": f"{v!r:>{w}}"}
        async def h(x: int = (y := 3), *a, k=lambda q=os.system: q, **kw) -> t[int]:
            async with m() as n, o:
                await z
            global G
            del d[1:2:3]
        @deco(x)
        class C(B, metaclass=M): ...
        try:
            pass
        except* E as e:
            raise X from e
    """)
    stdlib = Path(ast.__file__).parent
    sources = [snippet] + [
        (stdlib / name).read_text(encoding="utf-8")
        for name in (
            "ast.py",
            "dataclasses.py",
            "typing.py",
            "asyncio/base_events.py",
            "email/_header_value_parser.py",
            "test/test_patma.py",
            "test/test_grammar.py",
        )
        if (stdlib / name).exists()
    ]
    assert len(sources) >= 5
    singletons = (ast.expr_context, ast.operator, ast.boolop, ast.unaryop, ast.cmpop)
    for source in sources:
        tree = ast.parse(source)
        walked = [n for n in ast.walk(tree) if not isinstance(n, singletons)]
        found = [n for n in tree_nodes(tree) if n is not None]
        assert {id(n) for n in found} == {id(n) for n in walked}
        assert len(found) == len(walked)  # each once
        position = {id(n): i for i, n in enumerate(found)}
        for node in found:  # parents before their children
            assert all(
                position[id(child)] > position[id(node)]
                for child in ast.iter_child_nodes(node)
                if id(child) in position
            )


def test_a_profile_with_no_rules_about_the_code_does_not_parse_it(
    shipped: dict[str, Profile], monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[str] = []
    real_parse = ast.parse

    def counting_parse(source: str, *args: Any, **kwargs: Any) -> ast.Module:
        parsed.append(source)
        module: ast.Module = real_parse(source, *args, **kwargs)
        return module

    monkeypatch.setattr(ast, "parse", counting_parse)
    src = "import numpy as np\nfrom pandas import DataFrame\n"
    v = run_check(src, shipped, "data")
    assert (v.decision, v.rule, v.imports) == ("allow", None, frozenset({"numpy", "pandas"}))
    v = run_check("import json\nx = (\n", shipped, "data")  # not parsed: no code.syntax
    assert (v.decision, v.rule, v.imports) == ("allow", None, frozenset({"json"}))
    assert parsed == []
    # Any one rule about the code, and the code is parsed again.
    for rule in (
        {"imports_deny": ["ctypes"]},
        {"imports_approval": ["ctypes"]},
        {"imports_allow": ["numpy", "pandas"]},
        {"calls_deny": ["os.system"]},
        {"calls_approval": ["os.system"]},
        {"writes_outside_workspace": "deny"},
    ):
        only = {**shipped["data"].model_dump(), "name": "only", "languages": ["python"], **rule}
        profiles = {"only": Profile.model_validate(only)}
        parsed.clear()
        v = run_check(src, profiles, "only")
        assert parsed == [src], rule
        assert v.imports == frozenset({"numpy", "pandas"})
        assert run_check("import json\nx = (\n", profiles, "only").rule == "code.syntax"


@pytest.mark.parametrize(
    ("src", "expected"),
    [
        ("import json, os.path as p,  collections.abc\n", {"json", "os", "collections"}),
        ("x = 1; import numpy\nif x: from scipy.stats import norm\n", {"numpy", "scipy"}),
        ("from matplotlib import (\n    pyplot,\n    colors)\n", {"matplotlib"}),
        ("from os \\\n    import path\nimport json, \\\r\n  csv\n", {"os", "json", "csv"}),
        ("from  a_from_b.x\timport c\n", {"a_from_b"}),
        ("def f():\n    import numpy.linalg as la\n    return la\n", {"numpy"}),
        ("m = __import__('pandas.core')\nn = __import__( \"re\" )\n", {"pandas", "re"}),
        ("import importlib\nimportlib.import_module('scipy.stats')\n", {"importlib", "scipy"}),
        ('from importlib import import_module\nimport_module("zlib")\n', {"importlib", "zlib"}),
        ("from ｎｕｍｐｙ import array\n", {"numpy"}),  # NFKC, as the parser normalizes it
        ("from . import a\nfrom .b import c\nimport_module('.d')\n", set()),
        ("important = 1\nreimport(x)\nx.import_all()\nimports = [y_import]\n", set()),
        ("name = 'x'\n__import__(name)\nimport_module(name)\n", set()),
        ("import", set()),
        ("print('import numpy')  # a string: counted, at worst a bigger interpreter\n", {"numpy"}),
    ],
)
def test_the_scan_reads_each_form_of_import(src: str, expected: set[str]) -> None:
    assert scan_imports(src) == expected


def test_the_scan_finds_every_import_the_syntax_tree_finds(shipped: dict[str, Profile]) -> None:
    # The default profile picks a run's slot from the scan instead of the syntax tree: an
    # import it missed would run numpy code in a light program, importing numpy there. The
    # standard library's own sources are the ordinary code; the tree's analysis runs under a
    # profile with one rule about the code (writes), which denies none of them.
    reading = {
        "r": Profile.model_validate(
            {
                **shipped["data"].model_dump(),
                "name": "r",
                "writes_outside_workspace": "deny",
                "languages": ["python"],
            }
        )
    }
    stdlib = Path(ast.__file__).parent
    files = sorted(stdlib.glob("*.py")) + sorted(stdlib.glob("test/test_import*/*.py"))
    compared = 0
    for path in files:
        source = path.read_text(encoding="utf-8", errors="replace")
        seen = run_check(source, reading, "r").imports
        if seen is None:  # does not parse (the standard library's deliberately bad files)
            continue
        compared += 1
        assert seen <= scan_imports(source), (path.name, sorted(seen - scan_imports(source)))
    assert compared >= 150


def test_import_of_a_submodule_counts_as_its_top_level_module(shipped: dict[str, Profile]) -> None:
    profiles = strict(shipped, imports_deny=["os"])
    v = run_check("import json\nimport os.path\n", profiles, "strict")
    assert (v.decision, v.rule, v.line) == ("deny", "import.deny", 2)
    v = run_check("from os.path import join\n", profiles, "strict")
    assert (v.decision, v.rule, v.line) == ("deny", "import.deny", 1)


@pytest.mark.parametrize(
    "src",
    [
        "from . import subprocess\n",
        "from .subprocess import run\nrun()\n",
        "from .. import ctypes\n",
        "import importlib\nname = 'ctypes'\nimportlib.import_module(name)\n",
        "import importlib\nimportlib.import_module('.ctypes', 'pkg')\n",
        "import os\nprint(os.path.join('a', 'b'))\n",
        "import os\nos.getpid()\n",
        "import subprocess_helpers\n",
        "system = print\nsystem('x')\n",
        "import os\ngetattr(os, name)('ls')\n",
        "import os\nx = os\nx = x.path\nx.join('a')\n",
        "import sys\nprint(sys.platform)\n",
    ],
)
def test_relative_computed_and_unrelated_names_are_not_flagged(
    shipped: dict[str, Profile], src: str
) -> None:
    v = run_check(src, strict(shipped), "strict")
    assert v.decision == "allow", v.message


def test_wildcard_call_rules_match_and_are_named_in_the_message(
    shipped: dict[str, Profile],
) -> None:
    profiles = strict(shipped, imports_deny=[])
    v = run_check("import subprocess as sp\n\n\nsp.check_output(['ls'])\n", profiles, "strict")
    assert (v.decision, v.rule, v.line) == ("deny", "call.deny", 4)
    assert v.message is not None
    assert "subprocess.check_output" in v.message and "'subprocess.*'" in v.message
    assert "choose profile 'data'" in v.message


def test_the_earliest_denial_in_the_code_is_reported(shipped: dict[str, Profile]) -> None:
    v = run_check("import os\nos.system('a')\nimport ctypes\n", strict(shipped), "strict")
    assert (v.rule, v.line) == ("call.deny", 2)


def test_deep_expressions_do_not_break_the_analysis(shipped: dict[str, Profile]) -> None:
    chain = "x = " + " + ".join(["1"] * 900) + "\nimport subprocess\n"
    v = run_check(chain, strict(shipped), "strict")
    assert (v.rule, v.line) == ("import.deny", 2)
    paths = "from pathlib import Path\n(Path('/etc')" + " / 'a'" * 500 + ").write_text('x')\n"
    # Past the analysis depth the path is unknown: best effort, allowed, and no crash.
    assert run_check(paths, strict(shipped), "strict").decision == "allow"


# -- writes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "src,line",
    [
        ("open('/etc/x', 'w')\n", 1),
        ("x = 1\nopen('/etc/x', mode='a')\n", 2),
        ("path = '/etc/cron.d/job'\nwith open(path, 'w') as fh:\n    fh.write('x')\n", 2),
        ("open('../etc/passwd', 'r+')\n", 1),
        ("open(file='/usr/lib/x', mode='xb')\n", 1),
        ("import io\nio.open('/root/x', 'w')\n", 2),
        ("import pathlib\npathlib.Path('/x').write_text('hi')\n", 2),
        ("from pathlib import Path\nPath('/etc', 'x').write_bytes(b'hi')\n", 2),
        ("from pathlib import Path\n(Path('/etc') / 'x').touch()\n", 2),
        ("from pathlib import Path\np = Path('/opt/x')\n\np.write_text('hi')\n", 4),
        ("from pathlib import Path\nPath('/srv/x').open('w')\n", 2),
        ("from pathlib import Path\nPath('a.txt').rename('/etc/a.txt')\n", 2),
        ("import os\nos.mkdir('/data')\n", 2),
        ("import os\nos.remove(b'/etc/passwd')\n", 2),
        ("import os\nos.mknod('/etc/f')\n", 2),
        ("import os\nos.utime('/etc/x')\n", 2),
        ("import os\nos.setxattr('/etc/x', 'user.a', b'1')\n", 2),
        ("import os\nos.open('/etc/x', 577)\n", 2),
        ("import os\nos.open('/etc/x', os.O_RDONLY | 64)\n", 2),
        ("import logging\nlogging.FileHandler('/etc/log')\n", 2),
        ("import logging\nlogging.basicConfig(filename='/etc/log')\n", 2),
        ("import os\nos.chdir('/etc')\nopen('x', 'w')\n", 2),
    ],
)
def test_constant_writes_outside_the_workspace_are_denied_when_the_profile_says_so(
    shipped: dict[str, Profile], src: str, line: int
) -> None:
    v = run_check(src, strict(shipped), "strict")
    assert (v.decision, v.rule, v.line) == ("deny", "write.outside_workspace", line)
    assert v.message is not None and "/workspace" in v.message
    assert "choose profile 'data'" in v.message
    assert (
        run_check(src, strict(shipped, writes_outside_workspace="allow"), "strict").decision
        == "allow"
    )
    alone = strict(shipped, imports_deny=[], calls_deny=[])  # the write rule alone still fires
    v = run_check(src, alone, "strict")
    assert (v.decision, v.rule, v.line) == ("deny", "write.outside_workspace", line)


@pytest.mark.parametrize(
    "src",
    [
        "open('out.txt', 'w')\n",
        "open('/workspace/out.txt', 'a')\n",
        "open('/tmp/x', 'w')\n",
        "open('/dev/shm/x', 'wb')\n",
        "open('/dev/null', 'w')\n",
        "open('/etc/hosts')\n",
        "open('/etc/hosts', 'rb')\n",
        "open(name, 'w')\n",
        "open('/etc/x', mode)\n",
        "print('/etc/x'.replace('x', 'y'))\n",
        "p = '/etc/x'\np = 'ok.txt'\nopen(p, 'w')\n",
        "from pathlib import Path\nPath('/etc/hosts').read_text()\n",
        "from pathlib import Path\nPath('/etc/hosts').open()\n",
        "from pathlib import Path\nPath(base).write_text('x')\n",
        "import os\nos.mkdir('plots')\n",
        "import os\nos.open('/etc/hosts', 0)\n",
        "import os\nos.chdir('/tmp')\n",
        "import logging\nlogging.basicConfig(level=10)\n",
        "import logging\nlogging.FileHandler('run.log')\n",
    ],
)
def test_reads_workspace_writes_and_unknown_paths_are_not_flagged(
    shipped: dict[str, Profile], src: str
) -> None:
    v = run_check(src, strict(shipped), "strict")
    assert v.decision == "allow", v.message


# -- needs approval ---------------------------------------------------------------------------


def approval(shipped: dict[str, Profile]) -> dict[str, Profile]:
    return strict(
        shipped, imports_approval=["requests"], calls_approval=["os.kill", "builtins.eval"]
    )


def test_an_approval_import_holds_the_run_with_rule_and_line(shipped: dict[str, Profile]) -> None:
    v = run_check("import json\nimport requests\n", approval(shipped), "strict")
    assert (v.decision, v.rule, v.line) == ("needs_approval", "import.approval", 2)
    assert v.message is not None
    assert "'requests'" in v.message and "held" in v.message and "'data'" in v.message


def test_an_approval_call_holds_the_run(shipped: dict[str, Profile]) -> None:
    v = run_check("import os\n\nos.kill(1, 9)\n", approval(shipped), "strict")
    assert (v.decision, v.rule, v.line) == ("needs_approval", "call.approval", 3)
    v = run_check("x = eval('1 + 1')\n", approval(shipped), "strict")
    assert (v.decision, v.rule, v.line) == ("needs_approval", "call.approval", 1)
    alone = strict(
        shipped,
        imports_deny=[],
        calls_deny=[],
        writes_outside_workspace="allow",
        calls_approval=["os.kill"],
    )  # the only rule the profile has
    v = run_check("import os\n\nos.kill(1, 9)\n", alone, "strict")
    assert (v.decision, v.rule, v.line) == ("needs_approval", "call.approval", 3)


def test_a_deny_anywhere_wins_over_an_earlier_approval(shipped: dict[str, Profile]) -> None:
    v = run_check("import requests\nimport os\nos.system('x')\n", approval(shipped), "strict")
    assert (v.decision, v.rule, v.line) == ("deny", "call.deny", 3)


def test_deny_beats_approval_for_the_same_name(shipped: dict[str, Profile]) -> None:
    profiles = strict(shipped, imports_approval=["ctypes"], calls_approval=["os.system"])
    assert run_check("import ctypes\n", profiles, "strict").rule == "import.deny"
    assert run_check("import os\nos.system('x')\n", profiles, "strict").rule == "call.deny"


# -- code and input caps ----------------------------------------------------------------------


def test_code_over_the_size_cap_is_denied_and_a_larger_profile_suggested(
    shipped: dict[str, Profile],
) -> None:
    src = "x = 1\n" * (64 * 1024 // 6 + 1)
    v = run_check(src, shipped, "minimal")
    assert (v.decision, v.rule, v.line) == ("deny", "code.size", None)
    assert v.message is not None and "choose profile 'data'" in v.message
    assert run_check(src, shipped, "data").decision == "allow"


def test_code_size_counts_utf8_bytes(shipped: dict[str, Profile]) -> None:
    src = "s = '" + "é" * (33 * 1024) + "'\n"  # under 64 Ki characters, over 64 KiB
    assert run_check(src, shipped, "minimal").rule == "code.size"


def test_too_many_input_files_are_denied(shipped: dict[str, Profile]) -> None:
    files = [InputFile(name=f"f{i}.txt", data=b"x") for i in range(17)]
    v = run_check("print(1)\n", shipped, "minimal", files=files)
    assert (v.decision, v.rule) == ("deny", "input.files")
    assert v.message is not None and "17" in v.message and "choose profile 'data'" in v.message
    assert run_check("print(1)\n", shipped, "minimal", files=files[:16]).decision == "allow"


def test_input_bytes_count_files_and_stdin(shipped: dict[str, Profile]) -> None:
    files = [InputFile(name="a.bin", data=b"\0" * (4 * MIB))]
    ok = run_check("print(1)\n", shipped, "minimal", files=files, stdin=b"\0" * (4 * MIB))
    assert ok.decision == "allow"
    v = run_check("print(1)\n", shipped, "minimal", files=files, stdin=b"\0" * (4 * MIB + 1))
    assert (v.decision, v.rule, v.line) == ("deny", "input.bytes", None)
    assert v.message is not None and "8.0 MiB" in v.message


def test_csv_rows_are_capped_per_csv_file_only(shipped: dict[str, Profile]) -> None:
    rows = b"a,b\n" + b"1,2\n" * 100_000  # header + 100,000 rows = 100,001 lines
    v = run_check("print(1)\n", shipped, "minimal", files=[InputFile(name="d/big.CSV", data=rows)])
    assert (v.decision, v.rule) == ("deny", "input.csv_rows")
    assert v.message is not None and "'d/big.CSV'" in v.message and "100001" in v.message
    assert "choose profile 'data'" in v.message
    other = [InputFile(name="big.txt", data=rows)]
    assert run_check("print(1)\n", shipped, "minimal", files=other).decision == "allow"


def test_a_last_csv_line_without_newline_is_counted(shipped: dict[str, Profile]) -> None:
    exact = b"1\n" * 99_999 + b"1"  # 100,000 lines: at the cap
    files = [InputFile(name="x.csv", data=exact)]
    assert run_check("print(1)\n", shipped, "minimal", files=files).decision == "allow"
    files = [InputFile(name="x.csv", data=exact + b"\n1")]
    assert run_check("print(1)\n", shipped, "minimal", files=files).rule == "input.csv_rows"


# -- limits -----------------------------------------------------------------------------------


def test_a_request_without_limits_gets_the_profile_defaults(shipped: dict[str, Profile]) -> None:
    v = run_check("print(1)\n", shipped, "minimal")
    assert v.limits == shipped["minimal"].limits
    assert (v.limits.timeout_s, v.limits.pids) == (2, 16)


def test_explicit_limit_fields_override_only_those_defaults(shipped: dict[str, Profile]) -> None:
    v = run_check("print(1)\n", shipped, "minimal", limits=Limits(timeout_s=5))
    # timeout_s=5 equals the contract default: it still counts because the request set it.
    assert (v.limits.timeout_s, v.limits.memory_mib, v.limits.pids) == (5, 256, 16)
    v = check(
        RunRequest.model_validate(
            {"code": "", "profile": "extended", "limits": {"memory_mib": 4096}}
        ),
        shipped,
    )
    assert (v.limits.timeout_s, v.limits.memory_mib) == (60, 4096)


def test_asking_for_more_than_the_profile_maximum_is_denied(shipped: dict[str, Profile]) -> None:
    v = run_check("print(1)\n", shipped, "data", limits=Limits(timeout_s=120))
    assert (v.decision, v.rule, v.line) == ("deny", "limits.max", None)
    assert v.message is not None
    assert "timeout_s = 120" in v.message and "60" in v.message
    assert "choose profile 'extended'" in v.message
    assert v.limits.timeout_s == 120  # what was asked, for the record
    v = run_check("print(1)\n", shipped, "minimal", limits=Limits(memory_mib=1024))
    assert v.rule == "limits.max" and v.message is not None and "'data'" in v.message


def test_the_maximum_itself_is_allowed(shipped: dict[str, Profile]) -> None:
    v = run_check("print(1)\n", shipped, "data", limits=Limits(timeout_s=60, memory_mib=2048))
    assert v.decision == "allow"


def test_cpu_time_is_checked_as_enforced(shipped: dict[str, Profile]) -> None:
    data = shipped["data"]
    capped = {
        "strict": data.model_copy(
            update={"max_limits": data.max_limits.model_copy(update={"cpu_s": 10.0})}
        ),
        **shipped,
    }
    over = run_check("", capped, "strict", limits=Limits(cpu_s=20))
    assert (over.rule, over.limits.cpu_s) == ("limits.max", 20)
    # A longer timeout alone is not a request for more CPU time: CPU follows up to the cap.
    v = run_check("", capped, "strict", limits=Limits(timeout_s=30))
    assert v.decision == "allow"
    assert (v.limits.timeout_s, v.limits.effective_cpu_s) == (30, 10)


def test_every_limit_over_its_maximum_is_denied_by_name(shipped: dict[str, Profile]) -> None:
    """The comparison of each request's limits with its profile's maximums names each field
    over it, the first in the contract's order, cpu_s as enforced (timeout_s when null)."""
    data = shipped["data"]
    cap = data.max_limits
    checked = []
    for field in Limits.model_fields:
        most = cap.effective_cpu_s if field == "cpu_s" else getattr(cap, field)
        try:
            asked = Limits(**{field: most + 1})
        except ValidationError:  # the profile's maximum is the contract's
            continue
        checked.append(field)
        over = run_check("", shipped, "data", limits=asked)
        assert (over.decision, over.rule) == ("deny", "limits.max"), field
        assert over.message is not None and over.message.startswith(f"limits.{field} = "), field
        at = run_check("", shipped, "data", limits=Limits(**{field: most}))
        assert at.decision == "allow", field
    assert len(checked) >= 8, checked
    both = run_check("", shipped, "data", limits=Limits(pids=cap.pids + 1, timeout_s=3000))
    assert both.message is not None and both.message.startswith("limits.timeout_s = ")
    # cpu_s follows a timeout asked for explicitly, and is compared as enforced.
    capped = {
        "strict": data.model_copy(update={"max_limits": cap.model_copy(update={"cpu_s": 5.0})})
    }
    over = run_check("", capped, "strict", limits=Limits(timeout_s=30, cpu_s=None))
    assert over.message is not None and over.message.startswith("limits.cpu_s = 30 "), over


def test_a_request_without_limits_gets_the_profiles_defaults_themselves(
    shipped: dict[str, Profile],
) -> None:
    """Most requests set no limit: they get the profile's (frozen) defaults as they are, not
    a copy rebuilt for every request; a default CPU time over the maximum is still capped."""
    for name, profile in shipped.items():
        assert run_check("print(1)\n", shipped, name).limits is profile.limits, name
    data = shipped["data"]
    tight = data.model_copy(
        update={"max_limits": data.max_limits.model_copy(update={"cpu_s": 1.0})}
    )
    v = run_check("print(1)\n", {"tight": tight}, "tight")
    assert v.decision == "allow" and v.limits.effective_cpu_s == 1.0


def test_unknown_profile_is_a_usage_error_listing_the_known_ones(
    shipped: dict[str, Profile],
) -> None:
    with pytest.raises(UsageError, match="'nope'.*'minimal', 'data', 'extended'"):
        run_check("print(1)\n", shipped, "nope")


# -- syntax errors ----------------------------------------------------------------------------


def test_code_that_does_not_parse_is_allowed_for_the_sandbox_to_report(
    shipped: dict[str, Profile],
) -> None:
    v = run_check("import subprocess\nx = (\n", shipped, "minimal")
    assert (v.decision, v.rule) == ("allow", "code.syntax")
    assert v.limits == shipped["minimal"].limits
    v = run_check("x = 1\ndef f(:\n    pass\n", shipped, "minimal")
    assert (v.decision, v.rule, v.line) == ("allow", "code.syntax", 2)
    assert run_check("print(1)\x00\n", shipped, "minimal").decision == "allow"


def test_code_too_deep_to_compile_is_allowed_for_the_sandbox_to_report(
    shipped: dict[str, Profile],
) -> None:
    v = run_check("x = " + "+".join(["1"] * 20_000) + "\n", shipped, "minimal")
    assert (v.decision, v.rule) == ("allow", "code.syntax")


# -- loading ----------------------------------------------------------------------------------

GOOD = """
[profiles.tiny]
description = "test"
max_code_bytes = 100
max_input_bytes = 100
max_input_files = 1
max_csv_rows = 10
imports_deny = ["json"]
[profiles.tiny.limits]
timeout_s = 1
[profiles.tiny.max_limits]
timeout_s = 2
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "profiles.toml"
    path.write_text(text)
    return path


def test_a_profiles_file_loads_with_defaults_for_lists_and_limits(tmp_path: Path) -> None:
    profiles = load_profiles(write(tmp_path, GOOD))
    tiny = profiles["tiny"]
    assert list(profiles) == ["tiny"]
    assert (tiny.name, tiny.imports_allow, tiny.calls_deny) == ("tiny", None, [])
    assert tiny.writes_outside_workspace == "deny"
    assert (tiny.limits.timeout_s, tiny.limits.memory_mib) == (1, 512)
    v = check(RunRequest(code="import json\n", profile="tiny"), profiles)
    assert (v.rule, v.line) == ("import.deny", 1)
    assert v.message is not None and "remove the import" in v.message


def test_env_variable_names_the_profiles_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXECBOX_PROFILES", str(write(tmp_path, GOOD)))
    assert list(load_profiles()) == ["tiny"]
    shipped = resources.files("execbox").joinpath("profiles.toml")
    assert "minimal" in load_profiles(Path(str(shipped)))  # an explicit path wins


def test_env_variable_naming_a_missing_file_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXECBOX_PROFILES", str(tmp_path / "missing.toml"))
    with pytest.raises(UsageError, match="missing.toml.*EXECBOX_PROFILES"):
        load_profiles()


@pytest.mark.parametrize(
    "text,expected",
    [
        ("[profiles.tiny\n", r"not valid TOML.*line 1"),
        ("[other]\nx = 1\n", r"unknown top-level keys \['other'\]"),
        ("x = 1\n", r"unknown top-level keys"),
        ("", r"defines no profiles"),
        ("profiles = 3\n", r"defines no profiles"),
        ("[profiles]\ntiny = 3\n", r"profile 'tiny' must be a table"),
        (
            GOOD.replace("timeout_s = 1", "timeout_s = -1"),
            r"profile 'tiny': limits\.timeout_s: Input should be greater than 0",
        ),
        (
            GOOD.replace("max_csv_rows = 10", "max_csv_row = 10"),
            r"profile 'tiny': .*max_csv_row: Extra inputs are not permitted",
        ),
        (
            GOOD.replace('description = "test"\n', ""),
            r"profile 'tiny': description: Field required",
        ),
        (
            GOOD.replace("timeout_s = 2", "timeout_s = 0.5"),
            r"profile 'tiny': limits\.timeout_s = 1 is over max_limits\.timeout_s = 0\.5",
        ),
        (
            GOOD.replace('["json"]', '["os.path"]'),
            r"profile 'tiny': imports_deny: 'os.path' is not a top-level module name \(use 'os'\)",
        ),
        # A key written after a sub-table lands in it: the error says where it went.
        (
            GOOD + 'calls_deny = ["os.system"]\n',
            r"profile 'tiny': max_limits\.calls_deny: Extra inputs are not permitted",
        ),
        (
            GOOD.replace(
                'description = "test"', 'description = "test"\nwrites_outside_workspace = "no"'
            ),
            r"profile 'tiny': writes_outside_workspace",
        ),
        (
            GOOD.replace('description = "test"', 'description = "test"\nname = "other"'),
            r"profile 'tiny' has name = 'other'",
        ),
    ],
)
def test_a_bad_profiles_file_is_a_usage_error_naming_profile_and_field(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(UsageError, match=expected) as info:
        load_profiles(path)
    assert str(path) in str(info.value)


def test_calls_patterns_are_validated(tmp_path: Path) -> None:
    text = GOOD.replace('imports_deny = ["json"]', 'calls_deny = ["os system"]')
    with pytest.raises(UsageError, match=r"profile 'tiny': calls_deny: 'os system' is not"):
        load_profiles(write(tmp_path, text))


def test_attribute_patterns_are_validated_and_loaded(tmp_path: Path) -> None:
    text = GOOD.replace('imports_deny = ["json"]', 'attributes_deny = ["os.__dict__"]')
    with pytest.raises(UsageError, match=r"attributes_deny: 'os.__dict__' is not an attribute"):
        load_profiles(write(tmp_path, text))
    text = GOOD.replace('imports_deny = ["json"]', 'attributes_deny = ["f_*"]')
    profiles = load_profiles(write(tmp_path, text))
    v = run_check("import sys\nsys._getframe().f_back\n", profiles, "tiny")
    assert (v.decision, v.rule, v.line) == ("deny", "attribute.deny", 2)
    assert v.message is not None and "(rule 'f_*')" in v.message


def test_a_call_rule_covers_the_attributes_of_what_it_names(shipped: dict[str, Profile]) -> None:
    profiles = strict(shipped, calls_deny=["sys.modules"])
    v = run_check("import sys\n\nsys.modules.keys()\n", profiles, "strict")
    assert (v.decision, v.rule, v.line) == ("deny", "call.deny", 3)
    assert v.message is not None and v.message.startswith("using sys.modules is denied")
    assert (
        run_check("import sys\nsys.modules_x = 1\nsys.path\n", profiles, "strict").decision
        == "allow"
    )


def test_a_missing_profiles_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read profiles file"):
        load_profiles(tmp_path / "nope.toml")


def test_a_non_utf8_profiles_file_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "profiles.toml"
    path.write_bytes(b"# \xff\n")
    with pytest.raises(UsageError, match="not UTF-8"):
        load_profiles(path)
