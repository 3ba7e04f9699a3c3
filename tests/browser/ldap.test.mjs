// Directory sign-in in the real browser over HTTPS (issue 22): the test starts a real OpenLDAP slapd with a
// generated directory (lib/slapd.mjs) and the real daemon with `[ldap]` pointing at it and `[tls]`
// (a test CA's certificate that Chromium trusts by its key, nothing else), then, as
// an employee would: the sign-in form → a wrong password is refused with a clear message → the
// right one opens the chat → a question is answered from the documents alice's directory groups
// allow, and never from another group's → "Sign out" ends the session (a call with the old
// cookie is refused) → the form again. A session that ends mid-use sends the page back to the
// form with a message and the question kept. Every sign-in is in the audit log.
//
// Skipped with a message without AIRLOCK_BIN or Chromium; without slapd it fails when
// AIRLOCK_REQUIRE_SLAPD=1 (.ci/run) and is skipped loudly otherwise.

import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

import { browserMissing, launch, openPage } from './lib/browser.mjs';
import { ask, settled, sources, everythingInDom, assertClean, chooseModel } from './lib/ui.mjs';
import { startDaemon, tail } from './lib/daemon.mjs';
import { slapdMissing, startSlapd } from './lib/slapd.mjs';

const BIN = process.env.AIRLOCK_BIN;
const missing = slapdMissing();
if (missing && process.env.AIRLOCK_REQUIRE_SLAPD === '1') {
  throw new Error(`AIRLOCK_REQUIRE_SLAPD=1 but ${missing}`);
}
if (missing && BIN) {
  console.error(`\n!!!!!!!! SKIPPED: ${missing}; the browser LDAP sign-in test did not run !!!!!!!!\n`);
}
const skip = !BIN
  ? 'AIRLOCK_BIN is not set: set it to a built `airlock` binary to run the LDAP sign-in test against the real daemon'
  : browserMissing() || (missing && `SKIPPED: ${missing}; the LDAP sign-in is not proven here`) || false;

const HTTP_ERRORS = [/Failed to load resource: the server responded with a status of (401|403|404|503)/];
const ANSWER_TIMEOUT = 600_000;

// Two documents on the same subject, for two directory groups: retrieval would find both for
// the question, so only the access control keeps the risk desk's one out of alice's answer.
const ANALYSTS_DOC = {
  id: 'ldap-analysts-stress',
  title: 'Quarterly liquidity stress scenario (analysts)',
  text: 'The quarterly liquidity stress scenario assumes a thirty percent deposit outflow over thirty days. Analysts rerun the liquidity stress scenario every quarter.',
};
const RISK_DOC = {
  id: 'ldap-risk-stress',
  title: 'Risk desk liquidity stress scenario HERON',
  text: 'The risk desk liquidity stress scenario, code word HERON-4471, assumes a forty-five percent deposit outflow. The liquidity stress scenario of the risk desk is confidential.',
};
const QUESTION = 'What deposit outflow does the liquidity stress scenario assume?';

describe('web UI with directory (LDAP) sign-in', { skip, timeout: 30 * 60_000 }, () => {
  let slapd;
  let daemon;
  let browser;
  let riskToken;

  before(async () => {
    slapd = await startSlapd();
    const toml = path.join(slapd.dir, 'airlock.toml');
    // Over HTTPS, as a bank runs it: the daemon's certificate is the test CA's one for
    // 127.0.0.1 (the same CA as the directory's).
    const tls = `\n[tls]\ncert = "${path.join(slapd.dir, 'server.pem')}"\nkey = "${path.join(slapd.dir, 'server.key')}"\n`;
    fs.writeFileSync(toml, slapd.toml() + tls);
    process.env.AIRLOCK_CONFIG = toml;
    try {
      daemon = await startDaemon(BIN, { ca: path.join(slapd.dir, 'ca.pem') });
    } finally {
      delete process.env.AIRLOCK_CONFIG;
    }
    try {
      for (const [d, group] of [
        [ANALYSTS_DOC, 'analysts'],
        [RISK_DOC, 'risk'],
      ]) {
        await daemon.must('PUT', `/v1/documents/${d.id}`, { title: d.title, text: d.text, metadata: {}, acl: { users: [], groups: [group] } });
      }
      // The positive control's reader: a member of the risk group (a token user).
      await daemon.must('PUT', '/v1/acl/users/risk-reader', { groups: ['risk'] });
      riskToken = (await daemon.must('POST', '/v1/acl/users/risk-reader/token')).json.token;
    } catch (e) {
      throw new Error(`${e.message}\ndaemon log tail:\n${tail(daemon.log)}`);
    }
    browser = await launch({ trustCertOf: path.join(slapd.dir, 'server.pem') });
  });

  after(async () => {
    await browser?.close();
    await daemon?.stop();
    await slapd?.stop();
  });

  async function signInWithPassword(page, user, password) {
    await page.getByLabel('Username').fill(user);
    await page.getByLabel('Password').fill(password);
    await page.getByRole('button', { name: 'Sign in' }).click();
  }

  test('the methods route offers the directory sign-in and names no secret', async () => {
    const r = await daemon.fetch(`${daemon.url}/v1/auth/methods`);
    assert.equal(r.status, 200);
    const text = await r.text();
    assert.deepEqual(JSON.parse(text), { ldap: true, oidc: null, trusted_header: false, token: true });
    for (const s of [slapd.url, 'ou=services', 'bind.secret']) assert.ok(!text.includes(s), s);
  });

  test('sign in with the directory password, ask, get only allowed sources, sign out', async () => {
    // Control: the risk document does answer this question for someone allowed to read it.
    const control = await daemon.admitted('POST', '/v1/retrieve', { query: QUESTION, top_k: 10 }, riskToken);
    assert.ok(control.json.results.some((r) => r.doc_id === RISK_DOC.id), `control: ${JSON.stringify(control.json.results.map((r) => r.doc_id))}`);

    const page = await openPage(browser, daemon.url);
    await page.goto('/');
    const username = page.getByLabel('Username');
    await username.waitFor({ state: 'visible', timeout: 60_000 });
    assert.equal(await username.getAttribute('autocomplete'), 'username');
    assert.equal(await page.getByLabel('Password').getAttribute('autocomplete'), 'current-password');
    assert.equal(await page.getByLabel('Password').getAttribute('type'), 'password');
    assert.equal(await page.getByLabel('Access token').isVisible(), false, 'the token prompt waits behind its link');
    assert.equal(await page.getByRole('button', { name: 'Use an API token' }).isVisible(), true);

    // Wrong password: the directory's refusal, said plainly; the password is not kept or shown.
    await signInWithPassword(page, 'alice', 'Wrong-Horse-Battery-9');
    await page.locator('#ldap-error', { hasText: 'The username or password is wrong' }).waitFor({ timeout: 60_000 });
    assert.equal(await page.getByLabel('Password').inputValue(), '', 'the password field is emptied');
    assert.equal(await page.getByLabel('Username').inputValue(), 'alice', 'the username stays');
    assert.ok(!(await everythingInDom(page)).includes('Wrong-Horse-Battery-9'), 'the password appears nowhere');
    assert.equal(await page.getByLabel('Your question').isVisible(), false);

    // The right password: the chat opens, and says who is signed in.
    await signInWithPassword(page, 'alice', 'alice-pw');
    await page.getByLabel('Your question').waitFor({ state: 'visible', timeout: 60_000 });
    assert.equal(await page.locator('#whoami-user').textContent(), 'alice');
    const cookies = await page.context().cookies();
    const session = cookies.find((c) => c.name === 'airlock_session');
    assert.ok(session && session.httpOnly && session.sameSite === 'Strict', JSON.stringify(cookies));
    // Over HTTPS: the cookie is Secure and the daemon asks for HSTS.
    assert.ok(page.url().startsWith('https://127.0.0.1:'), page.url());
    assert.equal(session.secure, true, 'the session cookie is Secure');
    const hsts = (await daemon.fetch(`${daemon.url}/`)).headers.get('strict-transport-security');
    assert.match(hsts ?? '', /max-age=\d+/, `HSTS: ${hsts}`);
    assert.ok(!(await everythingInDom(page)).includes(session.value), 'the page never sees the session cookie');

    // A question: the answer cites the analysts' document only.
    await chooseModel(page, 'airlock-small');
    const answer = await ask(page, QUESTION);
    await settled(answer, ANSWER_TIMEOUT);
    assert.equal(await answer.locator('[role="alert"]:visible').count(), 0, `answered: ${await answer.textContent()}`);
    const src = await sources(answer);
    assert.ok(src.some((s) => s.doc === ANALYSTS_DOC.id), `cites the analysts' document: ${JSON.stringify(src)}`);
    for (const s of src) assert.notEqual(s.doc, RISK_DOC.id, 'the risk desk document is not alice’s');
    const all = await everythingInDom(page);
    for (const s of ['HERON-4471', RISK_DOC.title, RISK_DOC.id]) assert.ok(!all.includes(s), `"${s}" must not appear in alice's page`);

    // Sign out: the form again, and the old cookie is refused by the daemon.
    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.getByLabel('Username').waitFor({ state: 'visible', timeout: 30_000 });
    assert.equal(await page.locator('#signin-title').textContent(), 'Signed out');
    const after = await daemon.fetch(`${daemon.url}/v1/info`, { headers: { Cookie: `airlock_session=${session.value}` } });
    assert.equal(after.status, 401, 'the session ended on the daemon, not just in the page');
    assert.equal(await page.evaluate(async () => (await fetch('/v1/info')).status), 401);
    assert.equal(await page.evaluate(() => localStorage.getItem('airlock.csrf')), null, 'the CSRF token is gone');

    // The audit log has the refusal, the sign-in and the sign-out (never the password).
    const audit = (await daemon.must('GET', '/v1/audit?kind=sign_in')).json.entries;
    const outcomes = audit.map((e) => `${e.detail.outcome}:${e.user_id}`);
    for (const o of ['wrong_password:alice', 'success:alice', 'logout:alice']) assert.ok(outcomes.includes(o), `${o} in ${outcomes}`);
    assert.ok(!JSON.stringify(audit).includes('Wrong-Horse-Battery-9'));
    assertClean(page, { allowConsole: HTTP_ERRORS });
    await page.context().close();
  });

  test('a session that ends mid-use returns to the sign-in form and keeps the question', async () => {
    const page = await openPage(browser, daemon.url);
    await page.goto('/');
    await page.getByLabel('Username').waitFor({ state: 'visible', timeout: 60_000 });
    await signInWithPassword(page, 'alice', 'alice-pw');
    await page.getByLabel('Your question').waitFor({ state: 'visible', timeout: 60_000 });
    // The session ends on the daemon (as at its idle limit or a directory sync).
    const cookie = (await page.context().cookies()).find((c) => c.name === 'airlock_session').value;
    const csrf = await page.evaluate(() => localStorage.getItem('airlock.csrf'));
    const ended = await daemon.fetch(`${daemon.url}/v1/auth/logout`, { method: 'POST', headers: { Cookie: `airlock_session=${cookie}`, 'X-Airlock-CSRF': csrf } });
    assert.equal(ended.status, 204);
    const typed = 'Which teams rerun the stress scenario each quarter?';
    await page.getByLabel('Your question').fill(typed);
    await page.getByLabel('Your question').press('Enter');
    await page.locator('#signin-title', { hasText: 'Your session has ended' }).waitFor({ timeout: 60_000 });
    assert.match(await page.locator('#signin-alert').textContent(), /Sign in again to continue\. Your question is kept/);
    assert.equal(await page.getByLabel('Username').isVisible(), true, 'the directory form, not the token prompt');
    await signInWithPassword(page, 'alice', 'alice-pw');
    await page.getByLabel('Your question').waitFor({ state: 'visible', timeout: 60_000 });
    assert.equal(await page.getByLabel('Your question').inputValue(), typed, 'the question is back in the box');

    // The token prompt stays one click away.
    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.getByRole('button', { name: 'Use an API token' }).click();
    await page.getByLabel('Access token').waitFor({ state: 'visible' });
    assert.equal(await page.getByLabel('Username').isVisible(), false);
    assertClean(page, { allowConsole: HTTP_ERRORS });
    await page.context().close();
  });
});
