// Starts the real `airlock` daemon for the acceptance tests and seeds it through its public
// admin API (API.md): `airlock demo --setup-only --no-sample-data` makes a signed demo bundle,
// installs it and writes the admin token; `airlock serve` serves it; then users, documents
// (a slice of bank-dev with their iam_v1 grants, plus a hostile document) and tokens are
// created over HTTP, exactly as an operator's scripts would.

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import https from 'node:https';

const HERE = path.dirname(fileURLToPath(import.meta.url));
export const REPO = path.resolve(HERE, '../../..');

/** bank-dev location: AIRLOCK_SHARED_DIR/datasets/bank-dev, else ../shared beside the repo. */
export function bankDevDir() {
  const shared = process.env.AIRLOCK_SHARED_DIR || path.resolve(REPO, '../shared');
  return path.join(shared, 'datasets', 'bank-dev');
}

export function readJsonl(file) {
  return fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l));
}

export async function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

function run(bin, args, { env, log, timeoutMs }) {
  return new Promise((resolve, reject) => {
    const out = fs.openSync(log, 'a');
    fs.writeSync(out, `\n$ airlock ${args.join(' ')}\n`);
    // The repo root: `airlock demo`'s defaults (models-cache/staging, ../shared/datasets) are relative to it.
    const child = spawn(bin, args, { env, cwd: REPO, stdio: ['ignore', out, out] });
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`airlock ${args[0]} timed out after ${timeoutMs / 1000}s (log: ${log})`));
    }, timeoutMs);
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on('exit', (code) => {
      clearTimeout(timer);
      fs.closeSync(out);
      if (code === 0) resolve();
      else reject(new Error(`airlock ${args.join(' ')} exited with ${code}; log tail:\n${tail(log)}`));
    });
  });
}

export function tail(file, lines = 40) {
  try {
    return fs.readFileSync(file, 'utf8').split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}

/**
 * A running daemon.
 * @param {string} bin path to the `airlock` binary
 */
/**
 * `fetch` over HTTPS trusting only the CA in `ca` (PEM bytes): node's own fetch cannot be given
 * a CA per call. Returns what the tests read of a fetch Response (status, ok, headers.get, text,
 * json).
 */
export function fetchTrusting(ca) {
  return (u, { method = 'GET', headers = {}, body } = {}) =>
    new Promise((resolve, reject) => {
      const req = https.request(u, { method, headers, ca }, (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          const get = (k) => {
            const v = res.headers[k.toLowerCase()];
            return Array.isArray(v) ? v.join(', ') : (v ?? null);
          };
          resolve({
            status: res.statusCode,
            ok: res.statusCode >= 200 && res.statusCode < 300,
            headers: { get },
            text: async () => text,
            json: async () => JSON.parse(text),
          });
        });
      });
      req.on('error', reject);
      if (body !== undefined) req.write(body);
      req.end();
    });
}

/**
 * Sets up a demo data dir and starts `airlock serve` on loopback. `opts.port` picks the port;
 * `opts.ca` (a PEM file) means the configuration (AIRLOCK_CONFIG) has a `[tls]` table whose
 * certificate that CA issued for 127.0.0.1: the daemon is then reached over https:// and every
 * call here verifies it against that CA only. `opts.beforeServe(dataDir)` runs after the set-up,
 * before `airlock serve` starts.
 */
export async function startDaemon(bin, opts = {}) {
  const fetch = opts.ca ? fetchTrusting(fs.readFileSync(opts.ca)) : globalThis.fetch;
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'airlock-ui-test-'));
  const log = path.join(dataDir, 'daemon.log');
  const port = opts.port ?? (await freePort());
  // Short prompts and answers keep the small model quick on 2 cores; a long idle timeout keeps
  // a slow prefill on a loaded machine from ending the stream before its first token.
  const env = {
    AIRLOCK_TOP_K: '3',
    AIRLOCK_MAX_TOKENS: '128',
    AIRLOCK_STREAM_IDLE_TIMEOUT_SECS: '600',
    // The load-driven ladder is the daemon's own tests' subject (appliance/tests/integration/
    // ladder.rs). Here a debug build on 2 cores would step down to rung 4 after one slow answer
    // and time out the next questions in the queue; the shed path is tested with a forced rung.
    AIRLOCK_LADDER: 'false',
    AIRLOCK_LOG: 'info',
    ...process.env,
  };
  await run(bin, ['demo', '--data', dataDir, '--setup-only', '--no-sample-data'], { env, log, timeoutMs: 15 * 60_000 });
  const tokens = JSON.parse(fs.readFileSync(path.join(dataDir, 'demo', 'tokens.json'), 'utf8'));
  if (typeof tokens.admin !== 'string') throw new Error('demo/tokens.json has no admin token');

  // A test's own preparation of the data directory before the daemon starts (e.g. a corpus in
  // its ingest queue).
  if (opts.beforeServe) await opts.beforeServe(dataDir);

  const out = fs.openSync(log, 'a');
  fs.writeSync(out, `\n$ airlock serve --data ${dataDir} --port ${port} --bind 127.0.0.1\n`);
  const child = spawn(bin, ['serve', '--data', dataDir, '--port', String(port), '--bind', '127.0.0.1'], {
    env,
    cwd: REPO,
    stdio: ['ignore', out, out],
  });
  let exited = null;
  child.on('exit', (code, signal) => {
    exited = { code, signal };
  });
  const url = `${opts.ca ? 'https' : 'http'}://127.0.0.1:${port}`;
  const deadline = Date.now() + 5 * 60_000;
  for (;;) {
    if (exited) throw new Error(`airlock serve exited early (${JSON.stringify(exited)}); log tail:\n${tail(log)}`);
    try {
      const r = await fetch(`${url}/readyz`);
      if (r.ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`airlock serve not ready after 5 min; log tail:\n${tail(log)}`);
    }
    await new Promise((r) => setTimeout(r, 250));
  }

  const admin = tokens.admin;
  // The demo's second operator: a change that lets its maker read more (a token for a user with
  // groups, a grant to oneself) needs a second person's approval (docs/operations/roles.md, "Four eyes on access").
  const approver = tokens.approver;
  async function send(method, p, body, token, extra = {}) {
    const headers = { Authorization: `Bearer ${token}`, ...extra };
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const r = await fetch(url + p, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await r.text();
    let json = null;
    try {
      json = text ? JSON.parse(text) : null;
    } catch {
      json = null;
    }
    return { status: r.status, headers: r.headers, json, text };
  }
  /** The approval request (`POST /v1/acl/approvals` body) for an admin call, or null. */
  function changeOf(method, p, body) {
    const m = /^\/v1\/(acl\/users|acl\/documents|documents)\/([^/]+)(\/token)?$/.exec(p);
    if (!m) return null;
    const id = decodeURIComponent(m[2]);
    if (m[1] === 'acl/users' && m[3] && method === 'POST') return { action: 'token_issue', user_id: id };
    if (m[1] === 'acl/users' && method === 'PUT') return { action: 'user_put', user_id: id, groups: body.groups, ...(body.roles ? { roles: body.roles } : {}) };
    if (m[1] === 'acl/documents' && method === 'PUT') return { action: 'document_grants', doc_id: id, users: body.users, groups: body.groups };
    if (m[1] === 'documents' && method === 'PUT' && body?.acl) return { action: 'document_grants', doc_id: id, users: body.acl.users, groups: body.acl.groups };
    return null;
  }
  async function api(method, p, body, token = admin) {
    const r = await send(method, p, body, token);
    const change = r.status === 403 && /approval-required$/.test(r.json?.type ?? '') && approver && token !== approver ? changeOf(method, p, body) : null;
    if (!change) return r;
    const a = await send('POST', '/v1/acl/approvals', change, approver);
    if (a.status !== 201) throw new Error(`approval of ${method} ${p} → ${a.status} ${a.text.slice(0, 300)}`);
    return send(method, p, body, token, { 'X-Airlock-Approval': a.json.approval });
  }
  async function must(method, p, body, token) {
    const r = await api(method, p, body, token);
    if (r.status >= 300) throw new Error(`${method} ${p} → ${r.status} ${r.text.slice(0, 300)}`);
    return r;
  }

  /** Like `must`, but waits out 503 sheds (Retry-After) for up to `timeoutMs`. */
  async function admitted(method, p, body, token, timeoutMs = 600_000) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const r = await api(method, p, body, token);
      if (r.status !== 503 || Date.now() > deadline) {
        if (r.status >= 300) throw new Error(`${method} ${p} → ${r.status} ${r.text.slice(0, 300)}`);
        return r;
      }
      const wait = Math.min(30, Math.max(1, parseInt(r.headers.get('retry-after') || '2', 10)));
      await new Promise((res) => setTimeout(res, wait * 1000));
    }
  }

  return {
    url,
    /** `fetch` for this daemon (over HTTPS: verified against `opts.ca`). */
    fetch,
    dataDir,
    admitted,
    log,
    adminToken: admin,
    api,
    must,
    async metrics() {
      return (await must('GET', '/metrics')).text;
    },
    async stop() {
      if (!exited) {
        child.kill('SIGTERM');
        const t0 = Date.now();
        while (!exited && Date.now() - t0 < 15_000) await new Promise((r) => setTimeout(r, 100));
        if (!exited) child.kill('SIGKILL');
      }
      fs.closeSync(out);
      if (!process.env.AIRLOCK_KEEP_TEST_DATA) fs.rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/** A title and text a careless renderer would execute. */
export const HOSTILE = {
  doc_id: 'ui-hostile-0001',
  title: 'Zephyrine escrow note <img src=x onerror="window.__pwned=\'title\'"><script>window.__pwned="title"</script>',
  text:
    'Zephyrine escrow note. <script>window.__pwned="doc"</script> The Zephyrine vendor escrow ' +
    'arrangement is reviewed <img src=x onerror="window.__pwned=\'img\'"> every quarter by the treasury ' +
    'desk. <iframe src="javascript:window.__pwned=\'frame\'"></iframe> Escrow releases need two ' +
    'signatures. <a href="javascript:window.__pwned=\'link\'">details</a>\n\n' +
    'Zephyrine escrow review checklist: confirm the balance, confirm the signatories, file the note. ' +
    '<svg onload="window.__pwned=\'svg\'"></svg>',
};

/**
 * Picks the cases and documents the acceptance tests use, from bank-dev (no hard-coded ids):
 * the first answerable case, the first acl_denied case, the grants of their documents from
 * iam_v1, and a few all-staff documents as distractors.
 */
export function planFromBankDev() {
  const dir = bankDevDir();
  const golden = readJsonl(path.join(dir, 'golden.jsonl'));
  const iam = readJsonl(path.join(dir, 'iam_v1.jsonl'));
  const corpus = new Map(readJsonl(path.join(dir, 'corpus.jsonl')).map((d) => [d.doc_id, d]));
  const groupsOf = new Map(iam.filter((l) => l.user).map((l) => [l.user, l.groups]));
  const grantOf = new Map(iam.filter((l) => l.doc).map((l) => [l.doc, { users: l.users, groups: l.groups }]));
  const canRead = (user, doc) => {
    const g = grantOf.get(doc);
    if (!g) return false;
    const groups = groupsOf.get(user) || [];
    return g.users.includes(user) || g.groups.some((x) => groups.includes(x));
  };

  const answerable = golden.find(
    (c) => c.kind === 'answerable' && c.relevant_doc_ids.length === 1 && c.valid_phases.includes('v1') && groupsOf.has(c.user),
  );
  const denied = golden.find(
    (c) =>
      c.kind === 'acl_denied' &&
      c.valid_phases.includes('v1') &&
      groupsOf.has(c.user) &&
      c.user !== answerable.user &&
      c.forbidden_doc_ids.length > 0 &&
      c.forbidden_strings.length > 0,
  );
  // Someone who may read the denied case's document: the positive control for the leak check.
  const insider = [...groupsOf.keys()].find((u) => denied.forbidden_doc_ids.every((d) => canRead(u, d)) && u !== denied.user);

  const docIds = new Set([...answerable.relevant_doc_ids, ...denied.forbidden_doc_ids]);
  for (const [id, g] of grantOf) {
    if (docIds.size >= 24) break;
    if (g.groups.includes('all-staff') && corpus.has(id)) docIds.add(id);
  }
  const docs = [...docIds].map((id) => ({ ...corpus.get(id), acl: grantOf.get(id) }));
  const users = [answerable.user, denied.user, insider].map((u) => ({ user: u, groups: groupsOf.get(u) }));
  return { answerable, denied, insider, docs, users, corpus };
}

/** Seeds users, documents and tokens; returns `{user → token}`. */
export async function seed(daemon, plan) {
  for (const { user, groups } of plan.users) await daemon.must('PUT', `/v1/acl/users/${encodeURIComponent(user)}`, { groups });
  for (const d of plan.docs) {
    await daemon.must('PUT', `/v1/documents/${encodeURIComponent(d.doc_id)}`, {
      title: d.title,
      text: d.text,
      metadata: d.metadata ?? {},
      acl: { users: d.acl.users, groups: d.acl.groups },
    });
  }
  await daemon.must('PUT', `/v1/documents/${HOSTILE.doc_id}`, {
    title: HOSTILE.title,
    text: HOSTILE.text,
    metadata: {},
    acl: { users: [plan.answerable.user], groups: [] },
  });
  const tokens = {};
  for (const { user } of plan.users) {
    tokens[user] = (await daemon.must('POST', `/v1/acl/users/${encodeURIComponent(user)}/token`)).json.token;
  }
  return tokens;
}
