// The page's own logic in real Chromium, against the FAKE API of dev-server.mjs (a dev aid with
// canned answers). These tests prove rendering, streaming, stop, errors, storage, feedback and
// accessibility of appliance/ui; they say nothing about the daemon. The same journeys against
// the real daemon are in acceptance.test.mjs.

import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';

import { startDevServer } from './dev-server.mjs';
import { browserMissing, launch, openPage } from './lib/browser.mjs';
import { signIn, ask, settled, sources, assertClean, metric, chooseModel, forceRung } from './lib/ui.mjs';

const missing = browserMissing();
const HTTP_ERRORS = [/Failed to load resource: the server responded with a status of (401|404|429|503)/];

describe('web UI against the dev server (fake API)', { skip: missing || false }, () => {
  let srv;
  let browser;

  before(async () => {
    srv = await startDevServer();
    browser = await launch();
  });

  after(async () => {
    await browser?.close();
    await srv?.close();
  });

  async function adminMetric(name) {
    const res = await fetch(`${srv.url}/metrics`, { headers: { Authorization: `Bearer ${srv.tokens.admin}` } });
    return metric(await res.text(), name);
  }

  test('sign-in: a wrong token is refused, a right one opens the chat and stays in sessionStorage only', async () => {
    const page = await openPage(browser, srv.url);
    await page.goto('/');
    const res = await page.request.get('/');
    assert.match(res.headers()['content-security-policy'], /script-src 'self'/);
    await page.getByLabel('Access token').fill('not-a-token');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await assert.doesNotReject(page.getByText('That token was not accepted').waitFor());
    assert.equal(await page.evaluate(() => sessionStorage.getItem('airlock.token')), null);

    await page.getByLabel('Access token').fill(srv.tokens.user);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByLabel('Your question').waitFor();
    assert.equal(await page.evaluate(() => sessionStorage.getItem('airlock.token')), srv.tokens.user);
    assert.equal(await page.evaluate(() => localStorage.length), 0, 'nothing in localStorage by default');
    assert.equal(await page.locator('#bundle-version').textContent(), '2026.11.29-dev-fake');
    assert.equal(await page.evaluate(() => document.activeElement?.id), 'question', 'focus lands in the question box');

    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.getByRole('heading', { name: 'Signed out' }).waitFor();
    assert.equal(await page.evaluate(() => sessionStorage.getItem('airlock.token')), null);
    assertClean(page, { allowConsole: HTTP_ERRORS });
    await page.context().close();
  });

  test('streams an answer incrementally, renders Markdown safely and links [n] to the sources panel', async () => {
    const page = await openPage(browser, srv.url);
    await signIn(page, srv.tokens.user);
    const answer = await ask(page, 'What is the EDD threshold in Ireland?');
    // Sample the answer text while it streams: it must grow in several steps.
    const lengths = new Set();
    while ((await answer.getAttribute('aria-busy')) === 'true') {
      const len = (await answer.locator('.answer-body').textContent()).length;
      if (len > 0) lengths.add(len);
      await page.waitForTimeout(40);
    }
    assert.ok(lengths.size >= 3, `answer grew in ${lengths.size} visible steps`);
    assert.equal(await answer.locator('.answer-body strong').first().textContent(), 'Ireland');
    assert.equal(await answer.locator('.answer-body table tbody tr').count(), 3);
    assert.equal(await answer.locator('.answer-body ol > li').count(), 3);

    const src = await sources(answer);
    assert.equal(src.length, 3);
    assert.equal(src[0].title, 'Enhanced Due Diligence Thresholds — Institutional Clients (Ireland)');
    assert.equal(src[0].doc, 'doc-00128');
    assert.equal(src[0].score, 'relevance 0.87');
    assert.match(src[0].snippet, /7,250,000/);
    // The last event named sources 1 and 2 as used by the answer: they are marked, 3 is not.
    assert.match(await answer.locator('.sources-title').textContent(), /Sources \(3, 2 used by the answer\)/);
    assert.equal(await answer.locator('.source.used').count(), 2);
    assert.match(await answer.locator('.source.used').nth(1).textContent(), /used by the answer/);
    assert.equal(await answer.locator(`#${src[2].id}.used`).count(), 0);

    const cite = answer.locator('a.cite').first();
    assert.equal(await cite.getAttribute('aria-label'), 'Source 1: Enhanced Due Diligence Thresholds — Institutional Clients (Ireland)');
    await cite.focus();
    await page.keyboard.press('Enter');
    assert.equal(await page.evaluate(() => document.activeElement?.id), src[0].id, 'Enter on [1] moves focus to source 1');
    assert.ok(await page.locator(`#${src[0].id}.highlight`).count());

    const sent = srv.state.chats.at(-1);
    assert.deepEqual(sent.airlock, { retrieval: true });
    assert.equal(sent.model, 'airlock-large');
    assert.equal(await page.locator('[style]').count(), 0, 'no inline style attributes (CSP style-src self)');
    assert.match(await page.locator('#composer-status').textContent(), /Answer complete, with 3 sources/);
    assertClean(page);
    await page.context().close();
  });

  test('Stop aborts the stream: the server sees the disconnect, the partial answer stays, focus returns', async () => {
    const page = await openPage(browser, srv.url);
    await signIn(page, srv.tokens.user);
    const before = await adminMetric('airlock_generation_cancelled_total');
    const answer = await ask(page, 'Tell me something slow please');
    await answer.locator('.answer-body p').first().waitFor();
    await page.getByRole('button', { name: 'Stop' }).click();
    await settled(answer, 5000);
    assert.match(await answer.locator('.answer-note').textContent(), /Stopped/);
    const partial = await answer.locator('.answer-body').textContent();
    assert.ok(partial.length > 0 && partial.length < 2000, 'partial text kept');
    await assert.doesNotReject(async () => {
      for (let i = 0; i < 50; i++) {
        if ((await adminMetric('airlock_generation_cancelled_total')) > before) return;
        await page.waitForTimeout(100);
      }
      throw new Error('cancel counter did not move');
    });
    assert.equal(await page.getByRole('button', { name: 'Send' }).isVisible(), true);
    assert.equal(await page.evaluate(() => document.activeElement?.id), 'question');
    // The text does not grow any more after Stop.
    await page.waitForTimeout(400);
    assert.equal(await answer.locator('.answer-body').textContent(), partial);

    // Escape in the question box stops too.
    const b2 = await adminMetric('airlock_generation_cancelled_total');
    const second = await ask(page, 'another slow one');
    await second.locator('.answer-body p').first().waitFor();
    await page.keyboard.press('Escape');
    await settled(second, 5000);
    assert.match(await second.locator('.answer-note').textContent(), /Stopped/);
    for (let i = 0; i < 50 && (await adminMetric('airlock_generation_cancelled_total')) <= b2; i++) await page.waitForTimeout(100);
    assert.ok((await adminMetric('airlock_generation_cancelled_total')) > b2);
    assertClean(page);
    await page.context().close();
  });

  test('503 and 429 show a friendly message with the Retry-After time; Retry asks again', async () => {
    const page = await openPage(browser, srv.url);
    await signIn(page, srv.tokens.user);
    const busy = await ask(page, 'are you busy?');
    await settled(busy);
    const alert = busy.locator('[role="alert"]');
    assert.match(await alert.textContent(), /Airlock is busy right now/);
    assert.match(await alert.locator('.retry-when').textContent(), /try again in [67] seconds/);
    await page.waitForTimeout(100);
    assert.equal(await page.locator('#composer-status').textContent(), '', 'no stale "Searching…" status');
    const chatsBefore = srv.state.chats.length;
    await busy.getByRole('button', { name: 'Retry' }).click();
    await settled(busy);
    assert.equal(srv.state.chats.length, chatsBefore + 1, 'retry sent the question again');
    assert.equal(srv.state.chats.at(-1).question, 'are you busy?');

    const limited = await ask(page, 'over the limit');
    await settled(limited);
    assert.match(await limited.locator('[role="alert"]').textContent(), /question limit for the moment.*try again in 1[12] seconds/s);
    assert.equal(await limited.getByRole('button', { name: 'Helpful' }).isVisible(), false, 'no feedback on failed answers');
    assertClean(page, { allowConsole: HTTP_ERRORS });
    await page.context().close();
  });

  test('a rung forced by an admin (the acceptance shed path) reaches the server; 5 → 503 message', async () => {
    const page = await openPage(browser, srv.url);
    await signIn(page, srv.tokens.admin);
    await forceRung(page, 5);
    const responded = page.waitForResponse('**/v1/chat/completions');
    const answer = await ask(page, 'Is anyone there?');
    const res = await responded;
    assert.equal(res.status(), 503);
    assert.equal(res.headers()['retry-after'], '3');
    await settled(answer);
    assert.deepEqual(srv.state.chats.at(-1).airlock, { retrieval: true, rung: 5 });
    assert.match(await answer.locator('[role="alert"]').textContent(), /Airlock is busy right now.*try again in [23] seconds/s);
    assertClean(page, { allowConsole: HTTP_ERRORS });
    await page.context().close();
  });

  test('rung of each answer is shown discreetly', async () => {
    const page = await openPage(browser, srv.url);
    await signIn(page, srv.tokens.user);
    const full = await ask(page, 'normal question');
    await settled(full);
    assert.equal(await full.locator('.rung').isVisible(), false, 'nothing shown at rung 0');
    const expected = {
      1: 'reduced mode: reranking off',
      2: 'reduced mode: fewer sources',
      3: 'reduced mode: smaller model',
      4: 'reduced mode: queued',
    };
    for (const [r, label] of Object.entries(expected)) {
      const a = await ask(page, `answer at rung ${r}`);
      await settled(a);
      assert.equal(await a.locator('.rung').textContent(), label);
    }
    assertClean(page);
    await page.context().close();
  });

  test('an answer no source supports carries a warning above its sources', async () => {
    const page = await openPage(browser, srv.url);
    await signIn(page, srv.tokens.user);
    const plain = await ask(page, 'What is the EDD threshold in Ireland?');
    await settled(plain);
    assert.equal(await plain.locator('.unsupported').count(), 0, 'a supported answer has no warning');
    const answer = await ask(page, 'What fee applies? (unsupported)');
    await settled(answer);
    const warn = answer.locator('.unsupported');
    assert.equal(await warn.getAttribute('role'), 'note');
    assert.match(await warn.textContent(), /No source below supports this answer/);
    assert.match(await answer.locator('.sources-title').textContent(), /Sources \(3, 0 used by the answer\)/);
    assertClean(page);
    await page.close();
  });

  test('HTML and script in sources and answer render inert', async () => {
    const page = await openPage(browser, srv.url);
    await signIn(page, srv.tokens.user);
    const scriptsBefore = await page.locator('script').count();
    const a = await ask(page, 'show the hostile vendor note');
    await settled(a);
    await page.waitForTimeout(300);
    assert.equal(await page.evaluate(() => window.__pwned), undefined);
    assert.equal(await page.locator('script').count(), scriptsBefore);
    assert.equal(await page.locator('#log img, #log script, #log iframe, #log b, #log a[href^="javascript"]').count(), 0);
    const [s] = await sources(a);
    assert.match(s.title, /<img src=x onerror=/);
    assert.match(s.snippet, /<script>window.__pwned="snippet"<\/script>/);
    assert.match(await a.locator('.answer-body').textContent(), /<script>window.__pwned="answer"<\/script>/);
    assert.match(await a.locator('.md-link').textContent(), /click me \(javascript:window.__pwned='link'\)/);
    assertClean(page);
    await page.context().close();
  });

  test('a stream cut before [DONE] is reported as interrupted; no-source answers say so', async () => {
    const page = await openPage(browser, srv.url);
    await signIn(page, srv.tokens.user);
    const cut = await ask(page, 'please break the stream');
    await settled(cut);
    assert.match(await cut.locator('[role="alert"]').textContent(), /The answer was interrupted/);
    const none = await ask(page, 'nothing matches this');
    await settled(none);
    assert.match(await none.locator('.sources').textContent(), /No document you can read matched this question/);
    assertClean(page, { allowConsole: [/ERR_/, ...HTTP_ERRORS] });
    await page.context().close();
  });

  test('a 401 during the session shows the session-ended screen and drops the token', async () => {
    const page = await openPage(browser, srv.url);
    await signIn(page, srv.tokens.user);
    await page.getByLabel('Your question').fill('my token was revoked');
    await page.getByLabel('Your question').press('Enter');
    await page.getByRole('heading', { name: 'Your session has ended' }).waitFor();
    assert.match(await page.locator('#signin-alert').textContent(), /did not accept your access token/);
    assert.equal(await page.evaluate(() => sessionStorage.getItem('airlock.token')), null);
    assert.equal(await page.locator('.turn').count(), 0, 'conversation removed from the page');
    assert.equal(await page.evaluate(() => document.activeElement?.id), 'token');
    assertClean(page, { allowConsole: HTTP_ERRORS });
    await page.context().close();
  });

  test('conversation kept on this device only when asked, restored on reload, clearable', async () => {
    const page = await openPage(browser, srv.url);
    await signIn(page, srv.tokens.user);
    const a = await ask(page, 'remember this question');
    await settled(a);
    await page.reload();
    await page.getByLabel('Your question').waitFor();
    assert.equal(await page.locator('.turn').count(), 0, 'not kept by default');

    await page.getByText('Settings').click();
    await page.getByLabel('Keep my conversation on this device').check();
    const b = await ask(page, 'keep this one');
    await settled(b);
    const saved = await page.evaluate(() => Object.keys(localStorage).filter((k) => k.startsWith('airlock.conversation.')));
    assert.deepEqual(saved, ['airlock.conversation.u:alice'], 'keyed by the user from /v1/info');
    await page.reload();
    await page.getByLabel('Your question').waitFor();
    assert.equal(await page.locator('.turn').count(), 1);
    assert.equal(await page.locator('.question-text').textContent(), 'keep this one');
    assert.equal((await sources(page.locator('.answer-card').first())).length, 3);

    // History goes with the next question.
    const c = await ask(page, 'follow-up');
    await settled(c);
    assert.equal(srv.state.chats.at(-1).messages, 3, 'one earlier pair + the new question');

    await page.getByText('Settings').click();
    await page.getByRole('button', { name: 'Clear conversation' }).click();
    assert.equal(await page.locator('.turn').count(), 0);
    assert.equal(await page.evaluate(() => localStorage.getItem('airlock.conversation.u:alice')), null);
    await page.getByText('Settings').click();
    await page.getByLabel('Keep my conversation on this device').uncheck();
    assert.equal(await page.evaluate(() => localStorage.getItem('airlock.keep.u:alice')), null);
    assertClean(page);
    await page.context().close();
  });

  test('feedback: thumbs sends request id + rating, a comment replaces it; copy puts answer and sources on the clipboard', async () => {
    const page = await openPage(browser, srv.url);
    await page.context().grantPermissions(['clipboard-read', 'clipboard-write'], { origin: srv.url });
    await signIn(page, srv.tokens.user);
    const a = await ask(page, 'rate me');
    await settled(a);
    const rid = srv.state.lastRequestId;
    await a.getByRole('button', { name: 'Helpful', exact: true }).click();
    await a.getByText('Thanks for the feedback.').waitFor();
    assert.equal(await a.getByRole('button', { name: 'Helpful', exact: true }).getAttribute('aria-pressed'), 'true');
    const fb = srv.state.feedback.find((f) => f.request_id === rid);
    assert.deepEqual(fb, { user: 'alice', request_id: rid, rating: 'up', comment: null });

    await a.getByRole('button', { name: 'Add a comment' }).click();
    assert.equal(await page.evaluate(() => document.activeElement?.tagName), 'TEXTAREA');
    await page.keyboard.type('Clear and sourced');
    await a.getByRole('button', { name: 'Send comment' }).click();
    await a.getByText('Thanks: your rating and comment were saved.').waitFor();
    const all = srv.state.feedback.filter((f) => f.request_id === rid);
    assert.deepEqual(all, [{ user: 'alice', request_id: rid, rating: 'up', comment: 'Clear and sourced' }]);

    await a.getByRole('button', { name: 'Not helpful' }).click();
    await a.getByText('Thanks').first().waitFor();
    await page.waitForFunction(() => document.querySelector('.thumb[aria-pressed="true"] .btn-label')?.textContent === 'Not helpful');

    await a.getByRole('button', { name: 'Copy' }).click();
    await page.locator('#composer-status', { hasText: 'Answer copied' }).waitFor();
    const clip = await page.evaluate(() => navigator.clipboard.readText());
    assert.match(clip, /^Institutional customers onboarded in \*\*Ireland\*\*/);
    assert.match(clip, /Sources:\n\[1\] Enhanced Due Diligence Thresholds — Institutional Clients \(Ireland\) \(doc-00128\)/);
    assertClean(page);
    await page.context().close();
  });

  test('model choice from /v1/models is sent and remembered', async () => {
    const page = await openPage(browser, srv.url);
    await signIn(page, srv.tokens.user);
    await page.getByText('Settings').click();
    assert.deepEqual(await page.getByLabel('Model').locator('option').allTextContents(), ['airlock-large', 'airlock-small'], 'generators only');
    await page.keyboard.press('Escape');
    await chooseModel(page, 'airlock-small');
    const a = await ask(page, 'which model?');
    await settled(a);
    assert.equal(srv.state.chats.at(-1).model, 'airlock-small');
    assert.equal(await page.evaluate(() => JSON.parse(localStorage.getItem('airlock.prefs')).model), 'airlock-small');
    await page.context().close();
  });

  test('keyboard only: skip link, sign-in, ask, reach the citation and the actions in order', async () => {
    const page = await openPage(browser, srv.url);
    await page.goto('/');
    await page.waitForFunction(() => document.activeElement?.id === 'token');
    await page.keyboard.type(srv.tokens.user);
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => document.activeElement?.id === 'question');
    await page.keyboard.type('Keyboard question');
    await page.keyboard.press('Enter');
    const answer = page.locator('.answer-card').first();
    await settled(answer);
    // The skip link is the first focusable element; walk the tab order from it.
    const first = await page.evaluate(
      () => document.querySelector('a[href], button, input, select, textarea, summary, [tabindex="0"]')?.className,
    );
    assert.equal(first, 'skip-link');
    await page.locator('.skip-link').focus();
    const seen = ['a:Skip to the question box'];
    for (let i = 0; i < 40; i++) {
      await page.keyboard.press('Tab');
      seen.push(
        await page.evaluate(() => {
          const e = document.activeElement;
          if (!e || e === document.body) return 'body';
          const name = e.getAttribute('aria-label') || e.textContent?.trim().slice(0, 30) || e.id;
          return `${e.tagName.toLowerCase()}:${name}`;
        }),
      );
    }
    const order = (prefix) => seen.findIndex((s) => s.startsWith(prefix));
    assert.ok(order('a:Skip to the question box') === 0, `skip link first: ${seen[0]}`);
    assert.ok(order('summary:Settings') < order('button:Sign out'), 'header before content');
    assert.ok(order('button:Sign out') < order('a:Source 1'), 'header before the answer');
    assert.ok(order('a:Source 1') < order('button:Copy'), 'citations before actions');
    assert.ok(order('button:Copy') < order('button:Retry'));
    assert.ok(order('button:Not helpful') < order('textarea:question'), 'answer actions before the question box');
    // Every control has an accessible name.
    const unnamed = await page.evaluate(() =>
      [...document.querySelectorAll('button, input, select, textarea, a[href], summary')]
        .filter((e) => e.offsetParent !== null)
        .filter((e) => {
          const labelled = e.id && document.querySelector(`label[for="${e.id}"]`);
          return !(e.getAttribute('aria-label') || e.textContent.trim() || labelled);
        })
        .map((e) => e.outerHTML.slice(0, 80)),
    );
    assert.deepEqual(unnamed, []);
    assertClean(page);
    await page.context().close();
  });

  test('360 px wide: nothing overflows horizontally, controls stay reachable', async () => {
    const page = await openPage(browser, srv.url, { width: 360, height: 740 });
    await signIn(page, srv.tokens.user);
    const a = await ask(page, 'Wide table and long words please');
    await settled(a);
    const overflow = await page.evaluate(() => document.scrollingElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 0, `page overflows by ${overflow}px`);
    for (const name of ['Send', 'Sign out']) {
      const box = await page.getByRole('button', { name, exact: true }).boundingBox();
      assert.ok(box && box.x >= 0 && box.x + box.width <= 360, `${name} inside the viewport`);
      assert.ok(box.height >= 44, `${name} is a 44 px touch target`);
    }
    const copy = await a.getByRole('button', { name: 'Copy' }).boundingBox();
    assert.ok(copy.width >= 44 && copy.height >= 44, 'icon buttons are 44 px touch targets');
    await page.getByText('Settings').click();
    const panel = await page.locator('#menu .menu-panel').boundingBox();
    assert.ok(panel.x >= 0 && panel.x + panel.width <= 360, `settings panel inside the viewport: ${JSON.stringify(panel)}`);
    await page.getByLabel('Keep my conversation on this device').check();
    await page.locator('.brand').click();
    assert.equal(await page.locator('#menu').getAttribute('open'), null, 'a click outside closes the menu');
    assertClean(page);
    await page.context().close();
  });

  for (const colorScheme of ['light', 'dark']) {
    test(`text contrast meets WCAG AA (${colorScheme})`, async () => {
      const page = await openPage(browser, srv.url, { colorScheme });
      await signIn(page, srv.tokens.user);
      const a = await ask(page, 'answer at rung 2');
      await settled(a);
      await a.getByRole('button', { name: 'Helpful', exact: true }).click();
      await a.getByText('Thanks for the feedback.').waitFor();
      const low = await page.evaluate(() => {
        const parse = (c) => {
          const m = c.match(/rgba?\(([^)]+)\)/);
          if (!m) return null;
          const [r, g, b, al = 1] = m[1].split(/[ ,/]+/).filter(Boolean).map(Number);
          return { r, g, b, a: al };
        };
        const lum = ({ r, g, b }) => {
          const f = (v) => {
            v /= 255;
            return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
          };
          return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
        };
        const bgOf = (el) => {
          for (let e = el; e; e = e.parentElement) {
            const c = parse(getComputedStyle(e).backgroundColor);
            if (c && c.a > 0.5) return c;
          }
          return parse(getComputedStyle(document.body).backgroundColor);
        };
        const out = [];
        const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
        for (let n = walker.nextNode(); n; n = walker.nextNode()) {
          const el = n.parentElement;
          if (!n.textContent.trim() || !el || el.closest('[hidden], .visually-hidden, .offscreen')) continue;
          if (el.offsetParent === null && getComputedStyle(el).position !== 'fixed') continue;
          const fg = parse(getComputedStyle(el).color);
          const bg = bgOf(el);
          const l1 = lum(fg);
          const l2 = lum(bg);
          const ratio = (Math.max(l1, l2) + 0.05) / (Math.min(l1, l2) + 0.05);
          if (ratio < 4.5) out.push(`${ratio.toFixed(2)} ${el.className || el.tagName}: ${n.textContent.trim().slice(0, 30)}`);
        }
        return out;
      });
      assert.deepEqual(low, []);
      await page.context().close();
    });
  }

  test('without GET /v1/info the footer falls back and the conversation key is a token hash', async () => {
    const bare = await startDevServer({ info: false });
    try {
      const page = await openPage(browser, bare.url);
      await signIn(page, bare.tokens.user);
      assert.equal(await page.locator('#bundle-version').textContent(), 'unknown');
      await page.getByText('Settings').click();
      await page.getByLabel('Keep my conversation on this device').check();
      const keys = await page.evaluate(() => Object.keys(localStorage));
      assert.ok(keys.some((k) => /^airlock\.keep\.t:[0-9a-f]{24}$/.test(k)), keys.join());
      assert.ok(!keys.join().includes(bare.tokens.user), 'the token itself is never a storage key');
      assertClean(page, { allowConsole: HTTP_ERRORS });
      await page.context().close();
    } finally {
      await bare.close();
    }
  });
});
