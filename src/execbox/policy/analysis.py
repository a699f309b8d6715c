"""The syntax-tree rules: imports, calls, attributes and writes, with names resolved statically."""

from __future__ import annotations

import ast
import os
from collections.abc import Callable
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from .names import SAME_MODULE, CellContext, NameResolver, argument, const_str
from .profiles import Decision, Profile
from .rules import WORKSPACE, Finding, call_rule, import_rule, is_outside, one_regex
from .walk import tree_nodes

if TYPE_CHECKING:
    from .checker import Checker

_OPEN_FUNCS = frozenset({"builtins.open", "io.open", "codecs.open", "io.FileIO"})
# os.open writes at its path when its flags name one of these.
_WRITE_FLAGS = frozenset({"os.O_WRONLY", "os.O_RDWR", "os.O_CREAT", "os.O_APPEND", "os.O_TRUNC"})
# The same flags as a number (`os.open(p, 577)`): their bits on Linux.
_WRITE_FLAG_BITS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
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
_ATTRIBUTE_FUNCS = frozenset({"builtins.getattr", "builtins.setattr", "builtins.delattr"})
_ATTRIBUTE_GETTERS = frozenset({"operator.attrgetter", "operator.methodcaller"})
_CONSTANT_GETTERS = frozenset({"builtins.getattr", "builtins.hasattr"})
# Modules that are attributes of another under a name of their own (posixpath as os.path).
_MODULE_ATTRIBUTES = frozenset({"os.path"})


class Analysis:
    """The syntax-tree rules: imports, calls, attributes and writes, checked over one module
    with import aliases, attribute chains and lookups resolved by `NameResolver`. Traversal is
    iterative (`tree_nodes`), so deep code cannot exhaust the stack.
    """

    def __init__(
        self, tree: ast.Module, checker: Checker, before: CellContext | None = None
    ) -> None:
        self.checker = checker
        self.profile = checker.profile
        self.key = checker.key
        self.findings: list[Finding] = []
        self.imports: set[str] = set()
        # Only the rules the profile has are looked for: with no call rules a name's uses are
        # not resolved, and with writes allowed no path is followed (the default profile has
        # neither, and those two were half of its check's time).
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
        nodes = tree_nodes(tree)
        self.resolver = NameResolver(nodes, self.profile, before, self.writes)
        self.inspect(nodes)

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
                        self.check_module_value(self.resolver.call_value(node, 0), node)
                    if (
                        len(node.args) >= 2
                        and const_str(node.args[1]) is not None
                        and (self.resolver.qualnames(node.func, 0) & _CONSTANT_GETTERS)
                    ):
                        # getattr(os, "path") is followed like os.path: not a module let go.
                        self.resolver.bound_values.add(id(node.args[0]))
            elif isinstance(node, ast.Attribute):
                if self.attributes:
                    self.check_attribute(node.attr, node)
                if not self.uses:
                    continue
                inner.add(id(node.value))
                if id(node) not in inner and isinstance(node.ctx, ast.Load):
                    self.check_use(self.resolver.qualnames(node, 0), node, id(node) in called)
            elif not self.uses:
                continue
            elif isinstance(node, ast.Name | ast.Subscript):  # `sys.modules["os"]` too
                if id(node) not in inner and isinstance(node.ctx, ast.Load):
                    self.check_use(self.resolver.qualnames(node, 0), node, id(node) in called)

    def inspect_call(self, call: ast.Call) -> None:
        module = self.resolver.imported_module(call, 0)
        if module is not None:
            self.check_import(module.split(".")[0], call)
        if self.attributes:
            self.check_attribute_call(call)
        if self.uses and call.args and isinstance(call.func, ast.Name | ast.Attribute):
            # getattr(os, "system") is a use of os.system even when never called directly.
            value = self.resolver.call_value(call, 0) if module is None else set()
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
        funcs = self.resolver.qualnames(call.func, 0)
        if funcs & _OPEN_FUNCS:
            mode = const_str(argument(call, 1, "mode"))
            target = argument(call, 0, "file") or argument(call, 0, "filename")
            if mode is not None and set(mode) & set("wax+") and target is not None:
                paths += self.constant_paths([target])
        if "os.open" in funcs:
            flags = argument(call, 1, "flags")
            named = set()
            bits = 0
            for node in tree_nodes(flags) if flags is not None else ():
                if isinstance(node, ast.Attribute | ast.Name):
                    named |= self.resolver.qualnames(node, 0)
                elif isinstance(node, ast.Constant) and type(node.value) is int:
                    bits |= node.value
            if named & _WRITE_FLAGS or bits & _WRITE_FLAG_BITS:
                paths += self.constant_paths([argument(call, 0, "path")])
        for func in funcs:
            positions = _WRITE_FUNCS.get(func, ())
            paths += self.constant_paths([argument(call, i, kw) for i, kw in positions])
        if isinstance(call.func, ast.Attribute) and call.func.attr in _PATH_WRITERS:
            receiver = self.resolver.path_of(call.func.value, 0)
            if receiver is not None and receiver[1]:  # a pathlib object, not str.replace
                method = call.func.attr
                mode = const_str(argument(call, 0, "mode")) if method == "open" else "w"
                if mode is not None and set(mode) & set("wax+"):
                    paths.append(receiver[0])
                if method in _PATH_MOVES:
                    paths += self.constant_paths([argument(call, 0, "target")])
        return paths

    def constant_paths(self, nodes: list[ast.expr | None]) -> list[str]:
        found = [self.resolver.path_of(node, 0) for node in nodes if node is not None]
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
            first = 0 if parts[0] not in self.resolver.imported and parts[0] != "builtins" else 1
            for part in parts[first:]:
                bare = part.lstrip("_")
                module = SAME_MODULE.get(part) or (
                    part
                    if part in self.resolver.modules
                    else bare
                    if bare in self.resolver.modules
                    else None
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
        funcs = self.resolver.qualnames(call.func, 0)
        named: list[ast.expr | None]
        if funcs & _ATTRIBUTE_FUNCS:
            named = [argument(call, 1, "name")]
        elif funcs & _ATTRIBUTE_GETTERS:
            named = list(call.args if "operator.attrgetter" in funcs else call.args[:1])
        else:
            return
        for node in named:
            name = const_str(node)
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
        if id(node) in self.resolver.bound_values:
            return  # `p = pathlib`: the name is followed (`name_targets`)
        for name in sorted(names):
            last = name.rsplit(".", 1)[-1]
            # `datetime.datetime` also reads as the module `datetime` reached along it; only a
            # name that is all there is stands for the module its import statement bound.
            imported = name in self.resolver.import_targets and not any(
                other.endswith("." + name) for other in names
            )
            if not (
                imported
                or name in _MODULE_ATTRIBUTES
                or last in self.resolver.rule_modules
                or last.lstrip("_") in self.resolver.rule_modules
                or last in SAME_MODULE
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
