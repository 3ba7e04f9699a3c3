// DEV AID ONLY — a FAKE Airlock API for working on the web UI without the daemon.
//
// It serves appliance/ui/ the way the daemon does (same CSP header) and answers the few API
// routes the page uses with scripted, canned data. It has no retrieval, no model and no access
// control: nothing it returns says anything about the real appliance. The acceptance tests
// (acceptance.test.mjs) run against the real `airlock` binary; the dev-server tests
// (ui-dev.test.mjs) only prove the page's own logic (rendering, streaming, stop, errors).
//
//   node dev-server.mjs [--port 8787]      then open http://127.0.0.1:8787/
//   tokens: dev-alice, dev-admin (admin, can read /metrics)
//
// Scripted questions (matched case-insensitively in the last user message):
//   "busy" → 503 capacity-unavailable, Retry-After 7     "limit" → 429 rate-limited, Retry-After 12
//   "slow" → a long answer at 8 tokens/s (for Stop)      "hostile" → HTML/script in sources and answer
//   "rung N" → answer at ladder rung N                   "break" → stream cut before [DONE]
//   "nothing" → no sources                                "revoked" → 401 as if the token was revoked
//   request `airlock.rung` (admin only, else 403): that rung; 5 → 503 Retry-After 3
//   anything else → a Markdown answer citing [1] and [2]

import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = path.dirname(fileURLToPath(import.meta.url));
export const UI_DIR = path.resolve(HERE, '../../appliance/ui');

/** The Content-Security-Policy the daemon must send with the page (see appliance/ui/README.md). */
export const CSP =
  "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'";

const MIME = {
  '.html': 'text/html; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
};

const TOKENS = {
  'dev-alice': { user: 'alice', admin: false },
  'dev-admin': { user: 'admin', admin: true },
};

const DOCS = [
  {
    doc_id: 'doc-00128',
    title: 'Enhanced Due Diligence Thresholds — Institutional Clients (Ireland)',
    snippet:
      'Institutional customers onboarded in Ireland with an expected annual turnover above EUR 7,250,000 require enhanced due diligence before the account is opened. The threshold applies per customer.',
    passage:
      'Institutional customers onboarded in Ireland with an expected annual turnover above EUR 7,250,000 require enhanced due diligence before the account is opened.',
    page: 3,
    section: ['Enhanced Due Diligence', '4.2 Thresholds'],
    score: 0.87,
  },
  {
    doc_id: 'doc-00342',
    title: 'Customer Onboarding Procedure — Retail and Institutional',
    snippet: 'The onboarding officer records the expected turnover, the source of funds and the beneficial owners in the CRM before approval.',
    score: 0.61,
  },
  {
    doc_id: 'doc-01977',
    title: 'KYC Refresh Cycle FAQ',
    snippet: 'High-risk relationships are reviewed every 12 months, medium-risk every 24 months and low-risk every 36 months.',
    score: 0.44,
  },
];

const DEFAULT_ANSWER = `Institutional customers onboarded in **Ireland** need *enhanced due diligence* when their expected annual turnover is above **EUR 7,250,000** [1].

Before approval, the onboarding officer must:

1. record the expected turnover and the \`source of funds\` [2];
2. identify the beneficial owners [2];
3. schedule the first review at the cycle for the client's risk rating [3].

| Risk rating | Review cycle |
|---|---|
| High | 12 months |
| Medium | 24 months |
| Low | 36 months |

> The threshold applies per customer, not per account [1].`;

const HOSTILE_DOC = {
  doc_id: 'doc-hostile',
  title: 'Vendor note <img src=x onerror="window.__pwned=\'title\'"> <script>window.__pwned="title-script"</script>',
  snippet: 'Quoted from the vendor: <script>window.__pwned="snippet"</script> and <img src=x onerror="window.__pwned=\'img\'"> plus <a href="javascript:alert(1)">click</a>.',
  score: 0.9,
};

const HOSTILE_ANSWER = `The note contains markup that must stay text: <script>window.__pwned="answer"</script> and <img src=x onerror="window.__pwned='answer-img'"> [1].

[click me](javascript:window.__pwned='link') and **<b>bold?</b>** [1]`;

const SLOW_WORDS = (
  'This answer is long on purpose so that the reader can stop it while it is still being written. ' +
  'Each word arrives on its own, the way a small model on a busy appliance writes, and the page renders it as it comes. '
).repeat(12);

function problem(res, status, slug, title, extra = {}) {
  res.writeHead(status, { 'Content-Type': 'application/problem+json', ...extra });
  res.end(JSON.stringify({ type: `https://airlock.local/problems/${slug}`, title, status, detail: title }));
}

function readBody(req, limit = 1 << 20) {
  return new Promise((resolve, reject) => {
    let size = 0;
    const parts = [];
    req.on('data', (c) => {
      size += c.length;
      if (size > limit) reject(new Error('too large'));
      else parts.push(c);
    });
    req.on('end', () => resolve(Buffer.concat(parts).toString('utf8')));
    req.on('error', reject);
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Starts the fake server.
 * @param {{port?: number, info?: boolean, tokenDelayMs?: number}} [opts] `info: false` removes
 *   GET /v1/info (to check the page's fallback).
 */
export async function startDevServer(opts = {}) {
  const state = {
    cancelled: 0,
    completed: 0,
    chats: [],
    feedback: [],
    requestIds: new Map(), // request id → user
    lastRequestId: '',
  };
  const tokenDelay = opts.tokenDelayMs ?? 25;
  let seq = 0;

  const server = http.createServer(async (req, res) => {
    const url = new URL(req.url, 'http://localhost');
    const p = url.pathname;
    try {
      if (p === '/__dev/state' && req.method === 'GET') {
        res.writeHead(200, { 'Content-Type': 'application/json' });
        res.end(JSON.stringify({ cancelled: state.cancelled, completed: state.completed, chats: state.chats, feedback: state.feedback }));
        return;
      }
      if (!p.startsWith('/v1/') && p !== '/metrics') return serveStatic(p, res);

      if (p === '/v1/auth/methods' && req.method === 'GET') {
        // Token sign-in only (the directory and IdP sign-ins are tested against the real daemon).
        res.writeHead(200, { 'Content-Type': 'application/json' });
        res.end(JSON.stringify({ ldap: false, oidc: null, trusted_header: false, token: true }));
        return;
      }
      const auth = /^Bearer (.+)$/.exec(req.headers.authorization || '');
      const who = auth ? TOKENS[auth[1]] : undefined;
      if (!who) return problem(res, 401, 'unauthorized', 'Missing or unknown bearer token');

      if (p === '/metrics') {
        if (!who.admin) return problem(res, 403, 'forbidden', 'Admin only');
        res.writeHead(200, { 'Content-Type': 'text/plain; version=0.0.4' });
        res.end(
          `# HELP airlock_generation_cancelled_total (fake)\n# TYPE airlock_generation_cancelled_total counter\nairlock_generation_cancelled_total ${state.cancelled}\n`,
        );
        return;
      }
      if (p === '/v1/models' && req.method === 'GET') {
        res.writeHead(200, { 'Content-Type': 'application/json' });
        res.end(
          JSON.stringify({
            object: 'list',
            data: [
              { id: 'airlock-embed', object: 'model', owned_by: 'airlock', role: 'embedder' },
              { id: 'airlock-large', object: 'model', owned_by: 'airlock', role: 'generator' },
              { id: 'airlock-small', object: 'model', owned_by: 'airlock', role: 'generator' },
              { id: 'airlock-rerank', object: 'model', owned_by: 'airlock', role: 'reranker' },
            ],
          }),
        );
        return;
      }
      if (p === '/v1/info' && req.method === 'GET' && opts.info !== false) {
        res.writeHead(200, { 'Content-Type': 'application/json' });
        res.end(JSON.stringify({ bundle_version: '2026.11.29-dev-fake', user: who.user }));
        return;
      }
      if (p === '/v1/feedback' && req.method === 'POST') return feedback(req, res, who);
      if (p === '/v1/chat/completions' && req.method === 'POST') return chat(req, res, who);
      return problem(res, 404, 'not-found', 'Unknown route');
    } catch (e) {
      if (!res.headersSent) problem(res, 500, 'internal', 'Internal error');
      else res.destroy();
    }
  });

  function serveStatic(p, res) {
    const rel = p === '/' ? 'index.html' : decodeURIComponent(p).replace(/^\/+/, '');
    const file = path.resolve(UI_DIR, rel);
    if (!file.startsWith(UI_DIR + path.sep) || !fs.existsSync(file) || !fs.statSync(file).isFile()) {
      return problem(res, 404, 'not-found', 'Not found');
    }
    res.writeHead(200, {
      'Content-Type': MIME[path.extname(file)] || 'application/octet-stream',
      'Content-Security-Policy': CSP,
      'X-Content-Type-Options': 'nosniff',
      'Referrer-Policy': 'no-referrer',
      'Cache-Control': 'no-cache',
    });
    res.end(fs.readFileSync(file));
  }

  async function feedback(req, res, who) {
    let body;
    try {
      body = JSON.parse(await readBody(req));
    } catch {
      return problem(res, 400, 'invalid-request', 'Body is not JSON');
    }
    const keys = Object.keys(body || {});
    if (
      typeof body?.request_id !== 'string' ||
      !['up', 'down'].includes(body.rating) ||
      (body.comment !== undefined && (typeof body.comment !== 'string' || body.comment.length > 2000)) ||
      keys.some((k) => !['request_id', 'rating', 'comment'].includes(k))
    ) {
      return problem(res, 400, 'invalid-request', 'Invalid feedback');
    }
    if (state.requestIds.get(body.request_id) !== who.user) return problem(res, 404, 'not-found', 'Unknown request id');
    const existing = state.feedback.findIndex((f) => f.request_id === body.request_id && f.user === who.user);
    const record = { user: who.user, request_id: body.request_id, rating: body.rating, comment: body.comment ?? null };
    if (existing >= 0) state.feedback[existing] = record;
    else state.feedback.push(record);
    res.writeHead(existing >= 0 ? 200 : 201, { 'Content-Type': 'application/json' });
    res.end(JSON.stringify({ request_id: body.request_id, rating: body.rating, stored: true }));
  }

  async function chat(req, res, who) {
    let body;
    try {
      body = JSON.parse(await readBody(req));
    } catch {
      return problem(res, 400, 'invalid-request', 'Body is not JSON');
    }
    const msgs = Array.isArray(body.messages) ? body.messages : [];
    const last = [...msgs].reverse().find((m) => m.role === 'user')?.content || '';
    const q = String(last).toLowerCase();
    state.chats.push({ user: who.user, model: body.model ?? null, messages: msgs.length, airlock: body.airlock ?? null, question: last });

    if (q.includes('revoked')) return problem(res, 401, 'unauthorized', 'Missing or unknown bearer token');
    if (q.includes('busy'))
      return problem(res, 503, 'capacity-unavailable', 'The appliance is at capacity', { 'Retry-After': '7', 'X-Airlock-Rung': '5' });
    if (q.includes('limit')) return problem(res, 429, 'rate-limited', 'Request budget exhausted', { 'Retry-After': '12', 'X-Airlock-Rung': '0' });

    // Forcing a rung is for admins (API.md); rung 5 is the shed.
    const forced = body.airlock?.rung;
    if (forced !== undefined && forced !== null) {
      if (!who.admin) return problem(res, 403, 'forbidden', 'Only an admin may force a rung');
      if (forced === 5)
        return problem(res, 503, 'capacity-unavailable', 'The appliance is at capacity', { 'Retry-After': '3', 'X-Airlock-Rung': '5' });
    }
    const rungMatch = /rung (\d)/.exec(q);
    const rung = Number.isInteger(forced) ? Math.min(4, forced) : rungMatch ? Math.min(4, parseInt(rungMatch[1], 10)) : 0;
    let citations = DOCS.map((d, i) => ({ n: i + 1, chunk_id: 1000 + i, ...d }));
    let text = DEFAULT_ANSWER;
    let delay = tokenDelay;
    if (q.includes('hostile')) {
      citations = [{ n: 1, chunk_id: 666, ...HOSTILE_DOC }];
      text = HOSTILE_ANSWER;
    } else if (q.includes('nothing')) {
      citations = [];
      text = 'I could not find this in the documents you can read.';
    } else if (q.includes('slow')) {
      text = SLOW_WORDS;
      delay = 125;
    } else if (q.includes('unsupported')) {
      text = 'The fee is EUR 1,234,567.';
    }
    if (rung >= 2) citations = citations.slice(0, 2);

    const id = `chatcmpl-dev${++seq}`;
    state.requestIds.set(id, who.user);
    state.lastRequestId = id;
    const model = body.model || 'airlock-large';
    res.writeHead(200, {
      'Content-Type': 'text/event-stream',
      'Cache-Control': 'no-cache',
      'X-Airlock-Rung': String(rung),
      'X-Request-Id': id,
    });
    let closed = false;
    let finished = false;
    res.on('close', () => {
      closed = true;
      if (!finished) state.cancelled += 1;
    });
    const send = (obj) => res.write(`data: ${JSON.stringify(obj)}\n\n`);
    const chunk = (delta, finish = null, extra = {}) => ({
      id,
      object: 'chat.completion.chunk',
      created: Math.floor(Date.now() / 1000),
      model,
      choices: [{ index: 0, delta, finish_reason: finish }],
      ...extra,
    });
    await sleep(q.includes('slow') ? 300 : 150); // "retrieval"
    if (closed) return;
    send(chunk({ role: 'assistant', content: '' }, null, { airlock: { citations, rung } }));
    // Split into small pieces (keeping whitespace) like a tokenizer would; also split a CRLF
    // boundary once to exercise the client's parser.
    const pieces = text.match(/\s*\S{1,6}|\s+/g) || [];
    for (let i = 0; i < pieces.length; i++) {
      if (closed) return;
      if (q.includes('break') && i === Math.floor(pieces.length / 2)) {
        finished = true;
        res.destroy();
        return;
      }
      send(chunk({ content: pieces[i] }));
      await sleep(delay);
    }
    if (closed) return;
    // The daemon names the sources the answer used on the last event (API.md): the default
    // answer cites [1] and [2] with markers; the others use none ("unsupported": a figure that
    // no source holds, as the daemon reports it).
    const cited = text === DEFAULT_ANSWER ? [1, 2].filter((n) => n <= citations.length) : [];
    const citedBy = q.includes('unsupported') ? 'unsupported' : 'markers';
    send(chunk({}, 'stop', { airlock: { cited, cited_by: citedBy } }));
    res.write('data: [DONE]\n\n');
    finished = true;
    state.completed += 1;
    res.end();
  }

  await new Promise((resolve) => server.listen(opts.port ?? 0, '127.0.0.1', resolve));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    state,
    tokens: { user: 'dev-alice', admin: 'dev-admin' },
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections?.();
        server.close(() => resolve());
      }),
  };
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const i = process.argv.indexOf('--port');
  const port = i > 0 ? parseInt(process.argv[i + 1], 10) : 8787;
  const srv = await startDevServer({ port });
  console.log(`FAKE Airlock API (dev aid only) serving appliance/ui at ${srv.url}/`);
  console.log('tokens: dev-alice (user), dev-admin (admin)');
}
