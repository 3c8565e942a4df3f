// Talking to the dashboard server: the /k8s/ proxy, watches, /yaml/, /prometheus/.
// Every mutating request carries `X-Dashboard: 1`; a 401 from the cluster means the session ended.

export class ApiError extends Error {
  constructor(code, message, status) {
    super(message);
    this.code = code;
    this.status = status || null; // the Kubernetes Status object, when there was one
    this.reason = status?.reason || '';
  }
}

let sessionEnded = () => {};
export function onSessionEnded(fn) { sessionEnded = fn; }

export async function errorFrom(res) {
  const text = await res.text().catch(() => '');
  let status = null;
  try { status = JSON.parse(text); } catch { /* not JSON */ }
  if (status && typeof status !== 'object') status = null;
  const message = status?.message || text.trim() || `${res.status} ${res.statusText}`;
  return new ApiError(res.status, message, status);
}

const MUTATING = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);

// fetch() with the dashboard's conventions. Returns parsed JSON, text, or the Response (raw).
export async function request(url, { method = 'GET', body, contentType, signal, raw = false, accept } = {}) {
  const headers = { Accept: accept || 'application/json, */*' };
  if (MUTATING.has(method)) headers['X-Dashboard'] = '1';
  if (body !== undefined && typeof body !== 'string') body = JSON.stringify(body);
  if (body !== undefined) headers['Content-Type'] = contentType || 'application/json';
  const res = await fetch(url, { method, body, headers, signal, credentials: 'same-origin', cache: 'no-store' });
  if (!res.ok) {
    const err = await errorFrom(res);
    if (res.status === 401 && !url.startsWith('/login')) sessionEnded(err.message);
    throw err;
  }
  if (raw) return res;
  if (res.status === 204) return null;
  const ct = res.headers.get('content-type') || '';
  return ct.includes('json') ? res.json() : res.text();
}

export const k8s = (path, opts) => request('/k8s' + path, opts);

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') q.set(k, v);
  const s = q.toString();
  return s ? '?' + s : '';
}

// Yields the lines of a streamed response body as they arrive.
export async function* lines(res) {
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let start = 0, i;
      while ((i = buf.indexOf('\n', start)) >= 0) {
        const line = buf.slice(start, i);
        start = i + 1;
        if (line.trim()) yield line;
      }
      buf = buf.slice(start);
    }
    buf += dec.decode();
    if (buf.trim()) yield buf;
  } finally {
    reader.cancel().catch(() => {});
  }
}

export const sleep = (ms, signal) => new Promise((resolve) => {
  const t = setTimeout(resolve, ms);
  signal?.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
});

export const uidOf = (o) => o?.metadata?.uid || `${o?.metadata?.namespace || ''}/${o?.metadata?.name}`;

// One LIST, then a WATCH from its resourceVersion; on a 410/ERROR event or a dropped stream,
// LIST again after a short delay. Changes are coalesced and delivered once per animation frame
// as onBatch(changes: Map<uid, object|null>, store: Map<uid, object>, reset: boolean).
export class ListWatch {
  constructor(path, { labelSelector, fieldSelector, onBatch, onState, onError } = {}) {
    this.path = path;
    this.sel = { labelSelector, fieldSelector };
    this.onBatch = onBatch || (() => {});
    this.onState = onState || (() => {});
    this.onError = onError || (() => {});
    this.store = new Map();
    this.pending = new Map();
    this.scheduled = false;
    this.listed = false; // whether the first LIST has come back
    this.ac = new AbortController();
    this.reset = false;
  }

  start() { this.run(); return this; }
  stop() { this.ac.abort(); }
  get stopped() { return this.ac.signal.aborted; }

  queue(uid, obj) {
    this.pending.set(uid, obj);
    if (obj) this.store.set(uid, obj); else this.store.delete(uid);
    this.schedule();
  }

  schedule() {
    if (this.scheduled) return;
    this.scheduled = true;
    const flush = () => {
      if (!this.scheduled) return;
      this.scheduled = false;
      clearTimeout(timer);
      if (this.stopped) return;
      const changes = this.pending, reset = this.reset;
      this.pending = new Map();
      this.reset = false;
      this.onBatch(changes, this.store, reset);
    };
    // requestAnimationFrame does not run in a hidden tab: a timer takes over there.
    const timer = setTimeout(flush, 250);
    requestAnimationFrame(flush);
  }

  async run() {
    const signal = this.ac.signal;
    let delay = 1000;
    while (!signal.aborted) {
      try {
        this.onState('listing');
        const list = await k8s(this.path + query(this.sel), { signal });
        if (signal.aborted) return;
        const seen = new Set();
        for (const item of list.items || []) {
          const uid = uidOf(item);
          seen.add(uid);
          const old = this.store.get(uid);
          if (!old || old.metadata?.resourceVersion !== item.metadata?.resourceVersion) this.queue(uid, item);
        }
        for (const uid of [...this.store.keys()]) if (!seen.has(uid)) this.queue(uid, null);
        if (!this.listed) { this.listed = true; this.reset = true; this.schedule(); }
        let rv = list.metadata?.resourceVersion || '';
        this.onState('live');
        delay = 1000;
        const res = await k8s(this.path + query({ ...this.sel, watch: '1', resourceVersion: rv, allowWatchBookmarks: 'true' }), { signal, raw: true });
        for await (const line of lines(res)) {
          let ev;
          try { ev = JSON.parse(line); } catch { continue; }
          const obj = ev.object;
          if (ev.type === 'ERROR') {
            throw new ApiError(obj?.code || 500, obj?.message || 'watch error', obj);
          }
          if (obj?.metadata?.resourceVersion) rv = obj.metadata.resourceVersion;
          if (ev.type === 'BOOKMARK') continue;
          if (ev.type === 'ADDED' || ev.type === 'MODIFIED') this.queue(uidOf(obj), obj);
          else if (ev.type === 'DELETED') this.queue(uidOf(obj), null);
        }
        // The stream ended (the server's watch timeout or a dropped connection): list again.
        if (signal.aborted) return;
        this.onState('reconnecting');
      } catch (e) {
        if (signal.aborted) return;
        if (e.code === 401) { this.stop(); return; }
        if (e.code !== 410) {
          this.onState('error', e.message);
          this.onError(e);
          delay = Math.min(delay * 2, 15000);
        } else this.onState('reconnecting');
      }
      await sleep(delay, signal);
    }
  }
}

// CPU quantities ("12345n", "5m", "2") in cores; memory ("12345Ki", "1Gi", "1e9") in bytes.
const SUFFIX = { n: 1e-9, u: 1e-6, m: 1e-3, k: 1e3, K: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18,
  Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, Ei: 2 ** 60 };
export function quantity(q) {
  if (q === undefined || q === null || q === '') return NaN;
  const m = /^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$/.exec(String(q).trim());
  if (!m) return NaN;
  const mult = m[2] ? SUFFIX[m[2]] : 1;
  return mult === undefined ? NaN : parseFloat(m[1]) * mult;
}
