// Unit tests of the page's pure modules (no browser): SSE parsing, Markdown parsing, problem and
// Retry-After handling, citation cleaning, the storage-key hash.

import { test, describe } from 'node:test';
import assert from 'node:assert/strict';

import { SseEvent, SseParser } from '../../appliance/ui/js/sse.js';
import { parseMarkdown, parseInline, inlineText } from '../../appliance/ui/js/markdown.js';
import { parseRetryAfter, problemSlug, cleanCitations, cleanCited, cleanPassages, rungOf, errorFromResponse, cleanMethods, Api } from '../../appliance/ui/js/api.js';
import { anchorText } from '../../appliance/ui/js/view.js';
import { fnv1a64 } from '../../appliance/ui/js/store.js';

describe('SseParser', () => {
  test('joins events split at any byte, with LF, CRLF and CR line ends', () => {
    const stream = 'data: {"a":1}\n\ndata: two\r\ndata: lines\r\n\r\n: comment\n\ndata:x\r\rdata: [DONE]\n\n';
    for (let cut = 0; cut <= stream.length; cut++) {
      const p = new SseParser();
      const evs = [...p.push(stream.slice(0, cut)), ...p.push(stream.slice(cut))];
      assert.deepEqual(
        evs.map((e) => e.data),
        ['{"a":1}', 'two\nlines', 'x', '[DONE]'],
        `cut at ${cut}`,
      );
    }
  });

  test('one character at a time', () => {
    const p = new SseParser();
    const evs = [];
    for (const c of 'event: note\ndata: hi\nid: 7\n\ndata: second\n\n') evs.push(...p.push(c));
    assert.equal(evs.length, 2);
    assert.equal(evs[0].event, 'note');
    assert.equal(evs[0].data, 'hi');
    assert.equal(evs[0].id, '7');
    assert.equal(evs[1].event, 'message');
    assert.equal(evs[1].id, '7', 'last event id persists');
  });

  test('a final event without its blank line is dropped and reported as truncated', () => {
    const q = new SseParser();
    const evs = q.push('data: whole\n\ndata: partial');
    assert.deepEqual(evs.map((e) => e.data), ['whole']);
    assert.equal(q.finish(), true);
    const r = new SseParser();
    r.push('data: whole\n\n');
    assert.equal(r.finish(), false);
  });

  test('keep-alive comments before and between events are ignored', () => {
    // The daemon sends `: keep-alive` while the engine queues or prefills (API.md, SSE).
    const stream = ': keep-alive\n\n: keep-alive\n\ndata: {"a":1}\n\n: keep-alive\n\ndata: [DONE]\n\n';
    for (let cut = 0; cut <= stream.length; cut++) {
      const p = new SseParser();
      const evs = [...p.push(stream.slice(0, cut)), ...p.push(stream.slice(cut))];
      assert.deepEqual(evs.map((e) => [e.event, e.data]), [['message', '{"a":1}'], ['message', '[DONE]']], `cut at ${cut}`);
      assert.equal(p.finish(), false, `cut at ${cut}`);
    }
    // A stream cut right after a keep-alive holds no pending event data.
    const q = new SseParser();
    assert.deepEqual(q.push('data: x\n\n: keep-alive\n\n'), [new SseEvent('message', 'x', '')]);
    assert.equal(q.finish(), false);
  });

  test('field without colon, one leading space stripped only', () => {
    const p = new SseParser();
    const evs = p.push('data\ndata:  two spaces\n\n');
    assert.deepEqual(evs.map((e) => e.data), ['\n two spaces']);
  });
});

describe('parseMarkdown', () => {
  test('paragraph with strong, em, code and citations', () => {
    const [p] = parseMarkdown('The limit is **EUR 7,250,000** for *institutional* clients `EDD` [1][2] and [3, 4].');
    assert.equal(p.type, 'paragraph');
    const types = p.inlines.map((n) => n.type);
    assert.deepEqual(types, ['text', 'strong', 'text', 'em', 'text', 'code', 'text', 'cite', 'cite', 'text', 'cite', 'cite', 'text']);
    assert.deepEqual(
      p.inlines.filter((n) => n.type === 'cite').map((n) => n.n),
      [1, 2, 3, 4],
    );
  });

  test('HTML stays text', () => {
    const blocks = parseMarkdown('<script>alert(1)</script>\n\n<img src=x onerror=alert(1)>');
    assert.equal(blocks.length, 2);
    assert.equal(inlineText(blocks[0].inlines), '<script>alert(1)</script>');
    assert.equal(inlineText(blocks[1].inlines), '<img src=x onerror=alert(1)>');
  });

  test('unclosed delimiters stay literal (half-streamed text)', () => {
    const [p] = parseMarkdown('Partial **bold and `code and *em');
    assert.deepEqual(p.inlines, [{ type: 'text', text: 'Partial **bold and `code and *em' }]);
  });

  test('snake_case is not emphasis, _em_ is', () => {
    const [p] = parseMarkdown('use max_tokens_value and _this_');
    assert.deepEqual(p.inlines.map((n) => n.type), ['text', 'em']);
    assert.equal(inlineText(p.inlines), 'use max_tokens_value and this');
  });

  test('headings, lists with nesting, quote, rule, code fence', () => {
    const md = [
      '## Steps',
      '1. first',
      '2. second',
      '   - nested a',
      '   - nested b',
      '3. third',
      '',
      '> quoted **text**',
      '',
      '---',
      '```js',
      'const x = "<b>";',
      '```',
    ].join('\n');
    const b = parseMarkdown(md);
    assert.deepEqual(b.map((x) => x.type), ['heading', 'list', 'quote', 'hr', 'codeblock']);
    assert.equal(b[0].level, 2);
    assert.equal(b[1].ordered, true);
    assert.equal(b[1].items.length, 3);
    const second = b[1].items[1];
    assert.deepEqual(second.map((x) => x.type), ['paragraph', 'list']);
    assert.equal(second[1].items.length, 2);
    assert.equal(b[4].lang, 'js');
    assert.equal(b[4].text, 'const x = "<b>";');
  });

  test('an unclosed fence runs to the end', () => {
    const b = parseMarkdown('text\n```\nline 1\nline 2');
    assert.deepEqual(b.map((x) => x.type), ['paragraph', 'codeblock']);
    assert.equal(b[1].text, 'line 1\nline 2');
  });

  test('ordered list keeps its start number', () => {
    const [l] = parseMarkdown('3. c\n4. d');
    assert.equal(l.start, 3);
    assert.equal(l.items.length, 2);
  });

  test('pipe table with alignment', () => {
    const [t] = parseMarkdown('| a | b |\n|:--|--:|\n| 1 | 2 |\n| 3 |');
    assert.equal(t.type, 'table');
    assert.deepEqual(t.align, ['left', 'right']);
    assert.equal(t.rows.length, 2);
    assert.equal(inlineText(t.rows[1][1]), '', 'missing cells are empty');
  });

  test('links are kept with their address, never as a bare href', () => {
    const inl = parseInline('see [the policy](javascript:alert(1)) now');
    const link = inl.find((n) => n.type === 'link');
    // `(` inside the address ends it: the link does not match and stays literal text.
    assert.equal(link, undefined);
    const ok = parseInline('see [the policy](https://intranet/p) now').find((n) => n.type === 'link');
    assert.equal(ok.href, 'https://intranet/p');
    assert.equal(inlineText(ok.children), 'the policy');
  });

  test('single newlines inside a paragraph become line breaks', () => {
    const [p] = parseMarkdown('line one\nline two');
    assert.deepEqual(p.inlines.map((n) => n.type), ['text', 'br', 'text']);
  });

  test('deep nesting is bounded', () => {
    const md = '>'.repeat(5000) + ' deep';
    const b = parseMarkdown(md);
    assert.equal(b[0].type, 'quote');
    const stars = '*'.repeat(20000);
    assert.doesNotThrow(() => parseMarkdown(stars + 'x' + stars));
  });
});

describe('api helpers', () => {
  test('Retry-After: seconds, HTTP date, garbage', () => {
    assert.equal(parseRetryAfter('7'), 7);
    assert.equal(parseRetryAfter(' 120 '), 120);
    const now = Date.parse('2026-11-29T10:00:00Z');
    assert.equal(parseRetryAfter('Sun, 29 Nov 2026 10:00:30 GMT', now), 30);
    assert.equal(parseRetryAfter('Sun, 29 Nov 2026 09:00:00 GMT', now), 0);
    assert.equal(parseRetryAfter('soon'), null);
    assert.equal(parseRetryAfter('-3'), null);
    assert.equal(parseRetryAfter(null), null);
  });

  test('problem slug', () => {
    assert.equal(problemSlug('https://airlock.local/problems/capacity-unavailable'), 'capacity-unavailable');
    assert.equal(problemSlug('about:blank'), '');
    assert.equal(problemSlug(42), '');
  });

  test('errorFromResponse reads problem+json and Retry-After', async () => {
    const res = new Response(
      JSON.stringify({ type: 'https://airlock.local/problems/rate-limited', title: 'Too many', status: 429, detail: 'budget' }),
      { status: 429, headers: { 'Content-Type': 'application/problem+json', 'Retry-After': '12' } },
    );
    const e = await errorFromResponse(res);
    assert.equal(e.status, 429);
    assert.equal(e.slug, 'rate-limited');
    assert.equal(e.title, 'Too many');
    assert.equal(e.retryAfter, 12);
    const plain = await errorFromResponse(new Response('<html>bad gateway</html>', { status: 502, statusText: 'Bad Gateway' }));
    assert.equal(plain.status, 502);
    assert.equal(plain.slug, '');
  });

  test('cleanCitations drops malformed entries and sorts', () => {
    const out = cleanCitations([
      { n: 2, doc_id: 'b', title: 'B', snippet: 's', score: 0.5, chunk_id: 3 },
      { n: 1, doc_id: 'a', title: { html: '<b>' }, snippet: null, score: 'high' },
      { n: 2, doc_id: 'dup' },
      { n: 0 },
      null,
      'x',
    ]);
    assert.deepEqual(out, [
      { n: 1, doc_id: 'a', chunk_id: null, title: '', snippet: '', passage: '', score: null, anchor: {} },
      { n: 2, doc_id: 'b', chunk_id: 3, title: 'B', snippet: 's', passage: '', score: 0.5, anchor: {} },
    ]);
    assert.deepEqual(cleanCitations(undefined), []);
  });

  test('cleanCitations keeps a passage only inside its snippet, and well-formed anchors', () => {
    const [a, b] = cleanCitations([
      { n: 1, doc_id: 'r.pdf', snippet: '…the limit is 5. More…', passage: 'the limit is 5.', page: 3, section: ['Policy', '4.2 Limits', 7] },
      { n: 2, doc_id: 'x', snippet: 'abc', passage: 'not in it', page: 0, slide: 'two', sheet: 'Rates', rows: [4, 2] },
    ]);
    assert.equal(a.passage, 'the limit is 5.');
    assert.deepEqual(a.anchor, { page: 3, section: ['Policy', '4.2 Limits'] });
    assert.equal(b.passage, '');
    assert.deepEqual(b.anchor, { sheet: 'Rates' });
  });

  test('cleanPassages keeps {n, snippet, passage} with the passage inside the snippet', () => {
    assert.deepEqual(
      cleanPassages([
        { n: 1, snippet: 'a b c', passage: 'b' },
        { n: 2, snippet: 'a b c', passage: 'z' },
        { n: 0, snippet: 'a', passage: 'a' },
        null,
      ]),
      [{ n: 1, snippet: 'a b c', passage: 'b' }],
    );
    assert.deepEqual(cleanPassages('x'), []);
  });

  test('anchorText names page, slide, sheet and rows, and the innermost section', () => {
    assert.equal(anchorText({ page: 3, section: ['Policy', '4.2 Limits'] }), 'page 3 · 4.2 Limits');
    assert.equal(anchorText({ sheet: 'Rates', rows: [2, 4] }), 'sheet Rates, rows 2–4');
    assert.equal(anchorText({ slide: 2 }), 'slide 2');
    assert.equal(anchorText({}), '');
    assert.equal(anchorText(undefined), '');
  });

  test('cleanCited keeps unique positive integers, sorted; not a list is null', () => {
    assert.deepEqual(cleanCited([3, 1, 3, 0, -2, 1.5, '2', null, 1000, 2]), [1, 2, 3]);
    assert.deepEqual(cleanCited([]), []);
    assert.equal(cleanCited(undefined), null);
    assert.equal(cleanCited({ 0: 1 }), null);
  });

  test('rungOf', () => {
    assert.equal(rungOf('3'), 3);
    assert.equal(rungOf(0), 0);
    assert.equal(rungOf('9'), null);
    assert.equal(rungOf(null), null);
  });
});

test('fnv1a64 matches the reference vectors', () => {
  assert.equal(fnv1a64(''), 'cbf29ce484222325');
  assert.equal(fnv1a64('a'), 'af63dc4c8601ec8c');
  assert.equal(fnv1a64('foobar'), '85944171f73967e8');
});

describe('sign-in methods and the session CSRF header', () => {
  test('cleanMethods keeps well-formed fields and only same-origin OIDC links', () => {
    assert.deepEqual(cleanMethods(null), { ldap: false, oidc: null, trusted_header: false, token: true });
    assert.deepEqual(cleanMethods({ ldap: true, oidc: null, trusted_header: false, token: true }), {
      ldap: true,
      oidc: null,
      trusted_header: false,
      token: true,
    });
    assert.equal(cleanMethods({ ldap: 'yes' }).ldap, false);
    const oidc = (login_url, display_name = 'Bank SSO') => cleanMethods({ oidc: { display_name, login_url } }).oidc;
    assert.deepEqual(oidc('/v1/auth/oidc/login'), { display_name: 'Bank SSO', login_url: '/v1/auth/oidc/login' });
    for (const bad of ['https://evil.example/login', '//evil.example/login', '/\\evil.example', 'javascript:alert(1)', '']) {
      assert.equal(oidc(bad), null, bad);
    }
    assert.equal(oidc('/v1/auth/oidc/login', '   ').display_name, 'your identity provider');
  });

  test('writes of a session carry X-Airlock-CSRF; reads and bearer calls do not', () => {
    const api = new Api('');
    api.csrf = 'alk_csrf';
    assert.equal(api.headers({}, true)['X-Airlock-CSRF'], 'alk_csrf');
    assert.equal(api.headers({}, false)['X-Airlock-CSRF'], undefined);
    const bearer = new Api('alt_token');
    bearer.csrf = 'alk_csrf';
    assert.deepEqual(bearer.headers({}, true), { Authorization: 'Bearer alt_token' });
  });
});
