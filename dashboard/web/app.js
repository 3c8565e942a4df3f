// The single-page app: session and login, header, navigation, hash routing.
import { request, onSessionEnded, ListWatch } from './api.js';
import { h, Scope, notice, clearNotice, state } from './ui.js';
import { byResource } from './resources.js';
import { listPage, overviewPage, notFoundPage } from './pages.js';
import { detailPage } from './detail.js';

const $ = (id) => document.getElementById(id);
// "Other namespace…" in the selector: for users who may not list namespaces but may read one.
const OTHER = '__other__';

const NAV = [
  ['Cluster', [['overview', 'Overview'], ['namespaces', 'Namespaces'], ['nodes', 'Nodes'], ['persistentvolumes', 'PersistentVolumes']]],
  ['Workloads', [['deployments', 'Deployments'], ['statefulsets', 'StatefulSets'], ['daemonsets', 'DaemonSets'],
    ['replicasets', 'ReplicaSets'], ['jobs', 'Jobs'], ['cronjobs', 'CronJobs'], ['pods', 'Pods']]],
  ['Network', [['services', 'Services'], ['ingresses', 'Ingresses'], ['endpoints', 'Endpoints'], ['endpointslices', 'EndpointSlices']]],
  ['Config and storage', [['configmaps', 'ConfigMaps'], ['secrets', 'Secrets'], ['persistentvolumeclaims', 'PersistentVolumeClaims'],
    ['horizontalpodautoscalers', 'HorizontalPodAutoscalers']]],
];

let appScope = null; // lives while logged in (the namespace watch)
let pageScope = null; // lives while a page is shown
let ended = false;

// ---- login ----------------------------------------------------------------------------------

function showLogin(message) {
  pageScope?.dispose(); pageScope = null;
  appScope?.dispose(); appScope = null;
  state.session = null;
  $('app').hidden = true;
  $('login').hidden = false;
  document.title = 'Log in · MiniK8s';
  const err = $('login-error');
  err.textContent = message || '';
  err.hidden = !message;
}

async function login(body, button) {
  const err = $('login-error');
  err.hidden = true;
  button.disabled = true;
  try {
    const session = await request('/login', { method: 'POST', body });
    $('token').value = '';
    $('kubeconfig').value = '';
    $('kubeconfig-file').value = '';
    start(session);
  } catch (e) {
    err.textContent = `Login failed: ${e.message}`;
    err.hidden = false;
  } finally {
    button.disabled = false;
  }
}

$('token-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const token = $('token').value.trim();
  if (token) login({ token }, ev.submitter || ev.target.querySelector('button'));
});
$('kubeconfig-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const kubeconfig = $('kubeconfig').value;
  const err = $('login-error');
  if (!kubeconfig.trim()) { err.textContent = 'Choose a kubeconfig file or paste one first.'; err.hidden = false; return; }
  login({ kubeconfig }, ev.submitter || ev.target.querySelector('button'));
});
$('kubeconfig-file').addEventListener('change', async (ev) => {
  const f = ev.target.files?.[0];
  if (f) $('kubeconfig').value = await f.text();
});

onSessionEnded((message) => {
  if (ended || !state.session) return;
  ended = true;
  showLogin(`Your session ended: ${message}`);
});

$('logout').addEventListener('click', async () => {
  try { await request('/logout', { method: 'POST' }); } catch { /* gone anyway */ }
  showLogin('');
  $('login-error').hidden = true;
  document.getElementById('token').focus();
});

// ---- app shell ----------------------------------------------------------------------------

function start(session) {
  ended = false;
  state.session = session;
  $('login').hidden = true;
  $('app').hidden = false;
  $('user').textContent = session.user || '(unknown)';
  appScope = new Scope();
  watchNamespaces();
  buildNav();
  route(true);
}

function buildNav() {
  const nav = $('nav');
  nav.replaceChildren(h('div', { class: 'groups' }, NAV.map(([group, items], i) =>
    h('section', { 'aria-labelledby': `nav-h-${i}` },
      h('h2', { id: `nav-h-${i}` }, group),
      h('ul', null, items.map(([r, title]) => h('li', null, h('a', { href: `#/${r}`, 'data-route': r }, title))))))));
  updateNav();
}

function updateNav() {
  const cur = parseHash();
  for (const a of $('nav').querySelectorAll('a[data-route]')) {
    const r = a.dataset.route;
    const k = byResource.get(r);
    a.href = `#/${r}${state.ns && (r === 'overview' || k?.namespaced) ? `?ns=${encodeURIComponent(state.ns)}` : ''}`;
    if (cur.parts[0] === r || (!cur.parts[0] && r === 'overview')) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
}

$('menu-button').addEventListener('click', () => {
  const open = !$('nav').classList.contains('open');
  $('nav').classList.toggle('open', open);
  $('menu-button').setAttribute('aria-expanded', String(open));
});
$('nav').addEventListener('click', (ev) => {
  if (ev.target.closest('a')) { $('nav').classList.remove('open'); $('menu-button').setAttribute('aria-expanded', 'false'); }
});

// The namespace selector, kept live by a watch of namespaces.
function watchNamespaces() {
  const sel = $('namespace');
  const sync = (store) => {
    const names = [...store.values()].map((n) => n.metadata.name).sort();
    if (state.ns && !names.includes(state.ns)) names.push(state.ns);
    const want = ['', ...names, OTHER].join('\n');
    const have = [...sel.options].map((o) => o.value).join('\n');
    if (want !== have) {
      sel.replaceChildren(new Option('All namespaces', ''), ...names.map((n) => new Option(n, n)), new Option('Other namespace…', OTHER));
    }
    sel.value = state.ns;
  };
  sync(new Map());
  appScope.watch(new ListWatch('/api/v1/namespaces', {
    onBatch: (_c, store) => sync(store),
  }));
}
$('namespace').addEventListener('change', (ev) => {
  let ns = ev.target.value;
  if (ns === OTHER) {
    ns = (window.prompt('Namespace name') || '').trim();
    if (!/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(ns)) { ev.target.value = state.ns; return; }
  }
  setNamespace(ns, true);
});

export function setNamespace(ns, navigate) {
  state.ns = ns;
  sessionStorage.setItem('ns', ns);
  if ($('namespace').value !== ns) {
    if (![...$('namespace').options].some((o) => o.value === ns)) $('namespace').append(new Option(ns, ns));
    $('namespace').value = ns;
  }
  updateNav();
  const cur = parseHash();
  if (navigate && cur.parts[0] === 'object') {
    // on an object's page: go to the list of its kind in the chosen namespace
    const k = byResource.get(cur.parts[3]);
    location.hash = k?.namespaced ? `#/${k.resource}${ns ? '?ns=' + encodeURIComponent(ns) : ''}` : `#/overview${ns ? '?ns=' + encodeURIComponent(ns) : ''}`;
  } else if (navigate && (cur.parts.length <= 1)) {
    cur.params.delete('ns');
    if (ns) cur.params.set('ns', ns);
    const q = cur.params.toString();
    location.hash = `#/${cur.parts[0] || 'overview'}${q ? '?' + q : ''}`;
  }
}

// ---- routing ----------------------------------------------------------------------------

export function parseHash() {
  const raw = location.hash.replace(/^#\/?/, '');
  const [path, q] = raw.split('?');
  return { parts: path ? path.split('/').map(decodeURIComponent) : [], params: new URLSearchParams(q || '') };
}

let lastRoute = '';
function route(initial = false) {
  if (!state.session) return;
  const { parts, params } = parseHash();
  const key = parts.join('/') + '?' + [...params].filter(([k]) => k !== 'tab').map((x) => x.join('=')).join('&');
  if (!initial && key === lastRoute) return; // only the tab changed: the page handles it
  lastRoute = key;
  if (params.has('ns') && params.get('ns') !== state.ns) setNamespace(params.get('ns'), false);
  else if (!params.has('ns') && parts.length <= 1 && state.ns && byResource.get(parts[0])?.namespaced !== false) {
    // A list page without ?ns=: show all namespaces.
    setNamespace('', false);
  }
  updateNav();
  clearNotice();
  pageScope?.dispose();
  pageScope = new Scope();
  const main = $('page');
  main.replaceChildren();
  const setTitle = (t) => { document.title = `${t} · MiniK8s`; };
  try {
    if (!parts.length || parts[0] === 'overview') overviewPage(main, pageScope, { ns: state.ns, setTitle });
    else if (parts[0] === 'object' && parts.length === 6) {
      const [, group, version, resource, ns, name] = parts;
      detailPage(main, pageScope, { group: group === 'core' ? '' : group, version, resource, ns: ns === '_' ? '' : ns, name, params, setTitle });
    } else if (byResource.has(parts[0]) && parts.length === 1) listPage(main, pageScope, { kind: byResource.get(parts[0]), ns: state.ns, setTitle });
    else notFoundPage(main, { setTitle });
  } catch (e) {
    console.error(e);
    notice(`This page failed: ${e.message}`, 'error');
  }
  if (!initial) main.querySelector('h1')?.focus({ preventScroll: false });
}
window.addEventListener('hashchange', () => route(false));

// ---- start ------------------------------------------------------------------------------

(async () => {
  try {
    const res = await fetch('/session', { credentials: 'same-origin', cache: 'no-store' });
    if (res.ok) return start(await res.json());
    let msg = '';
    try { msg = (await res.json()).message; } catch { /* no body */ }
    showLogin(res.status === 401 ? '' : `The dashboard answered ${res.status}: ${msg}`);
  } catch (e) {
    showLogin(`Cannot reach the dashboard server: ${e.message}`);
  }
})();
