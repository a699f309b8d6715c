"""What a profile's rules see of JavaScript code: the modules it requires or imports, found in
its syntax tree by a real parser, never by reading its text with patterns.

The parser is acorn, which Node itself ships (as `internal/deps/acorn`, reached with
`--expose-internals`): the same parser Node's own tools use, pinned with the Node the image
digest records. It runs in a child `node` with an empty environment, a heap cap and a timeout;
it only parses (acorn builds a tree, it never evaluates), the code arrives on its stdin.

Found: `require('x')`, `import ... from 'x'`, `import('x')`, `export ... from 'x'` (a module
`node:x` or `x/sub` counts as `x`), and what a check of names cannot follow: `require` or
`import()` of a computed name, `require` used as a value, `process.binding`,
`process._linkedBinding`, `process.dlopen` and `module.constructor` (Node's loader).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass

from ..errors import SandboxUnavailable

PARSE_TIMEOUT_S = 10.0
PARSE_HEAP_MIB = 256

# Reads the code on stdin, prints {"modules": [[name, line], ...], "dynamic": [[what, line]],
# "error": null | [message, line]}. Script first (CommonJS, as the runner compiles it), then
# module (ESM syntax).
_SCRIPT = r"""
const acorn = require('internal/deps/acorn/acorn/dist/acorn');
const walk = require('internal/deps/acorn/acorn-walk/dist/walk');
const code = require('fs').readFileSync(0, 'utf8');
const options = { ecmaVersion: 'latest', allowHashBang: true, locations: true,
  allowReturnOutsideFunction: true, allowAwaitOutsideFunction: true };
let tree;
try {
  tree = acorn.parse(code, { ...options, sourceType: 'script' });
} catch (scriptError) {
  try {
    tree = acorn.parse(code, { ...options, sourceType: 'module' });
  } catch (e) {
    const line = scriptError.loc ? scriptError.loc.line : null;
    process.stdout.write(JSON.stringify({ modules: [], dynamic: [], error: [scriptError.message, line] }));
    process.exit(0);
  }
}
const modules = [], dynamic = [];
const literal = (node) => node && node.type === 'Literal' && typeof node.value === 'string' ? node.value
  : node && node.type === 'TemplateLiteral' && node.expressions.length === 0 ? node.quasis[0].value.cooked : null;
const source = (node, what) => {
  const name = literal(node);
  if (name === null) dynamic.push([what + ' of a computed name', node.loc.start.line]);
  else modules.push([name, node.loc.start.line]);
};
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
      }
      break;
    case 'MemberExpression': {
      const name = member(node);
      if (isName(node.object, 'process') && ['binding', '_linkedBinding', 'dlopen'].includes(name))
        dynamic.push(['process.' + name, node.loc.start.line]);
      else if (isName(node.object, 'module') && name === 'constructor')
        dynamic.push(['module.constructor', node.loc.start.line]);
      else if (node.computed && literal(node.property) === null && isName(node.object, 'process'))
        dynamic.push(['process[...] with a computed name', node.loc.start.line]);
      break;
    }
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


def analyse(code: str, node: str) -> JsAnalysis:
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
