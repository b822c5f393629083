// Shared by the ali-ons scripts: a logger that writes to stderr (stdout carries the JSON lines
// the tests read) and the HTTP client ali-ons asks for, which it uses only to look a NameServer
// up on Aliyun (never here: the scripts give it the NameServer's address).
'use strict';

function write(level, args) {
  process.stderr.write(`${new Date().toISOString()} ${level} ${require('util').format(...args)}\n`);
}

exports.quietLogger = {
  debug() {},
  info(...args) { write('INFO', args); },
  warn(...args) { write('WARN', args); },
  error(...args) { write('ERROR', args); },
};

exports.noHttp = {
  async request(url) {
    throw new Error(`no HTTP in the tests: ${url}`);
  },
};
