// Steps a person takes on the chat page, shared by the dev-server and the acceptance tests.

import assert from 'node:assert/strict';

export async function signIn(page, token) {
  await page.goto('/');
  await page.getByLabel('Access token').fill(token);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByLabel('Your question').waitFor({ state: 'visible' });
}

/** Chooses a model in Settings when the page offers a choice. */
export async function chooseModel(page, id) {
  await page.getByText('Settings').click();
  const select = page.getByLabel('Model');
  if (await select.isVisible()) {
    const ids = await select.locator('option').allTextContents();
    if (ids.includes(id)) await select.selectOption(id);
  }
  await page.keyboard.press('Escape');
}

/** Types a question and sends it with Enter; returns a locator for that turn's answer. */
export async function ask(page, question) {
  const before = await page.locator('.turn').count();
  await page.getByLabel('Your question').fill(question);
  await page.getByLabel('Your question').press('Enter');
  await page.locator('.turn').nth(before).waitFor();
  return page.locator('.turn').nth(before).locator('.answer-card');
}

/** Waits until an answer is no longer busy (done, stopped or failed). */
export async function settled(answer, timeout = 120_000) {
  await answer.locator('xpath=self::*[@aria-busy="false"]').waitFor({ timeout });
}

/** Sources listed for an answer: [{n, title, doc, score, snippet}]. */
export async function sources(answer) {
  return answer.locator('.source').evaluateAll((items) =>
    items.map((li) => ({
      id: li.id,
      n: li.querySelector('.source-n')?.textContent ?? '',
      title: li.querySelector('.source-title')?.textContent ?? '',
      doc: li.querySelector('.source-doc')?.textContent ?? '',
      score: li.querySelector('.source-score')?.textContent ?? '',
      snippet: li.querySelector('.source-snippet')?.textContent ?? '',
    })),
  );
}

/** Everything a person or a script could read in the page: text, attributes, storage. */
export async function everythingInDom(page) {
  return page.evaluate(() => {
    const parts = [document.documentElement.outerHTML, document.body.innerText];
    for (const s of [sessionStorage, localStorage]) {
      for (let i = 0; i < s.length; i++) parts.push(s.key(i), s.getItem(s.key(i)));
    }
    return parts.join('\n');
  });
}

/** Asserts the page met none of the hazards recorded by openPage. */
export function assertClean(page, { allowConsole = [] } = {}) {
  const p = page.problems;
  assert.deepEqual(p.errors, [], 'uncaught page errors');
  assert.deepEqual(p.csp, [], 'CSP violations');
  assert.deepEqual(p.dialogs, [], 'dialogs opened');
  assert.deepEqual(p.foreign, [], 'requests outside the appliance origin');
  const unexpected = p.console.filter((m) => !allowConsole.some((re) => re.test(m)));
  assert.deepEqual(unexpected, [], 'console errors');
}

/** Reads one counter from Prometheus text (sum over label sets). */
export function metric(text, name) {
  let total = null;
  for (const line of text.split('\n')) {
    if (line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (m && m[1] === name) total = (total ?? 0) + Number(m[3]);
  }
  return total;
}

/**
 * Makes every chat request of the page force ladder rung `rung` (`airlock.rung`, admin only per
 * API.md). The page never sends it: a test adds it to the request the page makes, and the
 * answer still comes from the server.
 */
export async function forceRung(page, rung) {
  await page.route('**/v1/chat/completions', async (route) => {
    const body = JSON.parse(route.request().postData() || '{}');
    body.airlock = { ...(body.airlock || {}), rung };
    await route.continue({ postData: JSON.stringify(body) });
  });
}

/** Resolves when the answer shows text or stops being busy. */
export async function firstTextOrEnd(answer, timeout) {
  await answer.evaluate(
    (el, t) =>
      new Promise((resolve, reject) => {
        const ready = () => el.querySelector('.answer-body')?.textContent.trim() || el.getAttribute('aria-busy') === 'false';
        if (ready()) return resolve();
        const obs = new MutationObserver(() => ready() && (obs.disconnect(), resolve()));
        obs.observe(el, { subtree: true, childList: true, characterData: true, attributes: true });
        setTimeout(() => reject(new Error('no answer text in time')), t);
      }),
    timeout,
  );
}

/**
 * Asks a question and, while the ladder sheds it (503 "Airlock is busy"), waits for the page's
 * Retry-After countdown and presses Retry, as a person would. Resolves once the answer has text
 * or ended for another reason.
 */
export async function askAdmitted(page, question, timeout) {
  const deadline = Date.now() + timeout;
  const answer = await ask(page, question);
  for (;;) {
    await firstTextOrEnd(answer, Math.max(1000, deadline - Date.now()));
    const busy = await answer.locator('.error-box:visible', { hasText: 'Airlock is busy' }).count();
    if (!busy) return answer;
    if (Date.now() > deadline) throw new Error('still shed (503) at the deadline');
    await answer.locator('.retry-when', { hasText: 'You can try again now.' }).waitFor({ timeout: Math.max(1000, deadline - Date.now()) });
    await answer.getByRole('button', { name: 'Retry' }).click();
    await answer.locator('xpath=self::*[@aria-busy="true"]').waitFor({ timeout: 5000 }).catch(() => {});
  }
}
