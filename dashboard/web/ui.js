// DOM helpers, formatting, the live table, notices.

// Shared app state: the session (user, prometheus) and the selected namespace.
export const state = { session: null, ns: sessionStorage.getItem('ns') || '' };

// h('a', {href, class, onclick, 'aria-label'}, ...children): children are strings, nodes, arrays or null.
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
      else if (k === 'class') el.className = v;
      else if (k === 'text') el.textContent = v;
      else if (k === 'dataset') Object.assign(el.dataset, v);
      else if (k in el && typeof v !== 'string') el[k] = v;
      else el.setAttribute(k, v === true ? '' : v);
    }
  }
  append(el, children);
  return el;
}
function append(el, c) {
  if (c === undefined || c === null || c === false) return;
  if (Array.isArray(c)) { for (const x of c) append(el, x); return; }
  el.append(c instanceof Node ? c : String(c));
}

// Ages like kubectl: 5s, 3m, 2h, 4d (and 3m20s / 2h5m below the next unit's tenfold).
export function age(ts, now = Date.now()) {
  const t = typeof ts === 'number' ? ts : Date.parse(ts);
  if (!ts || isNaN(t)) return '<unknown>';
  let s = Math.max(0, Math.floor((now - t) / 1000));
  if (s < 120) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 10) return s % 60 ? `${m}m${s % 60}s` : `${m}m`;
  if (m < 180) return `${m}m`;
  const hr = Math.floor(m / 60);
  if (hr < 8) return m % 60 ? `${hr}h${m % 60}m` : `${hr}h`;
  if (hr < 48) return `${hr}h`;
  const d = Math.floor(hr / 24);
  if (d < 8 && hr % 24) return `${d}d${hr % 24}h`;
  if (d < 365 * 2) return `${d}d`;
  return `${Math.floor(d / 365)}y`;
}
export function ageEl(ts) {
  if (!ts) return '';
  return h('time', { datetime: ts, 'data-age': '', title: new Date(ts).toLocaleString() }, age(ts));
}
setInterval(() => {
  const now = Date.now();
  for (const el of document.querySelectorAll('time[data-age]')) {
    const a = age(el.getAttribute('datetime'), now);
    if (el.textContent !== a) el.textContent = a;
  }
}, 5000);

export function cores(c) {
  if (!isFinite(c)) return '';
  if (c < 1) return `${Math.round(c * 1000)}m`;
  return `${+c.toFixed(2)}`;
}
export function bytes(b) {
  if (!isFinite(b)) return '';
  const units = ['B', 'Ki', 'Mi', 'Gi', 'Ti'];
  let i = 0;
  while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
  return `${+b.toFixed(b < 10 && i ? 1 : 0)}${units[i]}`;
}

export function labelsEl(labels) {
  const entries = Object.entries(labels || {});
  if (!entries.length) return h('span', { class: 'muted' }, 'none');
  return h('span', { class: 'labels' }, entries.map(([k, v]) => h('code', null, `${k}=${v}`)));
}
export function kv(pairs) {
  return h('dl', { class: 'kv' }, pairs.filter(Boolean).map(([k, v]) => [h('dt', null, k), h('dd', null, v === undefined || v === '' ? '—' : v)]));
}

// Visible, announced messages (action results, errors).
let noticeTimer = 0;
export function notice(message, kind = 'ok') {
  const box = document.getElementById('notice');
  clearTimeout(noticeTimer);
  const msg = h('div', { class: `msg ${kind}` },
    h('span', null, message),
    h('button', { type: 'button', 'aria-label': 'Dismiss message', onclick: () => box.replaceChildren() }, '×'));
  box.replaceChildren(msg);
  if (kind === 'ok') noticeTimer = setTimeout(() => { if (box.contains(msg)) box.replaceChildren(); }, 15000);
}
export function clearNotice() { document.getElementById('notice')?.replaceChildren(); }

// A page's resources (watches, timers, sockets), released together when the page goes away.
export class Scope {
  constructor() { this.fns = []; this.ac = new AbortController(); }
  get signal() { return this.ac.signal; }
  get closed() { return this.ac.signal.aborted; }
  add(fn) { if (this.closed) fn(); else this.fns.push(fn); return fn; }
  watch(lw) { this.add(() => lw.stop()); return lw.start(); }
  interval(fn, ms) { const t = setInterval(fn, ms); this.add(() => clearInterval(t)); return t; }
  child() { const c = new Scope(); this.add(() => c.dispose()); return c; }
  dispose() {
    if (this.closed) return;
    this.ac.abort();
    for (const fn of this.fns.splice(0).reverse()) { try { fn(); } catch (e) { console.error(e); } }
  }
}

// A table whose rows are kept in step with a ListWatch, keyed by uid, never re-rendered whole.
// columns: [{title, cell(obj) -> string|Node|array, key?: 'name', cls?}]
export class LiveTable {
  constructor({ columns, label, empty = 'None', sortKey, predicate, rowHeader = 0, limit = 0 }) {
    this.columns = columns;
    this.sortKey = sortKey || ((o) => `${o.metadata?.namespace || ''}/${o.metadata?.name || ''}`);
    this.predicate = predicate || (() => true);
    this.rowHeader = rowHeader;
    this.limit = limit;
    this.rows = new Map(); // uid -> {tr, key}
    this.order = []; // [{key, uid}] sorted by key
    this.textFilter = '';
    this.emptyText = empty;
    this.tbody = h('tbody');
    this.emptyRow = h('tr', { class: 'empty' }, h('td', { colspan: columns.length }, 'Loading…'));
    this.tbody.append(this.emptyRow);
    this.caption = h('caption');
    this.table = h('table', { 'aria-label': label },
      h('thead', null, h('tr', null, columns.map((c) => h('th', { scope: 'col', class: c.cls }, c.title)))),
      this.tbody, this.caption);
    this.el = h('div', { class: 'table-wrap', tabindex: '0', role: 'region', 'aria-label': `${label} (scrollable)` }, this.table);
    this.loaded = false;
    this.onRender = null;
  }

  makeRow(obj) {
    const tr = document.createElement('tr');
    tr.dataset.uid = obj.metadata?.uid || '';
    tr.dataset.name = obj.metadata?.name || '';
    this.columns.forEach((c, i) => {
      const td = document.createElement(i === this.rowHeader ? 'th' : 'td');
      if (i === this.rowHeader) td.scope = 'row';
      td.dataset.col = c.id || c.title.toLowerCase();
      if (c.cls) td.className = c.cls;
      let v;
      try { v = c.cell(obj); } catch (e) { v = '?'; console.error(e); }
      if (v instanceof Node) td.append(v);
      else if (Array.isArray(v)) append(td, v);
      else if (v !== undefined && v !== null) td.textContent = v;
      tr.append(td);
    });
    if (this.textFilter && !this.matches(obj)) tr.hidden = true;
    return tr;
  }

  matches(obj) {
    return !this.textFilter || (obj.metadata?.name || '').toLowerCase().includes(this.textFilter);
  }

  find(key, uid) {
    // binary search for the first index whose (key, uid) >= given
    let lo = 0, hi = this.order.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1, e = this.order[mid];
      if (e.key < key || (e.key === key && e.uid < uid)) lo = mid + 1; else hi = mid;
    }
    return lo;
  }

  remove(uid) {
    const r = this.rows.get(uid);
    if (!r) return;
    const i = this.find(r.key, uid);
    if (this.order[i]?.uid === uid) this.order.splice(i, 1);
    r.tr.remove();
    this.rows.delete(uid);
  }

  insert(uid, obj, key) {
    const tr = this.makeRow(obj);
    const i = this.find(key, uid);
    this.order.splice(i, 0, { key, uid });
    const next = this.order[i + 1];
    this.tbody.insertBefore(tr, next ? this.rows.get(next.uid).tr : null);
    this.rows.set(uid, { tr, key });
  }

  // changes: Map uid -> obj|null (from ListWatch); store: all objects.
  apply(changes, store) {
    if (!this.rows.size && changes.size > 20) return this.rebuild(store);
    for (const [uid, obj] of changes) {
      const r = this.rows.get(uid);
      if (!obj || !this.predicate(obj)) { if (r) this.remove(uid); continue; }
      const key = this.sortKey(obj);
      if (r && r.key === key) {
        const tr = this.makeRow(obj);
        r.tr.replaceWith(tr);
        r.tr = tr;
      } else {
        if (r) this.remove(uid);
        this.insert(uid, obj, key);
      }
    }
    this.finish();
  }

  // Every row again (the predicate changed, or many rows at once): one fragment.
  rebuild(store) {
    this.order = [];
    this.rows.clear();
    for (const [uid, obj] of store) if (this.predicate(obj)) this.order.push({ key: this.sortKey(obj), uid });
    this.order.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : a.uid < b.uid ? -1 : 1));
    const frag = document.createDocumentFragment();
    for (const e of this.order) {
      const tr = this.makeRow(store.get(e.uid));
      this.rows.set(e.uid, { tr, key: e.key });
      frag.append(tr);
    }
    this.tbody.replaceChildren(frag);
    this.finish();
  }

  setFilter(text, store) {
    this.textFilter = text.trim().toLowerCase();
    for (const [uid, r] of this.rows) r.tr.hidden = !this.matches(store.get(uid));
    this.finish();
  }

  finish() {
    this.loaded = true;
    // `limit` keeps only the first N rows (e.g. the 20 newest events)
    if (this.limit && this.order.length > this.limit) {
      for (const e of this.order.slice(this.limit)) { this.rows.get(e.uid)?.tr.remove(); this.rows.delete(e.uid); }
      this.order.length = this.limit;
    }
    let shown = 0;
    for (const r of this.rows.values()) if (!r.tr.hidden) shown++;
    this.emptyRow.firstChild.textContent = this.emptyText;
    if (shown === 0) this.tbody.append(this.emptyRow); else this.emptyRow.remove();
    const n = this.rows.size;
    this.caption.textContent = shown === n ? `${n} ${n === 1 ? 'item' : 'items'}` : `${shown} of ${n} items shown`;
    this.onRender?.();
  }

  showError(msg) {
    if (this.rows.size) return;
    this.emptyRow.firstChild.textContent = msg;
    this.tbody.append(this.emptyRow);
  }
}

// Status text + class for a "live" indicator beside a heading.
export function liveIndicator() {
  const el = h('span', { class: 'live' }, 'loading…');
  const set = (state, msg) => {
    el.className = 'live ' + (state === 'live' ? 'ok' : state === 'error' ? 'bad' : '');
    el.textContent = state === 'live' ? 'live' : state === 'error' ? `error: ${msg}` : state === 'listing' ? 'loading…' : 'reconnecting…';
  };
  return { el, set };
}
