// Run by the tests with the official RocketMQ 5 Node.js client (build/rmq5/node): send to TOPIC
// through ENDPOINTS, one message every PACE_MS, until stdin ends or LIMIT sends were tried. One
// JSON line per send: {"i", "ok": true, "message_id", "t_ms"} when acknowledged, {"i", "ok":
// false, "error", "t_ms"} when the client gave up on it (after its own retries); then
// {"done": sends tried}. The test kills nodes meanwhile and reads the lines as they come.
//
// With RMQ5_TLS=1: over TLS (grpc-js verifies the server's certificate against
// GRPC_DEFAULT_SSL_ROOTS_FILE_PATH), signed with RMQ5_ACCESS_KEY / RMQ5_SECRET_KEY.
//
// Usage: NODE_PATH=build/rmq5/node/node_modules node node_steady_producer.js ENDPOINTS TOPIC
//        PREFIX LIMIT
'use strict';

const { Producer } = require('rocketmq-client-nodejs');

// Between two sends: a steady trickle, a few dozen a second, not a flood of a small store.
const PACE_MS = 20;

function emit(record) {
  process.stdout.write(`${JSON.stringify({ ...record, t_ms: Date.now() })}\n`);
}

async function main() {
  const [endpoints, topic, prefix, limitText] = process.argv.slice(2);
  const limit = Number(limitText);
  let stopped = false;
  process.stdin.on('end', () => { stopped = true; });
  process.stdin.on('error', () => { stopped = true; });
  process.stdin.resume();
  const options = { endpoints, topics: [topic] };
  if (process.env.RMQ5_TLS === '1') {
    options.sslEnabled = true;
    options.sessionCredentials = {
      accessKey: process.env.RMQ5_ACCESS_KEY,
      accessSecret: process.env.RMQ5_SECRET_KEY,
    };
  }
  const producer = new Producer(options);
  await producer.startup();
  emit({ started: true });
  let i = 0;
  try {
    for (; i < limit && !stopped; i++) {
      try {
        const receipt = await producer.send({
          topic,
          keys: [`${prefix}-${i}`],
          properties: new Map([['seq', String(i)], ['origin', prefix]]),
          body: Buffer.from(`${prefix}-body-${i}`),
        });
        emit({ i, ok: true, message_id: receipt.messageId });
      } catch (err) {
        emit({ i, ok: false, error: String(err).slice(0, 300) });
      }
      await new Promise((resolve) => setTimeout(resolve, PACE_MS));
    }
  } finally {
    // Its termination notice goes to every route endpoint: the killed node's fails.
    await producer.shutdown().catch((err) => {
      process.stderr.write(`node_steady_producer: shutdown: ${String(err).slice(0, 300)}\n`);
    });
  }
  return i;
}

// A pipe's writes are asynchronous: exit once the last line (and so every earlier one) is out.
main().then(
  (tried) => process.stdout.write(`${JSON.stringify({ done: tried })}\n`, () => process.exit(0)),
  (err) => {
    process.stderr.write(`node_steady_producer: ${err && err.stack ? err.stack : err}\n`);
    process.exit(1);
  },
);
