// The operator console (/admin): pages over `GET /v1/admin/...` and `GET /v1/connectors`, read-only but for a connector's "Sync now" (docs/api/sign-in-and-roles.md,
// "Operator console"). Sign-in as on the chat page: the tab's bearer token, or the sign-in
// session's cookie (directory or identity provider) when there is no token. Which pages a
// person sees follows their roles from `GET /v1/info`; the daemon's role table decides anyway.
// Everything is built with createElement/textContent: nothing from the API is parsed as HTML.

import { Api, ApiError } from './api.js';
import { clearCsrf, clearToken, loadCsrf, loadToken, saveToken } from './store.js';

const ALL = ['admin', 'operator', 'auditor'];

/** The pages, in menu order, and who may open them (as crate::roles::ROUTES says). */
export const PAGES = [
  { id: 'documents', label: 'Documents', roles: ['operator'] },
  { id: 'users', label: 'Users and groups', roles: ALL },
  { id: 'syncs', label: 'IAM sync', roles: ALL },
  { id: 'capacity', label: 'Capacity', roles: ALL },
  { id: 'connectors', label: 'Connectors', roles: ['operator'] },
  { id: 'feedback', label: 'Feedback', roles: ['operator'] },
  { id: 'evals', label: 'Eval reports', roles: ['operator', 'auditor'] },
  { id: 'audit', label: 'Audit search', roles: ['admin', 'auditor'] },
];

/** Page size the console asks for (the API allows up to 200). */
export const PAGE_SIZE = 25;

const $ = (id) => document.getElementById(id);

/** An element with attributes/properties and children (strings become text nodes). */
function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const str = (v) => (v === null || v === undefined || v === '' ? '—' : String(v));
const when = (v) => (typeof v === 'string' ? v.replace('T', ' ').replace(/\.\d+/, '').replace(/Z$|\+00:00$/, ' UTC') : '—');
const num = (v, digits = 0) => (typeof v === 'number' && Number.isFinite(v) ? v.toFixed(digits) : '—');

/** A table: `cols` [{label, cell(row) → string | Node, wrap?}]. */
function table(caption, cols, rows) {
  const t = h(
    'table',
    { class: 'data' },
    h('caption', { class: 'visually-hidden' }, caption),
    h('thead', {}, h('tr', {}, cols.map((c) => h('th', { scope: 'col' }, c.label)))),
    h(
      'tbody',
      {},
      rows.map((r) => h('tr', {}, cols.map((c) => h('td', { class: c.wrap ? 'wrap' : c.mono ? 'mono' : null }, c.cell(r))))),
    ),
  );
  return h('div', { class: 'table-wrap', tabindex: '0', role: 'region', 'aria-label': caption }, t);
}

function figures(pairs) {
  return h(
    'dl',
    { class: 'figures' },
    pairs.map(([k, v]) => h('div', {}, h('dt', {}, k), h('dd', {}, str(v)))),
  );
}

function errorBox(e) {
  const msg = e instanceof ApiError ? `${e.title}${e.detail ? `: ${e.detail}` : ''}` : String(e);
  return h('p', { class: 'page-error', role: 'alert' }, msg);
}

const state = { api: null, info: null, page: null, timer: null };

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') q.set(k, String(v));
  const s = q.toString();
  return s ? `?${s}` : '';
}

/** A filter form: fields [{name, label, type?, options?}] → onSubmit(values). */
function filterForm(label, fields, values, onSubmit) {
  const form = h('form', { class: 'filters', 'aria-label': label });
  for (const f of fields) {
    const id = `f-${f.name}`;
    const input = f.options
      ? h('select', { id, name: f.name }, f.options.map(([v, t]) => h('option', { value: v, selected: values[f.name] === v }, t)))
      : h('input', { id, name: f.name, type: f.type || 'text', value: values[f.name] || '', autocomplete: 'off', spellcheck: 'false', placeholder: f.placeholder });
    form.append(h('div', { class: 'f' }, h('label', { for: id }, f.label), input));
  }
  form.append(h('button', { type: 'submit', class: 'btn primary' }, 'Apply'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const out = {};
    for (const f of fields) out[f.name] = form.elements[f.name].value.trim();
    onSubmit(out);
  });
  return form;
}

/**
 * A paged list: `load(cursor)` → {rows, next}; renders `render(rows)` with Next/First buttons.
 * Returns the container.
 */
function pagedList(load, render) {
  const box = h('div');
  const stack = [];
  async function show(cursor) {
    box.replaceChildren(h('p', { class: 'note', role: 'status' }, 'Loading…'));
    let res;
    try {
      res = await load(cursor);
    } catch (e) {
      box.replaceChildren(errorBox(e));
      return;
    }
    const pager = h('div', { class: 'pager' });
    if (stack.length) {
      pager.append(h('button', { type: 'button', class: 'btn', onclick: () => { stack.length = 0; show(undefined); } }, 'First page'));
    }
    if (res.next !== null && res.next !== undefined) {
      pager.append(h('button', { type: 'button', class: 'btn', onclick: () => { stack.push(cursor); show(res.next); } }, 'Next page'));
    }
    pager.append(h('span', { class: 'note' }, `Page ${stack.length + 1} · ${res.rows.length} shown`));
    box.replaceChildren(res.rows.length ? render(res.rows) : h('p', { class: 'note' }, 'Nothing matches.'), pager);
  }
  show(undefined);
  return box;
}

// ---------------------------------------------------------------------------------------------
// Pages

const pages = {
  documents(root, params) {
    root.append(
      h('h2', { id: 'page-title', tabindex: '-1' }, 'Documents'),
      h('p', { class: 'note' }, 'Find a document by id or title prefix. Titles, ids, versions and counts only. Refusals of the background ingest are listed below; those of `airlock ingest` are in its report, those of an upload in its answer.'),
      filterForm('Document filters', [
        { name: 'q', label: 'Id or title starts with' },
        { name: 'status', label: 'Status', options: [['all', 'All'], ['live', 'Live'], ['deleted', 'Deleted']] },
      ], params, (v) => go('documents', v)),
    );
    const detail = h('div', { class: 'detail', id: 'doc-detail', hidden: true });
    root.append(
      pagedList(
        async (after) => {
          const r = await state.api.getJson(`/v1/admin/documents${query({ q: params.q, status: params.status, after, limit: PAGE_SIZE })}`);
          return { rows: r.documents, next: r.next_after };
        },
        (rows) =>
          table('Documents', [
            { label: 'Id', cell: (d) => h('button', { type: 'button', class: 'btn link', onclick: () => openDocument(d.doc_id, detail) }, d.doc_id) },
            { label: 'Title', cell: (d) => str(d.title), wrap: true },
            { label: 'Status', cell: (d) => h('span', { class: `badge ${d.status === 'live' ? 'ok' : 'bad'}` }, d.status) },
            { label: 'Version', cell: (d) => str(d.version).slice(0, 12), mono: true },
            { label: 'Chunks', cell: (d) => str(d.chunks) },
            { label: 'Anchored', cell: (d) => str(d.anchored_chunks) },
            { label: 'Updated', cell: (d) => when(d.updated_at) },
            { label: 'Deleted', cell: (d) => when(d.deleted_at) },
          ], rows),
      ),
      detail,
    );
    if (params.doc) openDocument(params.doc, detail);
    root.append(h('h3', {}, 'Background ingest'), ingestQueue());
  },

  users(root, params) {
    root.append(
      h('h2', { id: 'page-title', tabindex: '-1' }, 'Users and groups'),
      h('p', { class: 'note' }, 'Readable documents: the live documents a user’s grants (or a group’s grant) open.'),
      filterForm('User and group filters', [{ name: 'q', label: 'Id starts with' }], params, (v) => go('users', v)),
      h('h3', {}, 'Users'),
      pagedList(
        async (after) => {
          const r = await state.api.getJson(`/v1/admin/users${query({ q: params.q, after, limit: PAGE_SIZE })}`);
          return { rows: r.users, next: r.next_after };
        },
        (rows) =>
          table('Users', [
            { label: 'User', cell: (u) => u.user_id, mono: true },
            { label: 'Roles', cell: (u) => (u.roles.length ? u.roles.join(', ') : 'user') },
            { label: 'Groups', cell: (u) => u.groups.join(', ') || '—', wrap: true },
            { label: 'Readable documents', cell: (u) => str(u.readable_documents) },
            { label: 'Local', cell: (u) => (u.local ? 'yes' : 'no') },
            { label: 'Token', cell: (u) => (u.has_token ? 'issued' : 'none') },
          ], rows),
      ),
      h('h3', {}, 'Groups'),
      pagedList(
        async (after) => {
          const r = await state.api.getJson(`/v1/admin/groups${query({ q: params.q, after, limit: PAGE_SIZE })}`);
          return { rows: r.groups, next: r.next_after };
        },
        (rows) =>
          table('Groups', [
            { label: 'Group', cell: (g) => g.group_id, mono: true },
            { label: 'Members', cell: (g) => str(g.members) },
            { label: 'Readable documents', cell: (g) => str(g.readable_documents) },
          ], rows),
      ),
    );
  },

  syncs(root) {
    const fresh = h('div');
    root.append(h('h2', { id: 'page-title', tabindex: '-1' }, 'IAM and directory sync'), fresh);
    root.append(
      pagedList(
        async (before) => {
          const r = await state.api.getJson(`/v1/admin/syncs${query({ before, limit: PAGE_SIZE })}`);
          const f = r.freshness || {};
          fresh.replaceChildren(
            figures([
              ['Last successful sync', when(f.last_success_at)],
              ['Age', typeof f.age_seconds === 'number' ? `${f.age_seconds} s` : 'never synced'],
            ]),
          );
          return { rows: r.runs, next: r.next_before };
        },
        (rows) =>
          table('Sync runs', [
            { label: 'Time', cell: (s) => when(s.at) },
            { label: 'Source', cell: (s) => str(s.source) },
            { label: 'Outcome', cell: (s) => h('span', { class: `badge ${s.outcome === 'applied' ? 'ok' : 'bad'}` }, s.outcome) },
            { label: 'By', cell: (s) => str(s.actor), mono: true },
            {
              label: 'Counts or error',
              wrap: true,
              cell: (s) =>
                s.outcome === 'applied'
                  ? Object.entries(s.counts || {}).map(([k, v]) => `${k.replace(/_/g, ' ')} ${v}`).join(' · ')
                  : str(s.error),
            },
          ], rows),
      ),
    );
  },

  capacity(root) {
    const box = h('div');
    const refresh = h('button', { type: 'button', class: 'btn', onclick: () => load() }, 'Refresh');
    root.append(
      h('h2', { id: 'page-title', tabindex: '-1' }, 'Capacity'),
      h('p', { class: 'note' }, 'The degradation ladder and admission now; rates are measured between two refreshes (every 5 s while this page is open).'),
      refresh,
      box,
    );
    let prev = null;
    async function load() {
      let r;
      try {
        r = await state.api.getJson('/v1/admin/capacity');
      } catch (e) {
        box.replaceChildren(errorBox(e));
        return;
      }
      const rate = (key, per = 1) => {
        if (!prev || r.at_unix <= prev.at_unix) return 'measuring…';
        return num(((r.totals[key] - prev.totals[key]) / (r.at_unix - prev.at_unix)) * per, 2);
      };
      box.replaceChildren(
        figures([
          ['Ladder rung', `${r.rung}${r.ladder_enabled ? '' : ' (ladder off)'}`],
          ['Pressure', num(r.pressure, 2)],
          ['In flight', r.inflight],
          ['Queue depth', r.queue_depth],
          ['KV cache used', `${num(r.kv_fraction * 100, 0)} %`],
          ['Queue wait (EWMA)', r.queue_wait_ewma_ms === null ? '—' : `${num(r.queue_wait_ewma_ms, 0)} ms`],
          ['Shed ratio', num(r.shed_ratio, 2)],
          ['Sheds, last minute', r.sheds_last_minute],
          ['Generated tokens/s', rate('generated_tokens')],
          ['Prompt tokens/s', rate('prompt_tokens')],
          ['Sheds/min', rate('shed_interactive', 60)],
          ['Sheds total', r.totals.shed_interactive + r.totals.shed_batch],
          ['Rate-limited total', r.totals.rate_limited_requests + r.totals.rate_limited_tokens],
        ]),
        h('h3', {}, 'Recent sheds'),
        r.recent_sheds.length
          ? table('Recent sheds', [
              { label: 'Time', cell: (s) => when(s.at) },
              { label: 'Priority', cell: (s) => s.priority },
            ], r.recent_sheds)
          : h('p', { class: 'note' }, 'No request was shed since the daemon started.'),
        h('p', { class: 'note' }, `As of ${when(r.at)}`),
      );
      prev = r;
    }
    load();
    state.timer = setInterval(load, 5000);
  },

  connectors(root) {
    const box = h('div');
    const said = h('p', { class: 'note', role: 'status' });
    root.append(
      h('h2', { id: 'page-title', tabindex: '-1' }, 'Connectors'),
      h('p', { class: 'note' }, 'Sources synced with their own permissions ([[connectors]]): each one\u2019s last run, lag and the files it could not take. Refreshed every 10 s while this page is open.'),
      said,
      box,
    );
    const ago = (unix, now) => {
      if (typeof unix !== 'number') return 'never';
      const s = Math.max(0, Math.round(now - unix));
      if (s < 120) return `${s} s ago`;
      if (s < 7200) return `${Math.round(s / 60)} min ago`;
      return `${num(s / 3600, 1)} h ago`;
    };
    const at = (unix) => (typeof unix === 'number' ? when(new Date(unix * 1000).toISOString()) : '—');
    async function syncNow(alias) {
      said.textContent = `Asking ${alias} to sync…`;
      try {
        await state.api.connectorSync(alias);
        said.textContent = `${alias}: sync requested.`;
      } catch (e) {
        said.textContent = e instanceof ApiError ? `${alias}: ${e.title}${e.detail ? `: ${e.detail}` : ''}` : String(e);
      }
      load();
    }
    function source(c, now) {
      const run = c.last_run;
      const outcome = !run ? h('span', { class: 'badge' }, 'not run yet') : run.error ? h('span', { class: 'badge bad' }, 'failed') : h('span', { class: 'badge ok' }, 'succeeded');
      const overdue = typeof c.last_success !== 'number' || now - c.last_success > 2 * 60 * c.interval_minutes;
      const counts = run ? Object.entries(run.counts || {}).map(([k, v]) => `${k.replace(/_/g, ' ')} ${v}`).join(' · ') : '—';
      return h(
        'section',
        { class: 'source', 'aria-label': `Connector ${c.alias}` },
        h('h3', {}, `${c.alias} `, h('span', { class: 'note' }, `${c.kind} ${c.location}`)),
        figures([
          ['State', c.running ? 'syncing now' : c.requested ? 'sync requested' : 'idle'],
          ['Last run', run ? `${run.error ? 'failed' : 'succeeded'} ${at(run.finished_at)}` : 'not run yet'],
          ['Last success', `${at(c.last_success)} (${ago(c.last_success, now)})`],
          ['Lag', overdue ? `over two intervals (${c.interval_minutes} min each)` : 'within two intervals'],
          ['Items', c.items],
          ['Files not taken', c.item_errors],
          ['Unknown principals', (c.unknown_principals || []).length],
          ['Runs since start', c.runs],
        ]),
        h('p', {}, outcome, ' ', run && run.error ? h('span', { class: 'page-error' }, run.error) : counts),
        (c.item_errors_listed || []).length
          ? table(`Files ${c.alias} could not take`, [
              { label: 'Path', cell: (e) => e.path, mono: true, wrap: true },
              { label: 'Reason', cell: (e) => e.reason, wrap: true },
            ], c.item_errors_listed)
          : null,
        h('button', { type: 'button', class: 'btn', disabled: c.running || c.requested, onclick: () => syncNow(c.alias) }, `Sync ${c.alias} now`),
      );
    }
    async function load() {
      let r;
      try {
        r = await state.api.getJson('/v1/connectors');
      } catch (e) {
        box.replaceChildren(errorBox(e));
        return;
      }
      const now = Date.now() / 1000;
      const list = r.data || [];
      box.replaceChildren(
        list.length
          ? h('div', {}, list.map((c) => source(c, now)))
          : h('p', { class: 'note' }, 'No connectors are configured ([[connectors]] in the configuration file; docs/operations/connectors.md).'),
      );
    }
    load();
    state.timer = setInterval(load, 10000);
  },

  feedback(root, params) {
    root.append(
      h('h2', { id: 'page-title', tabindex: '-1' }, 'Feedback review'),
      h('p', { class: 'note' }, 'Ratings and the comments people typed. Questions and answers are not shown here.'),
      filterForm('Feedback filters', [{ name: 'rating', label: 'Rating', options: [['', 'All'], ['up', 'Helpful'], ['down', 'Not helpful']] }], params, (v) => go('feedback', v)),
    );
    const totals = h('div');
    root.append(
      totals,
      pagedList(
        async (offset) => {
          const r = await state.api.getJson(`/v1/admin/feedback${query({ rating: params.rating, offset, limit: PAGE_SIZE })}`);
          totals.replaceChildren(figures([['Helpful', r.totals.up], ['Not helpful', r.totals.down]]));
          return { rows: r.feedback, next: r.next_offset };
        },
        (rows) =>
          table('Feedback', [
            { label: 'Time', cell: (f) => when(f.updated_at) },
            { label: 'Rating', cell: (f) => h('span', { class: `badge ${f.rating === 'up' ? 'ok' : 'bad'}` }, f.rating === 'up' ? 'helpful' : 'not helpful') },
            { label: 'Comment', cell: (f) => str(f.comment), wrap: true },
            { label: 'User', cell: (f) => f.user_id, mono: true },
            { label: 'Request', cell: (f) => f.request_id, mono: true },
            { label: 'Model', cell: (f) => f.model },
            { label: 'Rung', cell: (f) => str(f.rung) },
          ], rows),
      ),
    );
  },

  evals(root, params) {
    const detail = h('div', { class: 'detail', hidden: true });
    const note = h('p', { class: 'note' }, 'Aggregates of the reports in the configured directory; cases (queries, answers, ids) stay in the files.');
    root.append(h('h2', { id: 'page-title', tabindex: '-1' }, 'Eval reports'), note);
    root.append(
      pagedList(
        async (after) => {
          const r = await state.api.getJson(`/v1/admin/evals${query({ after, limit: PAGE_SIZE })}`);
          if (!r.configured) note.textContent = 'No eval reports directory is configured (eval_reports_dir).';
          return { rows: r.reports, next: r.next_after };
        },
        (rows) =>
          table('Eval reports', [
            { label: 'Report', cell: (r) => h('button', { type: 'button', class: 'btn link', onclick: () => openReport(r.name, detail) }, r.name) },
            { label: 'Set', cell: (r) => str(r.set) },
            { label: 'Bundle', cell: (r) => str(r.bundle_version) },
            { label: 'Cases', cell: (r) => str(r.overall?.cases) },
            { label: 'Leaking', cell: (r) => str(r.overall?.leaking_cases) },
            { label: 'Failed', cell: (r) => str(r.overall?.failed_cases) },
            { label: 'Written', cell: (r) => when(r.modified_at) },
          ], rows),
      ),
      detail,
    );
    if (params.report) openReport(params.report, detail);
  },

  audit(root, params) {
    root.append(
      h('h2', { id: 'page-title', tabindex: '-1' }, 'Audit search'),
      h('p', { class: 'note' }, 'Newest first. Entries hold ids, counts and digests, never document text, prompts or answers. Times are UTC.'),
      filterForm('Audit filters', [
        { name: 'user', label: 'User' },
        { name: 'doc_id', label: 'Document id' },
        { name: 'since', label: 'From (UTC)', type: 'datetime-local' },
        { name: 'until', label: 'Until (UTC)', type: 'datetime-local' },
        { name: 'kind', label: 'Kind', options: [['', 'All'], ['shown', 'shown'], ['recheck_drop', 'recheck_drop'], ['sync', 'sync'], ['admin', 'admin'], ['sign_in', 'sign_in'], ['receipt', 'receipt']] },
      ], params, (v) => go('audit', v)),
    );
    const utc = (v) => (v ? `${v.length === 16 ? `${v}:00` : v}Z` : undefined);
    root.append(
      pagedList(
        async (before) => {
          const r = await state.api.getJson(
            `/v1/admin/audit${query({ user: params.user, doc_id: params.doc_id, since: utc(params.since), until: utc(params.until), kind: params.kind, before, limit: PAGE_SIZE })}`,
          );
          return { rows: r.entries, next: r.next_before };
        },
        (rows) =>
          table('Audit entries', [
            { label: 'Seq', cell: (e) => str(e.seq) },
            { label: 'Time', cell: (e) => when(e.at) },
            { label: 'Kind', cell: (e) => e.kind },
            { label: 'Actor', cell: (e) => str(e.actor), mono: true },
            { label: 'User', cell: (e) => str(e.user_id), mono: true },
            { label: 'Request', cell: (e) => str(e.request_id), mono: true },
            { label: 'Detail', cell: (e) => JSON.stringify(e.detail), wrap: true, mono: true },
          ], rows),
      ),
    );
  },
};

/** The daemon's ingest queue (`GET /v1/info` `indexing`): the job in progress and the last finished jobs. */
function ingestQueue() {
  const box = h('div', { id: 'ingest-queue' });
  (async () => {
    let ix;
    try {
      ix = (await state.api.getJson('/v1/info')).indexing;
    } catch (e) {
      box.replaceChildren(errorBox(e));
      return;
    }
    if (!ix || (!ix.job && !Array.isArray(ix.finished))) {
      box.replaceChildren(h('p', { class: 'note' }, ix && ix.active ? 'A background ingest is running.' : 'No background ingest since the daemon started.'));
      return;
    }
    const parts = [];
    if (ix.job) {
      const j = ix.job;
      parts.push(
        figures([
          ['Job in progress', str(j.name)],
          ['Documents', `${str(j.docs_done)} of ${str(j.docs_total)}`],
          ['Refused', str(j.refused)],
          ['Chunks per second', typeof j.chunks_per_s === 'number' ? j.chunks_per_s.toFixed(1) : '—'],
          ['Time left', typeof j.eta_s === 'number' ? `${Math.round(j.eta_s)} s` : '—'],
          ['Queued behind it', str(ix.queued)],
          ['Last failure', j.last_error ? str(j.last_error) : 'none'],
        ]),
      );
    }
    const done = Array.isArray(ix.finished) ? ix.finished : [];
    parts.push(
      done.length
        ? table('Finished ingest jobs', [
            { label: 'Job', cell: (f) => str(f.name), mono: true },
            { label: 'Finished', cell: (f) => (typeof f.finished_at === 'number' ? when(new Date(f.finished_at * 1000).toISOString()) : '—') },
            { label: 'Stored', cell: (f) => str(f.stored) },
            { label: 'Refused', cell: (f) => h('span', { class: `badge ${f.refused ? 'bad' : 'ok'}` }, str(f.refused)) },
            { label: 'Seconds', cell: (f) => (typeof f.seconds === 'number' ? f.seconds.toFixed(0) : '—') },
            { label: 'First refusals', cell: (f) => (f.refusals || []).join(' · ') || '—', wrap: true },
          ], [...done].reverse())
        : h('p', { class: 'note' }, 'No job finished since the daemon started.'),
    );
    box.replaceChildren(...parts);
  })();
  return box;
}

async function openDocument(id, box) {
  box.hidden = false;
  box.replaceChildren(h('p', { class: 'note', role: 'status' }, 'Loading…'));
  let d;
  try {
    d = await state.api.getJson(`/v1/admin/documents/${encodeURIComponent(id)}`);
  } catch (e) {
    box.replaceChildren(errorBox(e));
    return;
  }
  const heading = h('h3', { tabindex: '-1' }, `Document ${d.doc_id}`);
  box.replaceChildren(
    heading,
    figures([
      ['Status', d.status],
      ['Title', d.title],
      ['Chunks', d.chunks],
      ['Anchored chunks', d.anchored_chunks],
      ['Readable by users', d.readable_by_users],
      ['Granted groups', (d.acl?.groups || []).join(', ') || 'none'],
      ['Granted users', (d.acl?.users || []).join(', ') || 'none'],
      [d.status === 'purged' ? 'Purged' : 'Deleted', when(d.purged_at || d.deleted_at)],
    ]),
    h('h3', {}, 'Versions'),
    d.versions.length
      ? table('Versions', [
          { label: 'Time', cell: (v) => when(v.at) },
          { label: 'Version', cell: (v) => str(v.version).slice(0, 16), mono: true },
          { label: 'Chunks', cell: (v) => str(v.chunks) },
          { label: 'Change', cell: (v) => str(v.status) },
          { label: 'By', cell: (v) => str(v.actor), mono: true },
        ], d.versions)
      : h('p', { class: 'note' }, 'No version is recorded in the audit log (ingested by the command line).'),
  );
  heading.focus();
}

async function openReport(name, box) {
  box.hidden = false;
  box.replaceChildren(h('p', { class: 'note', role: 'status' }, 'Loading…'));
  let r;
  try {
    r = await state.api.getJson(`/v1/admin/evals/${encodeURIComponent(name)}`);
  } catch (e) {
    box.replaceChildren(errorBox(e));
    return;
  }
  const metricTable = (caption, groups) => {
    const names = [...new Set(Object.values(groups).flatMap((g) => Object.keys(g.metrics || {})))];
    return table(caption, [
      { label: 'Group', cell: (row) => row[0] },
      { label: 'Cases', cell: (row) => str(row[1].cases) },
      { label: 'Leaking', cell: (row) => str(row[1].leaking_cases) },
      ...names.map((m) => ({ label: m, cell: (row) => num(row[1].metrics?.[m]?.mean, 3) })),
    ], Object.entries(groups));
  };
  const heading = h('h3', { tabindex: '-1' }, `Report ${r.name}`);
  box.replaceChildren(
    heading,
    figures([
      ['Set', r.set],
      ['Bundle', r.bundle_version],
      ['Forced rung', r.rung ?? 'none'],
      ['Cases', r.overall?.cases],
      ['Leaking cases', r.overall?.leaking_cases],
      ['Failed cases', r.overall?.failed_cases],
    ]),
    r.overall ? metricTable('Overall', { overall: r.overall }) : '',
    h('h3', {}, 'Per kind'),
    metricTable('Per kind', r.per_kind || {}),
    h('h3', {}, 'Per phase'),
    metricTable('Per phase', r.per_phase || {}),
  );
  heading.focus();
}

// ---------------------------------------------------------------------------------------------
// Navigation and sign-in

function allowed(page) {
  const roles = state.info?.roles || [];
  return page.roles.some((r) => roles.includes(r));
}

function parseHash() {
  const [id, qs] = location.hash.replace(/^#/, '').split('?');
  return { id, params: Object.fromEntries(new URLSearchParams(qs || '')) };
}

function go(id, params = {}) {
  const q = new URLSearchParams(Object.entries(params).filter(([, v]) => v)).toString();
  const hash = `#${id}${q ? `?${q}` : ''}`;
  if (location.hash === hash) render();
  else location.hash = hash;
}

function render() {
  if (!state.info) return;
  clearInterval(state.timer);
  state.timer = null;
  const visible = PAGES.filter(allowed);
  let { id, params } = parseHash();
  if (!visible.some((p) => p.id === id)) {
    id = visible[0].id;
    params = {};
  }
  for (const a of $('pages').querySelectorAll('a')) {
    if (a.dataset.page === id) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  const root = $('console-main');
  root.replaceChildren();
  pages[id](root, params);
  document.title = `${PAGES.find((p) => p.id === id).label} · Airlock operator console`;
  if (state.page !== null && state.page !== id) $('page-title')?.focus();
  state.page = id;
}

function show(which) {
  for (const s of ['signin', 'refused', 'console']) $(s).hidden = s !== which;
  $('account').hidden = which === 'signin';
  document.body.classList.toggle('console-on', which === 'console');
}

async function start() {
  const token = loadToken() || '';
  state.api = new Api(token);
  state.api.csrf = loadCsrf() || '';
  let info;
  try {
    info = await state.api.info();
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) {
      if (token) clearToken();
      show('signin');
      if (token) $('signin-error').textContent = 'That token was not accepted (expired or revoked).';
      $('token').focus();
      return;
    }
    show('signin');
    $('signin-error').textContent = e instanceof ApiError ? `${e.title}${e.detail ? `: ${e.detail}` : ''}` : String(e);
    return;
  }
  state.info = info || { roles: [] };
  // Behind the SSO proxy the daemon hands the page its CSRF token here (sign-out needs it).
  if (!token && typeof state.info.csrf_token === 'string') state.api.csrf = state.info.csrf_token;
  $('whoami-user').textContent = state.info.user || '';
  const roles = state.info.roles || [];
  $('whoami-roles').textContent = roles.length ? `(${roles.join(', ')})` : '';
  if (!PAGES.some(allowed)) {
    $('refused-user').textContent = state.info.user || 'this account';
    show('refused');
    return;
  }
  $('pages').replaceChildren(
    ...PAGES.filter(allowed).map((p) => h('li', {}, h('a', { href: `#${p.id}`, 'data-page': p.id }, p.label))),
  );
  show('console');
  render();
}

$('signin-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const t = $('token').value.trim();
  if (!t) {
    $('signin-error').textContent = 'Enter your access token.';
    return;
  }
  saveToken(t);
  $('token').value = '';
  $('signin-error').textContent = '';
  start();
});

$('signout').addEventListener('click', async () => {
  if (!state.api.token) {
    try {
      await state.api.logout();
    } catch {
      // the session may have ended already
    }
    clearCsrf();
  }
  clearToken();
  clearInterval(state.timer);
  state.info = null;
  state.page = null;
  show('signin');
  $('token').focus();
});

window.addEventListener('hashchange', render);
start();
