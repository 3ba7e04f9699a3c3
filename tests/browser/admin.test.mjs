// The operator console (/admin, issue 26 point 4) against the REAL daemon in Debian's Chromium:
// every page for the demo admin (admin + operator), the pages an auditor gets, and a plain user
// refused. One daemon for the whole file (`airlock demo --setup-only`, then `airlock serve`),
// seeded over the public API: a snapshot sync, documents (one deleted), users
// with roles, a no-source chat answer rated with a comment (no generation: instant), and an
// eval report in the configured reports directory. Without AIRLOCK_BIN the tests are skipped.
//
// AIRLOCK_CONSOLE_SCREENSHOT=FILE also saves the documents page (the README's screenshot).

import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { browserMissing, launch, openPage } from './lib/browser.mjs';
import { assertClean, everythingInDom } from './lib/ui.mjs';
import { startDaemon, tail } from './lib/daemon.mjs';

const BIN = process.env.AIRLOCK_BIN;
const skip = !BIN
  ? 'AIRLOCK_BIN is not set: set it to a built `airlock` binary to run the console tests against the real daemon'
  : browserMissing() || false;
// Chromium logs every non-2xx fetch: the refusal tests provoke 401 and 403 on purpose.
const HTTP_ERRORS = [/Failed to load resource: the server responded with a status of (401|403)/];
// The page's first `GET /v1/info` without a token (no session either) answers 401: the sign-in form.
const SIGN_IN_401 = [/Failed to load resource: the server responded with a status of 401/];
/** Words only the documents' text holds: the console must never show them. */
const TEXT_WORDS = ['Quetzalcoatl', 'Tuesday reconciliation'];
const COMMENT = 'The cut-off time was missing';

describe('operator console against the real daemon', { skip, timeout: 30 * 60_000 }, () => {
  let daemon;
  let browser;
  let reports;
  const tokens = {};

  before(async () => {
    reports = fs.mkdtempSync(path.join(os.tmpdir(), 'airlock-console-reports-'));
    fs.mkdirSync(path.join(reports, 'bank-set-run-1'));
    fs.writeFileSync(
      path.join(reports, 'bank-set-run-1', 'report.json'),
      JSON.stringify({
        set: 'bank-set',
        bundle_version: 'demo',
        rung: null,
        overall: { cases: 3, leaking_cases: 0, failed_cases: 0, metrics: { recall_10: { mean: 0.667, lo: 0.2, hi: 0.9 } } },
        per_kind: { injection: { cases: 3, leaking_cases: 0, failed_cases: 0, metrics: { recall_10: { mean: 0.667, lo: 0.2, hi: 0.9 } } } },
        per_phase: { v1: { cases: 3, leaking_cases: 0, failed_cases: 0, metrics: {} } },
        latency_ms: {},
        cases: [{ id: 'case-hidden-id', query: 'What does the Quetzalcoatl ledger say?', answer: 'Tuesday reconciliation' }],
      }),
    );
    process.env.AIRLOCK_EVAL_REPORTS_DIR = reports;
    daemon = await startDaemon(BIN);
    try {
      // The snapshot first: it replaces every non-local user and every grant.
      const sync = (body) =>
        daemon.fetch(`${daemon.url}/v1/acl/sync`, {
          method: 'POST',
          headers: { Authorization: `Bearer ${daemon.adminToken}`, 'Content-Type': 'application/x-ndjson' },
          body,
        });
      assert.equal((await sync('{"user": "console-synced", "groups": ["g-console"]}\n')).status, 200);
      for (const [user, spec] of [
        ['console-user', { groups: ['g-console'] }],
        ['console-auditor', { groups: [], roles: ['auditor'] }],
        ['console-outsider', { groups: [] }],
      ]) {
        await daemon.must('PUT', `/v1/acl/users/${user}`, spec);
        tokens[user] = (await daemon.must('POST', `/v1/acl/users/${user}/token`)).json.token;
      }
      for (const [id, title] of [['console-doc-1', 'Console ledger'], ['console-doc-2', 'Console memo']]) {
        await daemon.must('PUT', `/v1/documents/${id}`, {
          title,
          text: `The Quetzalcoatl ledger of ${title}. The Tuesday reconciliation closes it.`,
          acl: { users: [], groups: ['g-console'] },
        });
      }
      await daemon.must('DELETE', '/v1/documents/console-doc-2');
      // Someone who may read nothing gets an instant no-source answer; they rate it.
      const chat = await daemon.admitted(
        'POST',
        '/v1/chat/completions',
        { messages: [{ role: 'user', content: 'What is the escrow rule?' }], max_tokens: 16 },
        tokens['console-outsider'],
      );
      await daemon.must('POST', '/v1/feedback', { request_id: chat.json.id, rating: 'down', comment: COMMENT }, tokens['console-outsider']);
    } catch (e) {
      throw new Error(`${e.message}\ndaemon log tail:\n${tail(daemon.log)}`);
    }
    browser = await launch();
  });

  after(async () => {
    await browser?.close();
    await daemon?.stop();
    if (reports) fs.rmSync(reports, { recursive: true, force: true });
  });

  async function signedIn(token, opts) {
    const page = await openPage(browser, daemon.url, opts);
    await page.goto('/admin');
    await page.getByLabel('Access token').fill(token);
    await page.getByRole('button', { name: 'Sign in' }).click();
    return page;
  }

  const nav = (page) => page.getByRole('navigation', { name: 'Console pages' });
  const region = (page, name) => page.getByRole('region', { name, exact: true });

  test('every page works for the admin: documents, users and groups, IAM sync, capacity, connectors, feedback, eval reports, audit search', async () => {
    const page = await signedIn(daemon.adminToken);
    assert.deepEqual(await nav(page).getByRole('link').allTextContents(), [
      'Documents',
      'Users and groups',
      'IAM sync',
      'Capacity',
      'Connectors',
      'Feedback',
      'Eval reports',
      'Audit search',
    ]);

    // Documents: find by prefix, status, counts; open one: versions and who may read it.
    await page.getByLabel('Id or title starts with').fill('console');
    await page.getByRole('button', { name: 'Apply' }).click();
    const docs = region(page, 'Documents');
    await docs.getByRole('button', { name: 'console-doc-1' }).waitFor();
    assert.match(await docs.locator('tr', { hasText: 'console-doc-2' }).textContent(), /deleted/);
    if (process.env.AIRLOCK_CONSOLE_SCREENSHOT) {
      await page.screenshot({ path: process.env.AIRLOCK_CONSOLE_SCREENSHOT, fullPage: true });
    }
    await docs.getByRole('button', { name: 'console-doc-1' }).click();
    await page.getByRole('heading', { name: 'Document console-doc-1' }).waitFor();
    await region(page, 'Versions').waitFor();
    // console-user and console-synced (g-console); the admin holds no group.
    assert.match(await page.locator('.figures div', { hasText: 'Readable by users' }).textContent(), /2$/);

    // Keyboard: a nav link reached by focus and opened with Enter.
    await nav(page).getByRole('link', { name: 'Users and groups' }).focus();
    await page.keyboard.press('Enter');
    await page.getByRole('heading', { name: 'Users and groups' }).waitFor();
    const users = region(page, 'Users');
    await users.locator('tr', { hasText: 'console-user' }).waitFor();
    assert.match(await users.locator('tr', { hasText: 'console-user' }).textContent(), /g-console\s*1/);
    const groups = region(page, 'Groups');
    await groups.locator('tr', { hasText: 'g-console' }).waitFor();

    await nav(page).getByRole('link', { name: 'IAM sync' }).click();
    const runs = region(page, 'Sync runs');
    await runs.waitFor();
    assert.match(await runs.textContent(), /snapshot\s*applied\s*admin.*users added 1/);
    assert.match(await page.locator('.figures').textContent(), /Last successful sync/);

    await nav(page).getByRole('link', { name: 'Capacity' }).click();
    await page.locator('.figures div', { hasText: 'Ladder rung' }).waitFor();
    assert.match(await page.locator('.figures div', { hasText: 'Ladder rung' }).textContent(), /Ladder rung\s*0/);

    // No [[connectors]] in this daemon's configuration: the page says so (the Samba-backed
    // status itself is checked by the daemon's connectors test).
    await nav(page).getByRole('link', { name: 'Connectors' }).click();
    await page.getByText('No connectors are configured').waitFor();
    // How a source's status renders: `GET /v1/connectors` answered with a status of the shape
    // the daemon's Samba test receives (the request for a sync still goes to the daemon, which
    // has no such source and says so).
    const status = {
      data: [{
        alias: 'docs', kind: 'smb', location: '//127.0.0.1:445/docs', interval_minutes: 60,
        items: 4, item_errors: 1, item_errors_listed: [{ path: 'notes.TMP', reason: 'unsupported file type' }],
        last_run: { counts: { items: 4, upserted: 4, unchanged_content: 0, permissions: 0, moved: 0, deleted: 0, failed: 1 }, error: null, started_at: 1796653002, finished_at: 1796653003 },
        last_success: 1796653003, requested: false, running: false, running_since: null, runs: 1, unknown_principals: [],
      }],
    };
    await page.route('**/v1/connectors', (route) => route.fulfill({ status: 200, contentType: 'application/json', body: JSON.stringify(status) }));
    await nav(page).getByRole('link', { name: 'Capacity' }).click();
    await nav(page).getByRole('link', { name: 'Connectors' }).click();
    const source = region(page, 'Connector docs');
    await source.waitFor();
    assert.match(await source.locator('.figures div', { hasText: 'Files not taken' }).textContent(), /1$/);
    assert.match(await source.locator('.figures div', { hasText: 'Items' }).textContent(), /4$/);
    assert.match(await source.textContent(), /succeeded.*upserted 4/);
    assert.match(await region(page, 'Files docs could not take').textContent(), /notes\.TMP\s*unsupported file type/);
    await source.getByRole('button', { name: 'Sync docs now' }).click();
    await page.getByText('docs: Not Found: no connector `docs`').waitFor();
    await page.unroute('**/v1/connectors');

    await nav(page).getByRole('link', { name: 'Feedback' }).click();
    const fb = region(page, 'Feedback');
    await fb.locator('tr', { hasText: COMMENT }).waitFor();
    assert.match(await fb.locator('tr', { hasText: COMMENT }).textContent(), /not helpful/);

    await nav(page).getByRole('link', { name: 'Eval reports' }).click();
    await region(page, 'Eval reports').getByRole('button', { name: 'bank-set-run-1' }).click();
    await page.getByRole('heading', { name: 'Report bank-set-run-1' }).waitFor();
    assert.match(await region(page, 'Per kind').textContent(), /injection/);

    await nav(page).getByRole('link', { name: 'Audit search' }).click();
    await page.getByLabel('Document id').fill('console-doc-1');
    await page.getByLabel('Kind').selectOption('admin');
    await page.getByRole('button', { name: 'Apply' }).click();
    const entries = region(page, 'Audit entries');
    await entries.waitFor();
    assert.match(await entries.textContent(), /document_put/);
    assert.doesNotMatch(await entries.textContent(), /console-doc-2/);

    const dom = await everythingInDom(page);
    for (const w of [...TEXT_WORDS, 'case-hidden-id', 'escrow rule']) assert.ok(!dom.includes(w), `the console shows ${w}`);
    // The one 404 is the sync asked of the source this daemon does not have (above).
    assertClean(page, { allowConsole: [...SIGN_IN_401, /status of 404 \(Not Found\)/] });
    await page.context().close();
  });

  test('at 360 px every page fits the width (tables scroll in their own box)', async () => {
    const page = await signedIn(daemon.adminToken, { width: 360, height: 740 });
    for (const name of ['Documents', 'Users and groups', 'IAM sync', 'Capacity', 'Connectors', 'Feedback', 'Eval reports', 'Audit search']) {
      await nav(page).getByRole('link', { name }).click();
      await page.locator('#page-title', { hasText: name === 'Feedback' ? 'Feedback review' : name === 'IAM sync' ? 'IAM and directory sync' : name }).waitFor();
      const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      assert.ok(overflow <= 0, `${name}: the page is ${overflow}px wider than the screen`);
    }
    assertClean(page, { allowConsole: SIGN_IN_401 });
    await page.context().close();
  });

  test('an auditor gets the oversight pages only, and the API refuses them the others', async () => {
    const page = await signedIn(tokens['console-auditor']);
    assert.deepEqual(await nav(page).getByRole('link').allTextContents(), [
      'Users and groups',
      'IAM sync',
      'Capacity',
      'Eval reports',
      'Audit search',
    ]);
    // A hand-typed link to a page they may not read opens their first page instead.
    await page.goto('/admin#documents');
    await page.getByRole('heading', { name: 'Users and groups' }).waitFor();
    for (const p of ['/v1/admin/documents', '/v1/admin/feedback']) {
      const r = await daemon.api('GET', p, undefined, tokens['console-auditor']);
      assert.equal(r.status, 403, `${p}: ${r.text}`);
    }
    assertClean(page, { allowConsole: SIGN_IN_401 });
    await page.context().close();
  });

  test('a plain user who opens /admin is told the role it needs, and the API refuses them', async () => {
    const page = await signedIn(tokens['console-user']);
    await page.getByRole('heading', { name: 'This console needs the operator, admin or auditor role' }).waitFor();
    assert.equal(await page.locator('#refused-user').textContent(), 'console-user');
    assert.equal(await nav(page).count(), 0, 'no console navigation');
    for (const p of ['/v1/admin/users', '/v1/admin/documents', '/v1/admin/audit', '/v1/admin/capacity']) {
      const r = await daemon.api('GET', p, undefined, tokens['console-user']);
      assert.equal(r.status, 403, `${p}: ${r.text}`);
      assert.match(r.headers.get('content-type') || '', /^application\/problem\+json/);
    }
    // A wrong token: the sign-in form again, with the reason.
    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.getByLabel('Access token').fill('not-a-token');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByText('That token was not accepted').waitFor();
    assertClean(page, { allowConsole: HTTP_ERRORS });
    await page.context().close();
  });
});
