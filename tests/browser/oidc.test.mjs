// OIDC sign-in in the real browser (issue 22 point 4): the real daemon with `[oidc]` pointing at
// a real OpenID Provider (panva's oidc-provider, tests/oidc/provider.mjs) on loopback. Chromium
// opens /v1/auth/oidc/login, signs in on the provider's own login form, comes back to / with
// the session cookie, and asks a question with it: the answer cites only what the employee's
// groups (from the ID token) allow.
//
// Skipped with a message without AIRLOCK_BIN or Chromium; without node's provider package
// (npm ci --prefix tests/oidc) it fails when AIRLOCK_REQUIRE_OIDC=1 (.ci/run) and is skipped
// loudly otherwise.

import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { spawn } from 'node:child_process';

import { browserMissing, launch, openPage } from './lib/browser.mjs';
import { startDaemon, freePort, REPO } from './lib/daemon.mjs';
import { ask, settled, sources, chooseModel } from './lib/ui.mjs';

const BIN = process.env.AIRLOCK_BIN;
const PROVIDER_DIR = path.join(REPO, 'tests', 'oidc');
const PROVIDER_OK = fs.existsSync(path.join(PROVIDER_DIR, 'node_modules', 'oidc-provider', 'package.json'));
const SECRET = 'browser-oidc-client-secret-0123456789';
if (!PROVIDER_OK && process.env.AIRLOCK_REQUIRE_OIDC === '1') {
  throw new Error('AIRLOCK_REQUIRE_OIDC=1 but the OIDC provider is not installed (npm ci --prefix tests/oidc)');
}
const skip = !BIN
  ? 'AIRLOCK_BIN is not set: set it to a built `airlock` binary to run the OIDC test against the real daemon'
  : browserMissing()
    || (!PROVIDER_OK && '*** SKIPPED: the OIDC provider is not installed (npm ci --prefix tests/oidc); OIDC sign-in is not proven here ***')
    || false;

async function startProvider(dir, redirect) {
  const port = await freePort();
  const issuer = `http://127.0.0.1:${port}`;
  const cfg = path.join(dir, 'provider.json');
  fs.writeFileSync(cfg, JSON.stringify({
    issuer,
    port,
    kids: ['k1'],
    clients: [{ client_id: 'airlock', client_secret: SECRET, redirect_uris: [redirect] }],
    accounts: {
      'oidc-analyst': { preferred_username: 'oidc-analyst', name: 'Olga Analyst', groups: ['analysts'] },
    },
  }));
  const child = spawn('node', [path.join(PROVIDER_DIR, 'provider.mjs'), cfg], { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('the OIDC provider did not start')), 60_000);
    readline.createInterface({ input: child.stdout }).on('line', (l) => {
      if (l.startsWith('listening')) {
        clearTimeout(timer);
        resolve();
      }
    });
    child.on('exit', (code) => reject(new Error(`the OIDC provider exited (${code})`)));
  });
  return {
    issuer,
    async stop() {
      child.kill('SIGTERM');
      await new Promise((r) => setTimeout(r, 200));
      child.kill('SIGKILL');
    },
  };
}

describe('OIDC sign-in through the provider in Chromium', { skip, timeout: 30 * 60_000 }, () => {
  let dir;
  let provider;
  let daemon;
  let browser;

  before(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'airlock-oidc-'));
    const port = await freePort();
    const redirect = `http://127.0.0.1:${port}/v1/auth/oidc/callback`;
    provider = await startProvider(dir, redirect);
    const secretFile = path.join(dir, 'client.secret');
    fs.writeFileSync(secretFile, `${SECRET}\n`, { mode: 0o600 });
    const toml = path.join(dir, 'airlock.toml');
    fs.writeFileSync(toml, `[oidc]
issuer = "${provider.issuer}"
client_id = "airlock"
client_secret_file = "${secretFile}"
redirect_url = "${redirect}"
user_claim = "preferred_username"
groups_claim = "groups"
display_name = "Bank SSO"
scopes = ["openid", "profile", "groups"]
`);
    process.env.AIRLOCK_CONFIG = toml;
    daemon = await startDaemon(BIN, { port });
    delete process.env.AIRLOCK_CONFIG;
    for (const [id, group, text] of [
      ['oidc-open', 'analysts', 'The liquidity buffer must stay above fifteen percent of deposits.'],
      ['oidc-closed', 'board', 'The liquidity buffer of the board is a secret of the board.'],
    ]) {
      await daemon.must('PUT', `/v1/documents/${id}`, { title: id, text, acl: { users: [], groups: [group] } });
    }
    browser = await launch();
  });

  after(async () => {
    await browser?.close();
    await daemon?.stop();
    await provider?.stop();
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });

  test('the UI\'s "Sign in with" button → the provider\'s form → back signed in → a question in the chat', async () => {
    const page = await openPage(browser, daemon.url);
    await page.goto('/');
    // /v1/auth/methods names the IdP: the sign-in page offers its button.
    const button = page.getByRole('link', { name: 'Sign in with Bank SSO' });
    await button.waitFor({ state: 'visible', timeout: 60_000 });
    assert.equal(await button.getAttribute('href'), '/v1/auth/oidc/login');
    await button.click();
    // The provider's own login page (another origin: the daemon's only foreign request).
    await page.waitForURL(`${provider.issuer}/interaction/**`);
    await page.locator('input[name="login"]').fill('oidc-analyst');
    await page.locator('input[name="password"]').fill('any');
    await page.locator('button[type="submit"]').click();
    await page.waitForURL(`${daemon.url}/**`);
    // Back at the chat, signed in: the UI took the CSRF token from the fragment and removed it.
    await page.getByLabel('Your question').waitFor({ state: 'visible', timeout: 60_000 });
    assert.equal(await page.locator('#whoami-user').textContent(), 'oidc-analyst');
    const url = new URL(page.url());
    assert.equal(url.pathname, '/');
    assert.equal(url.hash, '', 'the CSRF token left the address bar');
    const csrf = await page.evaluate(() => Object.values(localStorage).find((v) => /^alk_/.test(v)) ?? '');
    assert.match(csrf, /^alk_/, 'the UI keeps the session\'s CSRF token');
    const cookies = await page.context().cookies(daemon.url);
    const session = cookies.find((c) => c.name === 'airlock_session');
    assert.ok(session, `session cookie: ${JSON.stringify(cookies.map((c) => c.name))}`);
    assert.equal(session.httpOnly, true);
    assert.equal(session.sameSite, 'Strict');
    assert.equal(cookies.some((c) => c.name === 'airlock_oidc'), false, 'the pre-login cookie is cleared');
    // A question through the chat UI: only the analysts' document can be a source.
    await chooseModel(page, 'airlock-small');
    const shown = await ask(page, 'What is the liquidity buffer?');
    await settled(shown, 600_000);
    const src = await sources(shown);
    assert.ok(src.some((x) => x.doc === 'oidc-open'), `cites the analysts' document: ${JSON.stringify(src)}`);
    assert.ok(src.every((x) => x.doc !== 'oidc-closed'), `never the board's: ${JSON.stringify(src)}`);
    // Signed in: the page's own requests are the OIDC user's (no token anywhere).
    const who = await page.evaluate(async () => (await (await fetch('/v1/info')).json()).user);
    assert.equal(who, 'oidc-analyst');
    assert.equal(await page.evaluate(() => document.cookie.includes('airlock_session')), false, 'HttpOnly');
    // A question with the session: only the analysts' document can be a source.
    const answer = await page.evaluate(async (token) => {
      const model = 'airlock-small';
      const r = await fetch('/v1/chat/completions', {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', 'X-Airlock-CSRF': token },
        body: JSON.stringify({ model, max_tokens: 24, messages: [{ role: 'user', content: 'What is the liquidity buffer?' }] }),
      });
      return { status: r.status, body: await r.json() };
    }, csrf);
    assert.equal(answer.status, 200, JSON.stringify(answer.body));
    const cited = (answer.body.airlock?.citations ?? []).map((c) => c.doc_id);
    assert.ok(cited.includes('oidc-open'), `cited: ${cited}`);
    assert.equal(cited.includes('oidc-closed'), false, `cited: ${cited}`);
    // Without the CSRF header the session cannot post.
    const refused = await page.evaluate(async () => (await fetch('/v1/retrieve', {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ query: 'liquidity' }),
    })).status);
    assert.equal(refused, 403);
    assert.deepEqual(page.problems.errors, []);
    // Foreign requests: the provider's pages only (its development login page also asks for
    // a web font, which fails here without network); the daemon's pages make none.
    assert.deepEqual(page.problems.foreign.filter((u) => !u.startsWith(provider.issuer)
      && !u.startsWith('https://fonts.googleapis.com/')), []);
    await page.context().close();
  });
});
