"""Name resolution for the policy's syntax-tree rules: what each name, attribute chain, lookup and
path expression in the code stands for, resolved statically (nothing is evaluated)."""

from __future__ import annotations

import ast
import builtins
import os
import posixpath
import sys
import threading

from .profiles import Profile

__all__ = ["SAME_MODULE", "CellContext", "NameResolver", "argument", "const_str"]

_BUILTINS = frozenset(dir(builtins))
_PATH_TYPES = frozenset({"pathlib.Path", "pathlib.PosixPath"})
# Expressions nest: resolving `getattr(getattr(...))` or `Path(...) / "a" / "b" ...` is
# recursive, and code can nest far deeper than Python's stack. Past this depth the analysis
# gives up on that expression (best effort), it never crashes.
_MAX_DEPTH = 32


# A module reached as an attribute of another (`pathlib.os`, `random._os`, `logging.sys`) is
# that module: any attribute named like a known module, or so named after leading
# underscores, stands for it too. Some modules go by another name.
_KNOWN_MODULES = frozenset(sys.stdlib_module_names)
SAME_MODULE = {"posix": "os", "nt": "os", "__builtins__": "builtins", "__builtin__": "builtins"}
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

    def add(self, resolver: NameResolver) -> None:
        # Each name the cell bound, resolved now: what it stands for from then on, along with
        # what it stood for before (the cell may not have run the assignment).
        bound = {
            name: resolver.name_targets(name)
            for name in set(resolver.aliases) | set(resolver.values)
        }
        with self._lock:
            for name, targets in bound.items():
                self.aliases.setdefault(name, set()).update(targets)
            self.star_modules.update(resolver.star_modules)
            self.import_targets |= resolver.import_targets
            self.imported |= resolver.imported


class NameResolver:
    """The names a module binds and what its expressions stand for, as dotted names.

    Name bindings are collected for the whole module at once, ignoring scopes and order: a name
    bound to a module anywhere resolves to it everywhere. That over-approximates (a deny can
    fire on a name that was rebound) but never misses a plain alias, which is the trade-off an
    early explanation wants. With `writes`, names bound once to a constant path are followed.
    """

    def __init__(
        self, nodes: list[ast.AST], profile: Profile, before: CellContext | None, writes: bool
    ) -> None:
        self.writes = writes
        self.aliases: dict[str, set[str]] = before.aliases if before else {}
        self.values: dict[str, list[ast.expr]] = {}  # name -> the values assigned to it
        self.resolved: dict[str, set[str]] = {}
        self.resolving: set[str] = set()
        self.star_modules: list[str] = sorted(before.star_modules) if before else []
        # Top-level modules of import statements
        self.imported: set[str] = before.imported if before else set()
        self.path_names: dict[str, tuple[str, bool]] = {}
        self.rule_modules = _rule_modules(profile)
        self.modules = _KNOWN_MODULES | self.rule_modules
        # What `import a.b as c` and `import a` bind
        self.import_targets: set[str] = before.import_targets if before else set()
        self.bound_values: set[int] = set()  # values assigned to a name the check follows
        self.bind_imports(nodes)
        self.bind_assignments(nodes)

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
            bases = self.item_value(node.value, const_str(node.slice), depth + 1)
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
            module = SAME_MODULE.get(part)
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
            found = self.item_value(func.value, const_str(call.args[0]), depth + 1)
            if found:
                return found
        funcs = self.qualnames(func, depth)
        if funcs & {"builtins.globals", "builtins.locals"} or (
            "builtins.vars" in funcs and not call.args
        ):
            return {_NAMESPACE}
        if "builtins.vars" in funcs and call.args:
            return {f"{base}.__dict__" for base in self.qualnames(call.args[0], depth + 1)}
        name = const_str(call.args[1]) if len(call.args) >= 2 else None
        if name is not None and "builtins.getattr" in funcs:
            found = set()
            for base in self.qualnames(call.args[0], depth + 1):
                found |= self.reached(f"{base}.{name}")
            return found or _gateway_names([name])
        return set()

    def imported_module(self, call: ast.Call, depth: int) -> str | None:
        """The module `__import__("x")` / `importlib.import_module("x")` returns, for a
        constant absolute name."""
        module = const_str(call.args[0]) if call.args else None
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


def _gateway_names(attrs: list[str]) -> set[str]:
    """The names an attribute chain on an object the check cannot name has from each gateway
    module it reaches: `x._module.sys.modules` is `sys.modules` whatever `x` is."""
    names = set()
    for i, attr in enumerate(attrs):
        module = SAME_MODULE.get(attr, attr.lstrip("_") or attr)
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


def const_str(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def argument(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
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
