// Run by the tests with the npm package ali-ons (RocketMQ 4.x's remoting protocol, unmodified;
// build/ons/node): send COUNT messages to TOPIC through the NameServer NAMESRV, one after the
// other, each with a tag, two keys and a "seq" property, and print one JSON line per
// acknowledged send, then {"done": COUNT}. A send that fails (a leader kill, no route yet) is
// tried again, the same message, until RETRY_S passes; each failure prints an "error" line.
// DELAY_LEVEL > 0 sets the message's delay level.
//
// Usage: NODE_PATH=build/ons/node/node_modules node ons_producer.js NAMESRV TOPIC COUNT PREFIX
//        [DELAY_LEVEL] [ACCESS_KEY SECRET_KEY]
'use strict';

const { Producer, Message } = require('ali-ons');
const { quietLogger, noHttp } = require('./ons_common');

// How long one message is tried again before the script gives up (a failover takes seconds);
// ONS_RETRY_S overrides it (a test expecting a refusal gives up at once).
const RETRY_S = Number(process.env.ONS_RETRY_S || '60');
const RETRY_PAUSE_MS = 200;

async function sendOne(producer, topic, i, prefix, delayLevel) {
  const msg = new Message(topic, `tag${i % 3}`, Buffer.from(`${prefix}-body-${i}`));
  msg.keys = [`${prefix}-key-${i}`, `${prefix}-k2-${i}`];
  msg.properties.seq = String(i);
  if (delayLevel > 0) {
    msg.delayTimeLevel = delayLevel;
  }
  const until = Date.now() + RETRY_S * 1000;
  for (;;) {
    try {
      return await producer.send(msg);
    } catch (err) {
      process.stdout.write(`${JSON.stringify({ event: 'error', i, error: String(err && err.message) })}\n`);
      if (Date.now() > until) {
        throw err;
      }
      await new Promise(resolve => setTimeout(resolve, RETRY_PAUSE_MS));
    }
  }
}

async function main() {
  const [namesrv, topic, countText, prefix, delayText, accessKey, secretKey] = process.argv.slice(2);
  const count = Number(countText);
  const delayLevel = Number(delayText || '0');
  const producer = new Producer({
    httpclient: noHttp,
    nameSrv: namesrv,
    producerGroup: `${prefix}-producer`,
    instanceName: `${prefix}-${process.pid}`,
    logger: quietLogger,
    // The client's own option (30 s by default, as RocketMQ's Java client): a send that
    // fails on a dead leader is not followed by a route refresh, so the new leader is found
    // only at the next poll. 2 s keeps a failover test short; production keeps its choice.
    pollNameServerInteval: 2000,
    accessKeyId: accessKey,
    accessKeySecret: secretKey,
  });
  await producer.ready();
  try {
    for (let i = 0; i < count; i++) {
      const r = await sendOne(producer, topic, i, prefix, delayLevel);
      const line = {
        event: 'sent', i, status: r.sendStatus, msg_id: r.msgId,
        queue: r.messageQueue.queueId, offset: r.queueOffset, at_ms: Date.now(),
      };
      process.stdout.write(`${JSON.stringify(line)}\n`);
    }
  } finally {
    await producer.close();
  }
  process.stdout.write(`${JSON.stringify({ done: count })}\n`);
}

main().then(
  () => process.exit(0),
  (err) => {
    process.stderr.write(`ons_producer: ${err && err.stack ? err.stack : err}\n`);
    process.exit(1);
  },
);
