// Run by the tests with the official RocketMQ 5 Node.js client (build/rmq5/node): send COUNT
// messages to TOPIC through ENDPOINTS, each with a tag, two keys and two user properties, and
// print one JSON line per send receipt, then one line {"done": COUNT}.
//
// Usage: NODE_PATH=build/rmq5/node/node_modules node node_producer.js ENDPOINTS TOPIC COUNT PREFIX
'use strict';

const { Producer } = require('rocketmq-client-nodejs');

async function main() {
  const [endpoints, topic, countText, prefix] = process.argv.slice(2);
  const count = Number(countText);
  const producer = new Producer({ endpoints, topics: [topic] });
  await producer.startup();
  try {
    for (let i = 0; i < count; i++) {
      const receipt = await producer.send({
        topic,
        tag: `tag${i % 3}`,
        keys: [`${prefix}-key-${i}`, `${prefix}-k2-${i}`],
        properties: new Map([['seq', String(i)], ['origin', prefix]]),
        body: Buffer.from(`${prefix}-body-${i}`),
      });
      const line = { i, message_id: receipt.messageId, offset: Number(receipt.offset) };
      process.stdout.write(`${JSON.stringify(line)}\n`);
    }
  } finally {
    await producer.shutdown();
  }
  process.stdout.write(`${JSON.stringify({ done: count })}\n`);
}

main().then(
  () => process.exit(0),
  (err) => {
    process.stderr.write(`node_producer: ${err && err.stack ? err.stack : err}\n`);
    process.exit(1);
  },
);
