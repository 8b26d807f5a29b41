'use strict';
/**
 * A client for decide: one long-running `decide --ready` child (or the socket service), many calls.
 * Node.js 16+, no dependencies: copy this file into your project.
 *
 *   const { DecideClient, DecideError } = require('./decide_client');
 *   const client = await DecideClient.spawn('/opt/decide/decide', ['--model', '/opt/models/alarms']);
 *   const answer = await client.classify('Pump 3 is leaking oil');   // {label: 'leak', leaning, score, ...}
 *   const answers = await client.classifyMany(['...', '...']);       // pipelined, in order
 *   await client.close();
 *
 * Every call is a Promise; any number may be in flight at once, each answer matched to its request
 * by id. A timeout per call (the child keeps running; its late answer is dropped). A child that
 * dies fails the calls in flight with `connection_lost`; the next call restarts it, with backoff.
 * stderr is always read (its last lines go into error messages). Errors are DecideError with the
 * protocol's code (`empty_text`, `busy`, ...) or this client's: `timeout`, `start_failed`,
 * `connection_lost`, `protocol_error`, `closed`. docs/embedding.md says more.
 */
const childProcess = require('child_process');
const net = require('net');

const STDERR_LINES = 20;
const MAX_BACKOFF_MS = 5000;

class DecideError extends Error {
  /** An error answer (`code` is the protocol's error code) or a failure of the client itself. */
  constructor(code, message) {
    super(message);
    this.name = 'DecideError';
    this.code = code;
  }
}

function toAnswer(data) {
  return {
    label: data.label ?? null, leaning: data.leaning, score: Number(data.score), scores: data.scores || {},
    abstained: Boolean(data.abstained), reason: data.reason ?? null, truncated: Boolean(data.truncated), raw: data,
  };
}

/**
 * One child process or one socket connection, with its requests in flight in sending order. The
 * protocol answers every line once, in order: an answer carries our id, or null when the runtime
 * could not read the line (line_too_long) - then it is the oldest request's; an id-less `busy` is
 * the service refusing the connection (every request on it fails busy). A timed-out request
 * stays in `pending` (marked done) so that its late answer is recognised and dropped.
 */
class Link {
  constructor(input, output, child) {
    this.input = input;
    this.child = child;
    this.pending = new Map(); // id -> {resolve, reject, timer, done}; Map keeps the sending order
    this.nextId = 1;
    this.failure = null;
    this.closing = false;
    this.answered = false;
    this.endedAt = 0;
    this.stderrTail = [];
    this.stderrPartial = '';
    this.buffer = Buffer.alloc(0);
    this.ended = new Promise((resolve) => { this.onEnded = resolve; });
    this.ready = child ? new Promise((resolve, reject) => { this.readyWait = { resolve, reject }; }) : null;
    if (this.ready) this.ready.catch(() => {}); // observed by start(); never an unhandled rejection
    output.on('data', (chunk) => this.onData(chunk));
    input.on('error', () => {}); // EPIPE: the child is gone; 'close' reports why
  }

  onData(chunk) {
    let buffer = Buffer.concat([this.buffer, chunk]);
    let newline;
    while ((newline = buffer.indexOf(10)) >= 0) {
      const line = buffer.subarray(0, newline).toString('utf8');
      buffer = buffer.subarray(newline + 1);
      if (line.trim() && !this.onLine(line)) return;
    }
    this.buffer = buffer;
  }

  onLine(line) {
    let message = null;
    try { message = JSON.parse(line); } catch (err) { /* judged below */ }
    if (message === null || typeof message !== 'object' || Array.isArray(message)) {
      this.fail(new DecideError('protocol_error', `decide wrote a line that is not a JSON object: ${line.slice(0, 200)}`));
      this.kill();
      return false;
    }
    if (this.readyWait) {
      const wait = this.readyWait;
      this.readyWait = null;
      if (message.event === 'ready') { wait.resolve(message); return true; }
      this.fail(new DecideError('protocol_error', `expected the ready line, got: ${line.slice(0, 200)}`));
      this.kill();
      return false;
    }
    const id = message.id ?? null;
    const error = message.error && typeof message.error === 'object' ? message.error : null;
    if (id === null && error && error.code === 'busy') { // the service refuses this connection
      this.fail(new DecideError('busy', String(error.message)));
      this.kill();
      return false;
    }
    let entry = id !== null ? this.pending.get(id) : undefined;
    if (entry !== undefined) this.pending.delete(id);
    else if (id === null && message.error && this.pending.size) { // an unreadable line: the oldest
      const [oldest, first] = this.pending.entries().next().value;
      this.pending.delete(oldest);
      entry = first;
    }
    if (entry === undefined) return true; // a late answer: its call timed out
    this.answered = true;
    clearTimeout(entry.timer);
    if (entry.done) return true;
    if (error) entry.reject(new DecideError(String(error.code), String(error.message)));
    else entry.resolve(toAnswer(message));
    return true;
  }

  request(text, timeoutMs) {
    if (this.failure) return Promise.reject(new DecideError(this.failure.code, this.failure.message));
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      const entry = { resolve, reject, done: false };
      entry.timer = setTimeout(() => {
        entry.done = true; // stays pending until its answer comes
        reject(new DecideError('timeout', `no answer within ${timeoutMs} ms (decide runs on; a late answer is dropped)`));
      }, timeoutMs);
      this.pending.set(id, entry);
      this.input.write(`{"id": ${id}, "text": ${JSON.stringify(text)}}\n`);
    });
  }

  fail(error) {
    if (!this.failure) {
      this.failure = error;
      this.endedAt = Date.now();
    }
    if (this.readyWait) this.readyWait.reject(this.failure);
    this.readyWait = null;
    for (const entry of this.pending.values()) {
      clearTimeout(entry.timer);
      if (!entry.done) entry.reject(this.failure);
    }
    this.pending.clear();
  }

  end(error) {
    this.fail(this.closing ? new DecideError('closed', 'the client was closed') : error);
    this.onEnded();
  }

  kill() {
    if (this.child) this.child.kill('SIGKILL');
    else this.input.destroy();
  }

  /** The complete stderr lines this chunk ends; the last ones are kept for error messages. */
  noteStderr(chunk) {
    const lines = (this.stderrPartial + chunk.toString('utf8')).split('\n');
    this.stderrPartial = lines.pop().slice(-4096);
    this.stderrTail = this.stderrTail.concat(lines).slice(-STDERR_LINES);
    return lines;
  }

  stderrNote() {
    return this.stderrTail.length ? `; last stderr: ${this.stderrTail[this.stderrTail.length - 1]}` : '';
  }

  /** EOF after the lines written; decide answers what it read and exits (SIGTERM, SIGKILL if not). */
  async close(timeoutMs) {
    this.closing = true;
    this.input.end();
    const stops = this.child ? [[1000, 'SIGTERM'], [timeoutMs, 'SIGKILL'], [timeoutMs, null]] : [[timeoutMs, null]];
    for (const [waitMs, signal] of stops) {
      if (await within(this.ended, waitMs)) return;
      if (signal) this.child.kill(signal);
      else if (!this.child) this.input.destroy();
    }
  }
}

/** True if `promise` settles within `ms`. */
async function within(promise, ms) {
  let timer;
  const timeout = new Promise((resolve) => { timer = setTimeout(() => resolve(false), ms); });
  try {
    return await Promise.race([promise.then(() => true, () => true), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

function describeExit(code, signal) {
  return signal ? `decide was killed by signal ${signal}` : `decide exited with code ${code}`;
}

class DecideClient {
  /** Start `command args... --ready` and resolve once it is ready. */
  static async spawn(command, args = [], options = {}) {
    const client = new DecideClient({ ...options, command, args });
    await client.current();
    return client;
  }

  /** Use a running `decide serve --socket PATH`. */
  static async connect(socketPath, options = {}) {
    const client = new DecideClient({ ...options, socketPath });
    await client.current();
    return client;
  }

  /** options: timeoutMs (per call, 30000), readyTimeoutMs (120000), cwd, env, onStderr(line). */
  constructor(options) {
    this.options = options;
    this.timeoutMs = options.timeoutMs ?? 30000;
    this.readyTimeoutMs = options.readyTimeoutMs ?? 120000;
    this.ready = null; // the child's ready line (model, labels, limits)
    this.link = null;
    this.starting = null;
    this.failures = 0; // starts in a row that ended without any answer
    this.notBefore = 0;
    this.closed = false;
  }

  /** One text -> its answer; rejects with DecideError. */
  async classify(text, { timeoutMs } = {}) {
    const link = await this.current();
    return link.request(text, timeoutMs ?? this.timeoutMs);
  }

  /** Many texts, pipelined (one request line each, all in flight at once); answers in order. */
  async classifyMany(texts, { timeoutMs } = {}) {
    const link = await this.current();
    return Promise.all(texts.map((text) => link.request(text, timeoutMs ?? this.timeoutMs)));
  }

  /** Stop: requests already sent are answered, then the child exits; later calls reject `closed`. */
  async close(timeoutMs = 5000) {
    this.closed = true;
    if (this.starting) await this.starting.catch(() => {});
    const link = this.link;
    this.link = null;
    if (link) await link.close(timeoutMs);
  }

  /** The live link, (re)started if the last one ended: one start at a time, after a backoff of
   * 100 ms doubling to 5 s while starts end without any answer. */
  async current() {
    if (!this.closed && this.link && !this.link.failure) return this.link;
    if (!this.closed && !this.starting) this.starting = this.restart().finally(() => { this.starting = null; });
    if (this.starting) await this.starting;
    if (this.closed || !this.link) throw new DecideError('closed', 'the client was closed');
    return this.link; // if it died meanwhile, its request() rejects with the reason
  }

  async restart() {
    if (this.link) {
      this.backOff(this.link.answered ? 1 : this.failures + 1, this.link.endedAt);
      this.link = null;
    }
    const wait = this.notBefore - Date.now();
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
    try {
      this.link = await (this.options.socketPath ? this.open() : this.start());
    } catch (err) {
      this.backOff(this.failures + 1, Date.now());
      throw err;
    }
  }

  backOff(failures, since) {
    this.failures = failures;
    this.notBefore = since + Math.min(100 * 2 ** (failures - 1), MAX_BACKOFF_MS);
  }

  open() {
    const path = this.options.socketPath;
    return new Promise((resolve, reject) => {
      const socket = net.createConnection({ path });
      socket.once('error', (err) => reject(new DecideError('start_failed', `cannot connect to ${path}: ${err.message}`)));
      socket.once('connect', () => {
        const link = new Link(socket, socket, null);
        socket.on('close', () => link.end(new DecideError('connection_lost', 'the decide service closed the connection')));
        resolve(link);
      });
    });
  }

  async start() {
    const { command, args, cwd, env, onStderr } = this.options;
    const child = childProcess.spawn(command, [...args, '--ready'], { cwd, env, stdio: ['pipe', 'pipe', 'pipe'] });
    const link = new Link(child.stdin, child.stdout, child);
    let spawnError = null;
    child.on('error', (err) => { spawnError = err; });
    child.stderr.on('data', (chunk) => {
      for (const line of link.noteStderr(chunk)) {
        try { if (onStderr) onStderr(line); } catch (err) { /* a failing callback must not stop the draining */ }
      }
    });
    child.stdout.on('end', () => setTimeout(() => child.kill('SIGKILL'), 2000).unref()); // no more answers can come
    child.on('close', (code, signal) => link.end(spawnError
      ? new DecideError('start_failed', `cannot run ${command}: ${spawnError.message}`)
      : new DecideError('connection_lost', describeExit(code, signal) + link.stderrNote())));
    if (await within(link.ready, this.readyTimeoutMs) && !link.failure) {
      this.ready = await link.ready;
      return link;
    }
    const failure = link.failure;
    link.kill();
    await within(link.ended, 2000); // its last stderr lines are in by then
    const why = failure ? failure.message : `no ready line within ${this.readyTimeoutMs} ms${link.stderrNote()}`;
    throw new DecideError('start_failed', `decide did not become ready: ${why}`);
  }
}

module.exports = { DecideClient, DecideError };
