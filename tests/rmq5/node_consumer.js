// Run by the tests with the official RocketMQ 5 Node.js client (build/rmq5/node): a
// SimpleConsumer of GROUP on TOPIC through ENDPOINTS receives and acks until COUNT distinct
// messages were acked, then receives once more to show that nothing comes again. Prints one
// JSON line per received message ({"event": "received", ...}) and per ack ({"event": "acked"}
// or "ack_failed"), then {"done": COUNT}. The same lines as tests/rmq5/py_consumer.py.
//
// Usage: NODE_PATH=build/rmq5/node/node_modules node node_consumer.js ENDPOINTS TOPIC GROUP all
//        INVISIBLE_S COUNT
'use strict';

const { SimpleConsumer } = require('rocketmq-client-nodejs');

// Long polling per receive, ms; and the time after which the script gives up.
const AWAIT_MS = 2000;
const BUDGET_MS = 50000;

function line(event, msg, extra) {
  const record = {
    event,
    message_id: msg.messageId,
    body: msg.body.toString(),
    tag: msg.tag,
    keys: [...msg.keys].sort(),
    properties: Object.fromEntries(msg.properties),
    attempt: msg.deliveryAttempt,
    // The client's own body check (MD5 digest, upper-case hex): true if it failed.
    corrupted: msg.corrupted === true,
    offset: Number(msg.offset),
    ...extra,
  };
  process.stdout.write(`${JSON.stringify(record)}\n`);
}

async function receiveAndAck(consumer, invisibleMs, acked) {
  const messages = await consumer.receive(32, invisibleMs);
  for (const msg of messages) {
    line('received', msg);
    try {
      await consumer.ack(msg);
      line('acked', msg);
      acked.add(msg.messageId);
    } catch (err) {
      line('ack_failed', msg, { error: String(err).slice(0, 300) });
    }
  }
}

async function main() {
  const [endpoints, topic, group, mode, invisibleText, countText] = process.argv.slice(2);
  if (mode !== 'all') throw new Error(`mode ${mode}: only 'all' is implemented here`);
  const invisibleMs = Number(invisibleText) * 1000;
  const count = Number(countText);
  const consumer = new SimpleConsumer({
    endpoints,
    consumerGroup: group,
    subscriptions: new Map([[topic, '*']]),
    awaitDuration: AWAIT_MS,
  });
  await consumer.startup();
  const acked = new Set();
  const deadline = Date.now() + BUDGET_MS;
  try {
    while (acked.size < count && Date.now() < deadline) {
      await receiveAndAck(consumer, invisibleMs, acked);
    }
    await receiveAndAck(consumer, invisibleMs, acked);
  } finally {
    await consumer.shutdown();
  }
}

// A pipe's writes are asynchronous: exit once the last line (and so every earlier one) is out.
main().then(
  () => process.stdout.write(`${JSON.stringify({ done: Number(process.argv[7]) })}\n`, () => process.exit(0)),
  (err) => {
    process.stderr.write(`node_consumer: ${err && err.stack ? err.stack : err}\n`);
    process.exit(1);
  },
);
