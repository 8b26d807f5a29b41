'use strict';
// The Node client's conformance harness: the command language of tests/clients/harness.py.
//   node harness.js PATH/TO/decide_client.js
// Node has no threads sharing an object: `threads N M` runs N concurrent callers instead, each
// making M calls one after the other.
const fs = require('fs');
const readline = require('readline');
const { DecideClient, DecideError } = require(process.argv[2]);

const clients = new Map();

function readLines(path) {
  const lines = fs.readFileSync(path, 'utf8').split('\n');
  lines.pop();
  return lines;
}

async function labelOrCode(call) {
  try {
    return (await call()).label;
  } catch (err) {
    if (err instanceof DecideError) return `!${err.code}: ${err.message}`;
    throw err;
  }
}

async function run(fields) {
  const [cmd, name, ...args] = fields;
  if (cmd === 'spawn') {
    const [readyS, timeoutS, command, ...rest] = args;
    clients.set(name, await DecideClient.spawn(command, rest, { readyTimeoutMs: readyS * 1000, timeoutMs: timeoutS * 1000 }));
  } else if (cmd === 'connect') {
    clients.set(name, await DecideClient.connect(args[1], { timeoutMs: args[0] * 1000 }));
  } else if (cmd === 'one') {
    const a = await clients.get(name).classify(args[1].repeat(Number(args[0])));
    return { label: a.label, leaning: a.leaning, score: a.score, abstained: a.abstained, reason: a.reason, truncated: a.truncated };
  } else if (cmd === 'many') {
    return { labels: (await clients.get(name).classifyMany(readLines(args[0]))).map((a) => a.label) };
  } else if (cmd === 'async') {
    const client = clients.get(name);
    const calls = readLines(args[0]).map((text) => labelOrCode(() => client.classify(text)));
    if (args[1] === 'inflight') process.stdout.write(JSON.stringify({ event: 'inflight' }) + '\n');
    return { labels: await Promise.all(calls) };
  } else if (cmd === 'threads') {
    const client = clients.get(name);
    const [n, m] = [Number(args[0]), Number(args[1])];
    const texts = readLines(args[2]);
    const labels = new Array(n * m).fill(null);
    await Promise.all(Array.from({ length: n }, async (_, t) => {
      for (let j = 0; j < m; j++) labels[t * m + j] = await labelOrCode(() => client.classify(texts[(t * m + j) % texts.length]));
    }));
    return { labels };
  } else if (cmd === 'sleep') {
    await new Promise((resolve) => setTimeout(resolve, Number(name)));
  } else if (cmd === 'close') {
    await clients.get(name).close();
  } else {
    throw new Error(`unknown command ${cmd}`);
  }
  return {};
}

async function main() {
  for await (const line of readline.createInterface({ input: process.stdin, crlfDelay: Infinity })) {
    const fields = line.split('\t');
    const started = process.hrtime.bigint();
    let result;
    try {
      result = await run(fields);
    } catch (err) {
      if (!(err instanceof DecideError)) throw err;
      result = { error_code: err.code, error_message: err.message };
    }
    result.cmd = fields[0];
    result.elapsed_ms = Number(process.hrtime.bigint() - started) / 1e6;
    process.stdout.write(JSON.stringify(result) + '\n');
  }
  for (const client of clients.values()) await client.close();
}

main().catch((err) => { console.error(err); process.exit(1); });
