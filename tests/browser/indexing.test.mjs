// The background ingest in the footer (issue 26 point 9, serving/src/ingest_queue.rs) against
// the REAL daemon in Debian's Chromium: a corpus queued in DATA/ingest-queue/ before
// `airlock serve` starts (200 Cranfield documents cut to one chunk each: tens of seconds of
// embedding in a debug build) is ingested
// while the daemon serves. The operator's footer names the job and counts its documents; an
// ordinary user's footer says only that indexing goes on; both lines disappear when it ends, and
// the documents are then searchable. Without AIRLOCK_BIN the tests are skipped.

import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

import { browserMissing, launch, openPage } from './lib/browser.mjs';
import { assertClean, signIn } from './lib/ui.mjs';
import { bankDevDir, startDaemon, tail } from './lib/daemon.mjs';

const BIN = process.env.AIRLOCK_BIN;
const skip = !BIN
  ? 'AIRLOCK_BIN is not set: set it to a built `airlock` binary to run the indexing tests against the real daemon'
  : browserMissing() || false;
const DOCS = 200;
/** Each document's text is cut to this many characters: one chunk each. */
const TEXT_CHARS = 400;
// Beside bank-dev (AIRLOCK_SHARED_DIR/datasets, else ../shared beside the repo).
const CRANFIELD = path.join(bankDevDir(), '..', 'cranfield', 'corpus.jsonl');
// The page's first `GET /v1/info` without a session answers 401: the sign-in form.
const SIGN_IN_401 = [/Failed to load resource: the server responded with a status of 401/];

describe('background ingest in the footer against the real daemon', { skip, timeout: 20 * 60_000 }, () => {
  let daemon;
  let browser;
  let userToken;
  let ids;

  before(async () => {
    const docs = fs
      .readFileSync(CRANFIELD, 'utf8')
      .split('\n')
      .filter((l) => l.trim())
      .slice(0, DOCS)
      .map((l) => JSON.parse(l));
    ids = docs.map((d) => String(d._id));
    const lines = docs.map((d) => JSON.stringify({ ...d, text: String(d.text).slice(0, TEXT_CHARS) }));
    daemon = await startDaemon(BIN, {
      beforeServe: (dir) => {
        // As crate::ingest_queue::enqueue does: a temporary name, then renamed into place.
        const q = path.join(dir, 'ingest-queue');
        fs.mkdirSync(q, { recursive: true });
        fs.writeFileSync(path.join(q, '.001-cranfield-part.jsonl.part'), lines.join('\n') + '\n');
        fs.renameSync(path.join(q, '.001-cranfield-part.jsonl.part'), path.join(q, '001-cranfield-part.jsonl'));
      },
    });
    try {
      await daemon.must('PUT', '/v1/acl/users/ix-reader', { groups: ['g-cran'] });
      userToken = (await daemon.must('POST', '/v1/acl/users/ix-reader/token')).json.token;
      for (const id of ids.slice(0, 5)) {
        await daemon.must('PUT', `/v1/acl/documents/${encodeURIComponent(id)}`, { users: [], groups: ['g-cran'] });
      }
      browser = await launch();
    } catch (e) {
      throw new Error(`${e.message}\nlog tail:\n${tail(daemon.log)}`);
    }
  });

  after(async () => {
    await browser?.close();
    await daemon?.stop();
  });

  test('the operator sees the job and its count, a user only that indexing goes on; both lines go when it ends', async () => {
    const admin = await openPage(browser, daemon.url);
    const user = await openPage(browser, daemon.url);
    await signIn(admin, daemon.adminToken);
    await signIn(user, userToken);
    const adminLine = admin.locator('#indexing-item');
    const userLine = user.locator('#indexing-item');
    await adminLine.waitFor({ state: 'visible', timeout: 30_000 });
    await userLine.waitFor({ state: 'visible', timeout: 30_000 });
    const adminText = await adminLine.innerText();
    assert.match(adminText, new RegExp(`Indexing cranfield-part: [\\d,]+ of ${DOCS} documents`), adminText);
    const userText = await userLine.innerText();
    assert.match(userText, /Still indexing documents: answers may miss some until it finishes\./, userText);
    assert.doesNotMatch(userText, /cranfield|\d/, 'no job name or count for an ordinary user');
    // The count moves while the page polls, then the line goes when the job is done.
    await adminLine.waitFor({ state: 'hidden', timeout: 15 * 60_000 });
    await userLine.waitFor({ state: 'hidden', timeout: 60_000 });
    const info = (await daemon.must('GET', '/v1/info')).json.indexing;
    assert.equal(info.active, false, JSON.stringify(info));
    assert.equal(info.finished[0].name, 'cranfield-part');
    assert.equal(info.finished[0].stored, DOCS);
    assert.equal(info.finished[0].refused, 0);
    assert.equal(fs.existsSync(path.join(daemon.dataDir, 'ingest-queue', '001-cranfield-part.jsonl')), false);
    // The ingested documents are there for their reader.
    const r = await daemon.must('POST', '/v1/retrieve', { query: 'boundary layer', top_k: 10 }, userToken);
    assert.ok(r.json.results.length > 0, r.text);
    assert.ok(r.json.results.every((h) => ids.slice(0, 5).includes(h.doc_id)), r.text);
    assertClean(admin, { allowConsole: SIGN_IN_401 });
    assertClean(user, { allowConsole: SIGN_IN_401 });

    // The operator console's documents page lists the finished job.
    const consolePage = await openPage(browser, daemon.url);
    await consolePage.goto('/admin');
    await consolePage.getByLabel('Access token').fill(daemon.adminToken);
    await consolePage.getByRole('button', { name: 'Sign in' }).click();
    const jobs = consolePage.getByRole('table', { name: 'Finished ingest jobs' });
    await jobs.waitFor({ timeout: 30_000 });
    const row = jobs.getByRole('row').filter({ hasText: 'cranfield-part' });
    assert.match(await row.innerText(), new RegExp(`cranfield-part\\s.*\\s${DOCS}\\s+0\\s`, 's'));
    assertClean(consolePage, { allowConsole: SIGN_IN_401 });
  });
});
