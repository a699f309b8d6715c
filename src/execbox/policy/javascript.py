"""What a profile's rules see of JavaScript code: the modules it requires or imports, found in
its syntax tree by a real parser, never by reading its text with patterns.

The parser is acorn, which Node itself ships (as `internal/deps/acorn`, reached with
`--expose-internals`): the same parser Node's own tools use, pinned with the Node the image
digest records. It runs in a child `node` with an empty environment, a heap cap and a timeout;
it only parses (acorn builds a tree, it never evaluates), the code arrives on its stdin.

Found: `require('x')`, `import ... from 'x'`, `import('x')`, `export ... from 'x'` (a module
`node:x` or `x/sub` counts as `x`), and what a check of names cannot follow (`dynamic`): a
require or import of a computed name or of a file (its code is not read), `require`,
`process`, `module`, `globalThis` or `this` outside any function (a session's cell is a
script: its `this` is the global object) used as a value or indexed by a computed name, `eval` and
`Function`, and members that lead to Node's loader, native bindings or the Function
constructor on any object (`.binding`, `.dlopen`, `.getBuiltinModule`, `.require`,
`.constructor`, ...). What it cannot see: a computed member name on other objects
(`[][k]`, where k spells "constructor"); the sandbox is the boundary, as for Python.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from ..errors import SandboxUnavailable

# Environment variables that change what Node or the dynamic loader runs before the code
# (NODE_OPTIONS=--import=..., LD_PRELOAD=/workspace/x.so): a checked run may not set them.
STEERING_ENV = ("NODE_", "LD_")
PARSE_TIMEOUT_S = 10.0
PARSE_HEAP_MIB = 256
# Each parse is a host `node` (0.2-0.4 s of CPU) before admission: at most this many at once,
# and a repeated request's code is answered from the cache of recent analyses.
MAX_PARSES = 2
CACHE_SIZE = 256

# Reads the code on stdin, prints {"modules": [[name, line], ...], "dynamic": [[what, line]],
# "error": null | [message, line]}. First as the runner compiles it, the body of CommonJS's
# module function (so `return`, `new.target` and `arguments` mean what they mean to V8; the
# wrapper's head is on line 1, so lines are the code's), then as a module (ESM syntax).
_SCRIPT = r"""
const acorn = require('internal/deps/acorn/acorn/dist/acorn');
const walk = require('internal/deps/acorn/acorn-walk/dist/walk');
const BUILTINS = new Set(require('module').builtinModules);
const code = require('fs').readFileSync(0, 'utf8');
const options = { ecmaVersion: 'latest', locations: true };
const WRAPPED = '(function (exports, require, module, __filename, __dirname) {' + code + '\n})';
let tree;
try {
  // Its body only: the module function's own parameters are not the code's use of them.
  tree = acorn.parse(WRAPPED, { ...options, sourceType: 'script' }).body[0].expression.body;
} catch (scriptError) {
  try {
    tree = acorn.parse(code, { ...options, sourceType: 'module', allowHashBang: true });
  } catch (e) {
    const line = scriptError.loc ? scriptError.loc.line : null;
    process.stdout.write(JSON.stringify({ modules: [], dynamic: [], error: [String(scriptError.message).replace(/ \(\d+:\d+\)$/, ''), line] }));
    process.exit(0);
  }
}
const modules = [], dynamic = [];
const literal = (node) => node && node.type === 'Literal' && typeof node.value === 'string' ? node.value
  : node && node.type === 'TemplateLiteral' && node.expressions.length === 0 ? node.quasis[0].value.cooked : null;
const source = (node, what) => {
  const name = literal(node);
  const bare = name === null ? null : name.replace(/^node:/, '');
  if (name === null) dynamic.push([what + ' of a computed name', node.loc.start.line]);
  // A file, a package, a URL (data:, file:), an import map entry (#x): code the check
  // never reads. Only Node's own modules are named by what they are.
  else if (!BUILTINS.has(bare) && !BUILTINS.has(bare.split('/')[0]))
    dynamic.push([`${what} of ${JSON.stringify(name).slice(0, 80)}, not one of Node's own modules (its code is not checked)`, node.loc.start.line]);
  else modules.push([name, node.loc.start.line]);
};
const RISKY_MEMBERS = ['binding', '_linkedBinding', 'dlopen', 'getBuiltinModule', 'require',
  'mainModule', 'constructor', '_load', '__proto__'];
const GLOBALS = ['process', 'globalThis', 'global', 'module'];
// Nodes whose `this` is their own (a class field's or static block's is the class's).
const THIS_SCOPES = ['FunctionDeclaration', 'FunctionExpression', 'PropertyDefinition', 'StaticBlock'];
const isName = (node, name) => node && node.type === 'Identifier' && node.name === name;
const member = (node) => node.computed ? literal(node.property) : (node.property.name || null);
walk.fullAncestor(tree, (node, _state, ancestors) => {
  const parent = ancestors[ancestors.length - 2];
  switch (node.type) {
    case 'ImportDeclaration': case 'ExportAllDeclaration': case 'ExportNamedDeclaration':
      if (node.source) source(node.source, 'import');
      break;
    case 'ImportExpression':
      source(node.source, 'import()');
      break;
    case 'Identifier':
      if (node.name === 'require') {
        // A name acorn-walk visits is never a plain property key: any other use of `require`
        // than a call or require.resolve (a binding of that name too) hides what it loads.
        const called = parent && parent.type === 'CallExpression' && parent.callee === node;
        const resolve = parent && parent.type === 'MemberExpression' && parent.object === node && member(parent) === 'resolve';
        if (called) source(parent.arguments[0], 'require');
        else if (!resolve) dynamic.push(['require used as a value', node.loc.start.line]);
      } else if (node.name === 'arguments') {
        // Outside any function of the code's own, `arguments` is the module function's:
        // arguments[1] is require.
        const own = ancestors.filter((a) => a.type === 'FunctionDeclaration' || a.type === 'FunctionExpression');
        if (own.length === 0) dynamic.push(['the module function\'s arguments', node.loc.start.line]);
      } else if (node.name === 'eval' || node.name === 'Function') {
        dynamic.push([node.name + ' (code built from a string)', node.loc.start.line]);
      } else if (GLOBALS.includes(node.name)) {
        // Only as the object of a member access the rules below read: passed along, the
        // check cannot follow what is done with it.
        const read = parent && parent.type === 'MemberExpression' && parent.object === node;
        if (!read) dynamic.push([node.name + ' used as a value', node.loc.start.line]);
        else if (parent.computed && literal(parent.property) === null)
          dynamic.push([node.name + '[...] with a computed name', node.loc.start.line]);
      }
      break;
    case 'MemberExpression': {
      // Ways to Node's loader, native bindings and the Function constructor, on any object
      // (globalThis.process.binding, module.require, (() => {}).constructor).
      const name = member(node);
      if (RISKY_MEMBERS.includes(name)) dynamic.push(['.' + name, node.loc.start.line]);
      // globalThis.process is process: only read further, as the name itself.
      else if (GLOBALS.includes(name) && !(parent && parent.type === 'MemberExpression' && parent.object === node))
        dynamic.push(['.' + name + ' used as a value', node.loc.start.line]);
      break;
    }
    case 'ObjectPattern':
      // const {getBuiltinModule: g} = globalThis.process reads a member by a plain name too.
      for (const prop of node.properties) {
        const key = prop.type === 'Property' ? (prop.computed ? literal(prop.key) : prop.key.name || literal(prop.key)) : null;
        if (RISKY_MEMBERS.includes(key) || GLOBALS.includes(key))
          dynamic.push([`{${key}} taken apart`, node.loc.start.line]);
      }
      break;
    case 'ThisExpression': {
      // Outside any function, `this` is the global object in a session's cell (a script):
      // globalThis by another name, read only as it is.
      if (ancestors.some((a) => THIS_SCOPES.includes(a.type))) break;
      const read = parent && parent.type === 'MemberExpression' && parent.object === node;
      if (!read) dynamic.push(['this (outside a function) used as a value', node.loc.start.line]);
      else if (parent.computed && literal(parent.property) === null)
        dynamic.push(['this[...] with a computed name', node.loc.start.line]);
      break;
    }
    case 'WithStatement':
      // with (globalThis.process) binding(...): its names are members of an object unseen.
      dynamic.push(['with (names from an object)', node.loc.start.line]);
      break;
  }
});
process.stdout.write(JSON.stringify({ modules, dynamic, error: null }));
"""


@dataclass(frozen=True)
class JsAnalysis:
    """What the rules see: modules (top-level name, line), what they cannot follow (what,
    line), and the parser's error (message, line) for code that does not parse."""

    modules: list[tuple[str, int]]
    dynamic: list[tuple[str, int]]
    error: tuple[str, int | None] | None


def top_level(name: str) -> str:
    """`node:fs/promises` -> `fs`; `@scope/pkg/sub` -> `@scope/pkg`."""
    name = name.removeprefix("node:")
    parts = name.split("/")
    return "/".join(parts[:2]) if name.startswith("@") else parts[0]


_parses = threading.BoundedSemaphore(MAX_PARSES)
_cache: OrderedDict[tuple[str, str], JsAnalysis] = OrderedDict()
_cache_lock = threading.Lock()
# Whose check this is (`checking_for`): a tenant parses one code at a time, so its flood of
# new code leaves the other parse to the other tenants instead of queueing them behind it.
_checker: ContextVar[str | None] = ContextVar("javascript_checker", default=None)
_tenant_turns: dict[str, tuple[threading.Lock, int]] = {}


@contextmanager
def checking_for(tenant: str | None) -> Iterator[None]:
    """Checks in this context parse as `tenant`'s (None: no tenant, only the shared cap)."""
    token = _checker.set(tenant)
    try:
        yield
    finally:
        _checker.reset(token)


@contextmanager
def _tenant_turn() -> Iterator[None]:
    """Wait for the checking tenant's own parse to end (none without a tenant)."""
    tenant = _checker.get()
    if tenant is None:
        yield
        return
    with _cache_lock:
        lock, users = _tenant_turns.get(tenant, (threading.Lock(), 0))
        _tenant_turns[tenant] = (lock, users + 1)
    try:
        with lock:
            yield
    finally:
        with _cache_lock:
            lock, users = _tenant_turns[tenant]
            if users == 1:
                del _tenant_turns[tenant]
            else:
                _tenant_turns[tenant] = (lock, users - 1)


def analyse(code: str, node: str) -> JsAnalysis:
    """What acorn finds in `code`, from the cache or parsed by `parse`."""
    key = (hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest(), node)
    with _cache_lock:
        found = _cache.get(key)
        if found is not None:
            _cache.move_to_end(key)
            return found
    with _tenant_turn(), _parses:
        found = parse(code, node)
    with _cache_lock:
        _cache[key] = found
        if len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return found


def parse(code: str, node: str) -> JsAnalysis:
    """Parse `code` with acorn in a child `node`; SandboxUnavailable if that fails."""
    try:
        done = subprocess.run(
            [node, "--expose-internals", f"--max-old-space-size={PARSE_HEAP_MIB}", "-e", _SCRIPT],
            input=code.encode("utf-8", "surrogatepass"),
            capture_output=True,
            env={},
            timeout=PARSE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailable(f"parse JavaScript with node's acorn: {exc}") from exc
    if done.returncode != 0:
        raise SandboxUnavailable(
            "parse JavaScript with node's acorn: "
            + done.stderr.decode("utf-8", "replace").strip()[-500:]
        )
    data = json.loads(done.stdout)
    error = data["error"]
    return JsAnalysis(
        modules=[(top_level(str(n)), int(line)) for n, line in data["modules"]],
        dynamic=[(str(what), int(line)) for what, line in data["dynamic"]],
        error=(str(error[0]), error[1]) if error else None,
    )
