// Run by the tests with the official RocketMQ 5 Node.js client (build/rmq5/node): a Producer and
// a consumer of GROUP side by side, both entering by ENDPOINTS. The producer sends to TOPIC one
// message every PACE_MS; the consumer (CONSUMER "simple": a SimpleConsumer that receives with
// INVISIBLE_S and acks each message as it comes; "push": a PushConsumer whose listener consumes
// each one) takes them. The producer stops at the first line on stdin (or after LIMIT sends) and prints
// {"event": "producer_done", "tried": sends tried}; the consumer at the end of stdin. One JSON
// line per event, each with t_ms (wall clock, ms):
//   {"event": "sent", "i", "ok": true, "message_id"} or {"event": "sent", "i", "ok": false,
//   "error"} (the client gave up on that send after its own retries);
//   {"event": "received", "message_id", "origin"} per delivered message, {"event": "acked" |
//   "ack_failed", "message_id"} per ack, {"event": "receive_failed", "error"} per failed
//   receive (those of a SimpleConsumer);
// then {"done": sends tried}. The same lines as tests/rmq5/py_steady_client.py.
//
// With RMQ5_TLS=1: over TLS (grpc-js verifies the server's certificate against
// GRPC_DEFAULT_SSL_ROOTS_FILE_PATH), signed with RMQ5_ACCESS_KEY / RMQ5_SECRET_KEY.
//
// Usage: NODE_PATH=build/rmq5/node/node_modules node node_steady_client.js ENDPOINTS TOPIC GROUP
//        PREFIX LIMIT INVISIBLE_S CONSUMER
'use strict';

const {
  ConsumeResult, Producer, PushConsumer, SimpleConsumer,
} = require('rocketmq-client-nodejs');

// Between two sends: a steady trickle, a few dozen a second.
const PACE_MS = 20;
// Long polling per receive, ms: short, so a receive parked at a node that dies costs little.
const AWAIT_MS = 1000;
// Most messages per receive; and the pause after a failed receive (no hot loop while every
// node refuses, e.g. during an election).
const BATCH = 16;
const RECEIVE_RETRY_MS = 50;
// The longest wait for a client's shutdown before the script goes on without it.
const SHUTDOWN_MS = 5000;

function emit(record) {
  process.stdout.write(`${JSON.stringify({ ...record, t_ms: Date.now() })}\n`);
}

const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function produce(producer, topic, prefix, limit, state) {
  let i = 0;
  for (; i < limit && !state.sendingStopped; i++) {
    try {
      const receipt = await producer.send({
        topic,
        keys: [`${prefix}-${i}`],
        properties: new Map([['origin', prefix]]),
        body: Buffer.from(`${prefix}-body-${i}`),
      });
      emit({ event: 'sent', i, ok: true, message_id: receipt.messageId });
    } catch (err) {
      emit({ event: 'sent', i, ok: false, error: String(err).slice(0, 300) });
    }
    await pause(PACE_MS);
  }
  return i;
}

async function consume(consumer, invisibleMs, state) {
  while (!state.stopped) {
    let messages;
    try {
      messages = await consumer.receive(BATCH, invisibleMs);
    } catch (err) {
      emit({ event: 'receive_failed', error: String(err).slice(0, 300) });
      await pause(RECEIVE_RETRY_MS);
      continue;
    }
    for (const msg of messages) {
      emit({ event: 'received', message_id: msg.messageId, origin: msg.properties.get('origin') || '' });
      try {
        await consumer.ack(msg);
        emit({ event: 'acked', message_id: msg.messageId });
      } catch (err) {
        emit({ event: 'ack_failed', message_id: msg.messageId, error: String(err).slice(0, 300) });
      }
    }
  }
}

// A push consumer's listener: each delivery printed and consumed.
async function pushed(msg) {
  emit({ event: 'received', message_id: msg.messageId, origin: msg.properties.get('origin') || '' });
  return ConsumeResult.SUCCESS;
}

function clientOptions(endpoints) {
  const options = { endpoints };
  if (process.env.RMQ5_TLS === '1') {
    options.sslEnabled = true;
    options.sessionCredentials = {
      accessKey: process.env.RMQ5_ACCESS_KEY,
      accessSecret: process.env.RMQ5_SECRET_KEY,
    };
  }
  return options;
}

async function main() {
  const [endpoints, topic, group, prefix, limitText, invisibleText, kind] = process.argv.slice(2);
  const state = { stopped: false, sendingStopped: false };
  let stdinEnded;
  const ended = new Promise((resolve) => { stdinEnded = resolve; });
  const stop = () => { state.stopped = true; state.sendingStopped = true; stdinEnded(); };
  process.stdin.on('data', () => { state.sendingStopped = true; });
  process.stdin.on('end', stop);
  process.stdin.on('error', stop);
  process.stdin.resume();
  const producer = new Producer({ ...clientOptions(endpoints), topics: [topic] });
  const consumerOptions = {
    ...clientOptions(endpoints),
    consumerGroup: group,
    subscriptions: new Map([[topic, '*']]),
  };
  const consumer = kind === 'push'
    ? new PushConsumer({ ...consumerOptions, messageListener: { consume: pushed } })
    : new SimpleConsumer({ ...consumerOptions, awaitDuration: AWAIT_MS });
  await producer.startup();
  await consumer.startup();
  emit({ event: 'started' });
  let tried = 0;
  try {
    const receiving = kind === 'push' ? Promise.resolve() : consume(consumer, Number(invisibleText) * 1000, state);
    tried = await produce(producer, topic, prefix, Number(limitText), state);
    emit({ event: 'producer_done', tried });
    await ended;
    await receiving;
  } finally {
    // Their goodbyes go to every route endpoint: the killed node's fail; and a push consumer's
    // shutdown waited on the killed node's receive loops for longer than the test's budget.
    for (const client of [producer, consumer]) {
      const gaveUp = pause(SHUTDOWN_MS).then(() => { throw new Error('not done in time'); });
      await Promise.race([client.shutdown(), gaveUp]).catch((err) => {
        process.stderr.write(`node_steady_client: shutdown: ${String(err).slice(0, 300)}\n`);
      });
    }
  }
  return tried;
}

// A pipe's writes are asynchronous: exit once the last line (and so every earlier one) is out.
main().then(
  (tried) => process.stdout.write(`${JSON.stringify({ done: tried })}\n`, () => process.exit(0)),
  (err) => {
    process.stderr.write(`node_steady_client: ${err && err.stack ? err.stack : err}\n`);
    process.exit(1);
  },
);
