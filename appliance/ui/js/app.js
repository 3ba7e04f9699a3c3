// The Airlock chat page: sign-in, the conversation, streaming, stop/retry/copy, feedback and
// the footer. Talks to the daemon only through api.js (the public API in API.md).

import { Api, ApiError, cleanCitations, cleanCited, isAbort, rungOf } from './api.js';
import * as store from './store.js';
import { TurnView } from './view.js';

/** How many earlier question/answer pairs are sent with a new question. */
const HISTORY_TURNS = 3;

const $ = (id) => /** @type {HTMLElement} */ (document.getElementById(id));

const ui = {
  account: $('account'),
  menu: /** @type {HTMLDetailsElement} */ ($('menu')),
  modelField: $('model-field'),
  model: /** @type {HTMLSelectElement} */ ($('model')),
  keep: /** @type {HTMLInputElement} */ ($('keep')),
  keepHint: $('keep-hint'),
  clear: $('clear'),
  signout: $('signout'),
  signin: $('signin'),
  signinTitle: $('signin-title'),
  signinAlert: $('signin-alert'),
  signinForm: /** @type {HTMLFormElement} */ ($('signin-form')),
  token: /** @type {HTMLInputElement} */ ($('token')),
  tokenShow: $('token-show'),
  signinError: $('signin-error'),
  signinSubmit: /** @type {HTMLButtonElement} */ ($('signin-submit')),
  chat: $('chat'),
  empty: $('empty'),
  log: $('log'),
  composer: /** @type {HTMLFormElement} */ ($('composer')),
  question: /** @type {HTMLTextAreaElement} */ ($('question')),
  send: /** @type {HTMLButtonElement} */ ($('send')),
  stop: /** @type {HTMLButtonElement} */ ($('stop')),
  status: $('composer-status'),
  bundle: $('bundle-version'),
  threadsMenu: /** @type {HTMLDetailsElement} */ ($('threads-menu')),
  threads: $('threads'),
  newThread: $('new-thread'),
  bundleItem: $('bundle-item'),
};

/** Session state: null while signed out. */
let session = null;
/** The answer being streamed: {turn, view, controller, stoppedByUser}. */
let current = null;

function newId() {
  const a = new Uint32Array(2);
  crypto.getRandomValues(a);
  return `${a[0].toString(36)}${a[1].toString(36)}`;
}

function emptyAnswer() {
  return {
    text: '',
    citations: [],
    citationsReceived: false,
    /** Source numbers the answer used (`null` until the daemon says). */
    cited: null,
    /** No source supports the answer's own words (`cited_by: "unsupported"`). */
    unsupported: false,
    rung: null,
    requestId: '',
    status: 'waiting',
    error: null,
    feedback: null,
  };
}

let announceTimer = 0;

/** Says `text` in the composer's status line (a polite live region); '' clears it. */
function announce(text) {
  clearTimeout(announceTimer);
  // Clear first so the same message twice is still announced.
  ui.status.textContent = '';
  if (text) {
    announceTimer = setTimeout(() => {
      ui.status.textContent = text;
    }, 30);
  }
}

// ---------------------------------------------------------------- screens

function showSignIn({ reason = 'start', message = '' } = {}) {
  ui.account.hidden = true;
  ui.chat.hidden = true;
  ui.signin.hidden = false;
  ui.signinError.textContent = '';
  ui.signinSubmit.disabled = false;
  ui.signinSubmit.textContent = 'Sign in';
  ui.token.value = '';
  if (reason === 'unauthorized') {
    ui.signinTitle.textContent = 'Your session has ended';
    ui.signinAlert.hidden = false;
    ui.signinAlert.replaceChildren(
      textP('alert-title', 'Airlock did not accept your access token (401 Unauthorized).'),
      textP('', 'It may have been revoked or replaced by a newer one, or your access may have been removed. Sign in again with a current token, or ask your Airlock administrator for a new one.'),
    );
  } else if (reason === 'signedout') {
    ui.signinTitle.textContent = 'Signed out';
    ui.signinAlert.hidden = false;
    ui.signinAlert.replaceChildren(textP('', 'You have signed out. Your token was removed from this tab.'));
  } else {
    ui.signinTitle.textContent = 'Sign in';
    ui.signinAlert.hidden = true;
    ui.signinAlert.replaceChildren();
  }
  if (message) ui.signinError.textContent = message;
  document.title = 'Sign in · Airlock';
  ui.token.focus();
}

function textP(className, text) {
  const p = document.createElement('p');
  if (className) p.className = className;
  p.textContent = text;
  return p;
}

function showChat() {
  ui.signin.hidden = true;
  ui.account.hidden = false;
  ui.chat.hidden = false;
  document.title = 'Airlock';
  syncComposer();
  ui.question.focus();
}

// ---------------------------------------------------------------- session

/**
 * Checks a token and opens the chat. Returns an error message for the sign-in form, or ''.
 * @param {string} token
 */
async function startSession(token) {
  const api = new Api(token);
  let models;
  try {
    models = await api.models();
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) return 'That token was not accepted. Check that you pasted all of it, or ask your administrator for a new one.';
    if (e instanceof ApiError && e.status === 0) return 'Airlock cannot be reached. Check your connection to the appliance and try again.';
    return `Sign-in failed: ${e instanceof ApiError ? e.title : 'unexpected error'}.`;
  }
  if (token) store.saveToken(token);
  let info = null;
  try {
    info = await api.info();
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) return 'That token was not accepted.';
    info = null; // the footer falls back to other sources
  }
  const user = info && typeof info.user === 'string' ? info.user : null;
  const key = await store.userKey({ user, token });
  // Threads are kept by the server only where it says so (`GET /v1/info`: conversations).
  const threadless = !(info && info.conversations === true);
  session = { api, key, user, turns: [], views: new Map(), threadId: null, threadless };
  ui.threadsMenu.hidden = threadless;
  setBundleVersion(bundleVersionFrom(info, models));
  fillModels(models);
  ui.keep.checked = store.keepEnabled(key);
  updateKeepHint();
  if (ui.keep.checked) restoreConversation();
  showChat();
  return '';
}

function endSession() {
  if (current) {
    current.stoppedByUser = true;
    current.controller.abort();
    current = null;
  }
  if (session) for (const v of session.views.values()) v.dispose();
  session = null;
  store.clearToken();
  ui.log.replaceChildren();
  ui.question.value = '';
  ui.menu.open = false;
  syncEmpty();
  setBundleVersion(null);
}

/** A 401 from any call: the token is no longer valid. */
function handleUnauthorized() {
  endSession();
  showSignIn({ reason: 'unauthorized' });
}

/**
 * Finds the bundle version: `GET /v1/info` (proposed) first, then fields the models list may
 * carry. Chat responses that carry `airlock.bundle_version` update it later.
 */
function bundleVersionFrom(info, models) {
  const pick = (...vals) => vals.find((v) => typeof v === 'string' && v.length > 0 && v.length < 200) || '';
  const data = Array.isArray(models?.data) ? models.data : [];
  return pick(
    info?.bundle_version,
    info?.bundle?.version,
    models?.airlock?.bundle_version,
    models?.bundle_version,
    ...data.map((m) => m?.airlock?.bundle_version),
    ...data.map((m) => m?.bundle_version),
  );
}

/** @param {string | null} v a version, '' when the daemon did not report one, null when signed out */
function setBundleVersion(v) {
  ui.bundleItem.hidden = v === null;
  ui.bundle.textContent = v || 'unknown';
}

function fillModels(models) {
  // Only generators answer questions: the list also names the embedder and the reranker.
  const ids = (Array.isArray(models?.data) ? models.data : [])
    .filter((m) => m && (m.role === undefined || m.role === 'generator'))
    .map((m) => m.id)
    .filter((id) => typeof id === 'string' && id.length > 0 && id.length < 200);
  const prefs = store.loadPrefs();
  const chosen = ids.includes(prefs.model) ? prefs.model : ids.includes('airlock-large') ? 'airlock-large' : ids[0];
  ui.model.replaceChildren(
    ...ids.map((id) => {
      const o = document.createElement('option');
      o.value = id;
      o.textContent = id;
      o.selected = id === chosen;
      return o;
    }),
  );
  ui.modelField.hidden = ids.length < 2;
}

function selectedModel() {
  return ui.model.value || undefined;
}

// ---------------------------------------------------------------- conversation storage

function serializeTurn(t) {
  const a = t.answer;
  return {
    id: t.id,
    question: t.question,
    model: t.model,
    answer: {
      text: a.text,
      citations: a.citations,
      citationsReceived: a.citationsReceived,
      cited: a.cited,
      unsupported: a.unsupported,
      rung: a.rung,
      requestId: a.requestId,
      status: a.status === 'waiting' || a.status === 'streaming' ? 'stopped' : a.status,
      error: a.error ? { title: a.error.title, message: a.error.message } : null,
      feedback: a.feedback && a.feedback.state === 'sent' ? { rating: a.feedback.rating, comment: a.feedback.comment, state: 'sent' } : null,
    },
  };
}

function restoreTurn(raw) {
  if (!raw || typeof raw !== 'object' || typeof raw.question !== 'string') return null;
  const a = raw.answer && typeof raw.answer === 'object' ? raw.answer : {};
  const fb = a.feedback && (a.feedback.rating === 'up' || a.feedback.rating === 'down') ? a.feedback : null;
  const status = ['done', 'stopped', 'error'].includes(a.status) ? a.status : 'stopped';
  return {
    id: typeof raw.id === 'string' && /^[a-z0-9]{1,40}$/.test(raw.id) ? raw.id : newId(),
    question: raw.question,
    model: typeof raw.model === 'string' ? raw.model : undefined,
    answer: {
      ...emptyAnswer(),
      text: typeof a.text === 'string' ? a.text : '',
      citations: cleanCitations(a.citations),
      citationsReceived: Boolean(a.citationsReceived),
      cited: cleanCited(a.cited),
      unsupported: a.unsupported === true,
      rung: rungOf(a.rung),
      requestId: typeof a.requestId === 'string' ? a.requestId : '',
      status,
      error:
        status === 'error' && a.error && typeof a.error.title === 'string'
          ? { title: a.error.title, message: typeof a.error.message === 'string' ? a.error.message : '' }
          : status === 'error'
            ? { title: 'This answer failed.', message: '' }
            : null,
      feedback: fb ? { rating: fb.rating, comment: typeof fb.comment === 'string' ? fb.comment : '', state: 'sent' } : null,
    },
  };
}

function restoreConversation() {
  for (const raw of store.loadConversation(session.key)) {
    const t = restoreTurn(raw);
    if (t) addTurn(t);
  }
  syncEmpty();
}

function persist() {
  if (!session || !ui.keep.checked) return;
  store.saveConversation(session.key, session.turns.map(serializeTurn));
}

function updateKeepHint() {
  ui.keepHint.textContent = ui.keep.checked
    ? 'On: questions, answers and their sources are saved in this browser for your account until you clear them.'
    : 'Off: the conversation is forgotten when you sign out or close the tab.';
}

// ---------------------------------------------------------------- turns

function addTurn(turn) {
  const view = new TurnView(document, turn, {
    onRetry: (t) => retry(t),
    onCopy: (t) => copyAnswer(t),
    onFeedback: (t, rating, comment) => sendFeedback(t, rating, comment),
    onCitation: (v, n) => v.focusSource(n),
  });
  session.turns.push(turn);
  session.views.set(turn.id, view);
  ui.log.appendChild(view.root);
  syncEmpty();
  return view;
}

function syncEmpty() {
  ui.empty.hidden = Boolean(session && session.turns.length > 0);
}

function syncComposer() {
  const streaming = current !== null;
  ui.send.hidden = streaming;
  ui.stop.hidden = !streaming;
}

function historyFor(turn) {
  const idx = session.turns.indexOf(turn);
  const prior = session.turns
    .slice(0, idx)
    .filter((t) => t.answer.status === 'done' && t.answer.text)
    .slice(-HISTORY_TURNS);
  const messages = [];
  for (const t of prior) {
    messages.push({ role: 'user', content: t.question });
    messages.push({ role: 'assistant', content: t.answer.text });
  }
  messages.push({ role: 'user', content: turn.question });
  return messages;
}

function nearBottom() {
  const se = document.scrollingElement || document.documentElement;
  return se.scrollHeight - se.scrollTop - se.clientHeight < 120;
}

function scrollToBottom() {
  const se = document.scrollingElement || document.documentElement;
  se.scrollTop = se.scrollHeight;
}

/** Maps an API error to what the reader sees. */
export function describeError(e) {
  const retryAt = e.retryAfter !== null && e.retryAfter !== undefined ? Date.now() + e.retryAfter * 1000 : null;
  switch (e.status) {
    case 0:
      return { title: 'Airlock cannot be reached.', message: 'Check your connection to the appliance, then retry.' };
    case -1:
      return { title: 'The answer was interrupted.', message: 'The connection to Airlock closed before the answer finished. Retry to ask again.' };
    case 400:
      if (e.slug === 'context-too-long')
        return { title: 'This conversation is too long for the model.', message: 'Clear the conversation (Settings) or ask a shorter question.' };
      return { title: 'Airlock could not accept this question.', message: e.detail || e.title };
    case 404:
      return { title: 'The selected model is not available.', message: 'Choose another model in Settings and retry.' };
    case 413:
      return { title: 'This question is too long.', message: 'Shorten it and try again.' };
    case 429:
      return {
        title: 'You have reached your question limit for the moment.',
        message: 'Airlock limits how much each person can ask per minute so that everyone gets answers.',
        retryAt: retryAt ?? Date.now() + 30000,
      };
    case 503:
      return {
        title: 'Airlock is busy right now.',
        message: 'All of its capacity is in use, so it could not take your question.',
        retryAt: retryAt ?? Date.now() + 30000,
      };
    case 504:
      return { title: 'Airlock was too busy to start your answer in time.', message: 'Your question waited in the queue too long. Please retry in a moment.', retryAt };
    default:
      return { title: 'Something went wrong on the appliance.', message: 'Retry in a moment; if it keeps happening, tell your administrator.' };
  }
}

async function run(turn, view) {
  const controller = new AbortController();
  current = { turn, view, controller, stoppedByUser: false };
  const mine = current;
  turn.answer = { ...emptyAnswer(), feedback: null };
  turn.model = selectedModel();
  view.update();
  syncComposer();
  announce('Searching your documents…');
  let frame = 0;
  const scheduleRender = () => {
    if (frame) return;
    frame = requestAnimationFrame(() => {
      frame = 0;
      const stick = nearBottom();
      view.update();
      if (stick) scrollToBottom();
    });
  };
  try {
    // The first question opens a server-kept thread; later ones are asked in it, and the
    // server supplies the thread's readable turns as the history.
    if (!session.threadId && !session.threadless) {
      try {
        session.threadId = (await session.api.createThread(turn.question)).id || null;
      } catch (e) {
        if (e instanceof ApiError && e.status === 401) throw e;
        session.threadless = true; // the daemon keeps no threads: history from the page
      }
    }
    await session.api.chatStream({
      messages: session.threadId ? [{ role: 'user', content: turn.question }] : historyFor(turn),
      conversationId: session.threadId || undefined,
      model: turn.model,
      signal: controller.signal,
      onMeta: (m) => {
        if (m.citations) {
          turn.answer.citations = m.citations;
          turn.answer.citationsReceived = true;
        }
        if (m.cited) turn.answer.cited = m.cited;
        if (m.unsupported) turn.answer.unsupported = true;
        if (m.rung !== undefined && m.rung !== null) turn.answer.rung = m.rung;
        if (m.requestId) turn.answer.requestId = m.requestId;
        if (m.bundleVersion) setBundleVersion(m.bundleVersion);
        scheduleRender();
      },
      onDelta: (text) => {
        if (turn.answer.status === 'waiting') {
          turn.answer.status = 'streaming';
          announce('Writing the answer…');
        }
        turn.answer.text += text;
        scheduleRender();
      },
    });
    turn.answer.status = 'done';
    const n = turn.answer.citations.length;
    announce(`Answer complete${n ? `, with ${n} source${n === 1 ? '' : 's'}` : ''}.`);
  } catch (e) {
    if (isAbort(e)) {
      turn.answer.status = 'stopped';
      if (mine.stoppedByUser && session) announce('Stopped.');
    } else if (e instanceof ApiError && e.status === 401) {
      if (current === mine) current = null;
      if (frame) cancelAnimationFrame(frame);
      handleUnauthorized();
      return;
    } else {
      turn.answer.status = 'error';
      turn.answer.error = describeError(e instanceof ApiError ? e : new ApiError({ status: -1 }));
      announce(''); // the answer's own alert says what happened
    }
  } finally {
    if (frame) cancelAnimationFrame(frame);
    if (current === mine) current = null;
  }
  if (!session || !session.views.has(turn.id)) return;
  const stick = nearBottom();
  view.update();
  if (stick) scrollToBottom();
  const stopHadFocus = document.activeElement === ui.stop;
  syncComposer();
  if (stopHadFocus) ui.question.focus();
  persist();
}

function ask(question) {
  const turn = { id: newId(), question, model: selectedModel(), answer: emptyAnswer() };
  const view = addTurn(turn);
  scrollToBottom();
  run(turn, view);
}

// ---------------------------------------------------------------- server-kept threads

/** The notice of a turn withheld because one of its sources is no longer readable. */
const WITHHELD = 'A source of this answer is no longer available to you, so this turn is withheld.';

async function listThreads() {
  if (!session) return;
  let threads;
  try {
    threads = await session.api.threads();
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) return handleUnauthorized();
    ui.threads.replaceChildren(textP('hint', 'Your conversations could not be loaded.'));
    return;
  }
  if (threads.length === 0) {
    ui.threads.replaceChildren(textP('hint', 'No conversations yet.'));
    return;
  }
  ui.threads.replaceChildren(
    ...threads.map((t) => {
      const li = document.createElement('li');
      const b = document.createElement('button');
      b.type = 'button';
      b.className = 'btn thread';
      b.dataset.thread = String(t.id);
      if (t.id === session.threadId) b.setAttribute('aria-current', 'true');
      b.textContent = `${t.title} (${t.turns} ${t.turns === 1 ? 'turn' : 'turns'})`;
      b.addEventListener('click', () => openThread(String(t.id)));
      li.appendChild(b);
      return li;
    }),
  );
}

function clearLog() {
  for (const v of session.views.values()) v.dispose();
  session.views.clear();
  session.turns = [];
  ui.log.replaceChildren();
  syncEmpty();
}

async function openThread(id) {
  if (!session || current) {
    announce('An answer is still being written: stop it first.');
    return;
  }
  let thread;
  try {
    thread = await session.api.thread(id);
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) return handleUnauthorized();
    announce('That conversation could not be opened.');
    return;
  }
  clearLog();
  session.threadId = id;
  for (const m of Array.isArray(thread?.messages) ? thread.messages : []) {
    const redacted = m.redacted === true;
    const turn = {
      id: newId(),
      question: redacted ? '(withheld)' : String(m.question ?? ''),
      answer: {
        ...emptyAnswer(),
        text: redacted ? WITHHELD : String(m.answer ?? ''),
        requestId: typeof m.request_id === 'string' ? m.request_id : '',
        status: 'done',
      },
      redacted,
    };
    const view = addTurn(turn);
    if (redacted) view.root.classList.add('withheld');
  }
  ui.threadsMenu.open = false;
  announce(`Conversation opened: ${thread?.messages?.length ?? 0} turns.`);
  ui.question.focus();
}

function newThread() {
  if (!session || current) return;
  clearLog();
  session.threadId = null;
  ui.threadsMenu.open = false;
  announce('New conversation.');
  ui.question.focus();
}

function retry(turn) {
  if (!session) return;
  if (current) {
    announce('An answer is still being written: stop it first, then retry.');
    return;
  }
  const view = session.views.get(turn.id);
  if (!view) return;
  run(turn, view);
}

function stop() {
  if (!current) return;
  current.stoppedByUser = true;
  current.controller.abort();
}

async function copyAnswer(turn) {
  const a = turn.answer;
  let text = a.text;
  if (a.citations.length) {
    text += `\n\nSources:\n${a.citations.map((c) => `[${c.n}] ${c.title || c.doc_id}${c.doc_id && c.title ? ` (${c.doc_id})` : ''}`).join('\n')}`;
  }
  let ok = false;
  try {
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(text);
      ok = true;
    }
  } catch {
    ok = false;
  }
  if (!ok) {
    // Plain-HTTP origins have no async clipboard: copy through a hidden textarea.
    const ta = document.createElement('textarea');
    ta.value = text;
    ta.setAttribute('readonly', '');
    ta.className = 'offscreen';
    document.body.appendChild(ta);
    ta.select();
    try {
      ok = document.execCommand('copy');
    } catch {
      ok = false;
    }
    ta.remove();
  }
  announce(ok ? 'Answer copied to the clipboard.' : 'Copying failed: select the answer text and copy it by hand.');
}

async function sendFeedback(turn, rating, comment) {
  if (!session || !turn.answer.requestId) return;
  const view = session.views.get(turn.id);
  turn.answer.feedback = { rating, comment, state: 'sending' };
  view?.update();
  try {
    const body = { request_id: turn.answer.requestId, rating };
    if (comment) body.comment = comment;
    await session.api.feedback(body);
    turn.answer.feedback = { rating, comment, state: 'sent' };
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) {
      handleUnauthorized();
      return;
    }
    let why = 'please try again.';
    if (e instanceof ApiError) {
      if (e.status === 404 || e.status === 405) why = 'this appliance does not collect feedback yet.';
      else if (e.status === 429 || e.status === 503) why = 'Airlock is busy, please try again shortly.';
      else if (e.status === 0) why = 'Airlock cannot be reached.';
    }
    turn.answer.feedback = { rating, comment, state: 'error', error: why };
  }
  if (session?.views.has(turn.id)) {
    view?.update();
    persist();
  }
}

// ---------------------------------------------------------------- wiring

ui.signinForm.addEventListener('submit', async (e) => {
  e.preventDefault();
  const token = ui.token.value.trim();
  if (!token) {
    ui.signinError.textContent = 'Enter your access token.';
    ui.token.focus();
    return;
  }
  ui.signinSubmit.disabled = true;
  ui.signinSubmit.textContent = 'Checking…';
  ui.signinError.textContent = '';
  const err = await startSession(token);
  if (err) {
    store.clearToken();
    ui.signinSubmit.disabled = false;
    ui.signinSubmit.textContent = 'Sign in';
    ui.signinError.textContent = err;
    ui.token.setAttribute('aria-invalid', 'true');
    ui.token.focus();
    ui.token.select();
  } else {
    ui.token.value = '';
    ui.token.removeAttribute('aria-invalid');
  }
});

ui.tokenShow.addEventListener('click', () => {
  const show = ui.token.type === 'password';
  ui.token.type = show ? 'text' : 'password';
  ui.tokenShow.textContent = show ? 'Hide' : 'Show';
  ui.tokenShow.setAttribute('aria-pressed', String(show));
});

ui.signout.addEventListener('click', () => {
  endSession();
  showSignIn({ reason: 'signedout' });
});

ui.composer.addEventListener('submit', (e) => {
  e.preventDefault();
  if (!session || current) return;
  const q = ui.question.value.trim();
  if (!q) {
    announce('Type a question first.');
    ui.question.focus();
    return;
  }
  ui.question.value = '';
  ask(q);
});

ui.question.addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    ui.composer.requestSubmit();
  }
});

ui.stop.addEventListener('click', () => stop());

document.addEventListener('keydown', (e) => {
  if (e.key === 'Escape' && current) {
    e.preventDefault();
    stop();
  } else if (e.key === 'Escape' && ui.menu.open) {
    ui.menu.open = false;
    ui.menu.querySelector('summary')?.focus();
  }
});

// A click outside the open Settings menu closes it.
document.addEventListener('click', (e) => {
  if (ui.menu.open && e.target instanceof Node && !ui.menu.contains(e.target)) ui.menu.open = false;
  if (ui.threadsMenu.open && e.target instanceof Node && !ui.threadsMenu.contains(e.target)) ui.threadsMenu.open = false;
});

// Opening the Conversations menu lists the threads the server keeps for this user.
ui.threadsMenu.addEventListener('toggle', () => {
  if (ui.threadsMenu.open) listThreads();
});
ui.newThread.addEventListener('click', () => newThread());

ui.model.addEventListener('change', () => {
  store.savePrefs({ ...store.loadPrefs(), model: ui.model.value });
});

ui.keep.addEventListener('change', () => {
  if (!session) return;
  store.setKeep(session.key, ui.keep.checked);
  updateKeepHint();
  persist();
  announce(ui.keep.checked ? 'Your conversation will be kept on this device.' : 'Saved conversation removed from this device.');
});

ui.clear.addEventListener('click', () => {
  if (!session) return;
  stop();
  for (const v of session.views.values()) v.dispose();
  session.turns = [];
  session.views.clear();
  ui.log.replaceChildren();
  store.clearConversation(session.key);
  session.threadId = null;
  syncEmpty();
  ui.menu.open = false;
  announce('Conversation cleared.');
  ui.question.focus();
});

/**
 * Behind an SSO proxy (trusted-header mode) the proxy has signed the user in already: a
 * `GET /v1/info` without a token answers 200, and the chat opens without the token prompt.
 */
async function ssoSignedIn() {
  if (document.querySelector('meta[name="airlock-sign-in"]')?.content !== 'proxy') return false;
  try {
    const info = await new Api('').info();
    return !!(info && typeof info.user === 'string');
  } catch {
    return false;
  }
}

async function boot() {
  const token = store.loadToken();
  if (!token) {
    if (await ssoSignedIn() && !(await startSession(''))) return;
    showSignIn();
    return;
  }
  const err = await startSession(token);
  if (err) {
    store.clearToken();
    showSignIn({ reason: /not accepted/.test(err) ? 'unauthorized' : 'start', message: /not accepted/.test(err) ? '' : err });
  }
}

boot();
