// Takes a screenshot of a real answer from a running daemon (not the fake dev server):
//
//   AIRLOCK_URL=http://127.0.0.1:8080 AIRLOCK_TOKEN=<a demo user's token> \
//   AIRLOCK_QUESTION='...' node screenshot-daemon.mjs
//
// Writes docs/screenshots/real-daemon-answer.png (used by the README).

import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { launch, openPage } from './lib/browser.mjs';
import { signIn, ask, settled } from './lib/ui.mjs';

const OUT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../docs/screenshots');
const url = process.env.AIRLOCK_URL ?? 'http://127.0.0.1:8080';
const token = process.env.AIRLOCK_TOKEN;
const question = process.env.AIRLOCK_QUESTION;
if (!token || !question) {
  console.error('set AIRLOCK_TOKEN and AIRLOCK_QUESTION');
  process.exit(2);
}

const browser = await launch();
try {
  const page = await openPage(browser, url, { width: 1100, height: 1500 });
  await signIn(page, token);
  const answer = await ask(page, question);
  await settled(answer, 300_000);
  await page.locator('a.cite').first().click().catch(() => {});
  await page.waitForTimeout(400);
  const file = path.join(OUT, 'real-daemon-answer.png');
  await page.screenshot({ path: file });
  console.log(file);
} finally {
  await browser.close();
}
