// bench/express/app.js - the express-idempotency row of `make bench`.
//
// An Express 4 app with the express-idempotency middleware (npm, pinned in
// package.json) on every POST, doing what idemd does in the bench: the
// request is forwarded to the bench upstream (the nginx server that answers
// a fixed JSON 200, the same one idemd forwards to) and its answer is sent
// back; a request whose key the middleware has already seen is answered by
// the middleware from its store, and the handler sees `isHit` and returns.
// The body is parsed with express.json() (the middleware's default intent
// check compares the parsed body, so without it a reused key with another
// payload would go unnoticed); the bytes as they came are forwarded.
//
// Forwarding uses Node's own http client with a keep-alive agent of 64
// sockets, as nginx proxy_pass has a keep-alive pool of 64: no extra
// dependency, and no reconnect per request.
//
// The store (the middleware's "data adapter"):
//   --adapter map      (default) a Map keyed by the idempotency key, with the
//                      semantics of the package's own in-memory adapter
//                      (create fails on a duplicate, update replaces, delete
//                      removes) but O(1) look-ups.
//   --adapter default  the package's InMemoryDataAdapter, as shipped: an array
//                      scanned with filter() on every look-up, so each
//                      request costs time linear in the number of keys seen.
// Both keep every key for the life of the process (no expiry) and lose
// everything when it stops; see bench/README.md.
//
// Usage: node app.js --listen PORT --upstream http://127.0.0.1:PORT/
//                    [--adapter map|default]
// One process, one event loop (a cluster would give each worker its own
// in-memory store, and a retry landing on another worker would run twice).
// GET /metrics: the outcome counters (below).  SIGTERM/SIGINT close the
// listener and exit 0.
'use strict';

const http = require('http');
const express = require('express');
const { idempotency, getSharedIdempotencyService } = require('express-idempotency');
const { InMemoryDataAdapter } = require('express-idempotency/dist/defaults/inMemoryDataAdapter');

const MAX_BODY = '1mb'; // request bodies; the bench sends 66 bytes
const MAX_UPSTREAM_BYTES = 1024 * 1024; // upstream answers kept, as idemd's max_response_bytes

function usage(msg) {
  process.stderr.write('bench/express/app.js: ' + msg + '\n' +
    'usage: node app.js --listen PORT --upstream http://HOST:PORT/ [--adapter map|default]\n');
  process.exit(2);
}

function parseArgs(argv) {
  const opts = { listen: null, upstream: null, adapter: 'map' };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const v = argv[i + 1];
    if (a === '--listen' && v !== undefined) { opts.listen = v; i++; }
    else if (a === '--upstream' && v !== undefined) { opts.upstream = v; i++; }
    else if (a === '--adapter' && v !== undefined) { opts.adapter = v; i++; }
    else usage('unknown or incomplete argument: ' + a);
  }
  if (!opts.listen || !/^[0-9]+$/.test(opts.listen) || +opts.listen < 1 || +opts.listen > 65535)
    usage('--listen needs a port 1..65535');
  if (!opts.upstream) usage('--upstream is required');
  let u;
  try { u = new URL(opts.upstream); } catch (e) { usage('--upstream is not a URL: ' + opts.upstream); }
  if (u.protocol !== 'http:') usage('--upstream must be http://');
  opts.upstreamUrl = u;
  if (opts.adapter !== 'map' && opts.adapter !== 'default') usage('--adapter is map or default');
  return opts;
}

// The package's adapter interface (findByIdempotencyKey, create, update,
// delete; all async) over a Map.
class MapDataAdapter {
  constructor() { this.resources = new Map(); }
  async findByIdempotencyKey(key) { return this.resources.get(key) || null; }
  async create(resource) {
    if (this.resources.has(resource.idempotencyKey)) throw new Error('Duplicate');
    this.resources.set(resource.idempotencyKey, resource);
  }
  async update(resource) { this.resources.set(resource.idempotencyKey, resource); }
  async delete(key) { this.resources.delete(key); }
}

const opts = parseArgs(process.argv.slice(2));
const agent = new http.Agent({ keepAlive: true, maxSockets: 64, maxFreeSockets: 64 });
const dataAdapter = opts.adapter === 'map' ? new MapDataAdapter() : new InMemoryDataAdapter();

// Outcomes, as Prometheus text on GET /metrics, named like idemd's counter
// so that bench/run.sh and bench/report.py read both the same way: new
// (forwarded), replay (answered by the middleware), error (the middleware's
// 409 in-flight and 417 misuse answers, and upstream failures).
const counts = { new: 0, replay: 0, error: 0 };

const app = express();
app.disable('x-powered-by');
app.disable('etag');
app.get('/metrics', (req, res) => {
  res.type('text/plain').send(Object.keys(counts)
    .map((k) => 'idem_requests_total{outcome="' + k + '"} ' + counts[k] + '\n').join(''));
});
app.use(express.json({ limit: MAX_BODY, verify: (req, res, buf) => { req.rawBody = buf; } }));
app.post('*', idempotency({ dataAdapter }));
app.post('*', (req, res) => {
  const service = getSharedIdempotencyService();
  if (service.isHit(req)) { // answered by the middleware
    counts.replay++;
    return;
  }
  counts.new++;
  const body = req.rawBody || Buffer.alloc(0);
  const up = http.request({
    agent,
    host: opts.upstreamUrl.hostname,
    port: opts.upstreamUrl.port || 80,
    method: req.method,
    path: req.originalUrl,
    headers: {
      'content-type': req.get('content-type') || 'application/octet-stream',
      'content-length': body.length,
      'idempotency-key': req.get('idempotency-key') || '',
    },
  }, (ur) => {
    const chunks = [];
    let size = 0;
    ur.on('data', (c) => {
      size += c.length;
      if (size > MAX_UPSTREAM_BYTES) { ur.destroy(new Error('upstream answer too large')); return; }
      chunks.push(c);
    });
    ur.on('end', () => {
      if (ur.headers['content-type']) res.type(ur.headers['content-type']);
      res.status(ur.statusCode).send(Buffer.concat(chunks));
    });
    ur.on('error', (err) => fail(err));
  });
  function fail(err) {
    if (res.headersSent) return;
    counts.error++;
    service.reportError(req).catch(() => {});
    res.status(502).json({ error: 'upstream: ' + err.message });
  }
  up.setTimeout(60000, () => up.destroy(new Error('upstream timeout')));
  up.on('error', fail);
  up.end(body);
});
// The middleware's 409 (in flight) and 417 (another payload) reach here with
// their status set; Express's own handler writes the answer.
app.use((err, req, res, next) => {
  counts.error++;
  next(err);
});

const server = app.listen(+opts.listen, '127.0.0.1', () => {
  process.stderr.write('bench/express/app.js: listening on 127.0.0.1:' + opts.listen +
    ', upstream ' + opts.upstream + ', adapter ' + opts.adapter + '\n');
});
server.keepAliveTimeout = 75000;
server.on('error', (err) => { process.stderr.write('listen: ' + err.message + '\n'); process.exit(1); });
function stop() {
  server.close(() => process.exit(0));
  server.closeAllConnections();
  agent.destroy();
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
