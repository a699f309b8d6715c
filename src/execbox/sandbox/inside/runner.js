// Inside the jail: run the user's JavaScript as the main module and report a structured error.
// Node runs this (with session.js after it) with `-e`, in one of two ways (process.argv):
//   <code fd> <error fd>: the code is in a memfd (a program exec'd Node for its request);
//   staged <go fd> <error fd> <done fd> <setup fd>: Node was started ahead of its request
//   (see staged.py); it says so on the done pipe and blocks reading the request from the go
//   pipe, then applies the request's environment and runs the code, or serves a session's
//   cells (session.js) when the request says `session`.
// The stack shown on stderr and in the result starts at the user's code.
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
const isUserFile = (name) => USER_FILES.includes(name) || /^cell-\d+\.js$/.test(name); // a session's
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

const STAGED = process.argv[1] === 'staged';
const [goFd, errFd, doneFd, setupFd] = STAGED
  ? process.argv.slice(2, 6).map(Number)
  : [-1, Number(process.argv[2]), -1, -1];
const codeFd = STAGED ? -1 : Number(process.argv[1]);
const PARKED = 'P'; // protocol.PARKED
const FRAME_HEADER = 12; // protocol.HEADER: a 4-byte kind and an 8-byte big-endian length
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
    if (isUserFile(safe(() => f.getFileName(), null))) last = i;
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

// Where acorn, the parser Node bundles, finds `code`'s syntax error as an ES module:
// [line, column, the line's text], or null. V8 keeps a module's syntax error position only
// in a private symbol (the arrow Node prints for a fatal error), which no JavaScript reads and
// `--expose-internals` would hand to the code too. Acorn's source is Node's own copy, read
// from the built-in sources and run in a function of its own, on this error path only: the
// code never ran, and nothing of the parser is left where later code could reach it.
// Taken before the code runs: code that ran (a module importing a broken one) may have
// replaced vm.compileFunction or process.binding, and must not have this path call it.
const compileFunction = vm.compileFunction;
const binding = process.binding;
function modulePosition(code) {
  return safe(() => {
    const source = binding('natives')['internal/deps/acorn/acorn/dist/acorn'];
    const exports = {};
    compileFunction(source, ['exports', 'module'], { filename: 'acorn' })(exports, { exports });
    const options = { ecmaVersion: 'latest', sourceType: 'module', allowHashBang: true, locations: true };
    try {
      exports.parse(code, options);
    } catch (err) {
      if (!err.loc) return null;
      const { line, column } = err.loc;
      return [line, column + 1, code.split(/\r\n|[\n\r\u2028\u2029]/)[line - 1] || ''];
    }
    return null;
  }, null);
}

function report(value, origin, code) {
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
  let [line, column] = position(value, text);
  let header = '';
  // The module's own syntax error (its compile failed before any frame of it ran): shown as
  // V8 shows a CommonJS one, its line with a caret under the column.
  if (origin === 'module' && line === null && type === 'SyntaxError' && value instanceof SyntaxError) {
    const found = modulePosition(code);
    if (found) {
      [line, column] = found;
      header = `${MODULE_URL}:${line}\n${found[2]}\n${' '.repeat(column - 1)}^\n\n`;
    }
  }
  const prefix = origin === 'unhandledRejection' ? 'Unhandled promise rejection: ' : '';
  const traceback = header + prefix + text + '\n';
  safe(() => fs.writeSync(2, traceback), null);
  safe(() => fs.writeSync(errFd, encoded({ type, message, line, column, traceback })), null);
}

process.on('uncaughtException', (err, origin) => {
  report(err, origin);
  process.exit(1);
});

// Set-up failed before any code ran: the supervisor reports it as the sandbox's error.
function setupFailed(why) {
  safe(() => fs.writeSync(setupFd, `program set-up: ${why}`), null);
  process.reallyExit(127);
}

// `n` bytes of `fd`, or fewer at its end; blocking, as the program has nothing else to do.
function readFull(fd, n) {
  const buf = Buffer.allocUnsafe(n);
  let at = 0;
  while (at < n) {
    let got;
    try {
      got = fs.readSync(fd, buf, at, n - at, null);
    } catch (err) {
      if (err.code === 'EINTR' || err.code === 'EAGAIN') continue;
      throw err;
    }
    if (got === 0) break;
    at += got;
  }
  return buf.subarray(0, at);
}

// A staged Node's request: it says it waits (PARKED), reads the whole request (a program
// that took its request leaves nothing in the pipe), and makes the request's environment
// the code's. Returns the request. A session's keeps the go pipe: its cells come there.
function awaitRequest() {
  fs.writeSync(doneFd, PARKED);
  const header = readFull(goFd, FRAME_HEADER);
  if (header.length === 0) process.reallyExit(0); // the slot was closed unused
  let go;
  try {
    if (header.length < FRAME_HEADER || header.toString('latin1', 0, 4) !== 'REQ ') {
      throw new Error('a request frame, not that');
    }
    const size = Number(header.readBigUInt64BE(4));
    const payload = readFull(goFd, size);
    if (payload.length !== size) throw new Error('the request ended early');
    go = JSON.parse(payload.toString('utf8'));
    const session = go.mode === 'session';
    if (!session && typeof go.code !== 'string') throw new Error('not a run');
    const env = go.spec.env || {};
    const threads = process.env.UV_THREADPOOL_SIZE;
    for (const name of Object.keys(process.env)) delete process.env[name];
    Object.assign(process.env, env);
    process.env.UV_THREADPOOL_SIZE = threads;
    if (session) {
      fs.closeSync(doneFd); // a session's interpreter reports no exit status of its own
    } else {
      fs.closeSync(goFd);
      reportExit(Buffer.from(String(go.token), 'latin1'));
    }
  } catch (err) {
    setupFailed(`staged node: ${safe(() => err.message, 'the request')}`);
  }
  fs.closeSync(setupFd);
  return go;
}

// Report the exit status on the done pipe once the 'exit' listeners have run, before Node
// tears down (milliseconds the caller need not wait for), as runner.py does: the token, then
// the status byte. Without the report (a signal, code that replaced process.emit) the status
// comes from the program's zygote, later.
// Output still queued in a stream (its pipe could not block) is left to Node's teardown.
function queuedOutput() {
  return safe(() => process.stdout.writableLength + process.stderr.writableLength, 1);
}

function reportExit(token) {
  const emit = process.emit;
  process.emit = function (event, ...args) {
    const result = emit.call(this, event, ...args);
    if (event === 'exit' && queuedOutput() === 0) {
      const status = Number(process.exitCode) || 0;
      for (const fd of [0, 1, 2]) safe(() => fs.closeSync(fd), null);
      safe(() => fs.writeSync(doneFd, Buffer.concat([token, Buffer.from([status & 0xff])])), null);
    }
    return result;
  };
}

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
// What every run's first steps would do lazily, done while a staged Node waits: compile and
// call a function as the code's is, format as console.log does, write (nothing) to stdout.
function warmUp() {
  vm.compileFunction('return 1', params, { filename: 'warm-up' })();
  for (const [stream, log] of [
    [process.stdout, console.log],
    [process.stderr, console.error],
  ]) {
    if (Object.hasOwn(stream, 'write')) continue;
    stream.write = () => true; // the stream's own method (its prototype's) comes back below
    log('%s %o', 1, { a: [1] });
    delete stream.write;
    stream.write('', () => {});
  }
  JSON.parse('{"code":"","spec":{"env":{}},"token":""}');
}

// Compile and run the code as the main module, or as an ES module when it uses their syntax.
function runCode(code) {
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
      report(err, 'module', code);
      process.exit(1);
    });
  }
}

if (STAGED) {
  warmUp();
  // The warm-up's write callbacks run in this first turn of the event loop; then Node blocks
  // for its request.
  setImmediate(() => {
    const go = awaitRequest();
    if (go.mode === 'session') serveSession(go);
    else runCode(go.code);
  });
} else {
  const code = fs.readFileSync(codeFd, 'utf8');
  fs.closeSync(codeFd);
  runCode(code);
}
