// Safe Markdown for model answers.
//
// Two steps: `parseMarkdown(text)` turns the text into a small tree of plain objects (no DOM,
// unit-tested in Node), and `renderMarkdown(tree, doc, opts)` builds DOM nodes from it with
// createElement / createTextNode only. Nothing here ever assigns innerHTML or an attribute
// taken from the text, so markup written by the model or quoted from a document shows as text.
// Links are shown as text with their address beside them, never as clickable anchors: an
// answer must not be able to send the reader somewhere. `[n]` citation markers become tree
// nodes that the caller turns into links to the sources panel.
//
// The subset is what chat models write: headings, paragraphs (single newlines kept as line
// breaks), **strong**, *em*, `code`, fenced code blocks (an unclosed fence runs to the end, so
// a half-streamed block looks right), bullet and numbered lists with nesting, block quotes,
// horizontal rules and pipe tables. Unmatched delimiters stay literal, so a partial stream
// never "jumps" into formatting it has not finished.

/**
 * @typedef {{type: 'text', text: string} | {type: 'br'} | {type: 'code', text: string}
 *   | {type: 'strong' | 'em', children: Inline[]} | {type: 'cite', n: number}
 *   | {type: 'link', children: Inline[], href: string}} Inline
 * @typedef {{type: 'paragraph', inlines: Inline[]} | {type: 'heading', level: number, inlines: Inline[]}
 *   | {type: 'codeblock', lang: string, text: string} | {type: 'hr'}
 *   | {type: 'quote', children: Block[]} | {type: 'list', ordered: boolean, start: number, items: Block[][]}
 *   | {type: 'table', align: string[], header: Inline[][], rows: Inline[][][]}} Block
 */

const FENCE = /^ {0,3}(`{3,}|~{3,})[ \t]*([A-Za-z0-9_+#.-]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
const HR = /^ {0,3}(?:(?:-[ \t]*){3,}|(?:\*[ \t]*){3,}|(?:_[ \t]*){3,})$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const LIST_ITEM = /^([ \t]*)([-*+]|\d{1,9}[.)])(?:[ \t]+(.*)|[ \t]*)$/;
const TABLE_SEP = /^[ \t]*\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$/;
const CITE = /^\[(\d{1,3}(?:[ \t]*,[ \t]*\d{1,3})*)\]/;
const LINK = /^\[([^\]\n]{1,500})\]\(([^()\s]{1,2000})\)/;
const ESCAPABLE = '\\`*_{}[]()#+-.!|>~<';

/** Visual width of leading whitespace (tab = 4). */
function indentOf(line) {
  let w = 0;
  for (const c of line) {
    if (c === ' ') w += 1;
    else if (c === '\t') w += 4 - (w % 4);
    else break;
  }
  return w;
}

/** Removes up to `n` columns of leading whitespace. */
function dedent(line, n) {
  let w = 0;
  let i = 0;
  while (i < line.length && w < n) {
    if (line[i] === ' ') w += 1;
    else if (line[i] === '\t') w += 4 - (w % 4);
    else break;
    i++;
  }
  return line.slice(i);
}

const isBlank = (line) => /^[ \t]*$/.test(line);

function isTableStart(lines, i) {
  return (
    i + 1 < lines.length &&
    lines[i].includes('|') &&
    lines[i + 1].includes('-') &&
    TABLE_SEP.test(lines[i + 1]) &&
    (lines[i + 1].includes('|') || lines[i].trim().startsWith('|'))
  );
}

/** Whether `line` starts a block that interrupts a paragraph. */
function interruptsParagraph(lines, i) {
  const line = lines[i];
  if (FENCE.test(line) || HR.test(line) || QUOTE.test(line)) return true;
  const h = HEADING.exec(line);
  if (h && (h[2] !== undefined || /#\s*$/.test(line))) return true;
  const li = LIST_ITEM.exec(line);
  if (li && li[3] !== undefined && indentOf(li[1]) < 4) return true;
  return isTableStart(lines, i);
}

function splitRow(line) {
  let s = line.trim();
  if (s.startsWith('|')) s = s.slice(1);
  if (s.endsWith('|') && !s.endsWith('\\|')) s = s.slice(0, -1);
  const cells = [];
  let cur = '';
  for (let i = 0; i < s.length; i++) {
    if (s[i] === '\\' && s[i + 1] === '|') {
      cur += '|';
      i++;
    } else if (s[i] === '|') {
      cells.push(cur.trim());
      cur = '';
    } else {
      cur += s[i];
    }
  }
  cells.push(cur.trim());
  return cells;
}

/**
 * Parses Markdown text into blocks.
 * @param {string} text
 * @returns {Block[]}
 */
export function parseMarkdown(text) {
  return parseLines(String(text ?? '').split(/\r\n|\r|\n/), 0);
}

/**
 * @param {string[]} lines
 * @param {number} depth nesting depth, bounded so hostile input cannot exhaust the stack
 * @returns {Block[]}
 */
function parseLines(lines, depth) {
  /** @type {Block[]} */
  const blocks = [];
  let i = 0;
  const n = lines.length;
  while (i < n) {
    const line = lines[i];
    if (isBlank(line)) {
      i++;
      continue;
    }
    let m = FENCE.exec(line);
    if (m) {
      const fence = m[1];
      const body = [];
      const open = indentOf(line);
      i++;
      while (i < n) {
        const l = lines[i];
        const t = l.trim();
        if (t.startsWith(fence[0].repeat(fence.length)) && /^[`~]+$/.test(t) && t[0] === fence[0]) {
          i++;
          break;
        }
        body.push(dedent(l, open));
        i++;
      }
      blocks.push({ type: 'codeblock', lang: m[2] || '', text: body.join('\n') });
      continue;
    }
    if (HR.test(line)) {
      blocks.push({ type: 'hr' });
      i++;
      continue;
    }
    m = HEADING.exec(line);
    if (m && (m[2] !== undefined || /#\s*$/.test(line))) {
      blocks.push({ type: 'heading', level: m[1].length, inlines: parseInline(m[2] || '') });
      i++;
      continue;
    }
    if (QUOTE.test(line)) {
      const inner = [];
      while (i < n && !isBlank(lines[i])) {
        const q = QUOTE.exec(lines[i]);
        inner.push(q ? q[1] : lines[i]);
        i++;
      }
      const children = depth < 8 ? parseLines(inner, depth + 1) : [paragraphOf(inner)];
      blocks.push({ type: 'quote', children });
      continue;
    }
    m = LIST_ITEM.exec(line);
    if (m && m[3] !== undefined && indentOf(m[1]) < 4) {
      i = parseList(lines, i, depth, blocks);
      continue;
    }
    if (isTableStart(lines, i)) {
      const header = splitRow(line);
      const align = splitRow(lines[i + 1]).map((c) =>
        c.startsWith(':') && c.endsWith(':') ? 'center' : c.endsWith(':') ? 'right' : c.startsWith(':') ? 'left' : '',
      );
      i += 2;
      const rows = [];
      while (i < n && !isBlank(lines[i]) && lines[i].includes('|')) {
        const cells = splitRow(lines[i]);
        rows.push(header.map((_, k) => parseInline(cells[k] ?? '')));
        i++;
      }
      blocks.push({ type: 'table', align: header.map((_, k) => align[k] || ''), header: header.map(parseInline), rows });
      continue;
    }
    const para = [line];
    i++;
    while (i < n && !isBlank(lines[i]) && !interruptsParagraph(lines, i)) {
      para.push(lines[i]);
      i++;
    }
    blocks.push(paragraphOf(para));
  }
  return blocks;
}

function paragraphOf(lines) {
  /** @type {Inline[]} */
  const inlines = [];
  lines.forEach((l, k) => {
    if (k > 0) inlines.push({ type: 'br' });
    inlines.push(...parseInline(l.trim()));
  });
  return { type: 'paragraph', inlines };
}

/** Parses a list starting at line `i`; pushes it to `blocks` and returns the next line index. */
function parseList(lines, i, depth, blocks) {
  const first = LIST_ITEM.exec(lines[i]);
  const base = indentOf(first[1]);
  const ordered = /\d/.test(first[2]);
  const bullet = first[2].slice(-1);
  const start = ordered ? parseInt(first[2], 10) : 1;
  const items = [];
  let cur = null;
  let contentIndent = base + first[2].length + 1;
  const n = lines.length;
  while (i < n) {
    const line = lines[i];
    const m = LIST_ITEM.exec(line);
    if (m && m[3] !== undefined && indentOf(m[1]) <= base + 1) {
      const sameKind = ordered ? /\d/.test(m[2]) && m[2].slice(-1) === bullet : m[2] === bullet;
      if (!sameKind) break;
      cur = [m[3]];
      items.push(cur);
      contentIndent = indentOf(m[1]) + m[2].length + 1;
      i++;
      continue;
    }
    if (isBlank(line)) {
      let j = i + 1;
      while (j < n && isBlank(lines[j])) j++;
      if (j >= n) break;
      const next = LIST_ITEM.exec(lines[j]);
      const continues = indentOf(lines[j]) > base + 1 || (next && next[3] !== undefined && indentOf(next[1]) <= base + 1);
      if (!continues) break;
      cur.push('');
      i++;
      continue;
    }
    if (indentOf(line) > base + 1) {
      cur.push(dedent(line, Math.min(indentOf(line), contentIndent)));
      i++;
      continue;
    }
    if (!interruptsParagraph(lines, i) && cur.length > 0 && !isBlank(cur[cur.length - 1])) {
      cur.push(line.trim());
      i++;
      continue;
    }
    break;
  }
  const parsed = items.map((itemLines) => (depth < 8 ? parseLines(itemLines, depth + 1) : [paragraphOf(itemLines)]));
  blocks.push({ type: 'list', ordered, start, items: parsed });
  return i;
}

/** Finds the next `delim` at or after `from` that can close an emphasis run. */
function findCloser(s, delim, from) {
  let k = from;
  while (k < s.length) {
    const j = s.indexOf(delim, k);
    if (j < 0) return -1;
    if (s[j - 1] === '\\') {
      k = j + 1;
      continue;
    }
    const before = s[j - 1];
    const after = s[j + delim.length];
    const closesAfterText = before !== undefined && !/\s/.test(before);
    // `_` may not close inside a word (snake_case stays literal).
    const intraword = delim[0] === '_' && after !== undefined && /[\p{L}\p{N}]/u.test(after);
    // A single `*` must not be the first half of a `**`.
    const partOfDouble = delim.length === 1 && s[j + 1] === delim;
    if (closesAfterText && !intraword && !partOfDouble) return j;
    k = j + (partOfDouble ? 2 : 1);
  }
  return -1;
}

/**
 * Parses inline Markdown.
 * @param {string} s
 * @param {number} [depth]
 * @returns {Inline[]}
 */
export function parseInline(s, depth = 0) {
  /** @type {Inline[]} */
  const out = [];
  let text = '';
  const flush = () => {
    if (text) out.push({ type: 'text', text });
    text = '';
  };
  let i = 0;
  while (i < s.length) {
    const c = s[i];
    if (c === '\\' && i + 1 < s.length && ESCAPABLE.includes(s[i + 1])) {
      text += s[i + 1];
      i += 2;
      continue;
    }
    if (c === '`') {
      let run = 1;
      while (s[i + run] === '`') run++;
      const fence = '`'.repeat(run);
      const end = s.indexOf(fence, i + run);
      if (end > 0 && s[end + run] !== '`') {
        flush();
        let code = s.slice(i + run, end);
        if (code.length > 1 && code.startsWith(' ') && code.endsWith(' ') && code.trim()) code = code.slice(1, -1);
        out.push({ type: 'code', text: code });
        i = end + run;
      } else {
        text += fence;
        i += run;
      }
      continue;
    }
    if ((c === '*' || c === '_') && depth < 6) {
      const double = s[i + 1] === c;
      const delim = double ? c + c : c;
      const openOk = s[i + delim.length] !== undefined && !/\s/.test(s[i + delim.length]);
      const prev = s[i - 1];
      const intraword = c === '_' && prev !== undefined && /[\p{L}\p{N}]/u.test(prev);
      if (openOk && !intraword) {
        const end = findCloser(s, delim, i + delim.length + 1);
        if (end > 0) {
          flush();
          out.push({ type: double ? 'strong' : 'em', children: parseInline(s.slice(i + delim.length, end), depth + 1) });
          i = end + delim.length;
          continue;
        }
      }
      text += delim;
      i += delim.length;
      continue;
    }
    if (c === '[') {
      const rest = s.slice(i);
      let m = CITE.exec(rest);
      if (m) {
        flush();
        for (const part of m[1].split(',')) out.push({ type: 'cite', n: parseInt(part.trim(), 10) });
        i += m[0].length;
        continue;
      }
      m = depth < 6 ? LINK.exec(rest) : null;
      if (m) {
        flush();
        out.push({ type: 'link', children: parseInline(m[1], depth + 1), href: m[2] });
        i += m[0].length;
        continue;
      }
    }
    text += c;
    i++;
  }
  flush();
  return out;
}

/**
 * Builds DOM nodes for parsed blocks. Only createElement / createTextNode are used.
 * @param {Block[]} blocks
 * @param {Document} doc
 * @param {{citation?: (n: number) => Node | null}} [opts] turns `[n]` into a node; null keeps
 *   the marker as plain text (a number the answer has no source for).
 * @returns {DocumentFragment}
 */
export function renderMarkdown(blocks, doc, opts = {}) {
  const frag = doc.createDocumentFragment();
  for (const b of blocks) frag.appendChild(renderBlock(b, doc, opts));
  return frag;
}

function renderBlock(b, doc, opts) {
  switch (b.type) {
    case 'paragraph': {
      const p = doc.createElement('p');
      appendInlines(p, b.inlines, doc, opts);
      return p;
    }
    case 'heading': {
      // Answers sit under the page's own h1/h2: model headings start at h3.
      const h = doc.createElement(`h${Math.min(6, b.level + 2)}`);
      appendInlines(h, b.inlines, doc, opts);
      return h;
    }
    case 'codeblock': {
      const pre = doc.createElement('pre');
      const code = doc.createElement('code');
      code.textContent = b.text;
      pre.appendChild(code);
      pre.tabIndex = 0;
      return pre;
    }
    case 'hr':
      return doc.createElement('hr');
    case 'quote': {
      const q = doc.createElement('blockquote');
      q.appendChild(renderMarkdown(b.children, doc, opts));
      return q;
    }
    case 'list': {
      const list = doc.createElement(b.ordered ? 'ol' : 'ul');
      if (b.ordered && b.start !== 1) list.start = b.start;
      for (const item of b.items) {
        const li = doc.createElement('li');
        if (item.length === 1 && item[0].type === 'paragraph') appendInlines(li, item[0].inlines, doc, opts);
        else li.appendChild(renderMarkdown(item, doc, opts));
        list.appendChild(li);
      }
      return list;
    }
    case 'table': {
      const wrap = doc.createElement('div');
      wrap.className = 'table-wrap';
      wrap.tabIndex = 0;
      const table = doc.createElement('table');
      const thead = doc.createElement('thead');
      const hr = doc.createElement('tr');
      b.header.forEach((cell, k) => {
        const th = doc.createElement('th');
        th.scope = 'col';
        if (b.align[k]) th.className = `align-${b.align[k]}`;
        appendInlines(th, cell, doc, opts);
        hr.appendChild(th);
      });
      thead.appendChild(hr);
      table.appendChild(thead);
      const tbody = doc.createElement('tbody');
      for (const row of b.rows) {
        const tr = doc.createElement('tr');
        row.forEach((cell, k) => {
          const td = doc.createElement('td');
          if (b.align[k]) td.className = `align-${b.align[k]}`;
          appendInlines(td, cell, doc, opts);
          tr.appendChild(td);
        });
        tbody.appendChild(tr);
      }
      table.appendChild(tbody);
      wrap.appendChild(table);
      return wrap;
    }
    default:
      return doc.createTextNode('');
  }
}

function appendInlines(parent, inlines, doc, opts) {
  for (const node of inlines) {
    switch (node.type) {
      case 'text':
        parent.appendChild(doc.createTextNode(node.text));
        break;
      case 'br':
        parent.appendChild(doc.createElement('br'));
        break;
      case 'code': {
        const code = doc.createElement('code');
        code.textContent = node.text;
        parent.appendChild(code);
        break;
      }
      case 'strong':
      case 'em': {
        const el = doc.createElement(node.type);
        appendInlines(el, node.children, doc, opts);
        parent.appendChild(el);
        break;
      }
      case 'cite': {
        const el = opts.citation ? opts.citation(node.n) : null;
        parent.appendChild(el || doc.createTextNode(`[${node.n}]`));
        break;
      }
      case 'link': {
        const span = doc.createElement('span');
        span.className = 'md-link';
        appendInlines(span, node.children, doc, opts);
        const url = doc.createElement('span');
        url.className = 'md-link-url';
        url.textContent = ` (${node.href})`;
        span.appendChild(url);
        parent.appendChild(span);
        break;
      }
      default:
        break;
    }
  }
}

/**
 * Plain text of inline nodes (for headings in tests and for accessible names).
 * @param {Inline[]} inlines
 * @returns {string}
 */
export function inlineText(inlines) {
  return inlines
    .map((n) => {
      if (n.type === 'text' || n.type === 'code') return n.text;
      if (n.type === 'br') return '\n';
      if (n.type === 'cite') return `[${n.n}]`;
      if (n.type === 'link') return `${inlineText(n.children)} (${n.href})`;
      return inlineText(n.children);
    })
    .join('');
}
