// Browser storage. The bearer token lives in sessionStorage (gone when the tab closes, removed
// at sign-out); a sign-in session's CSRF token in localStorage (removed at sign-out). A
// conversation is written to localStorage only when its user opted in on this
// device ("Keep conversation on this device"), under a key derived from the user (or, when the
// daemon does not say who the user is, from a hash of the token, never the token itself), and
// is removed by "Clear conversation". Storage that throws (disabled, full, private mode) falls
// back to memory so the page still works.

const TOKEN_KEY = 'airlock.token';
const PREFS_KEY = 'airlock.prefs';
const CSRF_KEY = 'airlock.csrf';
const CONV_PREFIX = 'airlock.conversation.';
const KEEP_PREFIX = 'airlock.keep.';

/** Max answers kept on the device per user (oldest dropped first). */
export const MAX_SAVED_TURNS = 50;

const memory = new Map();

function storage(kind) {
  try {
    const s = kind === 'session' ? window.sessionStorage : window.localStorage;
    const probe = '__airlock_probe__';
    s.setItem(probe, '1');
    s.removeItem(probe);
    return s;
  } catch {
    return null;
  }
}

function get(kind, key) {
  const s = storage(kind);
  if (s) return s.getItem(key);
  return memory.has(`${kind}:${key}`) ? memory.get(`${kind}:${key}`) : null;
}

function set(kind, key, value) {
  const s = storage(kind);
  try {
    if (s) {
      s.setItem(key, value);
      return true;
    }
  } catch {
    return false; // quota exceeded: the page keeps working from memory
  }
  memory.set(`${kind}:${key}`, value);
  return true;
}

function remove(kind, key) {
  const s = storage(kind);
  if (s) s.removeItem(key);
  memory.delete(`${kind}:${key}`);
}

/** @returns {string | null} */
export const loadToken = () => get('session', TOKEN_KEY);
/** @param {string} token */
export const saveToken = (token) => set('session', TOKEN_KEY, token);
export const clearToken = () => remove('session', TOKEN_KEY);

/**
 * The CSRF token of a sign-in session (the session itself is an HttpOnly cookie the page never
 * sees). Kept in localStorage so that other tabs of the same session can write too; useless
 * without the cookie, removed at sign-out and when the session ends.
 * @returns {string | null}
 */
export const loadCsrf = () => get('local', CSRF_KEY);
/** @param {string} csrf */
export const saveCsrf = (csrf) => set('local', CSRF_KEY, csrf);
export const clearCsrf = () => remove('local', CSRF_KEY);

/** Device-wide preferences (the chosen model). @returns {{model?: string}} */
export function loadPrefs() {
  try {
    const v = JSON.parse(get('local', PREFS_KEY) || '{}');
    return v && typeof v === 'object' ? v : {};
  } catch {
    return {};
  }
}

/** @param {{model?: string}} prefs */
export const savePrefs = (prefs) => set('local', PREFS_KEY, JSON.stringify(prefs));

/** FNV-1a 64-bit, for a storage key when SubtleCrypto is unavailable (plain-HTTP origins). */
export function fnv1a64(text) {
  let h = 0xcbf29ce484222325n;
  const bytes = new TextEncoder().encode(text);
  for (const b of bytes) {
    h ^= BigInt(b);
    h = (h * 0x100000001b3n) & 0xffffffffffffffffn;
  }
  return h.toString(16).padStart(16, '0');
}

/**
 * A storage key for a user: their id when the daemon tells it, else a hash of the token.
 * @param {{user?: string | null, token: string}} who
 * @returns {Promise<string>}
 */
export async function userKey({ user, token }) {
  if (user) return `u:${user}`;
  if (globalThis.crypto?.subtle) {
    const d = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(token));
    return `t:${[...new Uint8Array(d)].slice(0, 12).map((b) => b.toString(16).padStart(2, '0')).join('')}`;
  }
  return `t:${fnv1a64(token)}`;
}

/** @param {string} key */
export const keepEnabled = (key) => get('local', KEEP_PREFIX + key) === '1';

/**
 * @param {string} key
 * @param {boolean} on turning it off also deletes what was saved
 */
export function setKeep(key, on) {
  if (on) set('local', KEEP_PREFIX + key, '1');
  else {
    remove('local', KEEP_PREFIX + key);
    remove('local', CONV_PREFIX + key);
  }
}

/**
 * @param {string} key
 * @returns {object[]} saved turns (validated by the caller)
 */
export function loadConversation(key) {
  try {
    const v = JSON.parse(get('local', CONV_PREFIX + key) || '[]');
    return Array.isArray(v) ? v : [];
  } catch {
    return [];
  }
}

/**
 * @param {string} key
 * @param {object[]} turns
 */
export function saveConversation(key, turns) {
  return set('local', CONV_PREFIX + key, JSON.stringify(turns.slice(-MAX_SAVED_TURNS)));
}

/** @param {string} key */
export const clearConversation = (key) => remove('local', CONV_PREFIX + key);
