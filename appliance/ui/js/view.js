// DOM for one question and its answer. Every piece of text that comes from the user, the model
// or a document is set with textContent / createTextNode (or goes through markdown.js, which
// does the same); this module never uses innerHTML.

import { parseMarkdown, renderMarkdown } from './markdown.js';

const SVG_NS = 'http://www.w3.org/2000/svg';

/** Static icon paths (16×16), drawn for this page. */
const ICONS = {
  up: 'M1.5 7h3v7.5h-3zM6 14.5V7l3.2-5.6c.9-.1 1.8.6 1.8 1.6V6h3.1c.9 0 1.6.8 1.4 1.7l-1.2 5.6c-.2.7-.8 1.2-1.5 1.2z',
  down: 'M1.5 9h3V1.5h-3zM6 1.5V9l3.2 5.6c.9.1 1.8-.6 1.8-1.6V10h3.1c.9 0 1.6-.8 1.4-1.7L14.3 2.7c-.2-.7-.8-1.2-1.5-1.2z',
  copy: 'M5 1.5h8.5v10H12V3H5zM2.5 4.5H11v10H2.5zM4 6v7h5.5V6z',
  retry: 'M8 2.5a5.5 5.5 0 1 0 5.3 7h-1.6A4 4 0 1 1 8 4c1.1 0 2.1.5 2.8 1.2L8.8 7.2H14V2l-2.1 2.1A5.5 5.5 0 0 0 8 2.5z',
};

/**
 * An inline SVG icon (decorative: the button carries the text).
 * @param {Document} doc
 * @param {keyof ICONS} name
 */
export function icon(doc, name) {
  const svg = doc.createElementNS(SVG_NS, 'svg');
  svg.setAttribute('viewBox', '0 0 16 16');
  svg.setAttribute('width', '16');
  svg.setAttribute('height', '16');
  svg.setAttribute('aria-hidden', 'true');
  svg.setAttribute('focusable', 'false');
  svg.setAttribute('class', 'icon');
  const path = doc.createElementNS(SVG_NS, 'path');
  path.setAttribute('d', ICONS[name]);
  path.setAttribute('fill', 'currentColor');
  path.setAttribute('fill-rule', 'evenodd');
  svg.appendChild(path);
  return svg;
}

/** What each ladder rung means to a reader (DESIGN.md §6). */
export const RUNG_LABELS = {
  1: 'reduced mode: reranking off',
  2: 'reduced mode: fewer sources',
  3: 'reduced mode: smaller model',
  4: 'reduced mode: queued',
  5: 'reduced mode: shedding load',
};

const RUNG_HELP =
  'Airlock was busy when it answered this question, so it used a lighter method. The answer may be less complete than usual.';

/**
 * Where a source sits in its original file, for a reader: "page 3 · 4.2 Limits".
 * @param {{page?: number, slide?: number, sheet?: string, rows?: number[], section?: string[]} | undefined} a
 */
export function anchorText(a) {
  if (!a) return '';
  const parts = [];
  if (a.page) parts.push(`page ${a.page}`);
  if (a.slide) parts.push(`slide ${a.slide}`);
  if (a.sheet) parts.push(a.rows ? `sheet ${a.sheet}, rows ${a.rows[0]}–${a.rows[1]}` : `sheet ${a.sheet}`);
  else if (a.rows) parts.push(`rows ${a.rows[0]}–${a.rows[1]}`);
  if (a.section && a.section.length) parts.push(a.section[a.section.length - 1]);
  return parts.join(' · ');
}

/**
 * The snippet with its supporting passage marked (text nodes only).
 * @param {Document} doc
 * @param {string} snippet
 * @param {string} passage
 */
export function snippetNode(doc, snippet, passage) {
  const p = doc.createElement('p');
  p.className = 'source-snippet';
  const at = passage ? snippet.indexOf(passage) : -1;
  if (at < 0) {
    p.textContent = snippet;
    return p;
  }
  if (at > 0) p.appendChild(doc.createTextNode(snippet.slice(0, at)));
  const mark = doc.createElement('mark');
  mark.className = 'source-passage';
  mark.textContent = passage;
  p.appendChild(mark);
  const rest = snippet.slice(at + passage.length);
  if (rest) p.appendChild(doc.createTextNode(rest));
  return p;
}

function el(doc, tag, className, text) {
  const e = doc.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

function button(doc, className, label, iconName) {
  const b = el(doc, 'button', `btn ${className}`);
  b.type = 'button';
  if (iconName) b.appendChild(icon(doc, iconName));
  b.appendChild(el(doc, 'span', 'btn-label', label));
  return b;
}

/** Formats a relevance score for display. */
export function formatScore(score) {
  if (score === null || score === undefined || !Number.isFinite(score)) return '';
  return Math.abs(score) >= 100 ? score.toFixed(0) : score.toFixed(2);
}

/**
 * The view of one turn. `turn` is the app's state object; `update()` redraws from it.
 */
export class TurnView {
  /**
   * @param {Document} doc
   * @param {object} turn
   * @param {{onRetry: Function, onCopy: Function, onFeedback: Function, onCitation: Function, onOpenOriginal?: Function}} handlers
   */
  constructor(doc, turn, handlers) {
    this.doc = doc;
    this.turn = turn;
    this.handlers = handlers;
    this.countdownTimer = null;
    this.renderedError = null;
    this.renderedText = null;
    this.renderedCitations = null;

    const root = el(doc, 'li', 'turn');
    root.id = `turn-${turn.id}`;
    this.root = root;

    const q = el(doc, 'article', 'question-card');
    q.setAttribute('aria-label', 'Question');
    q.appendChild(el(doc, 'p', 'who', 'You'));
    this.questionText = el(doc, 'p', 'question-text');
    q.appendChild(this.questionText);
    root.appendChild(q);

    const a = el(doc, 'article', 'answer-card');
    const short = turn.question.length > 60 ? `${turn.question.slice(0, 60)}…` : turn.question;
    a.setAttribute('aria-label', `Answer to: ${short}`);
    this.answer = a;
    const head = el(doc, 'div', 'answer-head');
    head.appendChild(el(doc, 'p', 'who', 'Airlock'));
    this.rungBadge = el(doc, 'p', 'rung');
    this.rungBadge.hidden = true;
    head.appendChild(this.rungBadge);
    a.appendChild(head);

    this.body = el(doc, 'div', 'answer-body');
    a.appendChild(this.body);
    this.waiting = el(doc, 'p', 'waiting');
    this.waiting.appendChild(el(doc, 'span', 'dots'));
    this.waitingText = el(doc, 'span', 'waiting-text', 'Searching your documents…');
    this.waiting.appendChild(this.waitingText);
    a.appendChild(this.waiting);

    this.note = el(doc, 'p', 'answer-note');
    this.note.hidden = true;
    a.appendChild(this.note);

    this.errorBox = el(doc, 'div', 'alert error-box');
    this.errorBox.setAttribute('role', 'alert');
    this.errorBox.hidden = true;
    a.appendChild(this.errorBox);

    this.sources = el(doc, 'section', 'sources');
    this.sources.hidden = true;
    this.sourcesTitleId = `sources-title-${turn.id}`;
    this.sources.setAttribute('aria-labelledby', this.sourcesTitleId);
    a.appendChild(this.sources);

    this.actions = el(doc, 'div', 'answer-actions');
    this.copyBtn = button(doc, 'ghost', 'Copy', 'copy');
    this.copyBtn.addEventListener('click', () => handlers.onCopy(this.turn));
    this.retryBtn = button(doc, 'ghost', 'Retry', 'retry');
    this.retryBtn.addEventListener('click', () => handlers.onRetry(this.turn));
    this.upBtn = button(doc, 'ghost thumb', 'Helpful', 'up');
    this.upBtn.setAttribute('aria-pressed', 'false');
    this.upBtn.addEventListener('click', () => this.rate('up'));
    this.downBtn = button(doc, 'ghost thumb', 'Not helpful', 'down');
    this.downBtn.setAttribute('aria-pressed', 'false');
    this.downBtn.addEventListener('click', () => this.rate('down'));
    const fbGroup = el(doc, 'div', 'feedback-buttons');
    fbGroup.setAttribute('role', 'group');
    fbGroup.setAttribute('aria-label', 'Rate this answer');
    fbGroup.append(this.upBtn, this.downBtn);
    this.fbGroup = fbGroup;
    this.actions.append(this.copyBtn, this.retryBtn, fbGroup);
    a.appendChild(this.actions);

    this.feedbackArea = this.buildFeedbackArea();
    a.appendChild(this.feedbackArea);

    root.appendChild(a);
    this.update();
  }

  buildFeedbackArea() {
    const doc = this.doc;
    const wrap = el(doc, 'div', 'feedback');
    wrap.hidden = true;
    this.fbStatus = el(doc, 'p', 'feedback-status');
    this.fbStatus.setAttribute('role', 'status');
    wrap.appendChild(this.fbStatus);
    this.commentToggle = button(doc, 'link', 'Add a comment');
    this.commentToggle.setAttribute('aria-expanded', 'false');
    this.commentToggle.addEventListener('click', () => this.openComment());
    wrap.appendChild(this.commentToggle);

    const form = el(doc, 'form', 'comment-form');
    form.hidden = true;
    form.noValidate = true;
    const id = `comment-${this.turn.id}`;
    this.commentToggle.setAttribute('aria-controls', id);
    const label = el(doc, 'label', '', 'Comment (optional)');
    label.htmlFor = id;
    const hint = el(doc, 'p', 'hint', 'Stored with your rating. The answer text is not stored unless you paste it here.');
    hint.id = `${id}-hint`;
    const ta = el(doc, 'textarea');
    ta.id = id;
    ta.rows = 3;
    ta.maxLength = 2000;
    ta.setAttribute('aria-describedby', hint.id);
    const row = el(doc, 'div', 'row');
    const send = el(doc, 'button', 'btn primary', 'Send comment');
    send.type = 'submit';
    const cancel = el(doc, 'button', 'btn', 'Cancel');
    cancel.type = 'button';
    cancel.addEventListener('click', () => {
      form.hidden = true;
      this.commentToggle.hidden = false;
      this.commentToggle.setAttribute('aria-expanded', 'false');
      this.commentToggle.focus();
    });
    row.append(send, cancel);
    form.append(label, ta, hint, row);
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      const fb = this.turn.answer.feedback;
      if (!fb) return;
      this.handlers.onFeedback(this.turn, fb.rating, ta.value.trim());
      form.hidden = true;
    });
    wrap.appendChild(form);
    this.commentForm = form;
    this.commentInput = ta;
    return wrap;
  }

  openComment() {
    this.commentForm.hidden = false;
    this.commentToggle.hidden = true;
    this.commentToggle.setAttribute('aria-expanded', 'true');
    this.commentInput.value = this.turn.answer.feedback?.comment || '';
    this.commentInput.focus();
  }

  rate(rating) {
    const fb = this.turn.answer.feedback;
    const comment = fb && fb.rating === rating ? fb.comment : '';
    this.handlers.onFeedback(this.turn, rating, comment || '');
  }

  /** Redraws everything from the turn's state (cheap parts) and the body if its text changed. */
  update() {
    const { turn } = this;
    const a = turn.answer;
    this.questionText.textContent = turn.question;
    const busy = a.status === 'waiting' || a.status === 'streaming';
    this.answer.setAttribute('aria-busy', busy ? 'true' : 'false');
    this.waiting.hidden = a.status !== 'waiting';
    const n = a.citations.length;
    this.waitingText.textContent = !a.citationsReceived
      ? 'Searching your documents…'
      : n
        ? `Reading ${n} source${n === 1 ? '' : 's'}…`
        : 'Writing the answer…';

    if (a.rung !== null && a.rung !== undefined && a.rung > 0 && RUNG_LABELS[a.rung]) {
      this.rungBadge.hidden = false;
      this.rungBadge.textContent = RUNG_LABELS[a.rung];
      this.rungBadge.title = RUNG_HELP;
    } else {
      this.rungBadge.hidden = true;
    }

    this.renderBody();
    this.renderSources();

    if (a.status === 'stopped') {
      this.note.hidden = false;
      this.note.textContent = a.text ? 'Stopped: the answer above is incomplete.' : 'Stopped before the answer began.';
    } else if (a.status === 'done' && !a.text) {
      this.note.hidden = false;
      this.note.textContent = 'Airlock returned an empty answer.';
    } else {
      this.note.hidden = true;
    }

    this.renderError();

    const finished = !busy;
    this.actions.hidden = !finished;
    this.copyBtn.hidden = !a.text;
    const canRate = finished && Boolean(a.requestId) && a.status !== 'error';
    this.fbGroup.hidden = !canRate;
    this.renderFeedback(canRate);
  }

  renderBody() {
    const a = this.turn.answer;
    const citeKey = a.citations.map((c) => c.n).join(',');
    if (this.renderedText === a.text && this.renderedCitations === citeKey) return;
    this.renderedText = a.text;
    this.renderedCitations = citeKey;
    const known = new Map(a.citations.map((c) => [c.n, c]));
    const frag = renderMarkdown(parseMarkdown(a.text), this.doc, {
      citation: (n) => {
        const c = known.get(n);
        if (!c) return null;
        const link = el(this.doc, 'a', 'cite', String(n));
        link.href = `#${this.sourceId(n)}`;
        link.setAttribute('aria-label', `Source ${n}${c.title ? `: ${c.title}` : ''}`);
        link.addEventListener('click', (e) => {
          e.preventDefault();
          this.handlers.onCitation(this, n);
        });
        return link;
      },
    });
    this.body.replaceChildren(frag);
  }

  sourceId(n) {
    return `src-${this.turn.id}-${n}`;
  }

  /** Moves focus to source `n` and highlights it briefly. */
  focusSource(n) {
    const item = this.doc.getElementById(this.sourceId(n));
    if (!item) return;
    for (const other of this.sources.querySelectorAll('.source.highlight')) other.classList.remove('highlight');
    item.classList.add('highlight');
    item.focus({ preventScroll: true });
    item.scrollIntoView({ block: 'nearest', behavior: 'smooth' });
  }

  renderSources() {
    const a = this.turn.answer;
    const key = `${a.citationsReceived ? 1 : 0}${a.unsupported ? 1 : 0}${JSON.stringify(a.citations)}${JSON.stringify(a.cited)}`;
    if (this.sourcesKey === key) return;
    this.sourcesKey = key;
    const doc = this.doc;
    const hasMeta = a.citationsReceived || a.citations.length > 0;
    this.sources.hidden = !hasMeta;
    if (!hasMeta) return;
    const cited = new Set((a.cited || []).filter((n) => a.citations.some((c) => c.n === n)));
    const count = a.citations.length
      ? a.cited
        ? `Sources (${a.citations.length}, ${cited.size} used by the answer)`
        : `Sources (${a.citations.length})`
      : 'Sources';
    const title = el(doc, 'h3', 'sources-title', count);
    title.id = this.sourcesTitleId;
    const parts = [title];
    if (a.unsupported) {
      const warn = el(
        doc,
        'p',
        'unsupported',
        'No source below supports this answer: its figures and names may be made up. Check the sources or ask again.',
      );
      warn.setAttribute('role', 'note');
      parts.push(warn);
    }
    if (a.citations.length === 0) {
      parts.push(el(doc, 'p', 'hint', 'No document you can read matched this question.'));
    } else {
      const list = el(doc, 'ol', 'source-list');
      for (const c of a.citations) {
        const li = el(doc, 'li', a.cited && cited.has(c.n) ? 'source used' : 'source');
        li.id = this.sourceId(c.n);
        li.tabIndex = -1;
        li.appendChild(el(doc, 'span', 'source-n', String(c.n)));
        const main = el(doc, 'div', 'source-main');
        const t = el(doc, 'p', 'source-title', c.title || c.doc_id || 'Untitled document');
        main.appendChild(t);
        const meta = el(doc, 'p', 'source-meta');
        if (c.doc_id) meta.appendChild(el(doc, 'span', 'source-doc', c.doc_id));
        const score = formatScore(c.score);
        if (score) meta.appendChild(el(doc, 'span', 'source-score', `relevance ${score}`));
        if (a.cited && cited.has(c.n)) meta.appendChild(el(doc, 'span', 'source-used', 'used by the answer'));
        const where = anchorText(c.anchor);
        if (where) meta.appendChild(el(doc, 'span', 'source-where', where));
        main.appendChild(meta);
        if (c.snippet) main.appendChild(snippetNode(doc, c.snippet, c.passage));
        if (c.anchor && Object.keys(c.anchor).length && c.doc_id && this.handlers.onOpenOriginal) {
          const label = c.anchor.page ? `Open page ${c.anchor.page}` : 'Open the original';
          const open = button(doc, 'link source-open', label);
          open.setAttribute('aria-label', `${label} of ${c.title || c.doc_id}`);
          open.addEventListener('click', () => this.handlers.onOpenOriginal(c));
          main.appendChild(open);
        }
        li.appendChild(main);
        list.appendChild(li);
      }
      parts.push(list);
    }
    this.sources.replaceChildren(...parts);
  }

  renderError() {
    const err = this.turn.answer.status === 'error' ? this.turn.answer.error : null;
    // Redraw only when the error changes: the box is role=alert and would be re-announced.
    if (err === this.renderedError) return;
    this.renderedError = err;
    if (this.countdownTimer) {
      clearInterval(this.countdownTimer);
      this.countdownTimer = null;
    }
    if (!err) {
      this.errorBox.hidden = true;
      this.errorBox.replaceChildren();
      return;
    }
    const doc = this.doc;
    this.errorBox.hidden = false;
    const parts = [el(doc, 'p', 'alert-title', err.title)];
    if (err.message) parts.push(el(doc, 'p', '', err.message));
    let when = null;
    if (err.retryAt) {
      when = el(doc, 'p', 'retry-when');
      parts.push(when);
    }
    this.errorBox.replaceChildren(...parts);
    if (when) {
      const tick = () => {
        const s = Math.max(0, Math.ceil((err.retryAt - Date.now()) / 1000));
        when.textContent = s > 0 ? `You can try again in ${s} second${s === 1 ? '' : 's'}.` : 'You can try again now.';
        if (s === 0 && this.countdownTimer) {
          clearInterval(this.countdownTimer);
          this.countdownTimer = null;
        }
      };
      tick();
      if (err.retryAt > Date.now()) this.countdownTimer = setInterval(tick, 1000);
    }
  }

  renderFeedback(canRate) {
    const fb = this.turn.answer.feedback;
    this.upBtn.setAttribute('aria-pressed', String(fb?.rating === 'up'));
    this.downBtn.setAttribute('aria-pressed', String(fb?.rating === 'down'));
    this.feedbackArea.hidden = !canRate || !fb;
    if (!fb) return;
    const sending = fb.state === 'sending';
    this.upBtn.disabled = sending;
    this.downBtn.disabled = sending;
    let msg = '';
    if (fb.state === 'sending') msg = 'Sending your feedback…';
    else if (fb.state === 'sent') msg = fb.comment ? 'Thanks: your rating and comment were saved.' : 'Thanks for the feedback.';
    else if (fb.state === 'error') msg = `Feedback not saved: ${fb.error || 'please try again.'}`;
    this.fbStatus.textContent = msg;
    this.commentToggle.hidden = fb.state !== 'sent' || !this.commentForm.hidden;
    const label = this.commentToggle.querySelector('.btn-label');
    label.textContent = fb.comment ? 'Edit comment' : 'Add a comment';
  }

  /** Stops timers (the turn is being removed). */
  dispose() {
    if (this.countdownTimer) clearInterval(this.countdownTimer);
    this.countdownTimer = null;
  }
}
