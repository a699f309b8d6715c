// Inside the jail: run the user's JavaScript as the main module and report a structured error.
// Node runs this with `-e`; process.argv carries the descriptor of the code (a memfd) and of
// the error pipe. The stack shown on stderr and in the result starts at the user's code.
'use strict';

const fs = require('fs');
const Module = require('module');
const util = require('util');
const vm = require('vm');

const FILENAME = 'main.js';
// Code in ES module syntax runs as a module at this URL, its source handed to Node's loader
// by hooks (no file is written): its relative imports resolve in the workspace.
const MODULE_URL = 'file:///workspace/main.mjs';
const USER_FILES = [FILENAME, MODULE_URL];
// What V8 says of ES module syntax compiled as CommonJS (Node's own detection reads the same).
const MODULE_SYNTAX = [
  'Cannot use import statement outside a module',
  "Unexpected token 'export'",
  "Cannot use 'import.meta' outside a module",
  'await is only valid in async functions and the top level bodies of modules',
];
const WORKSPACE = '/workspace';
const MAX_TRACEBACK = 32 * 1024;
const MAX_RECORD = 60 * 1024; // below the pipe's 64 KiB, as runner.py: one write never blocks
const CUT_HEAD = '...\n';
const CUT_TAIL = ' …(truncated)';

const codeFd = Number(process.argv[1]);
const errFd = Number(process.argv[2]);
const code = fs.readFileSync(codeFd, 'utf8');
fs.closeSync(codeFd);
process.argv = [process.argv[0], FILENAME];

// Output to a pipe blocks, as Python's does: a loop that prints without yielding reaches the
// run's output cap, instead of queueing what it prints in its own memory until the memory
// limit or the timeout ends it with nothing shown.
for (const stream of [process.stdout, process.stderr]) {
  const handle = stream._handle;
  if (handle && typeof handle.setBlocking === 'function') handle.setBlocking(true);
}

function safe(fn, fallback) {
  try {
    return fn();
  } catch {
    return fallback;
  }
}

// Keep only the frames from the user's outermost one inwards, as runner.py keeps the
// traceback from the user's module down: the runner's own frames below it are noise.
Error.prepareStackTrace = (err, frames) => {
  let last = -1;
  frames.forEach((f, i) => {
    if (USER_FILES.includes(safe(() => f.getFileName(), null))) last = i;
  });
  // No frame of the user's (a syntax error, a rejection with no stack of its own): only
  // Node's frames that are not the runner's.
  const kept =
    last >= 0
      ? frames.slice(0, last + 1)
      : frames.filter((f) => !/^(node:|\[eval\])/.test(safe(() => f.getFileName(), '') || ''));
  const head = safe(() => Error.prototype.toString.call(err), 'Error');
  return head + kept.map((f) => `\n    at ${f}`).join('');
};

function typeOf(value) {
  if (value === null || (typeof value !== 'object' && typeof value !== 'function')) {
    return 'ThrownValue'; // `throw 1`: JavaScript throws any value, not only errors
  }
  const name = safe(() => value.constructor && value.constructor.name, null);
  if (typeof name === 'string' && name) return name;
  const own = safe(() => value.name, null);
  return typeof own === 'string' && own ? own : 'Error';
}

// The user's line and column: of a syntax error from the `file:line` header V8 puts first on
// its stack and the caret under it, else of the innermost frame in the user's file.
function position(value, stack) {
  const header = /^(?:main\.js|file:\/\/\/workspace\/main\.mjs):(\d+)\n(.*)\n( *)\^/.exec(stack);
  if (header) return [Number(header[1]), header[3].length + 1];
  const frame = /\(?(?:main\.js|file:\/\/\/workspace\/main\.mjs):(\d+):(\d+)\)?$/m.exec(stack);
  return frame ? [Number(frame[1]), Number(frame[2])] : [null, null];
}

function keepTail(text) {
  return text.length <= MAX_TRACEBACK ? text : CUT_HEAD + text.slice(-MAX_TRACEBACK);
}

function encoded(record) {
  record.traceback = keepTail(record.traceback);
  let data = Buffer.from(JSON.stringify(record));
  while (data.length > MAX_RECORD) {
    const key = ['type', 'message', 'traceback'].reduce((a, b) =>
      (record[a] || '').length >= (record[b] || '').length ? a : b,
    );
    const text = record[key] || '';
    record[key] = text.slice(0, Math.floor(text.length / 2)) + CUT_TAIL;
    data = Buffer.from(JSON.stringify(record));
  }
  return data;
}

function report(value, origin) {
  const isObject = value !== null && (typeof value === 'object' || typeof value === 'function');
  let stack = isObject ? safe(() => value.stack, null) : null;
  if (typeof stack !== 'string') stack = null;
  let message = isObject ? safe(() => value.message, null) : null;
  if (typeof message !== 'string') message = safe(() => util.inspect(value), '<uninspectable>');
  let type = typeOf(value);
  // What V8 throws when it cannot allocate a buffer's memory: the memory limit, as
  // Python's MemoryError (a buffer is reserved outside the heap the cgroup would OOM-kill).
  if (type === 'RangeError' && message === 'Array buffer allocation failed') type = 'MemoryError';
  const text =
    stack || `Uncaught ${safe(() => util.inspect(value), '<uninspectable>')}`;
  const [line, column] = position(value, text);
  const prefix = origin === 'unhandledRejection' ? 'Unhandled promise rejection: ' : '';
  const traceback = prefix + text + '\n';
  safe(() => fs.writeSync(2, traceback), null);
  safe(() => fs.writeSync(errFd, encoded({ type, message, line, column, traceback })), null);
}

process.on('uncaughtException', (err, origin) => {
  report(err, origin);
  process.exit(1);
});

const req = Module.createRequire(`${WORKSPACE}/${FILENAME}`);
const mod = new Module(FILENAME, null);
mod.filename = `${WORKSPACE}/${FILENAME}`;
mod.paths = Module._nodeModulePaths(WORKSPACE);
mod.require = req;
req.main = mod;
const params = ['exports', 'require', 'module', '__filename', '__dirname'];
// import() in CommonJS code, resolved as Node's own loader does (from /workspace). Node 20 says
// this option is experimental in a warning at each import(): that one warning is not the
// code's, and only it is dropped.
const importOption = vm.constants && vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER;
const emitWarning = process.emitWarning;
process.emitWarning = function (warning, ...rest) {
  if (String(warning).startsWith('vm.USE_MAIN_CONTEXT_DEFAULT_LOADER')) return undefined;
  return emitWarning.call(this, warning, ...rest);
};
let main;
try {
  main = vm.compileFunction(code, params, { filename: FILENAME, importModuleDynamically: importOption });
} catch (err) {
  const message = safe(() => err.message, '');
  if (!(err instanceof SyntaxError) || !MODULE_SYNTAX.some((m) => message.startsWith(m))) {
    report(err, 'compile');
    process.exit(1);
  }
}
if (main) {
  main.call(mod.exports, mod.exports, req, mod, FILENAME, '.');
} else {
  const hooks = `let code;
    export async function initialize(data) { code = data.code; }
    export async function resolve(specifier, context, next) {
      if (specifier === ${JSON.stringify(MODULE_URL)}) return { url: specifier, shortCircuit: true };
      return next(specifier, context);
    }
    export async function load(url, context, next) {
      if (url === ${JSON.stringify(MODULE_URL)}) return { format: 'module', source: code, shortCircuit: true };
      return next(url, context);
    }`;
  Module.register(`data:text/javascript,${encodeURIComponent(hooks)}`, { data: { code } });
  import(MODULE_URL).catch((err) => {
    report(err, 'module');
    process.exit(1);
  });
}
