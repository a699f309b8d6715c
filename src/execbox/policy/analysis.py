"""The syntax-tree rules: imports, calls, attributes and writes, with names resolved statically."""

from __future__ import annotations

import ast
import builtins
import os
import posixpath
import sys
import threading
from collections.abc import Callable
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from .profiles import Decision, Profile
from .rules import WORKSPACE, Finding, call_rule, import_rule, is_outside, one_regex
from .walk import tree_nodes

if TYPE_CHECKING:
    from .checker import Checker

_BUILTINS = frozenset(dir(builtins))
_OPEN_FUNCS = frozenset({"builtins.open", "io.open", "codecs.open", "io.FileIO"})
# os.open writes at its path when its flags name one of these.
_WRITE_FLAGS = frozenset({"os.O_WRONLY", "os.O_RDWR", "os.O_CREAT", "os.O_APPEND", "os.O_TRUNC"})
# The same flags as a number (`os.open(p, 577)`): their bits on Linux.
_WRITE_FLAG_BITS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_PATH_TYPES = frozenset({"pathlib.Path", "pathlib.PosixPath"})
# pathlib methods that change the file system at the receiver's path. `open` depends on its mode;
# rename/replace also write at their first argument.
_PATH_WRITERS = frozenset(
    {
        "write_text",
        "write_bytes",
        "touch",
        "mkdir",
        "unlink",
        "rmdir",
        "rename",
        "replace",
        "symlink_to",
        "hardlink_to",
        "chmod",
        "open",
    }
)
_PATH_MOVES = frozenset({"rename", "replace"})
# Functions that change the file system at some of their arguments: (position, keyword) pairs.
_WRITE_FUNCS: dict[str, tuple[tuple[int, str], ...]] = {
    "os.mkdir": ((0, "path"),),
    "os.makedirs": ((0, "name"),),
    "os.remove": ((0, "path"),),
    "os.unlink": ((0, "path"),),
    "os.rmdir": ((0, "path"),),
    "os.removedirs": ((0, "name"),),
    "os.truncate": ((0, "path"),),
    "os.chmod": ((0, "path"),),
    "os.chown": ((0, "path"),),
    "os.mkfifo": ((0, "path"),),
    "os.mknod": ((0, "path"),),
    "os.utime": ((0, "path"),),
    "os.setxattr": ((0, "path"),),
    "os.removexattr": ((0, "path"),),
    "os.lchown": ((0, "path"),),
    "os.lchmod": ((0, "path"),),
    # A working directory outside makes every later relative write land outside.
    "os.chdir": ((0, "path"),),
    "logging.FileHandler": ((0, "filename"),),
    "logging.basicConfig": ((-1, "filename"),),
    "os.rename": ((0, "src"), (1, "dst")),
    "os.replace": ((0, "src"), (1, "dst")),
    "os.symlink": ((1, "dst"),),
    "os.link": ((1, "dst"),),
    "shutil.rmtree": ((0, "path"),),
    "shutil.copy": ((1, "dst"),),
    "shutil.copy2": ((1, "dst"),),
    "shutil.copyfile": ((1, "dst"),),
    "shutil.copytree": ((1, "dst"),),
    "shutil.move": ((0, "src"), (1, "dst")),
}
# Expressions nest: resolving `getattr(getattr(...))` or `Path(...) / "a" / "b" ...` is
# recursive, and code can nest far deeper than Python's stack. Past this depth the analysis
# gives up on that expression (best effort), it never crashes.
_MAX_DEPTH = 32


# A module reached as an attribute of another (`pathlib.os`, `random._os`, `logging.sys`) is
# that module: any attribute named like a known module, or so named after leading
# underscores, stands for it too. Some modules go by another name.
_KNOWN_MODULES = frozenset(sys.stdlib_module_names)
_SAME_MODULE = {"posix": "os", "nt": "os", "__builtins__": "builtins", "__builtin__": "builtins"}
# Names IPython adds to the builtins of a session (`get_ipython().system(...)` runs a shell).
_SESSION_BUILTINS = frozenset({"get_ipython"})
# Modules that lead to processes, native code or any other module. An attribute of any object
# named like one (`x._module.sys`) is taken for the module, whatever the object: the names of
# other modules are too common as plain attributes (`match.string`, `dt.time`) to be read so.
_GATEWAY_MODULES = frozenset(
    {
        "os",
        "sys",
        "builtins",
        "subprocess",
        "_posixsubprocess",
        "importlib",
        "ctypes",
        "multiprocessing",
        "socket",
        "pty",
    }
)
# What `globals()`, `locals()` and `vars()` return: the code's own namespace.
_NAMESPACE = "<namespace>"
# Calls that take a key and return an item: `sys.modules.get("os")` is `sys.modules["os"]`.
_ITEM_METHODS = frozenset({"get", "__getitem__", "setdefault", "pop"})
_ATTRIBUTE_FUNCS = frozenset({"builtins.getattr", "builtins.setattr", "builtins.delattr"})
_ATTRIBUTE_GETTERS = frozenset({"operator.attrgetter", "operator.methodcaller"})
_CONSTANT_GETTERS = frozenset({"builtins.getattr", "builtins.hasattr"})
# Modules that are attributes of another under a name of their own (posixpath as os.path).
_MODULE_ATTRIBUTES = frozenset({"os.path"})


class CellContext:
    """What the cells a session ran before bound, for checking the next one: `import os` in one
    cell and `os.system(...)` in the next is a use of os.system. Filled by `check` with each
    cell it lets run (or holds); one per session."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.aliases: dict[str, set[str]] = {}  # name -> the dotted names it may stand for
        self.star_modules: set[str] = set()
        self.import_targets: set[str] = set()
        self.imported: set[str] = set()

    def snapshot(self) -> CellContext:
        copy = CellContext()
        with self._lock:
            copy.aliases = {name: set(targets) for name, targets in self.aliases.items()}
            copy.star_modules = set(self.star_modules)
            copy.import_targets = set(self.import_targets)
            copy.imported = set(self.imported)
        return copy

    def add(self, analysis: Analysis) -> None:
        # Each name the cell bound, resolved now: what it stands for from then on, along with
        # what it stood for before (the cell may not have run the assignment).
        bound = {
            name: analysis.name_targets(name)
            for name in set(analysis.aliases) | set(analysis.values)
        }
        with self._lock:
            for name, targets in bound.items():
                self.aliases.setdefault(name, set()).update(targets)
            self.star_modules.update(analysis.star_modules)
            self.import_targets |= analysis.import_targets
            self.imported |= analysis.imported


class Analysis:
    """The syntax-tree rules: imports, calls and writes, with import aliases resolved.

    Name bindings are collected for the whole module at once, ignoring scopes and order: a name
    bound to a module anywhere resolves to it everywhere. That over-approximates (a deny can
    fire on a name that was rebound) but never misses a plain alias, which is the trade-off an
    early explanation wants. Traversal is iterative (`tree_nodes`), so deep code cannot exhaust the
    stack.
    """

    def __init__(
        self, tree: ast.Module, checker: Checker, before: CellContext | None = None
    ) -> None:
        self.checker = checker
        self.profile = checker.profile
        self.key = checker.key
        self.aliases: dict[str, set[str]] = before.aliases if before else {}
        self.values: dict[str, list[ast.expr]] = {}  # name -> the values assigned to it
        self.resolved: dict[str, set[str]] = {}
        self.resolving: set[str] = set()
        self.star_modules: list[str] = sorted(before.star_modules) if before else []
        # Top-level modules of import statements
        self.imported: set[str] = before.imported if before else set()
        self.path_names: dict[str, tuple[str, bool]] = {}
        self.findings: list[Finding] = []
        self.imports: set[str] = set()
        # Only the rules the profile has are looked for: with no call rules a name's uses are
        # not resolved, and with writes allowed no path is followed (the default profile has
        # neither: for HumanEval's programs the check took 0.41 ms, ~0.2 of it those).
        # A denied module reached through an attribute chain (`asyncio.subprocess`) breaks its
        # import rule, so those rules need the uses resolved too.
        self.module_rules = bool(self.profile.imports_deny or self.profile.imports_approval)
        self.module_values = self.profile.module_values == "deny"
        self.uses = bool(
            self.profile.calls_deny
            or self.profile.calls_approval
            or self.module_rules
            or self.module_values
        )
        self.attributes = bool(self.profile.attributes_deny)
        self.writes = self.profile.writes_outside_workspace == "deny"
        self.rule_modules = _rule_modules(self.profile)
        self.modules = _KNOWN_MODULES | self.rule_modules
        # What `import a.b as c` and `import a` bind
        self.import_targets: set[str] = before.import_targets if before else set()
        self.bound_values: set[int] = set()  # values assigned to a name the check follows
        nodes = tree_nodes(tree)
        self.bind_imports(nodes)
        self.bind_assignments(nodes)
        self.inspect(nodes)

    # -- bindings --------------------------------------------------------------------------

    def bind(self, name: str, target: str) -> None:
        self.aliases.setdefault(name, set()).add(target)

    def bind_imports(self, nodes: list[ast.AST]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.bind(alias.asname, alias.name)
                        self.import_targets.add(alias.name)
                    else:  # `import a.b` binds `a`
                        top = alias.name.split(".")[0]
                        self.bind(top, top)
                        self.import_targets.add(top)
                    self.imported.add(alias.name.split(".")[0])
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                self.imported.add(node.module.split(".")[0])
                for alias in node.names:
                    if alias.name == "*":
                        self.star_modules.append(node.module)
                    else:
                        self.bind(alias.asname or alias.name, f"{node.module}.{alias.name}")

    def bind_assignments(self, nodes: list[ast.AST]) -> None:
        stores: dict[str, int] = {}
        pairs: list[tuple[str, ast.expr]] = []  # (name, the value bound to it)
        for node in nodes:
            if self.writes and isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                stores[node.id] = stores.get(node.id, 0) + 1
            elif self.writes and isinstance(node, ast.arg):
                stores[node.arg] = stores.get(node.arg, 0) + 1
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    pairs += _bound_pairs(target, node.value)
            elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and node.value is not None:
                pairs += _bound_pairs(node.target, node.value)
        # `p = pathlib`, `m = sys.modules["os"]`, `s = __import__("os")`: the name stands for
        # what its values resolve to, resolved when the name is used (`name_targets`).
        for name, value in pairs:
            self.values.setdefault(name, []).append(value)
        # A name bound in a class body is also an attribute (`C.m`), which is not followed.
        in_classes = {
            id(statement.value)
            for node in nodes
            if isinstance(node, ast.ClassDef)
            for statement in node.body
            if isinstance(statement, ast.Assign | ast.AnnAssign)
        }
        self.bound_values = {id(value) for _, value in pairs} - in_classes
        if not self.writes:
            return
        for name, value in pairs:
            # A path constant is only trusted for a name bound exactly once: a rebound name
            # could hold anything at the write, and a wrong guess here would be a false deny.
            if stores.get(name) == 1:
                path = self.path_of(value, 0)
                if path is not None:
                    self.path_names[name] = path

    # -- resolution ------------------------------------------------------------------------

    def qualnames(self, node: ast.expr, depth: int) -> set[str]:
        """The dotted names `node` may stand for (`o.system` -> {'os.system'}); empty when the
        expression is not a plain (possibly aliased) module attribute."""
        attrs: list[str] = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        suffix = "".join("." + attr for attr in reversed(attrs))
        if isinstance(node, ast.Name):
            bases = self.name_targets(node.id, depth)
        elif isinstance(node, ast.Call) and depth < _MAX_DEPTH:
            bases = self.call_value(node, depth + 1)
        elif isinstance(node, ast.Subscript) and depth < _MAX_DEPTH:
            bases = self.item_value(node.value, _const_str(node.slice), depth + 1)
        elif isinstance(node, ast.NamedExpr) and depth < _MAX_DEPTH:  # `(m := os).system`
            bases = self.qualnames(node.value, depth + 1)
        else:
            bases = set()
        if not bases:  # an object the check cannot name: `x._module.sys.modules`
            return _gateway_names(list(reversed(attrs)))
        names = set()
        for base in bases:
            names |= self.reached(base + suffix)
        return names

    def reached(self, name: str) -> set[str]:
        """`name` and the names it has from each module reached along it: `pathlib.os.system`
        is also `os.system`, `random._os.fork` also `os.fork`, `posix.system` also
        `os.system`."""
        names = {name}
        parts = name.split(".")
        for i, part in enumerate(parts):
            module = _SAME_MODULE.get(part)
            if module is None and i > 0:
                bare = part.lstrip("_")
                module = part if part in self.modules else bare if bare in self.modules else None
            if module is not None:
                names.add(".".join([module, *parts[i + 1 :]]))
        return names

    def item_value(self, container: ast.expr, key: str | None, depth: int) -> set[str]:
        """What `container[key]` is, as dotted names, for a constant key of a namespace:
        `sys.modules["os"]`, `pathlib.__dict__["os"]`, `globals()["os"]`."""
        if key is None:
            return set()
        found: set[str] = set()
        for name in self.qualnames(container, depth):
            if name == "sys.modules":
                found.add(key)
            elif name.endswith(".__dict__"):
                found |= self.reached(f"{name.removesuffix('.__dict__')}.{key}")
            elif name == "builtins":  # __builtins__ is a dict outside the main module
                found.add(f"builtins.{key}")
            elif name == _NAMESPACE:
                found |= self.name_targets(key)
        return found

    def name_targets(self, name: str, depth: int = 0) -> set[str]:
        if name in self.resolved:
            return self.resolved[name]
        if name in self.values:
            if name in self.resolving or depth > _MAX_DEPTH:  # `x = x.y`: x is what else it is
                return set(self.aliases.get(name, ()))
            self.resolving.add(name)
            targets = set(self.aliases.get(name, ()))
            for value in self.values[name]:
                targets |= self.qualnames(value, depth + 1)
            self.resolving.discard(name)
            if not self.resolving:  # a result cut short by a cycle is not kept
                self.resolved[name] = targets
            return targets
        if name in self.aliases:
            return set(self.aliases[name])
        targets = {f"{module}.{name}" for module in self.star_modules}
        if name in _BUILTINS or name in _SESSION_BUILTINS:
            targets.add(f"builtins.{name}")
        elif name in ("__builtins__", "__builtin__"):  # the latter in IPython's namespace
            targets.add("builtins")
        return targets

    def call_value(self, call: ast.Call, depth: int) -> set[str]:
        """What a call evaluates to, as dotted names: a module for an import call, an attribute
        for getattr with a constant name."""
        module = self.imported_module(call, depth)
        if module is not None:
            return {module}
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr in _ITEM_METHODS and call.args:
            found = self.item_value(func.value, _const_str(call.args[0]), depth + 1)
            if found:
                return found
        funcs = self.qualnames(func, depth)
        if funcs & {"builtins.globals", "builtins.locals"} or (
            "builtins.vars" in funcs and not call.args
        ):
            return {_NAMESPACE}
        if "builtins.vars" in funcs and call.args:
            return {f"{base}.__dict__" for base in self.qualnames(call.args[0], depth + 1)}
        name = _const_str(call.args[1]) if len(call.args) >= 2 else None
        if name is not None and "builtins.getattr" in funcs:
            found = set()
            for base in self.qualnames(call.args[0], depth + 1):
                found |= self.reached(f"{base}.{name}")
            return found or _gateway_names([name])
        return set()

    def imported_module(self, call: ast.Call, depth: int) -> str | None:
        """The module `__import__("x")` / `importlib.import_module("x")` returns, for a
        constant absolute name."""
        module = _const_str(call.args[0]) if call.args else None
        if not module or module.startswith("."):
            return None
        funcs = self.qualnames(call.func, depth + 1)
        if "importlib.import_module" in funcs:
            return module
        if funcs & {"builtins.__import__", "importlib.__import__"}:
            # __import__("a.b") returns the package `a` unless a fromlist asks for `a.b`.
            wants_leaf = len(call.args) >= 4 or any(k.arg == "fromlist" for k in call.keywords)
            return module if wants_leaf else module.split(".")[0]
        return None

    def path_of(self, node: ast.expr, depth: int) -> tuple[str, bool] | None:
        """(constant path, whether it is a pathlib object) for a path expression, if known."""
        if depth > _MAX_DEPTH:
            return None
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            value = node.value
            return (os.fsdecode(value) if isinstance(value, bytes) else value), False
        if isinstance(node, ast.Name):
            return self.path_names.get(node.id)
        if isinstance(node, ast.Call) and self.qualnames(node.func, depth) & _PATH_TYPES:
            if node.keywords:
                return None
            parts = [self.path_of(arg, depth + 1) for arg in node.args]
            if any(part is None for part in parts):
                return None
            return posixpath.join(".", *(part[0] for part in parts if part)), True
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            left, right = self.path_of(node.left, depth + 1), self.path_of(node.right, depth + 1)
            if left is not None and right is not None and (left[1] or right[1]):
                return posixpath.join(left[0], right[0]), True
        return None

    # -- rules -----------------------------------------------------------------------------

    # Complex on purpose: one dispatch over the node kinds the rules read, in rule order.
    def inspect(self, nodes: list[ast.AST]) -> None:  # noqa: C901
        # ast.walk yields a parent before its children, so marking the inner parts of an
        # attribute chain (`os` and `os.path` inside `os.path.join`) before reaching them
        # makes only the whole chain count as a use.
        inner: set[int] = set()
        called: set[int] = set()
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self.check_import(alias.name.split(".")[0], node)
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0 and node.module:  # relative imports stay in the workspace
                    self.check_import(node.module.split(".")[0], node)
            elif isinstance(node, ast.Call):
                called.add(id(node.func))
                self.inspect_call(node)
                if self.module_values:
                    if id(node) not in inner:
                        self.check_module_value(self.call_value(node, 0), node)
                    if (
                        len(node.args) >= 2
                        and _const_str(node.args[1]) is not None
                        and (self.qualnames(node.func, 0) & _CONSTANT_GETTERS)
                    ):
                        # getattr(os, "path") is followed like os.path: not a module let go.
                        self.bound_values.add(id(node.args[0]))
            elif isinstance(node, ast.Attribute):
                if self.attributes:
                    self.check_attribute(node.attr, node)
                if not self.uses:
                    continue
                inner.add(id(node.value))
                if id(node) not in inner and isinstance(node.ctx, ast.Load):
                    self.check_use(self.qualnames(node, 0), node, id(node) in called)
            elif not self.uses:
                continue
            elif isinstance(node, ast.Name | ast.Subscript):  # `sys.modules["os"]` too
                if id(node) not in inner and isinstance(node.ctx, ast.Load):
                    self.check_use(self.qualnames(node, 0), node, id(node) in called)

    def inspect_call(self, call: ast.Call) -> None:
        module = self.imported_module(call, 0)
        if module is not None:
            self.check_import(module.split(".")[0], call)
        if self.attributes:
            self.check_attribute_call(call)
        if self.uses and call.args and isinstance(call.func, ast.Name | ast.Attribute):
            # getattr(os, "system") is a use of os.system even when never called directly.
            value = self.call_value(call, 0) if module is None else set()
            if value:  # as a value it is checked where it is not an attribute chain's head
                self.check_use(value, call, False, as_value=False)
        if self.writes:
            for path in self.written_paths(call):
                if is_outside(path):
                    self.add(
                        call,
                        "deny",
                        "write.outside_workspace",
                        (
                            f"writing to {path!r} is denied by profile {self.key!r}: code may write "
                            f"only under {WORKSPACE} (the working directory), /tmp and /dev/shm; "
                            + self.checker.advice(
                                lambda q: q.writes_outside_workspace == "allow",
                                "write to a relative path instead",
                            )
                        ),
                    )
                    return

    def written_paths(self, call: ast.Call) -> list[str]:
        """Constant paths this call writes at, as far as can be told without running it."""
        paths: list[str] = []
        funcs = self.qualnames(call.func, 0)
        if funcs & _OPEN_FUNCS:
            mode = _const_str(_argument(call, 1, "mode"))
            target = _argument(call, 0, "file") or _argument(call, 0, "filename")
            if mode is not None and set(mode) & set("wax+") and target is not None:
                paths += self.constant_paths([target])
        if "os.open" in funcs:
            flags = _argument(call, 1, "flags")
            named = set()
            bits = 0
            for node in tree_nodes(flags) if flags is not None else ():
                if isinstance(node, ast.Attribute | ast.Name):
                    named |= self.qualnames(node, 0)
                elif isinstance(node, ast.Constant) and type(node.value) is int:
                    bits |= node.value
            if named & _WRITE_FLAGS or bits & _WRITE_FLAG_BITS:
                paths += self.constant_paths([_argument(call, 0, "path")])
        for func in funcs:
            positions = _WRITE_FUNCS.get(func, ())
            paths += self.constant_paths([_argument(call, i, kw) for i, kw in positions])
        if isinstance(call.func, ast.Attribute) and call.func.attr in _PATH_WRITERS:
            receiver = self.path_of(call.func.value, 0)
            if receiver is not None and receiver[1]:  # a pathlib object, not str.replace
                method = call.func.attr
                mode = _const_str(_argument(call, 0, "mode")) if method == "open" else "w"
                if mode is not None and set(mode) & set("wax+"):
                    paths.append(receiver[0])
                if method in _PATH_MOVES:
                    paths += self.constant_paths([_argument(call, 0, "target")])
        return paths

    def constant_paths(self, nodes: list[ast.expr | None]) -> list[str]:
        found = [self.path_of(node, 0) for node in nodes if node is not None]
        return [path[0] for path in found if path is not None]

    def check_import(self, module: str, node: ast.stmt | ast.expr) -> None:
        self.imports.add(module)
        rule = import_rule(self.profile, module)
        if rule is None:
            return
        decision, rule_id = rule
        advice = self.checker.advice(lambda q: import_rule(q, module) is None, "remove the import")
        if rule_id == "import.deny":
            message = f"import of module {module!r} is denied by profile {self.key!r}; {advice}"
        elif rule_id == "import.not_allowed":
            message = (
                f"module {module!r} is not in the import allowlist of profile "
                f"{self.key!r}; {advice} (or add it to imports_allow)"
            )
        else:
            message = (
                f"import of module {module!r} needs approval under profile "
                f"{self.key!r}: the run is held until it is approved"
                + self.alternative(lambda q: import_rule(q, module) is None)
            )
        self.add(node, decision, rule_id, message)

    def check_use(
        self, names: set[str], node: ast.expr, is_call: bool, as_value: bool = True
    ) -> None:
        if not names:
            return
        if as_value and not is_call:
            if self.module_values:
                self.check_module_value(names, node)
            if self.attributes and names & (_ATTRIBUTE_FUNCS | _ATTRIBUTE_GETTERS):
                self.add(
                    node,
                    "deny",
                    "attribute.computed",
                    self.computed_message(
                        f"{min(names & (_ATTRIBUTE_FUNCS | _ATTRIBUTE_GETTERS))} passed as a value "
                        "gets attributes by names the check cannot see"
                    ),
                )
        if self.module_rules:
            self.check_reached_modules(names, node)
        rule = call_rule(self.profile, names)
        if rule is None:
            return
        decision, rule_id, name, pattern = rule
        what = f"calling {name}" if is_call and name in names else f"using {name}"
        matched = f" (rule {pattern!r})" if pattern != name else ""

        def accepts(q: Profile) -> bool:
            return call_rule(q, names) is None

        if decision == "deny":
            message = f"{what} is denied by profile {self.key!r}{matched}; " + self.checker.advice(
                accepts, "remove the call"
            )
        else:
            message = (
                f"{what} needs approval under profile {self.key!r}{matched}: the run is "
                "held until it is approved" + self.alternative(accepts)
            )
        self.add(node, decision, rule_id, message)

    def check_reached_modules(self, names: set[str], node: ast.expr) -> None:
        """A denied module reached as an attribute (`asyncio.subprocess`) is that module."""
        for name in sorted(names):
            parts = name.split(".")
            # The first part of a name is a module its import statement already answered
            # for, or one reached by a lookup (`sys.modules["ctypes"]`), which is checked here.
            first = 0 if parts[0] not in self.imported and parts[0] != "builtins" else 1
            for part in parts[first:]:
                bare = part.lstrip("_")
                module = _SAME_MODULE.get(part) or (
                    part if part in self.modules else bare if bare in self.modules else None
                )
                if module is None or module == "__future__":
                    continue
                rule = import_rule(self.profile, module)
                if rule is None or rule[1] == "import.not_allowed":
                    # The allowlist is about imports only: `sys.platform` and `os.stat` are
                    # not uses of the modules platform and stat.
                    continue
                self.add(node, rule[0], rule[1], self.reached_message(name, module, rule[0]))
                return

    def reached_message(self, name: str, module: str, decision: Decision) -> str:
        advice = self.checker.advice(lambda q: import_rule(q, module) is None, "remove it")
        verb = "is denied" if decision == "deny" else "needs approval"
        if name == module:
            return f"looking up module {module!r} {verb} under profile {self.key!r}; {advice}"
        return (
            f"{name} reaches module {module!r}, whose use {verb} under profile "
            f"{self.key!r}; {advice}"
        )

    def check_attribute(self, attr: str, node: ast.expr) -> None:
        patterns = self.profile.attributes_deny
        if not one_regex(tuple(patterns)).match(attr):
            return
        for pattern in patterns:
            if fnmatchcase(attr, pattern):
                matched = f" (rule {pattern!r})" if pattern != attr else ""
                self.add(
                    node,
                    "deny",
                    "attribute.deny",
                    (
                        f"attribute {attr!r} is denied by profile {self.key!r}{matched}: it leads "
                        "to an object's internals (globals, modules, frames, classes), which the "
                        "check cannot follow; "
                        + self.checker.advice(lambda q: not q.attributes_deny, "remove it")
                    ),
                )
                return

    def check_attribute_call(self, call: ast.Call) -> None:
        """getattr/setattr/delattr and operator.attrgetter/methodcaller name attributes too:
        each constant name is checked; a computed one could be any attribute."""
        funcs = self.qualnames(call.func, 0)
        named: list[ast.expr | None]
        if funcs & _ATTRIBUTE_FUNCS:
            named = [_argument(call, 1, "name")]
        elif funcs & _ATTRIBUTE_GETTERS:
            named = list(call.args if "operator.attrgetter" in funcs else call.args[:1])
        else:
            return
        for node in named:
            name = _const_str(node)
            if name is None and not isinstance(node, ast.Starred | None):
                self.add(
                    call,
                    "deny",
                    "attribute.computed",
                    self.computed_message("an attribute name computed at run time"),
                )
                return
            for attr in (name or "").split("."):
                self.check_attribute(attr, call)

    def computed_message(self, what: str) -> str:
        return (
            f"{what} is denied by profile {self.key!r}: it could name any attribute, "
            f"including those the profile denies ({', '.join(self.profile.attributes_deny)})"
            "; use a constant name instead, or "
            + self.checker.advice(lambda q: not q.attributes_deny, "remove it")
        )

    def check_module_value(self, names: set[str], node: ast.expr) -> None:
        """A module stored, passed or returned is out of the check's sight from then on."""
        if id(node) in self.bound_values:
            return  # `p = pathlib`: the name is followed (`name_targets`)
        for name in sorted(names):
            last = name.rsplit(".", 1)[-1]
            # `datetime.datetime` also reads as the module `datetime` reached along it; only a
            # name that is all there is stands for the module its import statement bound.
            imported = name in self.import_targets and not any(
                other.endswith("." + name) for other in names
            )
            if not (
                imported
                or name in _MODULE_ATTRIBUTES
                or last in self.rule_modules
                or last.lstrip("_") in self.rule_modules
                or last in _SAME_MODULE
            ):
                continue
            self.add(
                node,
                "deny",
                "module.value",
                (
                    f"module {name} used as a value (stored, passed or returned) is denied by "
                    f"profile {self.key!r}: the check follows a module only through its "
                    f"attributes; use {name}.<name> directly instead, or "
                    + self.checker.advice(lambda q: q.module_values == "allow", "remove it")
                ),
            )
            return

    def alternative(self, accepts: Callable[[Profile], bool]) -> str:
        for key, profile in self.checker.profiles.items():
            if key != self.key and accepts(profile):
                return f", or choose profile {key!r}, which allows it"
        return ""

    def add(self, node: ast.stmt | ast.expr, decision: Decision, rule: str, message: str) -> None:
        self.findings.append(Finding(node.lineno, node.col_offset, decision, rule, message))


def _gateway_names(attrs: list[str]) -> set[str]:
    """The names an attribute chain on an object the check cannot name has from each gateway
    module it reaches: `x._module.sys.modules` is `sys.modules` whatever `x` is."""
    names = set()
    for i, attr in enumerate(attrs):
        module = _SAME_MODULE.get(attr, attr.lstrip("_") or attr)
        if module in _GATEWAY_MODULES:
            names.add(".".join([module, *attrs[i + 1 :]]))
    return names


def _rule_modules(profile: Profile) -> frozenset[str]:
    """The top-level names the profile's import and call rules name (modules outside the
    standard library included)."""
    names = [
        *profile.imports_deny,
        *profile.imports_approval,
        *profile.calls_deny,
        *profile.calls_approval,
    ]
    return frozenset(name.split(".")[0] for name in names)


def _bound_pairs(target: ast.expr, value: ast.expr) -> list[tuple[str, ast.expr]]:
    """(name, value) for each name `target = value` binds to a value of its own: `a = x`,
    and `a, b = x, y` element by element."""
    if isinstance(target, ast.Name):
        return [(target.id, value)]
    if (
        isinstance(target, ast.Tuple | ast.List)
        and isinstance(value, ast.Tuple | ast.List)
        and len(target.elts) == len(value.elts)
    ):
        pairs = []
        for sub_target, sub_value in zip(target.elts, value.elts, strict=True):
            pairs += _bound_pairs(sub_target, sub_value)
        return pairs
    return []


def _const_str(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _argument(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
    """The argument at `position` (none when negative: keyword-only), or the keyword argument
    `keyword`, if given."""
    if 0 <= position < len(call.args) and not any(
        isinstance(a, ast.Starred) for a in call.args[: position + 1]
    ):
        return call.args[position]
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value
    return None
