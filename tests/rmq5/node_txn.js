// Run by the tests with the official RocketMQ 5 Node.js client (build/rmq5/node): a
// transactional producer of TOPIC through ENDPOINTS, the same steps and lines as
// tests/rmq5/py_txn.py's "all" mode: commit one half, roll back one, leave one open; the checker
// answers ROLLBACK for a body ending in "-rollback", COMMIT otherwise. Then waits until stdin is
// closed.
//
// Usage: NODE_PATH=build/rmq5/node/node_modules node node_txn.js ENDPOINTS TOPIC PREFIX all
'use strict';

const { Producer } = require('rocketmq-client-nodejs');

// apache.rocketmq.v2.TransactionResolution
const COMMIT = 1;
const ROLLBACK = 2;

function emit(record) {
  process.stdout.write(`${JSON.stringify(record)}\n`);
}

const checker = {
  async check(message) {
    const body = message.body.toString();
    emit({ event: 'checked', message_id: message.messageId, body });
    return body.endsWith('-rollback') ? ROLLBACK : COMMIT;
  },
};

async function half(producer, topic, body) {
  const tx = producer.beginTransaction();
  const receipt = await producer.send(
    {
      topic,
      tag: 'tx',
      properties: new Map([['kind', body.split('-').pop()]]),
      body: Buffer.from(body),
    },
    tx,
  );
  emit({
    event: 'sent',
    body,
    message_id: receipt.messageId,
    transaction_id: receipt.transactionId,
  });
  return tx;
}

function stdinClosed() {
  return new Promise((resolve) => {
    process.stdin.on('data', () => {});
    process.stdin.on('end', resolve);
    process.stdin.resume();
  });
}

async function main() {
  const [endpoints, topic, prefix] = process.argv.slice(2);
  const producer = new Producer({ endpoints, topics: [topic], checker });
  await producer.startup();
  try {
    await (await half(producer, topic, `${prefix}-commit`)).commit();
    emit({ event: 'ended', body: `${prefix}-commit` });
    await (await half(producer, topic, `${prefix}-rollback`)).rollback();
    emit({ event: 'ended', body: `${prefix}-rollback` });
    await half(producer, topic, `${prefix}-check-commit`);
    await stdinClosed();
  } finally {
    await producer.shutdown();
  }
  emit({ done: 'all' });
}

main().then(
  () => process.exit(0),
  (err) => {
    process.stderr.write(`node_txn: ${err && err.stack ? err.stack : err}\n`);
    process.exit(1);
  },
);
