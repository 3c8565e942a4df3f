// The overview and the list pages.
import { ListWatch, k8s, quantity } from './api.js';
import { h, LiveTable, liveIndicator, ageEl, kv } from './ui.js';
import { byKind, collectionPath, columnsFor, podStatus, eventTime, newestFirstKey, involvedLink } from './resources.js';

const nsText = (ns) => (ns ? `in namespace ${ns}` : 'in all namespaces');

function head(title, sub, live) {
  return h('div', { class: 'page-head' }, h('h1', { tabindex: '-1' }, title), sub ? h('span', { class: 'sub' }, sub) : null, live?.el);
}

// Node usage from the metrics API, polled every 15 s while the page is open.
function pollNodeUsage(scope, onUpdate) {
  const usage = new Map();
  const poll = async () => {
    try {
      const m = await k8s('/apis/metrics.k8s.io/v1beta1/nodes', { signal: scope.signal });
      usage.clear();
      for (const i of m.items || []) usage.set(i.metadata.name, { cpu: quantity(i.usage?.cpu), memory: quantity(i.usage?.memory) });
      onUpdate();
    } catch { /* no metrics: the columns show — */ }
  };
  poll();
  scope.interval(poll, 15000);
  return usage;
}

// A live table for a list page or a section: table + ListWatch, wired together.
export function liveList(scope, { kind, ns, columns, label, empty, predicate, labelSelector, fieldSelector, live, sortKey }) {
  const table = new LiveTable({ columns, label, empty, predicate, sortKey });
  const lw = new ListWatch(collectionPath(kind, ns), {
    labelSelector, fieldSelector,
    onBatch: (changes, store) => table.apply(changes, store),
    onState: (s, msg) => { live?.set(s, msg); if (s === 'error') table.showError(`Cannot list ${kind.title}: ${msg}`); },
  });
  scope.watch(lw);
  return { table, lw };
}

export function listPage(main, scope, { kind, ns, setTitle }) {
  const scoped = kind.namespaced;
  setTitle(`${kind.title}${scoped && ns ? ' · ' + ns : ''}`);
  const live = liveIndicator();
  const extra = {};
  const { table, lw } = liveList(scope, {
    kind, ns: scoped ? ns : '', live, label: kind.title,
    columns: columnsFor(kind, scoped && !ns, extra),
    empty: `No ${kind.title} ${scoped ? nsText(ns) : ''}`.trim(),
  });
  if (kind.kind === 'Node') extra.usage = pollNodeUsage(scope, () => table.rebuild(lw.store));
  const filter = h('input', { id: 'filter', type: 'search', autocomplete: 'off', oninput: (e) => table.setFilter(e.target.value, lw.store) });
  main.append(
    head(kind.title, scoped ? nsText(ns) : 'cluster-wide', live),
    h('div', { class: 'toolbar' }, h('label', { for: 'filter' }, 'Filter by name'), filter),
    table.el);
}

export function overviewPage(main, scope, { ns, setTitle }) {
  setTitle('Overview');
  const Node = byKind.get('Node'), Pod = byKind.get('Pod'), Deployment = byKind.get('Deployment'), Event = byKind.get('Event');

  // Nodes, with current use from the metrics API.
  const nodeLive = liveIndicator();
  const extra = {};
  const nodes = liveList(scope, { kind: Node, columns: columnsFor(Node, false, extra), label: 'Nodes', empty: 'No nodes', live: nodeLive });
  extra.usage = pollNodeUsage(scope, () => nodes.table.rebuild(nodes.lw.store));

  // Workload counts.
  const podCounts = h('div'), deployCounts = h('div');
  const countBy = (store, fn) => {
    const m = new Map();
    for (const o of store.values()) { const k = fn(o); m.set(k, (m.get(k) || 0) + 1); }
    return m;
  };
  const PHASES = ['Running', 'Pending', 'Succeeded', 'Failed', 'Unknown'];
  const renderCounts = (el, m, order, total, what) => {
    const keys = [...new Set([...order, ...[...m.keys()].sort()])];
    el.replaceChildren(h('p', null, h('strong', null, String(total)), ` ${what}`),
      kv(keys.map((k) => [k, String(m.get(k) || 0)])));
  };
  const pods = new ListWatch(collectionPath(Pod, ns), {
    onBatch: (_c, store) => {
      const m = countBy(store, (p) => (p.metadata?.deletionTimestamp ? 'Terminating' : p.status?.phase || 'Pending'));
      const crash = [...store.values()].filter((p) => /BackOff|Err/.test(podStatus(p))).length;
      renderCounts(podCounts, m, PHASES, store.size, store.size === 1 ? 'pod' : 'pods');
      if (crash) podCounts.append(h('p', { class: 's-err' }, `${crash} failing to start (CrashLoopBackOff, ImagePullBackOff or errors)`));
    },
    onState: (s, msg) => { if (s === 'error') podCounts.replaceChildren(h('p', { class: 's-err' }, `Cannot list pods: ${msg}`)); },
  });
  const available = (d) => {
    const c = (d.status?.conditions || []).find((x) => x.type === 'Available');
    if (c) return c.status === 'True' && (d.status?.availableReplicas || 0) >= (d.spec?.replicas ?? 1) ? 'Available' : 'Not available';
    return (d.status?.availableReplicas || 0) >= (d.spec?.replicas ?? 1) ? 'Available' : 'Not available';
  };
  const deploys = new ListWatch(collectionPath(Deployment, ns), {
    onBatch: (_c, store) => renderCounts(deployCounts, countBy(store, available), ['Available', 'Not available'], store.size, store.size === 1 ? 'deployment' : 'deployments'),
    onState: (s, msg) => { if (s === 'error') deployCounts.replaceChildren(h('p', { class: 's-err' }, `Cannot list deployments: ${msg}`)); },
  });
  scope.watch(pods);
  scope.watch(deploys);

  // The 20 newest Warning events.
  const evCols = [
    { title: 'Object', id: 'object', cell: involvedLink },
    ...(ns ? [] : [{ title: 'Namespace', id: 'namespace', cell: (e) => e.metadata?.namespace || '' }]),
    { title: 'Reason', id: 'reason', cell: (e) => e.reason || '' },
    { title: 'Message', id: 'message', cls: 'wrap', cell: (e) => e.message || '' },
    { title: 'Age', id: 'age', cell: (e) => ageEl(eventTime(e)) },
  ];
  const evTable = new LiveTable({ columns: evCols, label: 'Recent warning events', empty: 'No warning events', sortKey: newestFirstKey, rowHeader: -1 });
  const evLive = liveIndicator();
  scope.watch(new ListWatch(collectionPath(Event, ns), {
    onBatch: (_c, store) => {
      const top = [...store.values()].filter((e) => e.type === 'Warning')
        .sort((a, b) => (newestFirstKey(a) < newestFirstKey(b) ? -1 : 1)).slice(0, 20);
      evTable.rebuild(new Map(top.map((e) => [e.metadata.uid, e])));
    },
    onState: (s, msg) => { evLive.set(s, msg); if (s === 'error') evTable.showError(`Cannot list events: ${msg}`); },
  }));

  const section = (id, title, ...body) => h('section', { 'aria-labelledby': `h-${id}`, 'data-section': id }, h('h2', { id: `h-${id}` }, title), ...body);
  main.append(
    head('Overview', ns ? `namespace ${ns}` : 'all namespaces'),
    section('nodes', 'Nodes', nodeLive.el, nodes.table.el),
    section('workloads', 'Workloads',
      h('div', { class: 'cards' },
        h('div', { class: 'card', 'data-card': 'pods' }, h('h3', null, h('a', { href: `#/pods${ns ? '?ns=' + encodeURIComponent(ns) : ''}` }, 'Pods by phase')), podCounts),
        h('div', { class: 'card', 'data-card': 'deployments' }, h('h3', null, h('a', { href: `#/deployments${ns ? '?ns=' + encodeURIComponent(ns) : ''}` }, 'Deployments')), deployCounts))),
    section('events', 'Recent warning events', evLive.el, evTable.el));
}

export function notFoundPage(main, { setTitle }) {
  setTitle('Not found');
  main.append(h('h1', { tabindex: '-1' }, 'Not found'), h('p', null, 'No such page. ', h('a', { href: '#/overview' }, 'Go to the overview')));
}
