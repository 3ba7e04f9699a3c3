// Acceptance tests of the web chat UI against the REAL daemon (issue 8), in Debian's Chromium.
//
// The test starts `$AIRLOCK_BIN demo --setup-only --no-sample-data` in a temporary data dir,
// then `$AIRLOCK_BIN serve`, and seeds a slice of bank-dev (with its iam_v1 grants) and one
// hostile document through the admin API. Without AIRLOCK_BIN every test here is skipped with
// a message; .ci/run sets it to the freshly built binary.

import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';

import { browserMissing, launch, openPage } from './lib/browser.mjs';
import { signIn, ask, askAdmitted, settled, sources, everythingInDom, assertClean, metric, chooseModel, forceRung } from './lib/ui.mjs';
import fs from 'node:fs';
import path from 'node:path';

import { startDaemon, planFromBankDev, seed, HOSTILE, tail, REPO } from './lib/daemon.mjs';

const BIN = process.env.AIRLOCK_BIN;
const skip = !BIN
  ? 'AIRLOCK_BIN is not set: set it to a built `airlock` binary to run the acceptance tests against the real daemon'
  : browserMissing() || false;
// Chromium logs every non-2xx fetch as a console error: the tests that provoke them allow these,
// and every test allows the 404 of the page's GET /v1/info probe on a daemon without that route
// and the 503s of a shed that askAdmitted waits out.
const HTTP_ERRORS = [/Failed to load resource: the server responded with a status of (401|404|503)/];
const INFO_404 = [/Failed to load resource: the server responded with a status of (404|503)/];
const SMALL_MODEL = 'airlock-small';
/** A whole answer from the small model on 2 busy cores. */
const ANSWER_TIMEOUT = 600_000;

describe('web UI against the real daemon', { skip, timeout: 60 * 60_000 }, () => {
  let daemon;
  let browser;
  let plan;
  let tokens;

  before(async () => {
    plan = planFromBankDev();
    daemon = await startDaemon(BIN);
    try {
      tokens = await seed(daemon, plan);
    } catch (e) {
      throw new Error(`${e.message}\ndaemon log tail:\n${tail(daemon.log)}`);
    }
    browser = await launch();
  });

  after(async () => {
    await browser?.close();
    await daemon?.stop();
  });

  async function signedIn(user, opts) {
    const page = await openPage(browser, daemon.url, opts);
    await signIn(page, tokens[user] ?? user);
    await chooseModel(page, SMALL_MODEL);
    return page;
  }

  test('the daemon serves the page with the strict CSP and the bundle version reaches the footer', async () => {
    const res = await fetch(`${daemon.url}/`);
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') || '', /^text\/html/);
    const csp = res.headers.get('content-security-policy') || '';
    for (const d of ["default-src 'self'", "script-src 'self'", "style-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"]) {
      assert.ok(csp.includes(d), `CSP has ${d}: ${csp}`);
    }
    for (const asset of ['app.css', 'js/app.js', 'js/api.js', 'js/sse.js', 'js/markdown.js', 'js/store.js', 'js/view.js']) {
      const r = await fetch(`${daemon.url}/${asset}`);
      assert.equal(r.status, 200, asset);
      assert.match(r.headers.get('content-type') || '', asset.endsWith('.css') ? /^text\/css/ : /javascript/, asset);
    }
    const bundle = /airlock_bundle_info\{[^}]*version="([^"]+)"/.exec(await daemon.metrics())?.[1];
    assert.ok(bundle, 'airlock_bundle_info{version} in /metrics');
    const page = await signedIn(plan.answerable.user);
    assert.equal(await page.locator('#bundle-version').textContent(), bundle, 'footer shows the installed bundle version');
    assertClean(page, { allowConsole: HTTP_ERRORS });
    await page.context().close();
  });

  test('sign in, ask an answerable question: streamed answer citing the right document', async () => {
    const c = plan.answerable;
    const page = await signedIn(c.user);
    const answer = await askAdmitted(page, c.query, ANSWER_TIMEOUT);
    const lengths = new Set();
    const deadline = Date.now() + ANSWER_TIMEOUT;
    while ((await answer.getAttribute('aria-busy')) === 'true') {
      assert.ok(Date.now() < deadline, 'answer finished in time');
      const len = (await answer.locator('.answer-body').textContent()).length;
      if (len > 0) lengths.add(len);
      await page.waitForTimeout(50);
    }
    assert.equal(await answer.locator('[role="alert"]:visible').count(), 0, await answer.textContent());
    assert.ok(lengths.size >= 2, `the answer appeared in ${lengths.size} steps (streamed)`);
    const src = await sources(answer);
    assert.ok(src.length >= 1, 'at least one citation');
    const title = plan.corpus.get(c.relevant_doc_ids[0]).title;
    const right = src.find((s) => s.doc === c.relevant_doc_ids[0]);
    assert.ok(right, `sources panel lists ${c.relevant_doc_ids[0]}: ${JSON.stringify(src.map((s) => s.doc))}`);
    assert.equal(right.title, title);
    assert.ok(right.snippet.length > 0, 'snippet shown');
    assert.match(right.score, /^relevance -?\d/, 'score shown');
    // The daemon's last event says which sources the answer used: the panel counts and marks
    // exactly those (any number, 0 included, of the listed ones).
    const used = await answer.locator('.source.used').count();
    assert.ok(used <= src.length);
    assert.equal(
      await answer.locator('.sources-title').textContent(),
      `Sources (${src.length}, ${used} used by the answer)`,
    );
    assertClean(page, { allowConsole: INFO_404 });
    await page.context().close();
  });

  test('an outsider asking a denied question sees no restricted title, figure or canary', async () => {
    const c = plan.denied;
    const forbiddenTitles = c.forbidden_doc_ids.map((id) => plan.corpus.get(id).title);
    // Positive control: the question does reach the restricted document for a user who may
    // read it, so an ACL failure would put it in the outsider's page.
    const control = await daemon.admitted('POST', '/v1/retrieve', { query: c.query, top_k: 10 }, tokens[plan.insider]);
    const controlIds = control.json.results.map((r) => r.doc_id);
    assert.ok(
      c.forbidden_doc_ids.some((d) => controlIds.includes(d)),
      `control: ${plan.insider} retrieves ${c.forbidden_doc_ids} for this query (got ${controlIds})`,
    );

    const page = await signedIn(c.user);
    const answer = await askAdmitted(page, c.query, ANSWER_TIMEOUT);
    await settled(answer, ANSWER_TIMEOUT);
    assert.equal(await answer.locator('[role="alert"]:visible').count(), 0, `the question was answered: ${await answer.textContent()}`);
    const all = await everythingInDom(page);
    for (const s of [...c.forbidden_strings, ...c.forbidden_doc_ids, ...forbiddenTitles]) {
      assert.ok(!all.includes(s), `"${s}" must not appear anywhere in the outsider's page`);
    }
    for (const s of await sources(answer)) assert.ok(!c.forbidden_doc_ids.includes(s.doc));
    assertClean(page, { allowConsole: INFO_404 });
    await page.context().close();
  });

  test('a PDF source names its page, marks the supporting passage and opens the original at that page, for its reader only', async () => {
    // A two-page rate sheet uploaded as a raw PDF (issue 20), readable by one user only; its
    // folder-style id has a `/`.
    const id = 'rates/table-two-pages.pdf';
    const pdf = fs.readFileSync(path.join(REPO, 'extract/tests/fixtures/table-two-pages.pdf'));
    const put = await daemon.fetch(`${daemon.url}/v1/documents/${encodeURIComponent(id)}?title=${encodeURIComponent('Deposit rate sheet')}`, {
      method: 'PUT',
      headers: { Authorization: `Bearer ${daemon.adminToken}`, 'Content-Type': 'application/pdf' },
      body: pdf,
    });
    assert.ok(put.status < 300, `raw PDF upload: ${put.status} ${await put.text()}`);
    const reader = plan.answerable.user;
    await daemon.must('PUT', `/v1/acl/documents/${encodeURIComponent(id)}`, { users: [reader], groups: [] });

    const page = await signedIn(reader);
    const popups = [];
    page.context().on('page', (p) => popups.push(p));
    const answer = await ask(page, 'What is the rate of the Premier Bond 68?');
    // The sources arrive before the answer: the PDF's citation carries its page and the row.
    const source = answer.locator('.source', { hasText: 'Deposit rate sheet' }).first();
    await source.waitFor({ timeout: ANSWER_TIMEOUT });
    await page.getByRole('button', { name: 'Stop' }).click({ timeout: 2000 }).catch(() => {});
    await settled(answer, 30_000);
    const where = await source.locator('.source-where').textContent();
    assert.match(where, /^page \d+/, where);
    const pageNo = Number(where.match(/^page (\d+)/)[1]);
    const marked = await source.locator('mark.source-passage').textContent();
    assert.match(marked, /Premier Bond 68/, `the passage is the row the question names: ${marked}`);
    assert.ok((await source.locator('.source-snippet').textContent()).includes(marked));

    // "Open page N" opens the original (fetched with the reader's credentials) at that page.
    await source.getByRole('button', { name: new RegExp(`^Open page ${pageNo} of`) }).click();
    for (let i = 0; i < 100 && !popups.some((p) => p.url().startsWith('blob:')); i++) await page.waitForTimeout(100);
    const opened = popups.find((p) => p.url().startsWith('blob:'));
    assert.ok(opened, `a tab with the original opened: ${popups.map((p) => p.url())}`);
    assert.ok(opened.url().endsWith(`#page=${pageNo}`), opened.url());
    assert.ok(opened.url().startsWith(`blob:${daemon.url}/`), opened.url());
    // What the page fetched for that tab: the original, byte for byte, to its reader.
    const mine = await daemon.fetch(`${daemon.url}/v1/documents/${encodeURIComponent(id)}/file`, {
      headers: { Authorization: `Bearer ${tokens[reader]}` },
    });
    assert.equal(mine.status, 200);
    assert.equal(mine.headers.get('content-type'), 'application/pdf');
    assert.ok(Buffer.from(await mine.arrayBuffer()).equals(pdf), 'the original file, byte for byte');

    // Anyone else gets the same 404 as for an id that does not exist.
    const other = tokens[plan.denied.user];
    const denied = await daemon.api('GET', `/v1/documents/${encodeURIComponent(id)}/file`, undefined, other);
    const missing = await daemon.api('GET', `/v1/documents/${encodeURIComponent('rates/none.pdf')}/file`, undefined, other);
    assert.equal(denied.status, 404);
    assert.equal(denied.text, missing.text);
    assertClean(page, { allowConsole: INFO_404 });
    await page.context().close();
  });

  test('Stop mid-stream cancels generation on the server (airlock_generation_cancelled_total)', async () => {
    const page = await signedIn(plan.answerable.user);
    const before = metric(await daemon.metrics(), 'airlock_generation_cancelled_total') ?? 0;
    const answer = await askAdmitted(
      page,
      'Explain in detail, step by step and at length, every rule, threshold and exception the documents give about onboarding institutional customers.',
      ANSWER_TIMEOUT,
    );
    assert.equal(await answer.getAttribute('aria-busy'), 'true', `still streaming when Stop is pressed: ${await answer.textContent()}`);
    await page.getByRole('button', { name: 'Stop' }).click();
    await settled(answer, 10_000);
    assert.match(await answer.locator('.answer-note').textContent(), /Stopped/, 'the answer was still streaming when Stop was pressed');
    let after = before;
    for (let i = 0; i < 100 && after <= before; i++) {
      await page.waitForTimeout(150);
      after = metric(await daemon.metrics(), 'airlock_generation_cancelled_total') ?? 0;
    }
    assert.ok(after > before, `airlock_generation_cancelled_total went from ${before} to ${after}`);
    assertClean(page, { allowConsole: INFO_404 });
    await page.context().close();
  });

  test('a forced shed (503 capacity-unavailable) shows the retry message with its time', async () => {
    // An admin may force a ladder rung per request (API.md); rung 5 is the shed. The page
    // itself never sends `rung`: the test adds it to the request the page makes.
    const page = await openPage(browser, daemon.url);
    await signIn(page, daemon.adminToken);
    await forceRung(page, 5);
    const responded = page.waitForResponse('**/v1/chat/completions');
    const answer = await ask(page, 'Is anyone there?');
    const res = await responded;
    assert.equal(res.status(), 503);
    const retryAfter = parseInt(res.headers()['retry-after'], 10);
    assert.ok(retryAfter >= 0, 'Retry-After set');
    await settled(answer);
    const alert = answer.locator('[role="alert"]');
    assert.match(await alert.textContent(), /Airlock is busy right now/);
    assert.match(await alert.locator('.retry-when').textContent(), /try again (in \d+ seconds?|now)/);
    assert.equal(await answer.getByRole('button', { name: 'Retry' }).isVisible(), true);
    assertClean(page, { allowConsole: HTTP_ERRORS });
    await page.context().close();
  });

  test('a document with <script> and <img onerror> renders inert', async () => {
    const page = await signedIn(plan.answerable.user);
    const scripts = await page.locator('script').count();
    const answer = await askAdmitted(page, 'What does the Zephyrine vendor escrow note say about escrow releases?', ANSWER_TIMEOUT);
    await settled(answer, ANSWER_TIMEOUT);
    await page.waitForTimeout(500);
    const src = await sources(answer);
    const hostile = src.find((s) => s.doc === HOSTILE.doc_id);
    assert.ok(hostile, `the hostile document is cited: ${JSON.stringify(src.map((s) => s.doc))}`);
    assert.equal(hostile.title, HOSTILE.title, 'its title shows as literal text');
    assert.equal(await page.evaluate(() => window.__pwned), undefined, 'no injected code ran');
    assert.equal(await page.locator('script').count(), scripts);
    assert.equal(await page.locator('#log img, #log script, #log iframe, #log svg:not(.icon), #log a[href^="javascript"]').count(), 0);
    assertClean(page, { allowConsole: INFO_404 });
    await page.context().close();
  });

  test('rating an answer and adding a comment stores them in the daemon (POST /v1/feedback)', async () => {
    const c = plan.answerable;
    const page = await signedIn(c.user);
    const before = metric(await daemon.metrics(), 'airlock_feedback_total') ?? 0;
    const chat = page.waitForResponse((r) => r.url().endsWith('/v1/chat/completions') && r.status() === 200, { timeout: ANSWER_TIMEOUT });
    const answer = await askAdmitted(page, c.query, ANSWER_TIMEOUT);
    await settled(answer, ANSWER_TIMEOUT);
    assert.equal(await answer.locator('[role="alert"]:visible').count(), 0, await answer.textContent());
    const requestId = (await chat).headers()['x-request-id'];
    assert.ok(requestId, 'the chat response carries X-Request-Id');

    // The thumb sends the rating at once: 201, first feedback of this user on this answer.
    let sent = page.waitForResponse('**/v1/feedback');
    await answer.getByRole('button', { name: 'Helpful', exact: true }).click();
    let res = await sent;
    assert.equal(res.status(), 201, await res.text());
    const first = await res.json();
    assert.deepEqual({ ...first, created_at: undefined }, { request_id: requestId, rating: 'up', comment: null, created_at: undefined });
    await answer.getByText('Thanks for the feedback.').waitFor();
    assert.equal(await answer.getByRole('button', { name: 'Helpful', exact: true }).getAttribute('aria-pressed'), 'true');

    // The comment repeats the call: 200, replaced, comment stored.
    const comment = 'Cited the right policy, thanks';
    await answer.getByRole('button', { name: 'Add a comment' }).click();
    await page.keyboard.type(comment);
    sent = page.waitForResponse('**/v1/feedback');
    await answer.getByRole('button', { name: 'Send comment' }).click();
    res = await sent;
    assert.equal(res.status(), 200, await res.text());
    assert.deepEqual(await res.json(), { request_id: requestId, rating: 'up', comment, created_at: first.created_at });
    await answer.getByText('Thanks: your rating and comment were saved.').waitFor();

    // Checked through the daemon, outside the page: the rating is stored under this user
    // (resending it is a 200 replace keeping the first created_at), invisible to anyone else
    // (404, as for an id never served), and counted by rating.
    const again = await daemon.api('POST', '/v1/feedback', { request_id: requestId, rating: 'up', comment }, tokens[c.user]);
    assert.equal(again.status, 200, again.text);
    assert.equal(again.json.created_at, first.created_at);
    const other = await daemon.api('POST', '/v1/feedback', { request_id: requestId, rating: 'down' }, tokens[plan.denied.user]);
    const unknown = await daemon.api('POST', '/v1/feedback', { request_id: 'never-served', rating: 'down' }, tokens[plan.denied.user]);
    assert.equal(other.status, 404, other.text);
    assert.equal(other.text, unknown.text, 'another user\'s request id looks unknown');
    const after = metric(await daemon.metrics(), 'airlock_feedback_total');
    assert.equal(after - before, 3, 'two ratings from the page, one from the check');
    assertClean(page, { allowConsole: INFO_404 });
    await page.context().close();
  });

  test('a revoked token shows the session-ended screen (401)', async () => {
    const user = plan.denied.user;
    const page = await signedIn(user);
    // Rotating the token invalidates the one the page holds.
    tokens[user] = (await daemon.must('POST', `/v1/acl/users/${encodeURIComponent(user)}/token`)).json.token;
    await page.getByLabel('Your question').fill('Anything new?');
    await page.getByLabel('Your question').press('Enter');
    await page.getByRole('heading', { name: 'Your session has ended' }).waitFor();
    assert.equal(await page.evaluate(() => sessionStorage.getItem('airlock.token')), null);
    assertClean(page, { allowConsole: HTTP_ERRORS });
    await page.context().close();
  });

  test('a thread kept by the server: a follow-up, reopened on another device, then withheld after an IAM sync revokes its source', async () => {
    const c = plan.answerable;
    const doc = c.relevant_doc_ids[0];
    const page = await signedIn(c.user);
    assert.equal(await page.locator('#threads-menu').isVisible(), true, 'the Conversations menu is offered');
    const first = await askAdmitted(page, c.query, ANSWER_TIMEOUT);
    await settled(first, ANSWER_TIMEOUT);
    assert.ok((await sources(first)).some((x) => x.doc === doc), 'the first answer cites the document');
    // A follow-up in the same thread, elliptical on its own: sent with the thread id, the server
    // supplies the history and rebuilds the question from it (rag/src/query.rs).
    const follow = await askAdmitted(page, 'And for institutional customers?', ANSWER_TIMEOUT);
    await settled(follow, ANSWER_TIMEOUT);
    assert.equal(await follow.locator('[role="alert"]:visible').count(), 0, await follow.textContent());
    assert.ok((await sources(follow)).some((x) => x.doc === doc), 'the follow-up retrieves the same document');
    await page.context().close();

    // Another browser (a fresh context: no storage): the thread is listed and reopens.
    const other = await signedIn(c.user);
    const openThread = async (p) => {
      await p.getByText('Conversations', { exact: true }).click();
      const item = p.locator('#threads button.thread').first();
      await item.waitFor();
      const label = await item.textContent();
      await item.click();
      await p.locator('.turn').nth(1).waitFor();
      return label;
    };
    assert.match(await openThread(other), /\(2 turns\)$/);
    assert.equal(await other.locator('.turn').count(), 2);
    assert.ok((await other.locator('.turn').nth(0).textContent()).includes(c.query.slice(0, 40)), 'the first question is shown');

    // An IAM sync re-permissions the document to nobody: reopened, the turns that showed it are
    // withheld, and nothing of the document is on the page any more.
    const lines = [
      ...plan.users.map((u) => ({ user: u.user, groups: u.groups })),
      ...plan.docs.map((d) => (d.doc_id === doc ? { doc: d.doc_id, users: [], groups: [] } : { doc: d.doc_id, users: d.acl.users, groups: d.acl.groups })),
      { doc: HOSTILE.doc_id, users: [c.user], groups: [] },
    ];
    const r = await fetch(`${daemon.url}/v1/acl/sync`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${daemon.adminToken}`, 'Content-Type': 'application/x-ndjson' },
      body: lines.map((l) => JSON.stringify(l)).join('\n') + '\n',
    });
    assert.equal(r.status, 200, await r.text());
    await other.reload();
    await other.getByLabel('Your question').waitFor({ state: 'visible' });
    await openThread(other);
    const withheld = other.locator('.turn.withheld');
    assert.equal(await withheld.count(), 2, 'both turns showed the revoked document');
    assert.match(await withheld.first().textContent(), /no longer available to you/);
    const dom = await everythingInDom(other);
    for (const s of c.answer_contains) assert.ok(!dom.includes(s), `the answer's figure ${s} is gone from the page`);
    assert.ok(!dom.includes(plan.corpus.get(doc).title), 'the document title is gone from the page');
    assertClean(other, { allowConsole: INFO_404 });
    await other.context().close();
  });
});
