// Takes the README screenshots of the main states of the chat page into docs/screenshots/.
// Runs the page against the FAKE API of dev-server.mjs (canned documents and answers, so the
// pictures are reproducible); the page code is exactly what the daemon embeds.
//
//   node screenshots.mjs

import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { startDevServer } from './dev-server.mjs';
import { launch, openPage } from './lib/browser.mjs';
import { signIn, ask, settled } from './lib/ui.mjs';

const OUT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../docs/screenshots');
fs.mkdirSync(OUT, { recursive: true });

const srv = await startDevServer({ tokenDelayMs: 70 });
const browser = await launch();
const shot = async (page, name) => {
  await page.screenshot({ path: path.join(OUT, name) });
  console.log(`docs/screenshots/${name}`);
};

try {
  // 1. Signed out.
  let page = await openPage(browser, srv.url, { width: 1100, height: 720 });
  await page.goto('/');
  await page.getByLabel('Access token').waitFor();
  await shot(page, 'signed-out.png');
  await page.context().close();

  // 2. Streaming answer with its sources.
  page = await openPage(browser, srv.url, { width: 1100, height: 900 });
  await signIn(page, srv.tokens.user);
  const streaming = await ask(page, 'Above what turnover do institutional customers onboarded in Ireland need enhanced due diligence?');
  await page.waitForFunction(() => (document.querySelector('.answer-body')?.textContent.length ?? 0) > 260);
  await page.locator('.source').first().waitFor();
  await shot(page, 'streaming-answer.png');
  await settled(streaming);
  await streaming.getByRole('button', { name: 'Helpful', exact: true }).click();
  await streaming.getByText('Thanks for the feedback.').waitFor();
  await page.locator('a.cite').first().click();
  await page.waitForTimeout(400);
  await shot(page, 'answer-with-sources.png');

  // 3. 503 from the ladder's shed, with the Retry-After time; and a reduced-mode answer.
  const reduced = await ask(page, 'nothing found here at rung 1');
  await settled(reduced);
  const busy = await ask(page, 'Is the appliance busy right now?');
  await settled(busy);
  await busy.evaluate((e) => e.scrollIntoView({ block: 'end' }));
  await page.evaluate(() => window.scrollBy(0, 200));
  await shot(page, 'busy-503.png');
  await page.context().close();

  // 4. 360 px wide.
  page = await openPage(browser, srv.url, { width: 360, height: 780 });
  await signIn(page, srv.tokens.user);
  const narrow = await ask(page, 'What is the EDD threshold for institutional clients in Ireland?');
  await settled(narrow);
  await page.evaluate(() => window.scrollTo(0, 0));
  await shot(page, 'mobile-360.png');
  await page.context().close();

  // 5. Session ended (401).
  page = await openPage(browser, srv.url, { width: 1100, height: 720 });
  await signIn(page, srv.tokens.user);
  await page.getByLabel('Your question').fill('my token was revoked');
  await page.getByLabel('Your question').press('Enter');
  await page.getByRole('heading', { name: 'Your session has ended' }).waitFor();
  await shot(page, 'session-ended-401.png');
  await page.context().close();

  // 6. Dark colour scheme, hostile document rendered as text.
  page = await openPage(browser, srv.url, { width: 1100, height: 760, colorScheme: 'dark' });
  await signIn(page, srv.tokens.user);
  const hostile = await ask(page, 'show the hostile vendor note');
  await settled(hostile);
  await shot(page, 'dark-inert-html.png');
  await page.context().close();
} finally {
  await browser.close();
  await srv.close();
}
