// Inside the jail: a JavaScript session's interpreter, the counterpart of kernel.py for Node.
// Appended to runner.js (one `-e` script): a staged Node whose request says `session` serves
// cells here instead of running code once, with kernel.py's protocol (cells.py is the other
// end): HELO once ready, then for each cell frame read from the go pipe the cell runs, its
// last expression's value becomes a text/plain output, the host's marker ends its output on
// stdout and stderr, and OUTP and CRES frames go to the report pipe.
//
// Cells run in Node's main context, as the `node` REPL's do (a separate vm context would give
// the code other Array and Error constructors than Node's modules return): a cell is a
// classic script, so its top-level `let`, `const` and `class` persist in the context's script
// scope for the next cells. A cell with a top-level `await` is rewritten as Node's REPL does
// (from acorn's tree): its declarations are hoisted into a script of their own and become
// assignments in an async function whose promise the cell awaits.
// SIGINT (the supervisor's interrupt: a cell past its time or output) stops a synchronous cell
// (breakOnSigint) or ends the wait for an asynchronous one; between cells it is ignored.
//
// This process runs the user's code: everything it reports is untrusted, and the supervisor
// and host treat it so (sizes capped, the cell's id echoed, limits enforced outside).

const CELL_FRAME = 'CELL';
const MAX_OUTPUTS = 1000; // kernel.MAX_OUTPUTS
const MIN_OUTPUT_BYTES = 1 << 20; // kernel.MIN_OUTPUT_BYTES
const MAX_MESSAGE = 16 * 1024; // kernel.MAX_MESSAGE

// Taken before any cell runs: a cell can replace what the modules export, not these.
const writeSync = fs.writeSync;
const inspect = util.inspect;
const Script = vm.Script;

function sessionFrame(kind, payload) {
  const header = Buffer.alloc(FRAME_HEADER);
  header.write(kind, 0, 'latin1');
  header.writeBigUInt64BE(BigInt(payload.length), 4);
  return Buffer.concat([header, payload]);
}

function writeAll(fd, data) {
  let at = 0;
  while (at < data.length) {
    try {
      at += writeSync(fd, data, at, data.length - at);
    } catch (err) {
      if (err.code !== 'EAGAIN' && err.code !== 'EINTR') throw err;
    }
  }
}

function sendReport(kind, payload) {
  writeAll(errFd, sessionFrame(kind, Buffer.isBuffer(payload) ? payload : Buffer.from(payload)));
}

// stdout and stderr written straight to their descriptors: an interrupt stops a cell between
// two statements, and one inside a stream's own write would leave the stream waiting for a
// write that never ends, holding back all later cells' output.
function writeDirectly(stream, fd) {
  stream.write = function write(chunk, encoding, callback) {
    if (typeof encoding === 'function') [callback, encoding] = [encoding, undefined];
    let error = null;
    try {
      writeAll(fd, typeof chunk === 'string' ? Buffer.from(chunk, encoding || 'utf8') : chunk);
    } catch (err) {
      error = err;
    }
    if (typeof callback === 'function') process.nextTick(callback, error);
    return error === null;
  };
}

// Node's own acorn, compiled once on the first cell that needs it (see modulePosition).
let acornParser = null;
function acorn() {
  if (acornParser === null) {
    const source = binding('natives')['internal/deps/acorn/acorn/dist/acorn'];
    const exports = {};
    compileFunction(source, ['exports', 'module'], { filename: 'acorn' })(exports, { exports });
    acornParser = exports;
  }
  return acornParser;
}

function parseCell(code) {
  return acorn().parse(code, {
    ecmaVersion: 'latest',
    sourceType: 'script',
    allowAwaitOutsideFunction: true,
    locations: true,
  });
}

const FUNCTIONS = ['FunctionDeclaration', 'FunctionExpression', 'ArrowFunctionExpression'];

// Whether `node` has an `await` (or `for await`) outside any function of its own.
function hasTopLevelAwait(node) {
  if (node === null || typeof node !== 'object') return false;
  if (Array.isArray(node)) return node.some(hasTopLevelAwait);
  if (typeof node.type !== 'string' || FUNCTIONS.includes(node.type)) return false;
  if (node.type === 'AwaitExpression' || (node.type === 'ForOfStatement' && node.await)) return true;
  return Object.keys(node).some((key) => key !== 'loc' && hasTopLevelAwait(node[key]));
}

// The names a declaration binds (identifiers of its patterns).
function boundNames(pattern, names) {
  if (pattern === null) return names;
  switch (pattern.type) {
    case 'Identifier':
      names.push(pattern.name);
      break;
    case 'ObjectPattern':
      for (const p of pattern.properties) boundNames(p.type === 'RestElement' ? p.argument : p.value, names);
      break;
    case 'ArrayPattern':
      for (const p of pattern.elements) if (p) boundNames(p, names);
      break;
    case 'RestElement':
      boundNames(pattern.argument, names);
      break;
    case 'AssignmentPattern':
      boundNames(pattern.left, names);
      break;
    default:
      break;
  }
  return names;
}

// A cell with a top-level await, as Node's REPL runs one: {hoisted, body, shifts}. `hoisted`
// declares the cell's top-level names (a script of its own: they persist as any cell's do);
// `body` is the cell inside an async arrow function whose head is on a line of its own (the
// script's lineOffset of -1 keeps the cell's line numbers), with each declaration turned into
// an assignment and the last expression returned; `shifts` are the columns inserted per line,
// taken off the columns an error reports.
function rewriteAwait(code, tree) {
  const hoisted = [];
  const functions = [];
  const edits = []; // [offset, text to insert, characters replaced]
  const statements = tree.body;
  statements.forEach((stmt, i) => {
    if (stmt.type === 'VariableDeclaration') {
      const names = stmt.declarations.flatMap((d) => boundNames(d.id, []));
      if (names.length) hoisted.push(`${stmt.kind === 'var' ? 'var' : 'let'} ${names.join(', ')};`);
      // `let ` becomes `;( `: the same width, so the line's columns stay; `;` against ASI.
      edits.push([stmt.start, ';(' + ' '.repeat(stmt.kind.length - 2), stmt.kind.length]);
      edits.push([stmt.declarations[stmt.declarations.length - 1].end, ')', 0]);
    } else if (stmt.type === 'FunctionDeclaration') {
      functions.push(stmt.id.name); // hoisted in the function, published at its start
    } else if (stmt.type === 'ClassDeclaration') {
      hoisted.push(`let ${stmt.id.name};`);
      edits.push([stmt.start, `;${stmt.id.name} = `, 0]);
      edits.push([stmt.end, ';', 0]);
    } else if (stmt.type === 'ExpressionStatement' && i === statements.length - 1) {
      edits.push([stmt.expression.start, ';return (', 0]);
      edits.push([stmt.expression.end, ')', 0]);
    }
  });
  const lineOf = (offset) => {
    let line = 1;
    let start = 0;
    for (let i = 0; i < offset; i++) {
      if (code.charCodeAt(i) === 10) {
        line += 1;
        start = i + 1;
      }
    }
    return [line, offset - start];
  };
  const shifts = [];
  let body = code;
  for (const [offset, text, replaced] of edits.sort((a, b) => b[0] - a[0])) {
    body = body.slice(0, offset) + text + body.slice(offset + replaced);
    if (text.length !== replaced) {
      const [line, column] = lineOf(offset);
      shifts.push([line, column, text.length - replaced]);
    }
  }
  const publish = functions.map((name) => `globalThis[${JSON.stringify(name)}] = ${name};`).join(' ');
  return {
    hoisted: hoisted.join(' '),
    body: `(async () => { ${publish}\n${body}\n})()`,
    shifts,
  };
}

class Outputs {
  constructor(cap) {
    this.cap = cap;
    this.reset();
  }

  reset() {
    this.items = [];
    this.used = 0;
    this.truncated = false;
  }

  add(mime, text) {
    const data = Buffer.from(text, 'utf8');
    if (this.used + data.length > this.cap || this.items.length >= MAX_OUTPUTS) {
      this.truncated = true;
      return;
    }
    this.used += data.length;
    this.items.push([mime, data]);
  }

  send() {
    for (const [mime, data] of this.items) {
      sendReport('OUTP', Buffer.concat([Buffer.from(mime), Buffer.from([0]), data]));
    }
  }
}

class Interrupted extends Error {}

function cellPosition(stack, shifts) {
  const header = /^cell-(\d+)\.js:(\d+)\n(.*)\n( *)\^/.exec(stack);
  if (header) return [Number(header[2]), header[4].length + 1];
  const frame = /\(?cell-(\d+)\.js:(\d+):(\d+)\)?$/m.exec(stack);
  if (!frame) return [null, null];
  const line = Number(frame[2]);
  let column = Number(frame[3]);
  const own = shifts.get(Number(frame[1])) || [];
  column -= own.filter(([l, c]) => l === line && c < column - 1).reduce((n, s) => n + s[2], 0);
  return [line, column];
}

function cellError(value, shifts) {
  if (value instanceof Interrupted) {
    return { type: 'Interrupted', message: 'the cell was interrupted', line: null, column: null, traceback: null };
  }
  const isObject = value !== null && (typeof value === 'object' || typeof value === 'function');
  let stack = isObject ? safe(() => value.stack, null) : null;
  if (typeof stack !== 'string') stack = null;
  let message = isObject ? safe(() => value.message, null) : null;
  if (typeof message !== 'string') message = safe(() => inspect(value), '<uninspectable>');
  let type = typeOf(value);
  if (type === 'RangeError' && message === 'Array buffer allocation failed') type = 'MemoryError';
  const text = stack || `Uncaught ${safe(() => inspect(value), '<uninspectable>')}`;
  const [line, column] = cellPosition(text, shifts);
  if (message.length > MAX_MESSAGE) message = message.slice(0, MAX_MESSAGE) + CUT_TAIL;
  return { type, message, line, column, traceback: keepTail(text + '\n') };
}

// A syntax error acorn found in the cell, shown as V8 shows one: the line and a caret.
function syntaxError(err, code, n) {
  const { line, column } = err.loc;
  const source = code.split(/\r\n|[\n\r\u2028\u2029]/)[line - 1] || '';
  const message = String(err.message).replace(/ \(\d+:\d+\)$/, '');
  const traceback = `cell-${n}.js:${line}\n${source}\n${' '.repeat(column)}^\n\nSyntaxError: ${message}\n`;
  return { type: 'SyntaxError', message, line, column: column + 1, traceback };
}

function serveSession(go) {
  const outputs = new Outputs(Math.max(MIN_OUTPUT_BYTES, Number(go.spec.artifact_bytes) || 0));
  const shifts = new Map(); // cell number: the columns its rewrite inserted
  let count = 0;
  let running = null; // the running cell's interrupt, or null between cells

  // Between cells SIGINT does nothing; during an asynchronous cell it ends the cell's wait.
  process.on('SIGINT', () => {
    if (running !== null) running();
  });
  // An error no cell awaits (a timer's callback, a promise nobody handles) is shown, as the
  // REPL shows it; the session goes on.
  process.removeAllListeners('uncaughtException');
  process.on('uncaughtException', (err, origin) => {
    const prefix = origin === 'unhandledRejection' ? 'Unhandled promise rejection: ' : 'Uncaught ';
    const text = safe(() => (typeof err.stack === 'string' ? err.stack : inspect(err)), '<uninspectable>');
    safe(() => writeSync(2, `${prefix}${text}\n`), null);
  });
  writeDirectly(process.stdout, 1);
  writeDirectly(process.stderr, 2);
  const req = Module.createRequire(`${WORKSPACE}/session.js`);
  Object.assign(globalThis, { require: req, module: mod, exports: mod.exports, __dirname: WORKSPACE });

  function compile(source, filename, lineOffset = 0) {
    return new Script(source, { filename, lineOffset, importModuleDynamically: importOption });
  }

  // The cell's value, from its completion value or its async function's promise.
  async function evaluate(code, n) {
    const filename = `cell-${n}.js`;
    let script;
    try {
      script = compile(code, filename);
    } catch (err) {
      if (!(err instanceof SyntaxError)) throw err;
      let tree;
      try {
        tree = parseCell(code);
      } catch (parseError) {
        if (parseError && parseError.loc) throw { syntax: syntaxError(parseError, code, n) };
        throw err;
      }
      if (!hasTopLevelAwait(tree)) throw err;
      const rewritten = rewriteAwait(code, tree);
      shifts.set(n, rewritten.shifts);
      if (rewritten.hoisted) compile(rewritten.hoisted, filename).runInThisContext({ breakOnSigint: true });
      script = compile(rewritten.body, filename, -1);
    }
    const value = script.runInThisContext({ breakOnSigint: true, displayErrors: false });
    if (!shifts.has(n)) return value;
    return new Promise((resolve, reject) => {
      running = () => reject(new Interrupted());
      value.then(resolve, reject);
    });
  }

  async function runCell(cell) {
    const n = (count += 1);
    outputs.reset();
    let error = null;
    try {
      const value = await evaluate(cell.code, n);
      if (value !== undefined) outputs.add('text/plain', safe(() => inspect(value), '<uninspectable>'));
    } catch (err) {
      if (err && typeof err === 'object' && err.syntax && !(err instanceof Error)) {
        error = err.syntax;
      } else if (err instanceof Error && /^Script execution was interrupted by `SIGINT`/.test(err.message)) {
        error = cellError(new Interrupted(), shifts);
      } else {
        error = cellError(err, shifts);
      }
      if (error.traceback) safe(() => writeSync(2, error.traceback), null);
    }
    running = null;
    const markers = {};
    for (const [name, fd] of [['stdout', 1], ['stderr', 2]]) {
      markers[name] = safe(() => (writeSync(fd, cell.marker), true), false);
    }
    outputs.send();
    const report = { status: error ? 'error' : 'ok', error, outputs_truncated: outputs.truncated, cell: cell.cell, markers };
    sendReport('CRES', JSON.stringify(report));
  }

  // Cells arrive as frames on the go pipe, one at a time (the host waits for each result).
  const net = require('net');
  const cells = new net.Socket({ fd: goFd, readable: true, writable: false });
  let pending = Buffer.alloc(0);
  let busy = Promise.resolve();
  cells.on('data', (chunk) => {
    pending = Buffer.concat([pending, chunk]);
    while (pending.length >= FRAME_HEADER) {
      const size = Number(pending.readBigUInt64BE(4));
      if (pending.length < FRAME_HEADER + size) break;
      const kind = pending.toString('latin1', 0, 4);
      const payload = pending.subarray(FRAME_HEADER, FRAME_HEADER + size);
      pending = pending.subarray(FRAME_HEADER + size);
      if (kind !== CELL_FRAME) process.reallyExit(1); // off-protocol: the session ends
      const cell = JSON.parse(payload.toString('utf8'));
      busy = busy.then(() => runCell(cell)).catch(() => process.reallyExit(1));
    }
  });
  cells.on('end', () => process.reallyExit(0)); // the session was closed
  cells.on('error', () => process.reallyExit(1));
  sendReport('HELO', JSON.stringify({ pid: process.pid }));
}
