// Launching Debian's Chromium through playwright-core, and a page that records everything the
// tests must see fail: uncaught errors, console errors, CSP violations, dialogs and requests
// that leave the page's origin.

import crypto from 'node:crypto';
import fs from 'node:fs';
import { chromium } from 'playwright-core';

export const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';

/** Why browser tests cannot run here, or '' when they can. */
export function browserMissing() {
  return fs.existsSync(CHROMIUM) ? '' : `Chromium not found at ${CHROMIUM} (apt-get install chromium, or set CHROMIUM_PATH)`;
}

/**
 * Launches headless Chromium. `opts.trustCertOf` (a PEM certificate file): Chromium accepts that
 * one server certificate (by its public key's SPKI hash, `--ignore-certificate-errors-spki-list`)
 * and no other untrusted one, so an HTTPS daemon with a test CA's certificate can be opened
 * without turning certificate checks off.
 */
export async function launch(opts = {}) {
  const extra = [];
  if (opts.trustCertOf) {
    const spki = crypto.createPublicKey(fs.readFileSync(opts.trustCertOf)).export({ type: 'spki', format: 'der' });
    extra.push(`--ignore-certificate-errors-spki-list=${crypto.createHash('sha256').update(spki).digest('base64')}`);
  }
  return chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: [
      ...extra,
      '--no-sandbox',
      '--disable-gpu',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--no-first-run',
      '--disable-dev-shm-usage',
    ],
  });
}

/**
 * A fresh context + page bound to `baseUrl`, with problems collected in `page.problems`.
 * @param {import('playwright-core').Browser} browser
 * @param {string} baseUrl
 * @param {{width?: number, height?: number, colorScheme?: 'light' | 'dark'}} [opts]
 */
export async function openPage(browser, baseUrl, opts = {}) {
  const context = await browser.newContext({
    viewport: { width: opts.width ?? 1100, height: opts.height ?? 800 },
    colorScheme: opts.colorScheme ?? 'light',
    reducedMotion: 'reduce',
    baseURL: baseUrl,
  });
  const page = await context.newPage();
  const problems = { errors: [], console: [], csp: [], dialogs: [], foreign: [] };
  const origin = new URL(baseUrl).origin;
  page.on('pageerror', (e) => problems.errors.push(String(e)));
  page.on('console', (m) => {
    if (m.type() === 'error') problems.console.push(m.text());
    if (/Content Security Policy/i.test(m.text())) problems.csp.push(m.text());
  });
  page.on('dialog', async (d) => {
    problems.dialogs.push(d.message());
    await d.dismiss();
  });
  page.on('request', (r) => {
    const u = r.url();
    if (!u.startsWith(origin) && !u.startsWith('data:')) problems.foreign.push(u);
  });
  page.problems = problems;
  return page;
}
