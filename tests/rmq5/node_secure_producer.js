// Run by the tests with the official RocketMQ 5 Node.js client (build/rmq5/node): send COUNT
// messages to TOPIC through ENDPOINTS over TLS (sslEnabled: grpc-js verifies the server's
// certificate against GRPC_DEFAULT_SSL_ROOTS_FILE_PATH), signed with RMQ5_ACCESS_KEY /
// RMQ5_SECRET_KEY (sessionCredentials). Prints one JSON line per receipt, then {"done": COUNT};
// or one line {"error": <class>, "code": <v2 code>, "at": "startup"|"send"} and exits 3.
//
// Usage: NODE_PATH=build/rmq5/node/node_modules node node_secure_producer.js ENDPOINTS TOPIC COUNT PREFIX
'use strict';

const { Producer } = require('rocketmq-client-nodejs');

async function main() {
  const [endpoints, topic, countText, prefix] = process.argv.slice(2);
  const count = Number(countText);
  const producer = new Producer({
    endpoints,
    topics: [topic],
    sslEnabled: true,
    sessionCredentials: {
      accessKey: process.env.RMQ5_ACCESS_KEY,
      accessSecret: process.env.RMQ5_SECRET_KEY,
    },
  });
  let at = 'startup';
  try {
    await producer.startup();
    at = 'send';
    for (let i = 0; i < count; i++) {
      const receipt = await producer.send({
        topic,
        tag: 'secure',
        keys: [`${prefix}-key-${i}`],
        properties: new Map([['origin', prefix]]),
        body: Buffer.from(`${prefix}-body-${i}`),
      });
      process.stdout.write(`${JSON.stringify({ i, message_id: receipt.messageId })}\n`);
    }
  } catch (err) {
    const line = { error: err && err.constructor ? err.constructor.name : String(err), code: err && err.code, at };
    process.stdout.write(`${JSON.stringify(line)}\n`);
    await producer.shutdown().catch(() => {});
    return 3;
  }
  await producer.shutdown();
  process.stdout.write(`${JSON.stringify({ done: count })}\n`);
  return 0;
}

main().then(
  (code) => process.exit(code),
  (err) => {
    process.stderr.write(`node_secure_producer: ${err && err.stack ? err.stack : err}\n`);
    process.exit(1);
  },
);
