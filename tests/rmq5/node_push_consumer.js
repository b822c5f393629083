// Run by the tests with the official RocketMQ 5 Node.js client (build/rmq5/node): a
// PushConsumer of GROUP on TOPIC through ENDPOINTS that prints one JSON line per delivery
// ({"event": "consumed", "message_id", "body", "group", "attempt", "t"}) until its stdin
// closes, then shuts down and prints {"done": N}. The same lines and MODEs as
// tests/rmq5/py_push_consumer.py.
//
// Usage: NODE_PATH=build/rmq5/node/node_modules node node_push_consumer.js ENDPOINTS TOPIC
//        GROUP MODE
'use strict';

const { PushConsumer, ConsumeResult } = require('rocketmq-client-nodejs');

async function main() {
  const [endpoints, topic, group, mode] = process.argv.slice(2);
  let count = 0;
  const consumer = new PushConsumer({
    endpoints,
    consumerGroup: group,
    subscriptions: new Map([[topic, '*']]),
    // A FIFO batch's message groups consumed side by side, each in order, as the Python client
    // does by default (Node.js: off by default; ignored for a normal group).
    enableFifoConsumeAccelerator: true,
    messageListener: {
      async consume(msg) {
        const attempt = msg.deliveryAttempt;
        count += 1;
        process.stdout.write(`${JSON.stringify({
          event: 'consumed',
          message_id: msg.messageId,
          body: msg.body.toString(),
          group: msg.messageGroup || '',
          attempt,
          t: Date.now() / 1000,
        })}\n`);
        const fails = mode === 'fail' ? (msg.properties.get('fails') || '0') : '0';
        if (fails === 'always' || (/^\d+$/.test(fails) && attempt <= Number(fails))) {
          return ConsumeResult.FAILURE;
        }
        return ConsumeResult.SUCCESS;
      },
    },
  });
  await consumer.startup();
  process.stdout.write(`${JSON.stringify({ event: 'started' })}\n`);
  await new Promise(resolve => {
    process.stdin.on('end', resolve);
    process.stdin.resume();
  });
  await consumer.shutdown();
  return count;
}

// A pipe's writes are asynchronous: exit once the last line (and so every earlier one) is out.
main().then(
  (count) => process.stdout.write(`${JSON.stringify({ done: count })}\n`, () => process.exit(0)),
  (err) => {
    process.stderr.write(`node_push_consumer: ${err && err.stack ? err.stack : err}\n`);
    process.exit(1);
  },
);
