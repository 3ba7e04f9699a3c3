// The only code that talks to the daemon. Every call goes to the page's own origin (the CSP
// allows `connect-src 'self'` only) with `Authorization: Bearer <token>` or the sign-in
// session's cookie (plus its `X-Airlock-CSRF` header on writes), and every error is
// turned into an ApiError from the RFC 9457 problem body the daemon sends (API.md).

import { SseParser } from './sse.js';

/** An error answer from the daemon, a network failure, or a broken stream. */
export class ApiError extends Error {
  /**
   * @param {object} p
   * @param {number} p.status HTTP status, 0 for a network failure, -1 for a broken stream
   * @param {string} [p.slug] problem type slug (`rate-limited`, `capacity-unavailable`, …)
   * @param {string} [p.title]
   * @param {string} [p.detail]
   * @param {number | null} [p.retryAfter] seconds from the Retry-After header
   */
  constructor({ status, slug = '', title = '', detail = '', retryAfter = null }) {
    super(title || `HTTP ${status}`);
    this.name = 'ApiError';
    this.status = status;
    this.slug = slug;
    this.title = title;
    this.detail = detail;
    this.retryAfter = retryAfter;
  }
}

/**
 * Parses a Retry-After header: delay-seconds or an HTTP date (RFC 9110 §10.2.3).
 * @param {string | null} value
 * @param {number} [nowMs]
 * @returns {number | null} whole seconds to wait (≥ 0), or null when absent or unreadable
 */
export function parseRetryAfter(value, nowMs = Date.now()) {
  if (value == null) return null;
  const v = value.trim();
  if (/^\d+$/.test(v)) return Math.min(parseInt(v, 10), 86400);
  if (!/[a-z]/i.test(v)) return null;
  const when = Date.parse(v);
  if (Number.isNaN(when)) return null;
  return Math.max(0, Math.min(86400, Math.ceil((when - nowMs) / 1000)));
}

/**
 * Slug of a problem `type` URI (`https://airlock.local/problems/rate-limited` → `rate-limited`).
 * @param {unknown} type
 */
export function problemSlug(type) {
  if (typeof type !== 'string') return '';
  const m = /\/problems\/([a-z0-9-]+)\/?$/.exec(type);
  return m ? m[1] : '';
}

/**
 * Builds an ApiError from a non-2xx response (reads a problem+json body when there is one).
 * @param {Response} res
 */
export async function errorFromResponse(res) {
  let body = null;
  try {
    const text = await res.text();
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  const isObj = body !== null && typeof body === 'object';
  return new ApiError({
    status: res.status,
    slug: isObj ? problemSlug(body.type) : '',
    title: isObj && typeof body.title === 'string' ? body.title : res.statusText,
    detail: isObj && typeof body.detail === 'string' ? body.detail : '',
    retryAfter: parseRetryAfter(res.headers.get('Retry-After')),
  });
}

/** True for the error fetch() throws when its AbortSignal fires. */
export function isAbort(err) {
  return err !== null && typeof err === 'object' && err.name === 'AbortError';
}

/**
 * Reads the numeric ladder rung from a header or an `airlock` object.
 * @param {unknown} v
 * @returns {number | null}
 */
export function rungOf(v) {
  const n = typeof v === 'number' ? v : typeof v === 'string' && /^\d+$/.test(v.trim()) ? parseInt(v, 10) : NaN;
  return Number.isInteger(n) && n >= 0 && n <= 5 ? n : null;
}

/**
 * Where a citation's chunk sits in its original file (only well-formed fields are kept).
 * @param {any} c
 * @returns {{page?: number, slide?: number, sheet?: string, rows?: [number, number], section?: string[]}}
 */
export function cleanAnchor(c) {
  const a = {};
  const count = (v) => Number.isInteger(v) && v >= 1 && v <= 1e7;
  if (count(c.page)) a.page = c.page;
  if (count(c.slide)) a.slide = c.slide;
  if (typeof c.sheet === 'string' && c.sheet) a.sheet = c.sheet.slice(0, 200);
  if (Array.isArray(c.rows) && c.rows.length === 2 && c.rows.every(count) && c.rows[0] <= c.rows[1]) {
    a.rows = [c.rows[0], c.rows[1]];
  }
  if (Array.isArray(c.section)) {
    const path = c.section.filter((s) => typeof s === 'string' && s).slice(0, 8).map((s) => s.slice(0, 200));
    if (path.length) a.section = path;
  }
  return a;
}

/**
 * A passage is kept only when it is part of its snippet (so it can be highlighted there).
 * @param {unknown} passage
 * @param {string} snippet
 * @returns {string}
 */
function cleanPassage(passage, snippet) {
  return typeof passage === 'string' && passage && snippet.includes(passage) ? passage : '';
}

/**
 * Keeps only well-formed citations (the UI never trusts a shape it has not checked).
 * @param {unknown} list
 * @returns {{n: number, doc_id: string, chunk_id: number | null, title: string, snippet: string, passage: string, score: number | null, anchor: ReturnType<typeof cleanAnchor>}[]}
 */
export function cleanCitations(list) {
  if (!Array.isArray(list)) return [];
  const seen = new Set();
  const out = [];
  for (const c of list) {
    if (!c || typeof c !== 'object') continue;
    const n = Number(c.n);
    if (!Number.isInteger(n) || n < 1 || n > 999 || seen.has(n)) continue;
    seen.add(n);
    out.push({
      n,
      doc_id: typeof c.doc_id === 'string' ? c.doc_id : '',
      chunk_id: Number.isFinite(c.chunk_id) ? c.chunk_id : null,
      title: typeof c.title === 'string' ? c.title : '',
      snippet: typeof c.snippet === 'string' ? c.snippet : '',
      passage: cleanPassage(c.passage, typeof c.snippet === 'string' ? c.snippet : ''),
      score: typeof c.score === 'number' && Number.isFinite(c.score) ? c.score : null,
      anchor: cleanAnchor(c),
    });
  }
  return out.sort((a, b) => a.n - b.n);
}

/**
 * The answer-based excerpts of a stream's last event (`airlock.passages`): `{n, snippet,
 * passage}` with the passage inside its snippet; anything else is dropped.
 * @param {unknown} list
 * @returns {{n: number, snippet: string, passage: string}[]}
 */
export function cleanPassages(list) {
  if (!Array.isArray(list)) return [];
  const out = [];
  for (const p of list) {
    if (!p || typeof p !== 'object') continue;
    const n = Number(p.n);
    if (!Number.isInteger(n) || n < 1 || n > 999 || typeof p.snippet !== 'string') continue;
    const passage = cleanPassage(p.passage, p.snippet);
    if (passage) out.push({ n, snippet: p.snippet, passage });
  }
  return out;
}

/**
 * The source numbers an answer used (`airlock.cited` on the stream's last event): positive
 * integers, unique, ascending; anything else is dropped. `null` when the value is not a list.
 * @param {unknown} list
 * @returns {number[] | null}
 */
export function cleanCited(list) {
  if (!Array.isArray(list)) return null;
  const ns = list.filter((n) => Number.isInteger(n) && n >= 1 && n <= 999);
  return [...new Set(ns)].sort((a, b) => a - b);
}

/** What `GET /v1/auth/methods` says when the daemon has no such route: tokens only. */
export const TOKEN_ONLY = Object.freeze({ ldap: false, oidc: null, trusted_header: false, token: true });

/**
 * Keeps the well-formed parts of a `GET /v1/auth/methods` body. The OIDC link must be a path on
 * this origin (`/…`, not `//host`): the page never sends anyone elsewhere.
 * @param {unknown} m
 * @returns {{ldap: boolean, oidc: {display_name: string, login_url: string} | null, trusted_header: boolean, token: boolean}}
 */
export function cleanMethods(m) {
  if (!m || typeof m !== 'object') return { ...TOKEN_ONLY };
  const o = m.oidc;
  const oidc =
    o && typeof o === 'object' && typeof o.login_url === 'string' && /^\/(?![/\\])/.test(o.login_url)
      ? { display_name: typeof o.display_name === 'string' && o.display_name.trim() ? o.display_name.trim().slice(0, 80) : 'your identity provider', login_url: o.login_url }
      : null;
  return { ldap: m.ldap === true, oidc, trusted_header: m.trusted_header === true, token: m.token !== false };
}

/**
 * A client bound to one bearer token; with an empty token it sends none: a sign-in session's
 * cookie (directory or IdP sign-in) or, behind an SSO proxy in trusted-header mode, the proxy
 * authenticates every request. Then `csrf` is the CSRF token (a session's from its sign-in,
 * the proxy's from `GET /v1/info`), sent in `X-Airlock-CSRF` on every state-changing request.
 */
export class Api {
  /**
   * @param {string} token
   * @param {typeof fetch} [fetchImpl]
   */
  constructor(token, fetchImpl = (...a) => fetch(...a)) {
    this.token = token;
    this.fetch = fetchImpl;
    this.csrf = '';
  }

  /**
   * @param {Record<string, string>} [extra]
   * @param {boolean} [write] a state-changing request (gets the CSRF header of a session)
   */
  headers(extra = {}, write = false) {
    const h = this.token ? { Authorization: `Bearer ${this.token}`, ...extra } : { ...extra };
    if (write && !this.token && this.csrf) h['X-Airlock-CSRF'] = this.csrf;
    return h;
  }

  /** `GET /v1/auth/methods` (no authentication): the sign-ins to offer; tokens only without it. */
  async methods() {
    try {
      return cleanMethods(await this.getJson('/v1/auth/methods'));
    } catch {
      return { ...TOKEN_ONLY };
    }
  }

  /**
   * `POST /v1/auth/login`: directory sign-in. Resolves to `{user, groups, expires_at,
   * csrf_token}` (the session cookie is set by the response); throws ApiError.
   * @param {string} username
   * @param {string} password
   */
  async login(username, password) {
    let res;
    try {
      res = await this.fetch('/v1/auth/login', {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', Accept: 'application/json' },
        body: JSON.stringify({ username, password }),
        cache: 'no-store',
      });
    } catch {
      throw new ApiError({ status: 0, title: 'Network error' });
    }
    if (!res.ok) throw await errorFromResponse(res);
    try {
      return await res.json();
    } catch {
      throw new ApiError({ status: res.status, title: 'Unreadable response' });
    }
  }

  /** `POST /v1/auth/logout`: ends the session of the cookie (with its CSRF header); throws ApiError. */
  async logout() {
    let res;
    try {
      res = await this.fetch('/v1/auth/logout', { method: 'POST', headers: this.headers({}, true), cache: 'no-store' });
    } catch {
      throw new ApiError({ status: 0, title: 'Network error' });
    }
    if (!res.ok) throw await errorFromResponse(res);
  }

  /**
   * GET a JSON resource; throws ApiError.
   * @param {string} path
   * @param {AbortSignal} [signal]
   */
  /**
   * `GET /v1/documents/{id}/file`: the original file of a document the caller may read, as a
   * Blob (throws ApiError: 404 for a document that is missing or not readable, alike).
   * @param {string} docId
   * @returns {Promise<Blob>}
   */
  async documentFile(docId) {
    let res;
    try {
      res = await this.fetch(`/v1/documents/${encodeURIComponent(docId)}/file`, {
        headers: this.headers({}),
        cache: 'no-store',
      });
    } catch (e) {
      throw new ApiError({ status: 0, title: 'Network error' });
    }
    if (!res.ok) throw await errorFromResponse(res);
    return res.blob();
  }

  async getJson(path, signal) {
    let res;
    try {
      res = await this.fetch(path, { headers: this.headers({ Accept: 'application/json' }), signal, cache: 'no-store' });
    } catch (e) {
      if (isAbort(e)) throw e;
      throw new ApiError({ status: 0, title: 'Network error' });
    }
    if (!res.ok) throw await errorFromResponse(res);
    try {
      return await res.json();
    } catch {
      throw new ApiError({ status: res.status, title: 'Unreadable response' });
    }
  }

  /** `GET /v1/models` (also serves as the token check at sign-in). */
  models() {
    return this.getJson('/v1/models');
  }

  /**
   * `GET /v1/info` (proposed: `{bundle_version, user, ...}`); resolves to null when the
   * daemon has no such route (404/405) so the page can fall back.
   */
  async info() {
    try {
      return await this.getJson('/v1/info');
    } catch (e) {
      if (e instanceof ApiError && (e.status === 404 || e.status === 405)) return null;
      throw e;
    }
  }

  /** `GET /v1/conversations`: the caller's server-kept threads, most recent first. */
  async threads() {
    const r = await this.getJson('/v1/conversations');
    return Array.isArray(r?.data) ? r.data : [];
  }

  /** `GET /v1/conversations/{id}`: one thread with its turns (redacted ones without text). */
  thread(id) {
    return this.getJson(`/v1/conversations/${encodeURIComponent(id)}`);
  }

  /**
   * `POST /v1/conversations`: a new thread titled after its first question.
   * @param {string} title
   */
  async createThread(title) {
    let res;
    try {
      res = await this.fetch('/v1/conversations', {
        method: 'POST',
        headers: this.headers({ 'Content-Type': 'application/json', Accept: 'application/json' }, true),
        body: JSON.stringify({ title }),
      });
    } catch (e) {
      throw new ApiError({ status: 0, title: 'Network error' });
    }
    if (!res.ok) throw await errorFromResponse(res);
    return res.json();
  }

  /** `POST /v1/connectors/{alias}/sync` (operator): asks the daemon to sync a source now. */
  async connectorSync(alias) {
    let res;
    try {
      res = await this.fetch(`/v1/connectors/${encodeURIComponent(alias)}/sync`, {
        method: 'POST',
        headers: this.headers({ Accept: 'application/json' }, true),
      });
    } catch (e) {
      throw new ApiError({ status: 0, title: 'Network error' });
    }
    if (!res.ok) throw await errorFromResponse(res);
    return res.json().catch(() => ({}));
  }

  /**
   * `POST /v1/feedback` (see "Feedback" in docs/api/answers.md).
   * @param {{request_id: string, rating: 'up' | 'down', comment?: string}} body
   */
  async feedback(body) {
    let res;
    try {
      res = await this.fetch('/v1/feedback', {
        method: 'POST',
        headers: this.headers({ 'Content-Type': 'application/json', Accept: 'application/json' }, true),
        body: JSON.stringify(body),
      });
    } catch (e) {
      throw new ApiError({ status: 0, title: 'Network error' });
    }
    if (!res.ok) throw await errorFromResponse(res);
    return res.json().catch(() => ({}));
  }

  /**
   * Streams `POST /v1/chat/completions`. Resolves when the stream ends with `[DONE]`; rejects
   * with ApiError (HTTP error, broken stream) or the AbortError of `signal`.
   * @param {object} req
   * @param {{role: string, content: string}[]} req.messages
   * @param {string} [req.model]
   * @param {AbortSignal} [req.signal]
   * @param {(meta: {citations?: ReturnType<typeof cleanCitations>, passages?: ReturnType<typeof cleanPassages>, rung?: number | null, requestId?: string, bundleVersion?: string}) => void} req.onMeta
   * @param {(text: string) => void} req.onDelta
   * @returns {Promise<{finishReason: string | null}>}
   */
  async chatStream({ messages, model, conversationId, signal, onMeta, onDelta }) {
    const body = { messages, stream: true, airlock: { retrieval: true } };
    if (conversationId) body.airlock.conversation_id = conversationId;
    if (model) body.model = model;
    let res;
    try {
      res = await this.fetch('/v1/chat/completions', {
        method: 'POST',
        headers: this.headers({ 'Content-Type': 'application/json', Accept: 'text/event-stream' }, true),
        body: JSON.stringify(body),
        signal,
        cache: 'no-store',
      });
    } catch (e) {
      if (isAbort(e)) throw e;
      throw new ApiError({ status: 0, title: 'Network error' });
    }
    const headerRung = rungOf(res.headers.get('X-Airlock-Rung'));
    if (!res.ok) throw await errorFromResponse(res);
    const headerRequestId = res.headers.get('X-Request-Id') || '';
    onMeta({ rung: headerRung, requestId: headerRequestId || undefined });
    if (!res.body) throw new ApiError({ status: -1, title: 'Empty response' });

    const reader = res.body.getReader();
    const decoder = new TextDecoder('utf-8');
    const parser = new SseParser();
    let finishReason = null;
    let done = false;
    let first = true;
    try {
      while (!done) {
        const { value, done: eof } = await reader.read();
        const text = eof ? decoder.decode() : decoder.decode(value, { stream: true });
        for (const ev of parser.push(text)) {
          if (ev.data === '[DONE]') {
            done = true;
            break;
          }
          let chunk;
          try {
            chunk = JSON.parse(ev.data);
          } catch {
            continue; // a keep-alive or a line the UI does not understand
          }
          if (chunk && chunk.error) {
            const e = chunk.error;
            throw new ApiError({
              status: Number.isInteger(e.status) ? e.status : -1,
              slug: problemSlug(e.type),
              title: typeof e.title === 'string' ? e.title : typeof e.message === 'string' ? e.message : 'Generation failed',
              detail: typeof e.detail === 'string' ? e.detail : '',
            });
          }
          const meta = {};
          if (first && typeof chunk?.id === 'string' && chunk.id) meta.requestId = chunk.id;
          const ext = chunk?.airlock;
          if (ext && typeof ext === 'object') {
            if ('citations' in ext) meta.citations = cleanCitations(ext.citations);
            const cited = cleanCited(ext.cited);
            if (cited) meta.cited = cited;
            if (ext.cited_by === 'unsupported') meta.unsupported = true;
            const passages = cleanPassages(ext.passages);
            if (passages.length) meta.passages = passages;
            const r = rungOf(ext.rung);
            if (r !== null) meta.rung = r;
            if (typeof ext.bundle_version === 'string') meta.bundleVersion = ext.bundle_version;
          }
          first = false;
          if (Object.keys(meta).length) onMeta(meta);
          const choice = Array.isArray(chunk?.choices) ? chunk.choices[0] : null;
          const delta = choice?.delta?.content;
          if (typeof delta === 'string' && delta) onDelta(delta);
          if (choice?.finish_reason) finishReason = choice.finish_reason;
        }
        if (eof) break;
      }
    } catch (e) {
      if (isAbort(e) || e instanceof ApiError) throw e;
      throw new ApiError({ status: -1, title: 'The answer stream was interrupted' });
    } finally {
      if (!done) reader.cancel().catch(() => {});
    }
    if (!done) {
      parser.finish();
      throw new ApiError({ status: -1, title: 'The answer stream was interrupted' });
    }
    return { finishReason };
  }
}
