// Trusted-header SSO in the real browser (issue 22 point 5): Debian's nginx in front of the real
// daemon sets the user header and the shared secret, and the page opens the chat without asking
// for a token. Straight at the daemon (no proxy) the same page still asks for one.
//
// Skipped with a message without AIRLOCK_BIN or Chromium; without nginx it fails when
// AIRLOCK_REQUIRE_NGINX=1 (.ci/run) and is skipped loudly otherwise.

import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import net from 'node:net';
import { spawn } from 'node:child_process';

import { browserMissing, launch, openPage } from './lib/browser.mjs';
import { ask, assertClean, settled } from './lib/ui.mjs';
import { startDaemon, freePort } from './lib/daemon.mjs';

const BIN = process.env.AIRLOCK_BIN;
const NGINX = ['/usr/sbin/nginx', '/usr/bin/nginx'].find((p) => fs.existsSync(p));
const SECRET = 'browser-proxy-secret-0123456789';
if (!NGINX && process.env.AIRLOCK_REQUIRE_NGINX === '1') {
  throw new Error('AIRLOCK_REQUIRE_NGINX=1 but nginx is not installed (apt-get install nginx)');
}
const skip = !BIN
  ? 'AIRLOCK_BIN is not set: set it to a built `airlock` binary to run the SSO test against the real daemon'
  : browserMissing() || (!NGINX && 'SKIPPED: nginx is not installed; the SSO proxy sign-in is not proven here') || false;

async function startNginx(upstream, user) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'airlock-nginx-'));
  const port = await freePort();
  fs.writeFileSync(path.join(dir, 'nginx.conf'), `daemon off;
master_process off;
worker_processes 1;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log info;
events { worker_connections 64; }
http {
  access_log ${dir}/access.log;
  client_body_temp_path ${dir}/client_body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  server {
    listen 127.0.0.1:${port};
    location / {
      proxy_pass http://${upstream};
      proxy_http_version 1.1;
      proxy_buffering off;
      # What the bank's SSO module would set from its own sign-in.
      proxy_set_header X-Remote-User "${user}";
      proxy_set_header X-Airlock-Proxy-Secret "${SECRET}";
    }
  }
}
`);
  const child = spawn(NGINX, ['-p', dir, '-c', path.join(dir, 'nginx.conf'), '-e', path.join(dir, 'error.log')], { stdio: 'ignore' });
  for (let i = 0; i < 200; i++) {
    const up = await new Promise((res) => {
      const s = net.connect(port, '127.0.0.1', () => { s.end(); res(true); });
      s.on('error', () => res(false));
    });
    if (up) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    url: `http://127.0.0.1:${port}`,
    async stop() {
      child.kill('SIGTERM');
      await new Promise((r) => setTimeout(r, 200));
      child.kill('SIGKILL');
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

describe('web UI behind an SSO proxy (trusted-header mode)', { skip, timeout: 30 * 60_000 }, () => {
  let daemon;
  let nginx;
  let browser;
  let user;

  before(async () => {
    process.env.AIRLOCK_TRUSTED_HEADER = 'X-Remote-User';
    process.env.AIRLOCK_TRUSTED_HEADER_SECRET = SECRET;
    daemon = await startDaemon(BIN);
    // The employee the proxy signs in (created without a token: only the proxy can sign them in).
    user = 'sso-employee';
    await daemon.must('PUT', `/v1/acl/users/${user}`, { groups: ['all-staff'] });
    nginx = await startNginx(daemon.url.replace('http://', ''), user);
    browser = await launch();
  });

  after(async () => {
    await browser?.close();
    await nginx?.stop();
    await daemon?.stop();
  });

  test('through the proxy the chat opens without a token prompt', async () => {
    const page = await openPage(browser, nginx.url);
    await page.goto('/');
    await page.getByLabel('Your question').waitFor({ state: 'visible', timeout: 60_000 });
    assert.equal(await page.locator('#signin').isHidden(), true, 'no sign-in form');
    assert.equal(await page.getByLabel('Access token').count() === 0 || await page.getByLabel('Access token').isHidden(), true);
    // The page's API calls carry no token and are the proxy user's.
    const who = await page.evaluate(async () => (await (await fetch('/v1/info')).json()).user);
    assert.equal(who, user);
    assert.equal(await page.evaluate(() => sessionStorage.length), 0, 'no token stored');
    // A write signed in by the proxy needs the user's CSRF token: the page took it from
    // GET /v1/info and sends it (issue 42 H3). The proxy user reads no document, so the answer
    // comes without generation.
    const writes = [];
    page.on('request', (r) => {
      if (r.method() !== 'GET') writes.push({ url: r.url(), csrf: r.headers()['x-airlock-csrf'] ?? '', resp: r.response() });
    });
    const answer = await ask(page, 'When are salaries paid?');
    await settled(answer);
    const chat = writes.filter((w) => w.url.endsWith('/v1/chat/completions'));
    assert.ok(chat.length >= 1, `the question was sent: ${JSON.stringify(writes.map((w) => w.url))}`);
    for (const w of writes) {
      assert.match(w.csrf, /^alp_[0-9a-f]{64}$/, `${w.url} carries the proxy user's CSRF token`);
      const status = (await w.resp)?.status() ?? 0;
      assert.ok(status >= 200 && status < 300, `${w.url} was served: ${status}`);
    }
    assertClean(page, { allowConsole: [/status of (404|503)/] });
    await page.context().close();
  });

  test('straight at the daemon the page still asks for a token', async () => {
    const page = await openPage(browser, daemon.url);
    await page.goto('/');
    await page.getByLabel('Access token').waitFor({ state: 'visible', timeout: 60_000 });
    assert.equal(await page.getByLabel('Your question').isVisible(), false);
    // The probe without a token is refused (401) by the daemon itself.
    assertClean(page, { allowConsole: [/status of (401|404|503)/] });
    await page.context().close();
  });
});
