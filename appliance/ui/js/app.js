// The Airlock chat page: sign-in, the conversation, streaming, stop/retry/copy, feedback and
// the footer. Talks to the daemon only through api.js (the public API in API.md).

import { Api, ApiError, TOKEN_ONLY, cleanCitations, cleanCited, isAbort, rungOf } from './api.js';
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
  tokenSignin: $('token-signin'),
  ldapForm: /** @type {HTMLFormElement} */ ($('ldap-form')),
  username: /** @type {HTMLInputElement} */ ($('username')),
  password: /** @type {HTMLInputElement} */ ($('password')),
  ldapError: $('ldap-error'),
  ldapSubmit: /** @type {HTMLButtonElement} */ ($('ldap-submit')),
  oidcRow: $('oidc-row'),
  oidcLink: /** @type {HTMLAnchorElement} */ ($('oidc-link')),
  useTokenRow: $('use-token-row'),
  useToken: $('use-token'),
  usePasswordRow: $('use-password-row'),
  usePassword: $('use-password'),
  whoami: $('whoami'),
  whoamiUser: $('whoami-user'),
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
  indexingItem: $('indexing-item'),
  indexing: $('indexing'),
};

/** Session state: null while signed out. `kind`: `token` (bearer), `session` (a sign-in
 * session's cookie + CSRF token) or `proxy` (an SSO proxy signs every request). */
let session = null;
/** The sign-ins the daemon offers (`GET /v1/auth/methods`). */
let methods = { ...TOKEN_ONLY };
/** A question typed before the session ended, put back once signed in again. */
let restoreQuestion = '';
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

/**
 * Shows the sign-in screen. `mode`: `ldap` (username and password, when the daemon offers it) or
 * `token`; `kind`: how the session that just ended was signed in (for the message).
 */
function showSignIn({ reason = 'start', message = '', mode, kind = 'token' } = {}) {
  ui.account.hidden = true;
  ui.chat.hidden = true;
  ui.signin.hidden = false;
  ui.signinError.textContent = '';
  ui.ldapError.textContent = '';
  ui.signinSubmit.disabled = false;
  ui.signinSubmit.textContent = 'Sign in';
  ui.ldapSubmit.disabled = false;
  ui.ldapSubmit.textContent = 'Sign in';
  ui.token.value = '';
  ui.password.value = '';
  ui.oidcRow.hidden = !methods.oidc;
  if (methods.oidc) {
    ui.oidcLink.href = methods.oidc.login_url;
    ui.oidcLink.textContent = `Sign in with ${methods.oidc.display_name}`;
  }
  const kept = restoreQuestion ? ' Your question is kept: it will be back in the question box.' : '';
  if (reason === 'unauthorized' && kind !== 'token') {
    ui.signinTitle.textContent = 'Your session has ended';
    ui.signinAlert.hidden = false;
    ui.signinAlert.replaceChildren(
      textP('alert-title', 'Airlock ended your sign-in session (401 Unauthorized).'),
      textP('', `Sessions end after a while without use, at their time limit, or when your access changes in the directory. Sign in again to continue.${kept}`),
    );
  } else if (reason === 'unauthorized') {
    ui.signinTitle.textContent = 'Your session has ended';
    ui.signinAlert.hidden = false;
    ui.signinAlert.replaceChildren(
      textP('alert-title', 'Airlock did not accept your access token (401 Unauthorized).'),
      textP('', `It may have been revoked or replaced by a newer one, or your access may have been removed. Sign in again with a current token, or ask your Airlock administrator for a new one.${kept}`),
    );
  } else if (reason === 'signedout') {
    ui.signinTitle.textContent = 'Signed out';
    ui.signinAlert.hidden = false;
    ui.signinAlert.replaceChildren(
      textP('', kind === 'token' ? 'You have signed out. Your token was removed from this tab.' : 'You have signed out. Your session has ended on the appliance.'),
    );
  } else {
    ui.signinTitle.textContent = 'Sign in';
    ui.signinAlert.hidden = true;
    ui.signinAlert.replaceChildren();
  }
  setSignInMode(mode ?? (methods.ldap ? 'ldap' : 'token'));
  if (message) (methods.ldap && !ui.ldapForm.hidden ? ui.ldapError : ui.signinError).textContent = message;
  document.title = 'Sign in · Airlock';
}

/** Shows the username/password form or the token form (and the link to the other). */
function setSignInMode(mode) {
  const ldap = mode === 'ldap' && methods.ldap;
  ui.ldapForm.hidden = !ldap;
  ui.tokenSignin.hidden = ldap;
  ui.useTokenRow.hidden = !ldap || !methods.token;
  ui.usePasswordRow.hidden = ldap || !methods.ldap;
  if (!ldap) ui.token.focus();
  else if (ui.username.value) ui.password.focus();
  else ui.username.focus();
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
  if (restoreQuestion) {
    ui.question.value = restoreQuestion;
    restoreQuestion = '';
  }
  ui.question.focus();
}

// ---------------------------------------------------------------- session

/**
 * Checks a token (or, with '', the session cookie or the SSO proxy) and opens the chat. Returns
 * an error message for the sign-in form, or ''.
 * @param {string} token
 * @param {{kind?: 'token' | 'session' | 'proxy', csrf?: string}} [how]
 */
async function startSession(token, how = {}) {
  const api = new Api(token);
  if (how.csrf) api.csrf = how.csrf;
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
  // Behind the SSO proxy the daemon hands the page its CSRF token here (writes need it).
  if (!token && info && typeof info.csrf_token === 'string') api.csrf = info.csrf_token;
  const user = info && typeof info.user === 'string' ? info.user : null;
  const key = await store.userKey({ user, token });
  // Threads are kept by the server only where it says so (`GET /v1/info`: conversations).
  const threadless = !(info && info.conversations === true);
  const kind = how.kind ?? (token ? 'token' : 'proxy');
  session = { api, key, user, kind, turns: [], views: new Map(), threadId: null, threadless };
  ui.whoamiUser.textContent = user ?? '';
  ui.whoami.hidden = !user;
  ui.threadsMenu.hidden = threadless;
  setBundleVersion(bundleVersionFrom(info, models));
  showIndexing(info?.indexing);
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
  store.clearCsrf();
  ui.whoami.hidden = true;
  ui.whoamiUser.textContent = '';
  ui.log.replaceChildren();
  ui.question.value = '';
  ui.menu.open = false;
  syncEmpty();
  setBundleVersion(null);
  showIndexing(null);
}

/** How often the footer asks for the background ingest's progress while one runs, ms. */
const INDEXING_POLL_MS = 3000;
let indexingTimer = 0;

/** "about 4 min left" from seconds; '' when unknown. */
function etaText(s) {
  if (typeof s !== 'number' || !Number.isFinite(s) || s < 0) return '';
  if (s < 60) return 'under a minute left';
  const m = Math.round(s / 60);
  return m < 120 ? `about ${m} min left` : `about ${Math.round(m / 60)} h left`;
}

/**
 * The footer's background-ingest line (`GET /v1/info` `indexing`, crate::ingest_queue): to an
 * operator the job, its documents and the time left; to anyone else only that indexing goes
 * on. While a job runs, the page asks again every few seconds; when none does, the line hides.
 * @param {any} ix the `indexing` object, or null
 */
function showIndexing(ix) {
  clearTimeout(indexingTimer);
  indexingTimer = 0;
  const active = !!(ix && ix.active === true);
  if (!session || !active) {
    ui.indexingItem.hidden = true;
    ui.indexing.textContent = '';
    return;
  }
  const job = ix.job && typeof ix.job === 'object' ? ix.job : null;
  let text = 'Still indexing documents: answers may miss some until it finishes.';
  if (job && typeof job.name === 'string' && Number.isFinite(job.docs_total)) {
    const n = (v) => Number(v).toLocaleString('en-US');
    const queued = Number.isFinite(ix.queued) && ix.queued > 0 ? ` (${ix.queued} more queued)` : '';
    const eta = etaText(job.eta_s);
    text = `Indexing ${job.name}: ${n(job.docs_done)} of ${n(job.docs_total)} documents${eta ? `, ${eta}` : ''}${queued}.`;
    if (typeof job.last_error === 'string' && job.last_error) text += ' The last attempt failed; it is retried.';
  }
  ui.indexing.textContent = text;
  ui.indexingItem.hidden = false;
  const api = session.api;
  indexingTimer = setTimeout(async () => {
    if (!session || session.api !== api) return;
    let next = null;
    try {
      next = (await api.info())?.indexing ?? null;
    } catch (e) {
      // A refused token stops the polling; any other failure keeps the line and tries again.
      next = e instanceof ApiError && e.status === 401 ? null : ix;
    }
    if (session && session.api === api) showIndexing(next);
  }, INDEXING_POLL_MS);
}

/**
 * A 401 from any call (or a refused CSRF token): the token or session is no longer valid. The
 * question being written, else `lost` (the one whose answer failed), comes back after sign-in.
 * @param {string} [lost]
 */
function handleUnauthorized(lost = '') {
  const typed = ui.question.value.trim() ? ui.question.value : lost;
  if (typed) restoreQuestion = typed;
  const kind = session?.kind ?? 'token';
  endSession();
  showSignIn({ reason: 'unauthorized', kind, mode: kind === 'token' ? 'token' : undefined });
}

/** Whether an error means the caller must sign in again. */
function signedOut(e) {
  return e instanceof ApiError && (e.status === 401 || (e.status === 403 && e.slug === 'csrf-failed'));
}

/** What the sign-in form says for a refused `POST /v1/auth/login` (from the problem body). */
export function describeLoginError(e) {
  switch (e.status) {
    case 0:
      return 'Airlock cannot be reached. Check your connection to the appliance and try again.';
    case 400:
      return `Airlock could not accept this sign-in: ${e.detail || e.title}.`;
    case 401:
      return 'The username or password is wrong. Check both and try again.';
    case 403:
      if (e.slug === 'account-disabled') return 'Your directory account is disabled or locked, so Airlock cannot sign you in. Contact your IT service desk.';
      return `Airlock refused this sign-in: ${e.detail || e.title}.`;
    case 404:
      return 'Signing in with a username and password is not set up on this appliance. Use an API token.';
    case 429: {
      const wait = e.retryAfter ? (e.retryAfter >= 120 ? `about ${Math.ceil(e.retryAfter / 60)} minutes` : `${e.retryAfter} seconds`) : 'a few minutes';
      return `Too many failed sign-ins for this username or from this computer. Wait ${wait}, then try again.`;
    }
    case 503:
      if (e.slug === 'directory-unavailable') return 'Airlock cannot reach the bank directory right now, so it cannot check your password. Try again in a few minutes.';
      return 'Airlock is starting or busy. Try again in a moment.';
    default:
      return 'Sign-in failed on the appliance. Try again in a moment; if it keeps happening, tell your administrator.';
  }
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
    onOpenOriginal: (c) => openOriginal(c),
  });
  session.turns.push(turn);
  session.views.set(turn.id, view);
  ui.log.appendChild(view.root);
  syncEmpty();
  return view;
}

/**
 * Opens a cited document's original file in a new tab, at the cited page for a PDF. The file is
 * fetched with this page's credentials (a bearer token cannot ride on a plain link) and shown
 * from a blob: address; the tab is opened first, inside the click, so no popup blocker stops it.
 */
async function openOriginal(c) {
  if (!session) return;
  const tab = window.open('', '_blank');
  try {
    const blob = await session.api.documentFile(c.doc_id);
    const url = URL.createObjectURL(blob);
    const at = c.anchor && c.anchor.page ? `#page=${c.anchor.page}` : '';
    if (tab) {
      tab.opener = null;
      tab.location.href = url + at;
    } else {
      window.location.assign(url + at);
    }
    setTimeout(() => URL.revokeObjectURL(url), 5 * 60 * 1000);
  } catch (e) {
    if (tab) tab.close();
    if (signedOut(e)) return;
    announce(e.status === 404 ? 'That document is no longer available to you.' : 'The original could not be opened.');
  }
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
        if (signedOut(e)) throw e;
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
        if (m.passages) {
          // The finished answer's supporting passages replace the question-based ones.
          for (const p of m.passages) {
            const c = turn.answer.citations.find((x) => x.n === p.n);
            if (c) Object.assign(c, { snippet: p.snippet, passage: p.passage });
          }
        }
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
    } else if (signedOut(e)) {
      if (current === mine) current = null;
      if (frame) cancelAnimationFrame(frame);
      handleUnauthorized(turn.question);
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
    if (signedOut(e)) return handleUnauthorized();
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
    if (signedOut(e)) return handleUnauthorized();
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
    if (signedOut(e)) {
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

ui.signout.addEventListener('click', async () => {
  const s = session;
  endSession();
  // A sign-in session ends on the appliance too (behind an SSO proxy this changes nothing).
  if (s && s.kind !== 'token') {
    ui.signout.disabled = true;
    try {
      await s.api.logout();
    } catch {
      // already ended, or unreachable: the cookie expires on its own
    }
    ui.signout.disabled = false;
  }
  showSignIn({ reason: 'signedout', kind: s?.kind ?? 'token' });
});

ui.ldapForm.addEventListener('submit', async (e) => {
  e.preventDefault();
  const username = ui.username.value.trim();
  const password = ui.password.value;
  ui.username.removeAttribute('aria-invalid');
  ui.password.removeAttribute('aria-invalid');
  if (!username || !password) {
    const field = username ? ui.password : ui.username;
    ui.ldapError.textContent = username ? 'Enter your password.' : 'Enter your username.';
    field.setAttribute('aria-invalid', 'true');
    field.focus();
    return;
  }
  ui.ldapSubmit.disabled = true;
  ui.ldapSubmit.textContent = 'Signing in…';
  ui.ldapError.textContent = '';
  let err = '';
  try {
    const body = await new Api('').login(username, password);
    const csrf = typeof body?.csrf_token === 'string' ? body.csrf_token : '';
    // The password is gone from the page before anything else happens.
    ui.password.value = '';
    store.saveCsrf(csrf);
    err = await startSession('', { kind: 'session', csrf });
    if (err) store.clearCsrf();
  } catch (x) {
    err = describeLoginError(x instanceof ApiError ? x : new ApiError({ status: -1 }));
  }
  ui.password.value = '';
  ui.ldapSubmit.disabled = false;
  ui.ldapSubmit.textContent = 'Sign in';
  if (err) {
    ui.ldapError.textContent = err;
    ui.password.setAttribute('aria-invalid', 'true');
    ui.password.focus();
  }
});

ui.useToken.addEventListener('click', () => setSignInMode('token'));
ui.usePassword.addEventListener('click', () => setSignInMode('ldap'));

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
 * Without a token the page may already be signed in: behind an SSO proxy (trusted-header mode)
 * the proxy signs every request, and a sign-in session's cookie (directory or IdP) authenticates
 * like a token. Then `GET /v1/info` without a token answers 200 and no prompt is shown. The
 * probe is made only where it can succeed (a proxy is configured, or this browser holds a
 * session's CSRF token), so a signed-out page logs no 401.
 */
async function alreadySignedIn() {
  if (!methods.trusted_header && !store.loadCsrf()) return false;
  try {
    const info = await new Api('').info();
    return !!(info && typeof info.user === 'string');
  } catch {
    return false;
  }
}

async function boot() {
  // An IdP sign-in may hand the session's CSRF token over in the fragment, which no server sees.
  const handover = /^#csrf_token=([A-Za-z0-9_-]{1,200})$/.exec(location.hash);
  if (handover) {
    store.saveCsrf(handover[1]);
    history.replaceState(null, '', location.pathname + location.search);
  }
  methods = await new Api('').methods();
  // Older daemons mark trusted-header mode in the page only.
  if (document.querySelector('meta[name="airlock-sign-in"]')?.content === 'proxy') methods.trusted_header = true;
  const token = store.loadToken();
  if (!token) {
    if (await alreadySignedIn()) {
      const csrf = store.loadCsrf() || '';
      if (!(await startSession('', { kind: csrf ? 'session' : 'proxy', csrf }))) return;
    }
    store.clearCsrf();
    showSignIn();
    return;
  }
  const err = await startSession(token);
  if (err) {
    store.clearToken();
    showSignIn({ reason: /not accepted/.test(err) ? 'unauthorized' : 'start', message: /not accepted/.test(err) ? '' : err, mode: 'token' });
  }
}

boot();
