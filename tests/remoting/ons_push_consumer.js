// Run by the tests with the npm package ali-ons (unmodified, build/ons/node): a push consumer of
// GROUP on TOPIC through the NameServer NAMESRV, MODEL "clustering" or "broadcasting", printing
// one JSON line per delivery ({"event": "consumed", ...}) until its stdin closes. A message whose
// body is in the FAIL list (comma separated) is failed on its first FAIL_TIMES deliveries (the
// listener throws: ali-ons sends it back for a retry). It starts from the first offset of a
// queue it has none for.
//
// Usage: NODE_PATH=build/ons/node/node_modules node ons_push_consumer.js NAMESRV TOPIC GROUP
//        MODEL [FAIL_TIMES FAIL] [ACCESS_KEY SECRET_KEY]
'use strict';

const { Consumer } = require('ali-ons');
const { quietLogger, noHttp } = require('./ons_common');

async function main() {
  const [namesrv, topic, group, model, failText, failList, accessKey, secretKey] = process.argv.slice(2);
  const failTimes = Number(failText || '0');
  const failing = new Set((failList || '').split(',').filter(Boolean));
  const seen = new Map();
  const consumer = new Consumer({
    httpclient: noHttp,
    nameSrv: namesrv,
    consumerGroup: group,
    instanceName: `${group}-${process.pid}`,
    isBroadcast: model === 'broadcasting',
    consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET',
    logger: quietLogger,
    rebalanceInterval: 2000,
    pollNameServerInteval: 2000,
    persistConsumerOffsetInterval: 1000,
    maxReconsumeTimes: 3,
    accessKeyId: accessKey,
    accessKeySecret: secretKey,
  });
  consumer.on('error', err => process.stderr.write(`consumer error: ${err && err.message}\n`));
  consumer.subscribe(topic, '*', async msg => {
    const body = msg.body.toString();
    const n = (seen.get(body) || 0) + 1;
    seen.set(body, n);
    const line = {
      event: 'consumed', body, topic: msg.topic, queue: msg.queueId, offset: msg.queueOffset,
      msg_id: msg.msgId, uniq: msg.properties.UNIQ_KEY, tags: msg.tags, keys: msg.keys,
      seq: msg.properties.seq, reconsume: msg.reconsumeTimes, store_ms: msg.storeTimestamp,
      born_ms: msg.bornTimestamp, at_ms: Date.now(),
    };
    process.stdout.write(`${JSON.stringify(line)}\n`);
    if (failing.has(body) && n <= failTimes) {
      // Thrown, not ACTION_RETRY: ali-ons's wrapper of the retry topic's deliveries drops the
      // listener's return value, so only a throw fails a retry again.
      throw new Error(`failing ${body} on purpose (delivery ${n})`);
    }
  });
  await consumer.ready();
  process.stdout.write(`${JSON.stringify({ event: 'ready' })}\n`);
  await new Promise(resolve => {
    process.stdin.on('end', resolve);
    process.stdin.on('close', resolve);
    process.stdin.resume();
  });
  await consumer.close();
}

main().then(
  () => process.exit(0),
  (err) => {
    process.stderr.write(`ons_push_consumer: ${err && err.stack ? err.stack : err}\n`);
    process.exit(1);
  },
);
