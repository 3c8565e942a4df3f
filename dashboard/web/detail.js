// The page of one object: summary, owner and children, YAML editor, events, logs, terminal, plots.
import { ApiError, ListWatch, k8s, request, quantity, query } from './api.js';
import { h, LiveTable, liveIndicator, ageEl, kv, labelsEl, notice, state } from './ui.js';
import {
  byResource, byKind, kindFor, collectionPath, objectPath, objectHash, columnsFor, podColumns, podStatus, statusEl,
  nodeStatus, nodeRoles, virtualBadge, isModulePod, eventTime, newestFirstKey, jobStatus,
} from './resources.js';
import { lineChart } from './charts.js';

const SCALABLE = new Set(['Deployment', 'StatefulSet', 'ReplicaSet']);
const RESTARTABLE = new Set(['Deployment', 'StatefulSet', 'DaemonSet']);
const PLOTTED = new Set(['Node', 'Pod', 'Deployment']);
const CHILDREN = { Deployment: ['ReplicaSet', 'Pod'], CronJob: ['Job', 'Pod'], ReplicaSet: ['Pod'], StatefulSet: ['Pod'], DaemonSet: ['Pod'], Job: ['Pod'] };

const ownedBy = (o, uids) => (o.metadata?.ownerReferences || []).some((r) => uids.has(r.uid));
const mergePatch = 'application/merge-patch+json';

export function detailPage(main, scope, { group, version, resource, ns, name, params, setTitle }) {
  const known = byResource.get(resource);
  const kind = known && known.group === group ? { ...known, version }
    : { kind: resource, group, version, resource, namespaced: !!ns, title: resource };
  const K = kind.kind;
  setTitle(`${K} ${name}`);
  const path = objectPath(kind, ns, name);
  const listHash = `#/${resource}${ns ? '?ns=' + encodeURIComponent(ns) : ''}`;

  const live = liveIndicator();
  const banner = h('p', { class: 'msg error banner', role: 'alert', hidden: true });
  const terminating = h('p', { class: 'msg banner', hidden: true });
  const body = h('div', null, h('p', null, 'Loading…'));
  main.append(
    h('div', { class: 'page-head' },
      h('h1', { tabindex: '-1' }, `${K} ${name}`),
      h('span', { class: 'sub' }, ns ? `namespace ${ns} · ` : '', byResource.has(resource) ? h('a', { href: listHash }, `all ${kind.title}`) : ''),
      live.el),
    banner, terminating, body);

  let obj = null, uid = null, gone = false;
  const ctx = { kind, K, ns, name, path, scope, get obj() { return obj; }, get uid() { return uid; } };
  const onUpdate = new Set(); // callbacks run on each change of the object

  function markGone(message) {
    if (gone) return;
    gone = true;
    banner.replaceChildren(message, ' ', h('a', { href: listHash }, `Back to ${kind.title}`));
    banner.hidden = false;
    terminating.hidden = true;
    body.replaceChildren();
    ctx.tabScope?.dispose();
    sampler?.stop();
  }

  const lw = new ListWatch(collectionPath(kind, ns), {
    fieldSelector: `metadata.name=${name}`,
    onState: (s, msg) => { live.set(s, msg); if (s === 'error' && !uid) body.replaceChildren(h('p', { class: 'msg error', role: 'alert' }, `Cannot read ${K} ${name}: ${msg}`)); },
    onBatch: (_changes, store) => {
      if (gone) return;
      const cur = [...store.values()].find((o) => o.metadata?.name === name);
      if (!cur) {
        if (uid) markGone(`This ${K} was deleted.`);
        else markGone(`${K} ${name} was not found${ns ? ` in namespace ${ns}` : ''}.`);
        return;
      }
      if (uid && cur.metadata.uid !== uid) {
        markGone(`This ${K} was deleted (a new ${K} with the same name has been created since).`);
        banner.append(' ', h('a', { href: location.hash, onclick: () => location.reload() }, 'Open the new one'));
        return;
      }
      obj = cur;
      if (obj.metadata.deletionTimestamp) {
        terminating.textContent = `This ${K} is being deleted (since ${new Date(obj.metadata.deletionTimestamp).toLocaleTimeString()}).`;
        terminating.hidden = false;
      }
      if (!uid) { uid = cur.metadata.uid; build(); }
      for (const fn of onUpdate) fn(obj);
    },
  });
  scope.watch(lw);

  let sampler = null;
  function build() {
    if (PLOTTED.has(K) && !state.session?.prometheus) sampler = startSampler(ctx);
    const tabs = [['overview', 'Overview'], ['yaml', 'YAML'], ['events', 'Events']];
    if (K === 'Pod') tabs.push(['logs', 'Logs'], ['terminal', 'Terminal']);
    if (PLOTTED.has(K)) tabs.push(['metrics', 'Metrics']);
    const panel = h('div', { role: 'tabpanel', id: 'tabpanel', tabindex: '0' });
    const buttons = tabs.map(([id, title]) => h('button', {
      type: 'button', role: 'tab', id: `tab-${id}`, 'aria-controls': 'tabpanel', 'aria-selected': 'false', tabindex: '-1',
      onclick: () => select(id, true),
      onkeydown: (ev) => {
        const i = tabs.findIndex((t) => t[0] === id);
        const j = ev.key === 'ArrowRight' ? (i + 1) % tabs.length : ev.key === 'ArrowLeft' ? (i + tabs.length - 1) % tabs.length
          : ev.key === 'Home' ? 0 : ev.key === 'End' ? tabs.length - 1 : -1;
        if (j >= 0) { ev.preventDefault(); select(tabs[j][0], true); buttons[j].focus(); }
      },
    }, title));
    const tablist = h('div', { role: 'tablist', 'aria-label': `${K} ${name}` }, buttons);
    body.replaceChildren(actionsBar(ctx, onUpdate), tablist, panel);

    const renderers = { overview: overviewTab, yaml: yamlTab, events: eventsTab, logs: logsTab, terminal: terminalTab, metrics: metricsTab };
    function select(id, user) {
      tabs.forEach(([t], i) => {
        buttons[i].setAttribute('aria-selected', String(t === id));
        buttons[i].tabIndex = t === id ? 0 : -1;
      });
      panel.setAttribute('aria-labelledby', `tab-${id}`);
      ctx.tabScope?.dispose();
      ctx.tabScope = scope.child();
      ctx.tabUpdate = null;
      panel.replaceChildren();
      renderers[id](panel, ctx, ctx.tabScope, sampler);
      if (user) {
        const q = new URLSearchParams(location.hash.split('?')[1] || '');
        q.set('tab', id);
        history.replaceState(null, '', `${location.hash.split('?')[0]}?${q}`);
      }
    }
    onUpdate.add((o) => ctx.tabUpdate?.(o));
    const want = params.get('tab');
    select(tabs.some((t) => t[0] === want) ? want : 'overview', false);
  }
}

// ---- actions ----------------------------------------------------------------------------------

function actionsBar(ctx, onUpdate) {
  const { K, name, path } = ctx;
  const bar = h('div', { class: 'actions', role: 'group', 'aria-label': 'Actions' });
  const run = async (button, what, fn) => {
    button.disabled = true;
    try { notice(await fn()); } catch (e) { notice(`${what} failed: ${e.message}`, 'error'); } finally { button.disabled = false; }
  };
  if (SCALABLE.has(K)) {
    const input = h('input', { id: 'replicas', type: 'number', min: '0', step: '1', value: String(ctx.obj.spec?.replicas ?? 1) });
    let dirty = false;
    input.addEventListener('input', () => { dirty = true; });
    onUpdate.add((o) => { if (!dirty && document.activeElement !== input) input.value = String(o.spec?.replicas ?? 1); });
    const btn = h('button', { type: 'button', class: 'primary' }, 'Scale');
    const scale = () => run(btn, 'Scale', async () => {
      const n = Number(input.value);
      if (!Number.isInteger(n) || n < 0) throw new Error('replicas must be a whole number, 0 or more');
      await k8s(path + '/scale', { method: 'PATCH', body: { spec: { replicas: n } }, contentType: mergePatch });
      dirty = false;
      return `Scaled ${K} ${name} to ${n} ${n === 1 ? 'replica' : 'replicas'}.`;
    });
    btn.addEventListener('click', scale);
    input.addEventListener('keydown', (ev) => { if (ev.key === 'Enter') scale(); });
    bar.append(h('div', { class: 'group' }, h('label', { for: 'replicas' }, 'Replicas'), input, btn));
  }
  if (RESTARTABLE.has(K)) {
    const btn = h('button', { type: 'button' }, 'Restart rollout');
    btn.addEventListener('click', () => run(btn, 'Restart', async () => {
      const now = new Date().toISOString().replace(/\.\d+Z$/, 'Z');
      await k8s(path, { method: 'PATCH', contentType: mergePatch,
        body: { spec: { template: { metadata: { annotations: { 'kubectl.kubernetes.io/restartedAt': now } } } } } });
      return `Restarted the rollout of ${K} ${name}.`;
    }));
    bar.append(btn);
  }
  const del = h('button', { type: 'button', class: 'danger' }, 'Delete');
  const confirmBox = h('div', { class: 'confirm', hidden: true, role: 'group', 'aria-label': 'Confirm deletion' });
  const yes = h('button', { type: 'button', class: 'danger' }, 'Confirm delete');
  const no = h('button', { type: 'button' }, 'Cancel');
  confirmBox.append(h('span', null, `Delete ${K} ${name}? This cannot be undone.`), yes, no);
  del.addEventListener('click', () => { confirmBox.hidden = false; del.hidden = true; yes.focus(); });
  no.addEventListener('click', () => { confirmBox.hidden = true; del.hidden = false; del.focus(); });
  yes.addEventListener('click', () => run(yes, 'Delete', async () => {
    await k8s(path, { method: 'DELETE' });
    confirmBox.hidden = true; del.hidden = false;
    return `Deletion of ${K} ${name} requested.`;
  }));
  bar.append(del, confirmBox);
  return bar;
}

// ---- overview tab ---------------------------------------------------------------------------

function overviewTab(panel, ctx, scope) {
  const summary = h('div');
  const revealed = new Set();
  const render = (o) => summary.replaceChildren(...summaryOf(ctx, o, revealed, () => render(ctx.obj)));
  render(ctx.obj);
  ctx.tabUpdate = render;
  panel.append(summary, ownerSection(ctx), childrenSection(ctx, scope));
}

function section(id, title, ...body) {
  return h('section', { 'aria-labelledby': `h-${id}`, 'data-section': id }, h('h2', { id: `h-${id}` }, title), ...body);
}

function conditionsTable(conds) {
  if (!conds?.length) return null;
  return section('conditions', 'Conditions', h('div', { class: 'table-wrap' }, h('table', { 'aria-label': 'Conditions' },
    h('thead', null, h('tr', null, ['Type', 'Status', 'Reason', 'Message', 'Last transition'].map((t) => h('th', { scope: 'col' }, t)))),
    h('tbody', null, conds.map((c) => h('tr', null, h('th', { scope: 'row' }, c.type), h('td', null, c.status), h('td', null, c.reason || ''),
      h('td', { class: 'wrap' }, c.message || ''), h('td', null, ageEl(c.lastTransitionTime || c.lastUpdateTime))))))));
}

function simpleTable(label, cols, rows) {
  return h('div', { class: 'table-wrap' }, h('table', { 'aria-label': label },
    h('thead', null, h('tr', null, cols.map((t) => h('th', { scope: 'col' }, t)))),
    h('tbody', null, rows.length ? rows.map((r) => h('tr', null, r.map((c, i) => h(i ? 'td' : 'th', i ? { class: 'wrap' } : { scope: 'row' }, c)))) : h('tr', { class: 'empty' }, h('td', { colspan: cols.length }, 'None')))));
}

function containerState(s) {
  if (!s) return 'Unknown';
  if (s.running) return ['Running since ', ageEl(s.running.startedAt), ' ago'];
  if (s.waiting) return `Waiting: ${s.waiting.reason || ''}${s.waiting.message ? ' — ' + s.waiting.message : ''}`;
  if (s.terminated) return `Terminated: ${s.terminated.reason || ''} (exit code ${s.terminated.exitCode})`;
  return 'Unknown';
}

function summaryOf(ctx, o, revealed, rerender) {
  const { K } = ctx;
  const md = o.metadata || {};
  const spec = o.spec || {}, st = o.status || {};
  const annotations = Object.fromEntries(Object.entries(md.annotations || {}).filter(([k]) => k !== 'kubectl.kubernetes.io/last-applied-configuration'));
  const rows = [['Name', md.name], md.namespace && ['Namespace', md.namespace], ['UID', md.uid],
    ['Created', md.creationTimestamp ? [ageEl(md.creationTimestamp), ` ago (${new Date(md.creationTimestamp).toLocaleString()})`] : ''],
    ['Labels', labelsEl(md.labels)], ['Annotations', labelsEl(annotations)]];
  const out = [];
  const node = (n) => (n ? h('a', { href: objectHash(byKind.get('Node'), '', n) }, n) : '');
  switch (K) {
    case 'Pod': {
      rows.push(['Status', statusEl(podStatus(o))], ['Node', node(spec.nodeName)], ['Pod IP', st.podIP], ['QoS class', st.qosClass],
        isModulePod(o) && ['Kind', h('span', { class: 'badge module' }, 'module')]);
      const cs = new Map((st.containerStatuses || []).concat(st.initContainerStatuses || []).map((c) => [c.name, c]));
      const all = [...(spec.initContainers || []).map((c) => [c, true]), ...(spec.containers || []).map((c) => [c, false])];
      out.push(section('containers', 'Containers', simpleTable('Containers', ['Name', 'Image', 'State', 'Ready', 'Restarts'],
        all.map(([c, init]) => {
          const s = cs.get(c.name);
          return [c.name + (init ? ' (init)' : ''), c.image, containerState(s?.state), s?.ready ? 'Yes' : 'No', String(s?.restartCount ?? 0)];
        }))));
      break;
    }
    case 'Deployment': case 'StatefulSet': case 'ReplicaSet': {
      const want = spec.replicas ?? 1;
      rows.push(['Replicas', `${want} desired · ${st.updatedReplicas || 0} up-to-date · ${st.readyReplicas || 0} ready · ${st.availableReplicas || 0} available`],
        ['Rollout', [h('progress', { max: String(Math.max(want, 1)), value: String(Math.min(st.updatedReplicas || 0, want)), 'aria-label': 'Rollout progress' }),
          ` ${Math.min(st.updatedReplicas || 0, want)}/${want} updated`]],
        ['Selector', labelsEl(spec.selector?.matchLabels)],
        ['Images', (spec.template?.spec?.containers || []).map((c) => c.image).join(', ')],
        spec.strategy && ['Strategy', spec.strategy.type]);
      break;
    }
    case 'DaemonSet':
      rows.push(['Pods', `${st.desiredNumberScheduled || 0} desired · ${st.currentNumberScheduled || 0} current · ${st.numberReady || 0} ready · ${st.updatedNumberScheduled || 0} up-to-date`],
        ['Images', (spec.template?.spec?.containers || []).map((c) => c.image).join(', ')]);
      break;
    case 'Job':
      rows.push(['Status', statusEl(jobStatus(o))], ['Completions', `${st.succeeded || 0}/${spec.completions ?? 1}`], ['Active', String(st.active || 0)], ['Failed', String(st.failed || 0)]);
      break;
    case 'CronJob':
      rows.push(['Schedule', spec.schedule], ['Suspend', String(!!spec.suspend)], ['Last schedule', st.lastScheduleTime ? [ageEl(st.lastScheduleTime), ' ago'] : 'never']);
      break;
    case 'Node': {
      rows.push(['Status', statusEl(nodeStatus(o))], ['Roles', nodeRoles(o)], ['Virtual', virtualBadge(o) || 'no'],
        ['Addresses', (st.addresses || []).map((a) => `${a.type}: ${a.address}`).join(', ')],
        ['Kubelet', st.nodeInfo?.kubeletVersion], ['OS', `${st.nodeInfo?.osImage || ''} ${st.nodeInfo?.architecture || ''}`]);
      const res = [...new Set([...Object.keys(st.capacity || {}), ...Object.keys(st.allocatable || {})])];
      out.push(section('capacity', 'Capacity', simpleTable('Capacity', ['Resource', 'Capacity', 'Allocatable'],
        res.map((r) => [r, st.capacity?.[r] || '', st.allocatable?.[r] || '']))));
      break;
    }
    case 'Service':
      rows.push(['Type', spec.type || 'ClusterIP'], ['Cluster IP', spec.clusterIP], ['Selector', labelsEl(spec.selector)]);
      out.push(section('ports', 'Ports', simpleTable('Ports', ['Name', 'Port', 'Target port', 'Node port', 'Protocol'],
        (spec.ports || []).map((p) => [p.name || '', String(p.port), String(p.targetPort ?? p.port), p.nodePort ? String(p.nodePort) : '', p.protocol || 'TCP']))));
      break;
    case 'Ingress':
      out.push(section('rules', 'Rules', simpleTable('Rules', ['Host', 'Path', 'Backend'],
        (spec.rules || []).flatMap((r) => (r.http?.paths || []).map((p) => [r.host || '*', `${p.path || '/'} (${p.pathType || ''})`,
          `${p.backend?.service?.name}:${p.backend?.service?.port?.number ?? p.backend?.service?.port?.name ?? ''}`])))));
      break;
    case 'ConfigMap':
      out.push(section('data', 'Data', simpleTable('Data', ['Key', 'Value'],
        Object.entries(o.data || {}).map(([k, v]) => [k, h('pre', { class: 'secret-val' }, v)]))));
      break;
    case 'Secret':
      rows.push(['Type', o.type || 'Opaque']);
      out.push(section('data', 'Data', simpleTable('Data', ['Key', 'Value', 'Action'],
        Object.entries(o.data || {}).map(([k, v]) => {
          const shown = revealed.has(k);
          return [k, shown ? h('pre', { class: 'secret-val' }, decode64(v)) : h('span', { class: 'muted' }, `hidden (${Math.floor(((v || '').length * 3) / 4)} bytes)`),
            h('button', { type: 'button', 'aria-label': `${shown ? 'Hide' : 'Reveal'} ${k}`, onclick: () => { shown ? revealed.delete(k) : revealed.add(k); rerender(); } }, shown ? 'Hide' : 'Reveal')];
        }))));
      break;
    case 'PersistentVolumeClaim':
      rows.push(['Status', statusEl(st.phase || 'Pending')], ['Volume', spec.volumeName], ['Capacity', st.capacity?.storage], ['Storage class', spec.storageClassName]);
      break;
    case 'PersistentVolume':
      rows.push(['Status', statusEl(st.phase || '')], ['Capacity', spec.capacity?.storage], ['Claim', spec.claimRef ? `${spec.claimRef.namespace}/${spec.claimRef.name}` : ''], ['Reclaim policy', spec.persistentVolumeReclaimPolicy]);
      break;
    case 'HorizontalPodAutoscaler': {
      const ref = spec.scaleTargetRef || {};
      const rk = kindFor(ref.apiVersion || 'apps/v1', ref.kind || 'Deployment');
      rows.push(['Target', h('a', { href: objectHash(rk, o.metadata.namespace, ref.name) }, `${ref.kind}/${ref.name}`)],
        ['Replicas', `min ${spec.minReplicas ?? 1} · max ${spec.maxReplicas} · current ${st.currentReplicas ?? 0} · desired ${st.desiredReplicas ?? 0}`]);
      out.push(section('hpa-metrics', 'Metrics', simpleTable('HPA metrics', ['Metric', 'Current', 'Target'],
        (spec.metrics || []).map((m, i) => {
          const r = m.resource || m.containerResource || {};
          const c = (st.currentMetrics || [])[i]?.resource || (st.currentMetrics || [])[i]?.containerResource;
          const t = r.target || {};
          const util = t.averageUtilization !== undefined;
          return [r.name || m.type,
            util ? (c?.current?.averageUtilization !== undefined ? `${c.current.averageUtilization}% (${c.current.averageValue || ''})` : '<unknown>') : (c?.current?.averageValue || c?.current?.value || '<unknown>'),
            util ? `${t.averageUtilization}% utilization` : (t.averageValue || t.value || '')];
        }))));
      break;
    }
    default:
  }
  return [kv(rows), ...out, conditionsTable(st.conditions)].filter(Boolean);
}

function decode64(v) {
  try {
    const bin = atob(v || '');
    return new TextDecoder().decode(Uint8Array.from(bin, (c) => c.charCodeAt(0)));
  } catch { return '(not valid base64)'; }
}

function ownerSection(ctx) {
  const refs = ctx.obj.metadata?.ownerReferences || [];
  return section('owner', 'Owner', refs.length
    ? h('ul', null, refs.map((r) => h('li', null, `${r.kind} `, h('a', { href: objectHash(kindFor(r.apiVersion, r.kind), ctx.ns, r.name) }, r.name), r.controller ? ' (controller)' : '')))
    : h('p', { class: 'muted' }, 'None: nothing owns this object.'));
}

// Children: objects whose ownerReferences point at this object, then at those (Deployment →
// ReplicaSets → Pods). A node's children are the pods scheduled onto it.
function childrenSection(ctx, scope) {
  const { K, ns } = ctx;
  const Pod = byKind.get('Pod');
  if (K === 'Node') {
    const live = liveIndicator();
    const table = new LiveTable({ columns: podColumns(true), label: 'Pods on this node', empty: 'No pods on this node', predicate: (p) => p.spec?.nodeName === ctx.name });
    scope.watch(new ListWatch(collectionPath(Pod, ''), { onBatch: (c, s) => table.apply(c, s), onState: live.set }));
    return section('children-pods', 'Pods on this node', live.el, table.el);
  }
  const chain = CHILDREN[K];
  if (!chain) return section('children', 'Children', h('p', { class: 'muted' }, `A ${K} has no child objects the dashboard follows.`));
  const wrap = section('children', 'Children');
  const levels = [];
  chain.forEach((kindName, i) => {
    const ck = byKind.get(kindName);
    const level = { owners: i === 0 ? new Set([ctx.uid]) : new Set(), child: null };
    const live = liveIndicator();
    level.table = new LiveTable({
      columns: kindName === 'Pod' ? podColumns(false) : columnsFor(ck, false), label: `${ck.title} of ${K} ${ctx.name}`,
      empty: `No ${ck.title}`, predicate: (o) => ownedBy(o, level.owners),
    });
    level.lw = new ListWatch(collectionPath(ck, ns), {
      onState: live.set,
      onBatch: (changes, store) => {
        level.table.apply(changes, store);
        const child = level.child;
        if (child) {
          const next = new Set([...store.values()].filter((o) => ownedBy(o, level.owners)).map((o) => o.metadata.uid));
          if ([...next].sort().join() !== [...child.owners].sort().join()) {
            child.owners = next;
            if (child.lw.listed) child.table.rebuild(child.lw.store);
          }
        }
      },
    });
    if (i > 0) levels[i - 1].child = level;
    levels.push(level);
    wrap.append(h('section', { 'aria-labelledby': `h-children-${ck.resource}`, 'data-section': `children-${ck.resource}` },
      h('h3', { id: `h-children-${ck.resource}` }, ck.title), live.el, level.table.el));
  });
  for (const lv of levels) scope.watch(lv.lw);
  return wrap;
}

// ---- YAML tab ---------------------------------------------------------------------------------

// Secret values stay hidden in the read-only view (the editor has the real text).
function maskSecret(text) {
  let inData = false;
  return text.split('\n').map((l) => {
    if (/^(data|stringData):\s*$/.test(l)) { inData = true; return l; }
    if (inData && /^\S/.test(l)) inData = false;
    const m = inData && /^(\s+[^:\s][^:]*:)\s+\S.*$/.exec(l);
    return m ? `${m[1]} •••••• (hidden; Edit shows it)` : l;
  }).join('\n');
}

function yamlTab(panel, ctx, scope) {
  const { K, name, path } = ctx;
  const url = '/yaml' + path;
  const errors = h('div', { class: 'yaml-errors' });
  const area = h('div');
  const bar = h('div', { class: 'toolbar' });
  panel.append(h('h2', null, 'YAML'), bar, errors, area);
  let text = '';

  const showView = () => {
    bar.replaceChildren(
      h('button', { type: 'button', class: 'primary', onclick: () => showEditor(text) }, 'Edit'),
      h('button', { type: 'button', onclick: load }, 'Reload'));
    area.replaceChildren(h('pre', { class: 'view', tabindex: '0', 'aria-label': `YAML of ${K} ${name}` }, h('code', null, K === 'Secret' ? maskSecret(text) : text)));
  };
  async function load() {
    errors.replaceChildren();
    area.replaceChildren(h('p', null, 'Loading…'));
    try {
      text = await request(url, { accept: 'text/yaml', signal: scope.signal });
      if (!scope.closed) showView();
    } catch (e) {
      if (!scope.closed) area.replaceChildren(h('p', { class: 'msg error', role: 'alert' }, `Cannot read the YAML: ${e.message}`));
    }
  }

  function showEditor(initial) {
    const ta = h('textarea', { id: 'yaml-editor', class: 'code', spellcheck: 'false', autocomplete: 'off', wrap: 'off', autocapitalize: 'off' });
    ta.value = initial;
    const gutter = h('div', { class: 'gutter', 'aria-hidden': 'true' });
    const box = h('div', { class: 'editor' }, gutter, ta);
    let bad = new Set();
    // The textarea grows with its text (no inner vertical scroll), so the gutter's numbers stay
    // beside their lines; the editor box scrolls both together.
    const numbers = () => {
      const n = ta.value.split('\n').length;
      ta.rows = n + 1;
      if (gutter.childElementCount !== n || bad.size) {
        gutter.replaceChildren(...Array.from({ length: n }, (_, i) => h('div', { class: bad.has(i + 1) ? 'bad' : null }, String(i + 1))));
      }
    };
    ta.addEventListener('input', numbers);
    const save = h('button', { type: 'button', class: 'primary' }, 'Save');
    save.addEventListener('click', async () => {
      const submitted = ta.value;
      save.disabled = true;
      errors.replaceChildren();
      try {
        const stored = await request(url, { method: 'PUT', body: submitted, contentType: 'text/yaml', accept: 'text/yaml, application/json' });
        text = typeof stored === 'string' ? stored : JSON.stringify(stored, null, 2);
        notice(`Saved ${K} ${name}.`);
        showView();
      } catch (e) {
        bad = new Set((e.status?.lines || []).map((l) => l.line).filter(Boolean));
        numbers();
        errors.replaceChildren(...yamlErrors(e, submitted, (line) => goToLine(ta, box, line)));
        notice(`Save failed: ${e.message}`, 'error');
      } finally { save.disabled = false; }
    });
    bar.replaceChildren(save,
      h('button', { type: 'button', onclick: () => { errors.replaceChildren(); showView(); } }, 'Cancel'));
    area.replaceChildren(h('label', { for: 'yaml-editor' }, 'YAML'), box);
    numbers();
    ta.setSelectionRange(0, 0);
    ta.focus({ preventScroll: true });
    box.scrollTop = 0;
  }
  load();
}

function goToLine(ta, box, line) {
  const lines = ta.value.split('\n');
  const start = lines.slice(0, line - 1).reduce((a, l) => a + l.length + 1, 0);
  ta.focus({ preventScroll: true });
  ta.setSelectionRange(start, start + (lines[line - 1] || '').length);
  box.scrollTop = Math.max(0, (line - 5) * 18);
}

// The Status message on top, then the submitted text around each error line with the message beside it.
function yamlErrors(e, submitted, go) {
  const st = e.status || {};
  const entries = (st.lines || []).filter((l) => l && l.line);
  const out = [h('p', { class: 'msg error', role: 'alert' }, `${st.code || e.code} ${st.reason || ''}: ${e.message}`)];
  if ((st.code || e.code) === 409) out.push(h('p', null, 'The object changed since you loaded it: Cancel, Reload, and edit the new version.'));
  const loose = (st.lines || []).filter((l) => l && !l.line);
  if (loose.length) out.push(h('ul', null, loose.map((l) => h('li', null, `${l.field ? l.field + ': ' : ''}${l.message}`))));
  if (!entries.length) return out;
  const src = submitted.split('\n');
  const byLine = new Map();
  for (const l of entries) byLine.set(l.line, [...(byLine.get(l.line) || []), l]);
  const show = new Set();
  for (const n of byLine.keys()) for (let i = n - 2; i <= n + 2; i++) if (i >= 1 && i <= src.length) show.add(i);
  const rows = [];
  let last = 0;
  for (const n of [...show].sort((a, b) => a - b)) {
    if (n > last + 1) rows.push(h('div', { class: 'skip', 'aria-hidden': 'true' }, '⋮'));
    const errs = byLine.get(n);
    rows.push(h('div', { class: `line${errs ? ' bad' : ''}`, 'data-line': String(n) },
      h('span', { class: 'ln' }, String(n)), h('code', null, src[n - 1] ?? ''),
      errs ? h('span', { class: 'lmsg' }, errs.map((l) => `⚠ ${l.field ? l.field + ': ' : ''}${l.message}`).join('; '), ' ',
        h('button', { type: 'button', onclick: () => go(n), 'aria-label': `Go to line ${n}` }, 'Go to line')) : null));
    last = n;
  }
  out.push(h('div', { class: 'annotated', role: 'region', 'aria-label': 'Errors beside their lines' }, rows));
  return out;
}

// ---- events tab -----------------------------------------------------------------------------

function eventsTab(panel, ctx, scope) {
  const { K, name, ns, kind } = ctx;
  const live = liveIndicator();
  const mine = (e) => {
    const io = e.involvedObject || e.regarding || {};
    // by uid; or by kind + name where the reporter put no uid or the name there (node events)
    return io.uid === ctx.uid || (io.kind === K && io.name === name && (io.namespace || '') === (kind.namespaced ? ns : (io.namespace || '')) && (!io.uid || io.uid === name));
  };
  const table = new LiveTable({
    label: `Events of ${K} ${name}`, empty: 'No events', sortKey: newestFirstKey, predicate: mine, rowHeader: -1,
    columns: [
      { title: 'Type', id: 'type', cell: (e) => h('span', { class: e.type === 'Warning' ? 's-err' : '' }, e.type || '') },
      { title: 'Reason', id: 'reason', cell: (e) => e.reason || '' },
      { title: 'Message', id: 'message', cls: 'wrap', cell: (e) => e.message || e.note || '' },
      { title: 'Count', id: 'count', cell: (e) => String(e.count || e.series?.count || 1) },
      { title: 'From', id: 'from', cell: (e) => e.source?.component || e.reportingComponent || '' },
      { title: 'Last seen', id: 'age', cell: (e) => ageEl(eventTime(e)) },
    ],
  });
  scope.watch(new ListWatch(collectionPath(byKind.get('Event'), kind.namespaced ? ns : ''), {
    onBatch: (c, s) => table.apply(c, s),
    onState: (s, msg) => { live.set(s, msg); if (s === 'error') table.showError(`Cannot list events: ${msg}`); },
  }));
  panel.append(h('h2', null, 'Events'), live.el, table.el);
}

// ---- logs tab ---------------------------------------------------------------------------------

function containerPicker(ctx, id, onChange) {
  const names = [...(ctx.obj.spec?.containers || []), ...(ctx.obj.spec?.initContainers || [])].map((c) => c.name);
  const sel = h('select', { id }, names.map((n) => h('option', { value: n }, n)));
  sel.addEventListener('change', () => onChange(sel.value));
  return { sel, label: h('label', { for: id }, 'Container'), value: () => sel.value };
}

function logsTab(panel, ctx, scope) {
  const out = h('pre', { class: 'logs', role: 'log', 'aria-label': 'Log output', tabindex: '0' });
  const follow = h('input', { type: 'checkbox', id: 'logs-follow', checked: true });
  const streamState = h('span', { class: 'live' });
  let run = null;
  const picker = containerPicker(ctx, 'logs-container', () => start());
  follow.addEventListener('change', () => start());
  panel.append(h('h2', null, 'Logs'),
    h('div', { class: 'toolbar' }, picker.label, picker.sel, h('label', { for: 'logs-follow' }, follow, ' Follow'),
      h('button', { type: 'button', onclick: () => start() }, 'Reload logs'), streamState),
    out);

  let pending = '', scheduled = false, size = 0, retries = 0;
  const sys = (t) => { flush(); out.append(h('span', { class: 'sys' }, t + '\n')); out.scrollTop = out.scrollHeight; };
  function flush() {
    scheduled = false;
    if (!pending) return;
    const atBottom = out.scrollTop + out.clientHeight >= out.scrollHeight - 40;
    out.append(pending);
    size += pending.length;
    pending = '';
    while (size > 400000 && out.firstChild) { size -= out.firstChild.textContent.length; out.firstChild.remove(); }
    if (atBottom) out.scrollTop = out.scrollHeight;
  }
  function start() {
    run?.abort();
    const ac = run = new AbortController();
    scope.add(() => ac.abort());
    out.replaceChildren();
    pending = ''; size = 0;
    const q = query({ container: picker.value(), follow: follow.checked ? 'true' : '', tailLines: '500' });
    streamState.className = 'live';
    streamState.textContent = 'loading…';
    (async () => {
      try {
        const res = await k8s(`/api/v1/namespaces/${encodeURIComponent(ctx.ns)}/pods/${encodeURIComponent(ctx.name)}/log${q}`, { raw: true, signal: ac.signal, accept: 'text/plain, */*' });
        streamState.className = 'live ok';
        streamState.textContent = follow.checked ? 'following' : 'loaded';
        const reader = res.body.getReader();
        const dec = new TextDecoder();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          retries = 0;
          pending += dec.decode(value, { stream: true });
          if (!scheduled) { scheduled = true; requestAnimationFrame(flush); setTimeout(() => scheduled && flush(), 250); }
        }
        if (!ac.signal.aborted) { flush(); sys('— end of the log stream —'); streamState.className = 'live'; streamState.textContent = 'ended'; }
      } catch (e) {
        if (ac.signal.aborted) return;
        flush();
        // A followed stream that breaks (the browser drops open requests when the machine's
        // network changes, as it does when pods start on it) is followed again.
        if (follow.checked && !(e instanceof ApiError) && retries < 5) {
          retries += 1;
          sys(`The log stream broke (${e.message}); following again…`);
          streamState.className = 'live';
          streamState.textContent = 'reconnecting';
          setTimeout(() => { if (!ac.signal.aborted) start(); }, 1000 * retries);
          return;
        }
        sys(`Cannot read the logs: ${e.message}`);
        streamState.className = 'live bad';
        streamState.textContent = 'error';
      }
    })();
  }
  start();
}

// ---- terminal tab -------------------------------------------------------------------------------

function terminalTab(panel, ctx, scope) {
  const out = h('pre', { class: 'term', role: 'log', 'aria-label': 'Terminal output', tabindex: '0' });
  const input = h('input', { id: 'term-input', type: 'text', autocomplete: 'off', spellcheck: 'false', autocapitalize: 'off' });
  const connectBtn = h('button', { type: 'button' }, 'Connect');
  const closeStdin = h('button', { type: 'button', title: 'Send end-of-input (like Ctrl-D)' }, 'Close input');
  let ws = null;
  const picker = containerPicker(ctx, 'term-container', () => connect());
  const write = (text, cls) => {
    const atBottom = out.scrollTop + out.clientHeight >= out.scrollHeight - 40;
    out.append(cls ? h('span', { class: cls }, text) : text);
    if (out.childNodes.length > 5000) out.firstChild.remove();
    if (atBottom || cls === 'in') out.scrollTop = out.scrollHeight;
  };
  const history = [];
  let hpos = 0;

  function disconnect() { if (ws) { const w = ws; ws = null; w.close(); } }
  function connect() {
    disconnect();
    const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
    const q = query({ container: picker.value(), command: 'sh', stdin: 'true', stdout: 'true', stderr: 'true' });
    const sock = new WebSocket(`${proto}//${location.host}/k8s/api/v1/namespaces/${encodeURIComponent(ctx.ns)}/pods/${encodeURIComponent(ctx.name)}/exec${q}`,
      ['v5.channel.k8s.io', 'v4.channel.k8s.io']);
    ws = sock;
    sock.binaryType = 'arraybuffer';
    const decs = [null, new TextDecoder(), new TextDecoder(), new TextDecoder()];
    write(`Connecting to ${picker.value()}…\n`, 'sys');
    connectBtn.textContent = 'Disconnect';
    sock.onopen = () => { write(`Connected: sh in container ${picker.value()}. Type a command and press Enter.\n`, 'sys'); input.focus(); };
    sock.onmessage = (ev) => {
      if (typeof ev.data === 'string') { write(ev.data); return; }
      const data = new Uint8Array(ev.data);
      if (data.length < 2) return;
      const ch = data[0];
      const text = decs[ch]?.decode(data.subarray(1), { stream: ch !== 3 }) ?? '';
      if (ch === 1) write(text);
      else if (ch === 2) write(text, 'err');
      else if (ch === 3) {
        let st = null;
        try { st = JSON.parse(text); } catch { /* plain text */ }
        if (st?.status === 'Success') write('The shell exited.\n', 'sys');
        else write(`The shell ended: ${st?.message || text}\n`, 'sys');
      }
    };
    sock.onerror = () => { if (ws === sock) write('The connection failed.\n', 'sys'); };
    sock.onclose = (ev) => {
      if (ws === sock) ws = null;
      write(`Disconnected${ev.reason ? ': ' + ev.reason : ''}.\n`, 'sys');
      if (!ws) connectBtn.textContent = 'Connect';
    };
  }
  function send(line) {
    if (!ws || ws.readyState !== WebSocket.OPEN) { write('Not connected. Press Connect first.\n', 'sys'); return; }
    const bytes = new TextEncoder().encode(line + '\n');
    const msg = new Uint8Array(bytes.length + 1);
    msg[0] = 0;
    msg.set(bytes, 1);
    ws.send(msg);
    write(`$ ${line}\n`, 'in');
  }
  const form = h('form', { class: 'term-input' },
    h('label', { for: 'term-input' }, 'Command'), input, h('button', { type: 'submit' }, 'Send'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const line = input.value;
    if (line.trim()) { history.push(line); hpos = history.length; }
    input.value = '';
    send(line);
  });
  input.addEventListener('keydown', (ev) => {
    if (ev.key === 'ArrowUp' && hpos > 0) { input.value = history[--hpos]; ev.preventDefault(); }
    if (ev.key === 'ArrowDown' && hpos < history.length) { input.value = history[++hpos] || ''; ev.preventDefault(); }
  });
  connectBtn.addEventListener('click', () => (ws ? disconnect() : connect()));
  closeStdin.addEventListener('click', () => {
    if (ws?.readyState === WebSocket.OPEN && ws.protocol === 'v5.channel.k8s.io') { ws.send(new Uint8Array([255, 0])); write('(input closed)\n', 'sys'); }
    else write('Closing input needs the v5 protocol; use `exit` instead.\n', 'sys');
  });
  scope.add(disconnect);
  panel.append(h('h2', null, 'Terminal'),
    h('p', { class: 'muted' }, 'A line-mode shell (sh, no TTY): each line you send runs when you press Enter; there is no prompt.'),
    h('div', { class: 'toolbar' }, picker.label, picker.sel, connectBtn, closeStdin), out, form);
  connect();
}

// ---- plots ----------------------------------------------------------------------------------

const escRe = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, (c) => `[${c}]`);
const podNameRe = (deploy) => `${escRe(deploy)}-[a-z0-9]+-[a-z0-9]+`;

// Without Prometheus: sample the metrics API every 15 s while the page is open.
function startSampler(ctx) {
  const { K, ns, name } = ctx;
  const s = { samples: [], since: Date.now(), listeners: new Set(), error: '', timer: 0 };
  const re = new RegExp(`^${podNameRe(name)}$`);
  const take = async () => {
    try {
      const series = {};
      let cpu = 0, mem = 0;
      if (K === 'Node') {
        const m = await k8s(`/apis/metrics.k8s.io/v1beta1/nodes/${encodeURIComponent(name)}`);
        series[name] = { cpu: quantity(m.usage?.cpu), mem: quantity(m.usage?.memory) };
      } else if (K === 'Pod') {
        const m = await k8s(`/apis/metrics.k8s.io/v1beta1/namespaces/${encodeURIComponent(ns)}/pods/${encodeURIComponent(name)}`);
        for (const c of m.containers || []) series[c.name] = { cpu: quantity(c.usage?.cpu), mem: quantity(c.usage?.memory) };
      } else {
        const m = await k8s(`/apis/metrics.k8s.io/v1beta1/namespaces/${encodeURIComponent(ns)}/pods`);
        for (const p of m.items || []) {
          if (!re.test(p.metadata.name)) continue;
          const u = { cpu: 0, mem: 0 };
          for (const c of p.containers || []) { u.cpu += quantity(c.usage?.cpu) || 0; u.mem += quantity(c.usage?.memory) || 0; }
          series[p.metadata.name] = u;
          cpu += u.cpu; mem += u.mem;
        }
        series['total (all pods)'] = { cpu, mem, total: true };
      }
      s.samples.push({ t: Date.now(), series });
      if (s.samples.length > 240) s.samples.shift();
      s.error = '';
    } catch (e) {
      s.error = e.message;
    }
    for (const fn of s.listeners) fn();
  };
  take();
  s.timer = setInterval(take, 15000);
  s.stop = () => clearInterval(s.timer);
  ctx.scope.add(s.stop);
  return s;
}

async function promRange(q, start, end, signal) {
  const res = await request(`/prometheus/api/v1/query_range${query({ query: q, start: String(start), end: String(end), step: '15' })}`, { signal });
  if (res.status !== 'success') throw new Error(res.error || 'query failed');
  return res.data.result;
}

function metricsTab(panel, ctx, scope, sampler) {
  const { K, ns, name } = ctx;
  const charts = h('div', { class: 'charts' });
  const status = h('p', { class: 'muted' });
  panel.append(h('h2', null, 'CPU and memory'), status, charts);

  if (!state.session?.prometheus) {
    const render = () => {
      const names = [...new Set(sampler.samples.flatMap((x) => Object.keys(x.series)))];
      // the total first, so it gets the first color
      names.sort((a, b) => (a.startsWith('total') ? -1 : b.startsWith('total') ? 1 : a < b ? -1 : 1));
      const mk = (field, scale) => names.map((n) => ({ name: n, total: n.startsWith('total'),
        points: sampler.samples.filter((x) => x.series[n]).map((x) => [x.t, x.series[n][field] * scale]) }));
      const note = `Collected since the page opened (${new Date(sampler.since).toLocaleTimeString()}), every 15 s from the metrics API.`;
      status.textContent = sampler.error ? `The metrics API answered: ${sampler.error}` : `${sampler.samples.length} samples collected since the page opened.`;
      charts.replaceChildren(
        lineChart({ title: `CPU of ${K} ${name}`, unit: 'cores', yLabel: 'CPU (cores)', series: mk('cpu', 1), from: sampler.since, to: Date.now(), note, gap: 40000 }),
        lineChart({ title: `Memory of ${K} ${name}`, unit: 'MiB', yLabel: 'Memory (MiB)', series: mk('mem', 1 / 1048576), from: sampler.since, to: Date.now(), note, gap: 40000 }));
    };
    sampler.listeners.add(render);
    scope.add(() => sampler.listeners.delete(render));
    render();
    return;
  }

  const sel = K === 'Node' ? `node="${name}"` : K === 'Pod' ? `namespace="${ns}",pod="${name}",container!=""` : `namespace="${ns}",pod=~"${podNameRe(name).replace(/\\/g, '\\\\')}",container!=""`;
  const by = K === 'Pod' ? 'container' : 'pod';
  const queries = K === 'Node'
    // The kubelet exports no machine-wide series to Prometheus: a node's plot is its containers' use.
    ? { cpu: `sum(rate(container_cpu_usage_seconds_total{${sel},container!=""}[2m]))`, mem: `sum(container_memory_working_set_bytes{${sel},container!=""}) / 1048576` }
    : { cpu: `sum by (${by}) (rate(container_cpu_usage_seconds_total{${sel}}[2m]))`, mem: `sum by (${by}) (container_memory_working_set_bytes{${sel}}) / 1048576` };
  const toSeries = (result) => {
    let series = result.map((r) => ({ name: K === 'Node' ? `containers on ${name}` : r.metric[by] || '(all)', points: r.values.map(([t, v]) => [t * 1000, parseFloat(v)]) }));
    if (K === 'Deployment') {
      const sum = new Map();
      for (const s of series) for (const [t, v] of s.points) sum.set(t, (sum.get(t) || 0) + v);
      const total = { name: 'total (all pods)', total: true, points: [...sum].sort((a, b) => a[0] - b[0]) };
      series = [total, ...series.sort((a, b) => (a.name < b.name ? -1 : 1)).slice(0, 8)];
    }
    return series;
  };
  const load = async () => {
    const end = Math.floor(Date.now() / 1000), start = end - 3600;
    try {
      const [cpu, mem] = await Promise.all([promRange(queries.cpu, start, end, scope.signal), promRange(queries.mem, start, end, scope.signal)]);
      if (scope.closed) return;
      const note = 'The last hour, from Prometheus.';
      status.textContent = `Updated ${new Date().toLocaleTimeString()}.`;
      charts.replaceChildren(
        lineChart({ title: `CPU of ${K} ${name}`, unit: 'cores', yLabel: 'CPU (cores)', series: toSeries(cpu), from: start * 1000, to: end * 1000, note }),
        lineChart({ title: `Memory of ${K} ${name}`, unit: 'MiB', yLabel: 'Memory (MiB)', series: toSeries(mem), from: start * 1000, to: end * 1000, note }));
    } catch (e) {
      if (!scope.closed) status.textContent = `Prometheus answered: ${e.message}`;
    }
  };
  load();
  scope.interval(load, 30000);
}
