// Run by the tests with the official RocketMQ 5 Node.js client (build/rmq5/node): send COUNT
// DELAY messages to TOPIC through ENDPOINTS, message i asking for delivery MIN_MS..MAX_MS after
// it is sent (ms precision), 50 sends in flight at a time. Prints one JSON line per send
// receipt with the delivery time asked for, then one line {"done": COUNT}.
//
// Usage: NODE_PATH=build/rmq5/node/node_modules node node_timed_producer.js ENDPOINTS TOPIC COUNT PREFIX MIN_MS MAX_MS
'use strict';

const { Producer } = require('rocketmq-client-nodejs');

const IN_FLIGHT = 50;

async function sendOne(producer, topic, prefix, i, low, high) {
  const deliverMs = Date.now() + low + Math.floor(Math.random() * (high - low));
  const receipt = await producer.send({
    topic,
    tag: 'timed',
    body: Buffer.from(`${prefix}-body-${i}`),
    deliveryTimestamp: new Date(deliverMs),
  });
  return { i, message_id: receipt.messageId, deliver_ms: deliverMs };
}

async function main() {
  const [endpoints, topic, countText, prefix, lowText, highText] = process.argv.slice(2);
  const [count, low, high] = [Number(countText), Number(lowText), Number(highText)];
  const producer = new Producer({ endpoints, topics: [topic] });
  await producer.startup();
  try {
    for (let start = 0; start < count; start += IN_FLIGHT) {
      const sends = [];
      for (let i = start; i < Math.min(count, start + IN_FLIGHT); i++) {
        sends.push(sendOne(producer, topic, prefix, i, low, high));
      }
      for (const line of await Promise.all(sends)) {
        process.stdout.write(`${JSON.stringify(line)}\n`);
      }
    }
  } finally {
    await producer.shutdown();
  }
  process.stdout.write(`${JSON.stringify({ done: count })}\n`);
}

main().then(
  () => process.exit(0),
  (err) => {
    process.stderr.write(`node_timed_producer: ${err && err.stack ? err.stack : err}\n`);
    process.exit(1);
  },
);
