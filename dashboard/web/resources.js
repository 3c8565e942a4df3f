// The kinds the dashboard knows: where they live in the API and how their lists look.
import { h, ageEl, cores, bytes } from './ui.js';
import { quantity } from './api.js';

const K = (kind, group, version, resource, namespaced, title) => ({ kind, group, version, resource, namespaced, title });
export const KINDS = [
  K('Namespace', '', 'v1', 'namespaces', false, 'Namespaces'),
  K('Node', '', 'v1', 'nodes', false, 'Nodes'),
  K('Deployment', 'apps', 'v1', 'deployments', true, 'Deployments'),
  K('StatefulSet', 'apps', 'v1', 'statefulsets', true, 'StatefulSets'),
  K('DaemonSet', 'apps', 'v1', 'daemonsets', true, 'DaemonSets'),
  K('ReplicaSet', 'apps', 'v1', 'replicasets', true, 'ReplicaSets'),
  K('Job', 'batch', 'v1', 'jobs', true, 'Jobs'),
  K('CronJob', 'batch', 'v1', 'cronjobs', true, 'CronJobs'),
  K('Pod', '', 'v1', 'pods', true, 'Pods'),
  K('Service', '', 'v1', 'services', true, 'Services'),
  K('Ingress', 'networking.k8s.io', 'v1', 'ingresses', true, 'Ingresses'),
  K('Endpoints', '', 'v1', 'endpoints', true, 'Endpoints'),
  K('EndpointSlice', 'discovery.k8s.io', 'v1', 'endpointslices', true, 'EndpointSlices'),
  K('ConfigMap', '', 'v1', 'configmaps', true, 'ConfigMaps'),
  K('Secret', '', 'v1', 'secrets', true, 'Secrets'),
  K('PersistentVolume', '', 'v1', 'persistentvolumes', false, 'PersistentVolumes'),
  K('PersistentVolumeClaim', '', 'v1', 'persistentvolumeclaims', true, 'PersistentVolumeClaims'),
  K('HorizontalPodAutoscaler', 'autoscaling', 'v2', 'horizontalpodautoscalers', true, 'HorizontalPodAutoscalers'),
  K('Event', '', 'v1', 'events', true, 'Events'),
  K('ServiceAccount', '', 'v1', 'serviceaccounts', true, 'ServiceAccounts'),
  K('ControllerRevision', 'apps', 'v1', 'controllerrevisions', true, 'ControllerRevisions'),
];
export const byResource = new Map(KINDS.map((k) => [k.resource, k]));
export const byKind = new Map(KINDS.map((k) => [k.kind, k]));

// The kind of an ownerReference / involvedObject (apiVersion + kind), known or guessed.
export function kindFor(apiVersion, kind) {
  const known = byKind.get(kind);
  const [g, v] = (apiVersion || 'v1').includes('/') ? apiVersion.split('/') : ['', apiVersion || 'v1'];
  if (known && known.group === g) return { ...known, version: v || known.version };
  const lower = kind.toLowerCase();
  const resource = lower.endsWith('s') ? lower + 'es' : lower.endsWith('y') ? lower.slice(0, -1) + 'ies' : lower + 's';
  return K(kind, g, v, resource, true, kind);
}

export const apiPrefix = (k) => (k.group ? `/apis/${k.group}/${k.version}` : `/api/${k.version}`);
const enc = encodeURIComponent;
export function collectionPath(k, ns) {
  return apiPrefix(k) + (k.namespaced && ns ? `/namespaces/${enc(ns)}` : '') + `/${k.resource}`;
}
export function objectPath(k, ns, name) {
  return apiPrefix(k) + (k.namespaced ? `/namespaces/${enc(ns)}` : '') + `/${k.resource}/${enc(name)}`;
}
export function objectHash(k, ns, name) {
  return `#/object/${k.group || 'core'}/${k.version}/${k.resource}/${k.namespaced && ns ? enc(ns) : '_'}/${enc(name)}`;
}
export function objLink(k, obj, text) {
  const name = obj.metadata?.name ?? obj.name;
  const ns = obj.metadata?.namespace ?? obj.namespace;
  return h('a', { href: objectHash(k, ns, name) }, text ?? name);
}

// ---- pods -------------------------------------------------------------------------------

export const isModulePod = (p) => p.metadata?.labels?.['virtual-kubelet.koupleless.io/component'] === 'module';
export function isVirtualNode(n) {
  const l = n.metadata?.labels || {};
  return l['virtual-kubelet.koupleless.io/component'] === 'vnode' || l.type === 'virtual-kubelet';
}

// The STATUS column as kubectl prints it.
export function podStatus(pod) {
  const st = pod.status || {};
  let reason = st.reason || st.phase || 'Pending';
  const specInit = pod.spec?.initContainers || [];
  let initializing = false;
  (st.initContainerStatuses || []).forEach((c, i) => {
    if (initializing) return;
    const t = c.state?.terminated, w = c.state?.waiting;
    if (t && t.exitCode === 0) return;
    initializing = true;
    if (t) reason = t.reason ? `Init:${t.reason}` : t.signal ? `Init:Signal:${t.signal}` : `Init:ExitCode:${t.exitCode}`;
    else if (w?.reason && w.reason !== 'PodInitializing') reason = `Init:${w.reason}`;
    else reason = `Init:${i}/${specInit.length}`;
  });
  if (!initializing) {
    let hasRunning = false;
    const cs = st.containerStatuses || [];
    for (let i = cs.length - 1; i >= 0; i--) {
      const c = cs[i], w = c.state?.waiting, t = c.state?.terminated;
      if (w?.reason) reason = w.reason;
      else if (t?.reason) reason = t.reason;
      else if (t) reason = t.signal ? `Signal:${t.signal}` : `ExitCode:${t.exitCode}`;
      else if (c.ready && c.state?.running) hasRunning = true;
    }
    if (reason === 'Completed' && hasRunning) {
      const ready = (st.conditions || []).some((c) => c.type === 'Ready' && c.status === 'True');
      reason = ready ? 'Running' : 'NotReady';
    }
  }
  if (pod.metadata?.deletionTimestamp) reason = st.reason === 'NodeLost' ? 'Unknown' : 'Terminating';
  return reason;
}
export function statusClass(s) {
  if (/^(Running|Succeeded|Completed|Ready|Bound|Active|Available|True|Complete)$/.test(s)) return 's-ok';
  if (/^(Pending|ContainerCreating|PodInitializing|Terminating|Init:\d|NotReady|Released|Progressing|Suspended)/.test(s)) return 's-warn';
  return 's-err';
}
export const statusEl = (s) => h('span', { class: statusClass(s) }, s);
export function podReady(pod) {
  const cs = pod.status?.containerStatuses || [];
  return `${cs.filter((c) => c.ready).length}/${(pod.spec?.containers || []).length}`;
}
export function podRestarts(pod) {
  const cs = pod.status?.containerStatuses || [];
  const n = cs.reduce((a, c) => a + (c.restartCount || 0), 0);
  const last = cs.map((c) => c.lastState?.terminated?.finishedAt).filter(Boolean).sort().pop();
  return last && n ? [String(n), ' (', ageEl(last), ' ago)'] : String(n);
}

// ---- nodes ------------------------------------------------------------------------------

export function nodeStatus(n) {
  const ready = (n.status?.conditions || []).find((c) => c.type === 'Ready');
  let s = !ready ? 'Unknown' : ready.status === 'True' ? 'Ready' : ready.status === 'False' ? 'NotReady' : 'Unknown';
  if (n.spec?.unschedulable) s += ',SchedulingDisabled';
  return s;
}
export function nodeRoles(n) {
  const roles = Object.keys(n.metadata?.labels || {})
    .filter((l) => l.startsWith('node-role.kubernetes.io/')).map((l) => l.slice(24)).filter(Boolean);
  if (n.metadata?.labels?.['kubernetes.io/role']) roles.push(n.metadata.labels['kubernetes.io/role']);
  return roles.length ? roles.join(',') : '<none>';
}
export const nodeIP = (n) => (n.status?.addresses || []).find((a) => a.type === 'InternalIP')?.address || '';
export const virtualBadge = (n) => (isVirtualNode(n) ? h('span', { class: 'badge virtual' }, 'virtual node (Koupleless base)') : '');

// ---- columns ------------------------------------------------------------------------------

const name = (k) => ({ title: 'Name', id: 'name', cls: 'wrap', cell: (o) => objLink(k, o) });
const nsCol = { title: 'Namespace', id: 'namespace', cell: (o) => o.metadata?.namespace || '' };
const ageCol = { title: 'Age', id: 'age', cell: (o) => ageEl(o.metadata?.creationTimestamp) };
const col = (title, cell, extra) => ({ title, id: title.toLowerCase().replace(/[^a-z0-9]+/g, '-'), cell, ...extra });
const num = (v) => String(v ?? 0);
const join = (a) => (a && a.length ? a.join(', ') : '<none>');

function progress(done, total, label) {
  const t = total || 0, d = Math.min(done || 0, t);
  return [h('progress', { max: String(Math.max(t, 1)), value: String(t ? d : 0), 'aria-label': label }), ` ${d}/${t}`];
}
function svcPorts(s) {
  return join((s.spec?.ports || []).map((p) => `${p.port}${p.nodePort ? ':' + p.nodePort : ''}/${p.protocol || 'TCP'}${p.name ? ' (' + p.name + ')' : ''}`));
}
function hpaTargets(a) {
  const cur = a.status?.currentMetrics || [];
  return join((a.spec?.metrics || []).map((m, i) => {
    const r = m.resource || m.containerResource;
    const c = cur[i]?.resource || cur[i]?.containerResource;
    if (r) {
      const t = r.target || {};
      const tgt = t.averageUtilization !== undefined ? `${t.averageUtilization}%` : t.averageValue || t.value || '?';
      const now = t.averageUtilization !== undefined
        ? (c?.current?.averageUtilization !== undefined ? `${c.current.averageUtilization}%` : '<unknown>')
        : (c?.current?.averageValue || c?.current?.value || '<unknown>');
      return `${r.name}: ${now}/${tgt}`;
    }
    return `${m.type}`;
  }));
}
function endpointsText(e) {
  const out = [];
  for (const s of e.subsets || []) for (const a of s.addresses || []) for (const p of s.ports || [{}]) out.push(p.port ? `${a.ip}:${p.port}` : a.ip);
  if (out.length > 5) return `${out.slice(0, 5).join(', ')} + ${out.length - 5} more`;
  return join(out);
}
function accessModes(m) {
  const short = { ReadWriteOnce: 'RWO', ReadOnlyMany: 'ROX', ReadWriteMany: 'RWX', ReadWriteOncePod: 'RWOP' };
  return (m || []).map((x) => short[x] || x).join(',');
}

export const podColumns = (allNs) => [
  { title: 'Name', id: 'name', cls: 'wrap', cell: (p) => [objLink(byKind.get('Pod'), p), isModulePod(p) ? h('span', { class: 'badge module', title: 'Koupleless module pod' }, 'module') : ''] },
  allNs && nsCol,
  col('Ready', podReady),
  col('Status', (p) => statusEl(podStatus(p))),
  col('Restarts', podRestarts),
  ageCol,
  col('Node', (p) => (p.spec?.nodeName ? h('a', { href: objectHash(byKind.get('Node'), '', p.spec.nodeName) }, p.spec.nodeName) : '')),
  col('IP', (p) => p.status?.podIP || ''),
].filter(Boolean);

// Columns per kind (allNs: the list spans namespaces, add a Namespace column).
export function columnsFor(k, allNs, extra = {}) {
  const ns = allNs && k.namespaced ? [nsCol] : [];
  const base = (...cols) => [name(k), ...ns, ...cols];
  switch (k.kind) {
    case 'Pod': return podColumns(allNs);
    case 'Namespace': return base(col('Status', (o) => statusEl(o.status?.phase || 'Active')), ageCol);
    case 'Node': return base(
      col('Status', (n) => statusEl(nodeStatus(n))), col('Roles', nodeRoles),
      col('Virtual', virtualBadge),
      col('CPU', (n) => n.status?.capacity?.cpu || ''),
      col('Memory', (n) => bytes(quantity(n.status?.capacity?.memory))),
      col('CPU use', (n) => usageText(extra.usage?.get(n.metadata.name)?.cpu, quantity(n.status?.allocatable?.cpu || n.status?.capacity?.cpu), cores)),
      col('Memory use', (n) => usageText(extra.usage?.get(n.metadata.name)?.memory, quantity(n.status?.allocatable?.memory || n.status?.capacity?.memory), bytes)),
      ageCol, col('Version', (n) => n.status?.nodeInfo?.kubeletVersion || ''), col('Internal IP', nodeIP));
    case 'Deployment': return base(
      col('Ready', (d) => `${d.status?.readyReplicas || 0}/${d.spec?.replicas ?? 1}`),
      col('Up-to-date', (d) => num(d.status?.updatedReplicas)),
      col('Available', (d) => num(d.status?.availableReplicas)),
      col('Rollout', (d) => progress(d.status?.updatedReplicas, d.spec?.replicas ?? 1, `Rollout of ${d.metadata.name}`)),
      ageCol);
    case 'StatefulSet': return base(
      col('Ready', (d) => `${d.status?.readyReplicas || 0}/${d.spec?.replicas ?? 1}`),
      col('Up-to-date', (d) => num(d.status?.updatedReplicas)), ageCol);
    case 'DaemonSet': return base(
      col('Desired', (d) => num(d.status?.desiredNumberScheduled)), col('Current', (d) => num(d.status?.currentNumberScheduled)),
      col('Ready', (d) => num(d.status?.numberReady)), col('Up-to-date', (d) => num(d.status?.updatedNumberScheduled)),
      col('Available', (d) => num(d.status?.numberAvailable)), ageCol);
    case 'ReplicaSet': return base(
      col('Desired', (d) => num(d.spec?.replicas ?? 1)), col('Current', (d) => num(d.status?.replicas)),
      col('Ready', (d) => num(d.status?.readyReplicas)), ageCol);
    case 'Job': return base(
      col('Status', (j) => statusEl(jobStatus(j))),
      col('Completions', (j) => `${j.status?.succeeded || 0}/${j.spec?.completions ?? 1}`),
      col('Duration', (j) => (j.status?.startTime ? duration(j.status.startTime, j.status.completionTime) : '')), ageCol);
    case 'CronJob': return base(
      col('Schedule', (c) => c.spec?.schedule || ''), col('Suspend', (c) => String(!!c.spec?.suspend)),
      col('Active', (c) => num(c.status?.active?.length)),
      col('Last schedule', (c) => (c.status?.lastScheduleTime ? ageEl(c.status.lastScheduleTime) : '<none>')), ageCol);
    case 'Service': return base(
      col('Type', (s) => s.spec?.type || 'ClusterIP'), col('Cluster IP', (s) => s.spec?.clusterIP || ''),
      col('External IP', (s) => join([...(s.status?.loadBalancer?.ingress || []).map((i) => i.ip || i.hostname), ...(s.spec?.externalIPs || [])])),
      col('Ports', svcPorts, { cls: 'wrap' }), ageCol);
    case 'Ingress': return base(
      col('Class', (i) => i.spec?.ingressClassName || '<none>'),
      col('Hosts', (i) => join((i.spec?.rules || []).map((r) => r.host || '*'))),
      col('Paths', (i) => join((i.spec?.rules || []).flatMap((r) => (r.http?.paths || []).map((p) =>
        `${r.host || '*'}${p.path || '/'} → ${p.backend?.service?.name || '?'}:${p.backend?.service?.port?.number ?? p.backend?.service?.port?.name ?? ''}`))), { cls: 'wrap' }),
      col('Address', (i) => join((i.status?.loadBalancer?.ingress || []).map((x) => x.ip || x.hostname))), ageCol);
    case 'Endpoints': return base(col('Endpoints', endpointsText, { cls: 'wrap' }), ageCol);
    case 'EndpointSlice': return base(
      col('Address type', (e) => e.addressType || ''),
      col('Ports', (e) => join((e.ports || []).map((p) => `${p.port}/${p.protocol || 'TCP'}`))),
      col('Endpoints', (e) => {
        const a = (e.endpoints || []).flatMap((x) => x.addresses || []);
        return a.length > 5 ? `${a.slice(0, 5).join(', ')} + ${a.length - 5} more` : join(a);
      }, { cls: 'wrap' }), ageCol);
    case 'ConfigMap': return base(col('Data', (c) => num(Object.keys(c.data || {}).length + Object.keys(c.binaryData || {}).length)), ageCol);
    case 'Secret': return base(col('Type', (s) => s.type || 'Opaque'), col('Data', (s) => num(Object.keys(s.data || {}).length)), ageCol);
    case 'PersistentVolume': return base(
      col('Capacity', (p) => p.spec?.capacity?.storage || ''), col('Access modes', (p) => accessModes(p.spec?.accessModes)),
      col('Reclaim policy', (p) => p.spec?.persistentVolumeReclaimPolicy || ''), col('Status', (p) => statusEl(p.status?.phase || '')),
      col('Claim', (p) => (p.spec?.claimRef ? `${p.spec.claimRef.namespace}/${p.spec.claimRef.name}` : '')),
      col('Storage class', (p) => p.spec?.storageClassName || ''), ageCol);
    case 'PersistentVolumeClaim': return base(
      col('Status', (p) => statusEl(p.status?.phase || 'Pending')), col('Volume', (p) => p.spec?.volumeName || ''),
      col('Capacity', (p) => p.status?.capacity?.storage || ''), col('Access modes', (p) => accessModes(p.status?.accessModes || p.spec?.accessModes)),
      col('Storage class', (p) => p.spec?.storageClassName || ''), ageCol);
    case 'HorizontalPodAutoscaler': return base(
      col('Reference', (a) => `${a.spec?.scaleTargetRef?.kind}/${a.spec?.scaleTargetRef?.name}`),
      col('Targets (current/target)', hpaTargets, { cls: 'wrap' }),
      col('Min pods', (a) => num(a.spec?.minReplicas ?? 1)), col('Max pods', (a) => num(a.spec?.maxReplicas)),
      col('Replicas', (a) => `${a.status?.currentReplicas ?? 0} (desired ${a.status?.desiredReplicas ?? 0})`), ageCol);
    default: return base(ageCol);
  }
}

function usageText(used, total, fmt) {
  if (!isFinite(used)) return '—';
  return isFinite(total) && total > 0 ? `${fmt(used)} (${Math.round((100 * used) / total)}%)` : fmt(used);
}
export function jobStatus(j) {
  const c = j.status?.conditions || [];
  if (c.some((x) => x.type === 'Complete' && x.status === 'True')) return 'Complete';
  if (c.some((x) => x.type === 'Failed' && x.status === 'True')) return 'Failed';
  if (j.spec?.suspend) return 'Suspended';
  return 'Running';
}
function duration(from, to) {
  const s = Math.round(((to ? Date.parse(to) : Date.now()) - Date.parse(from)) / 1000);
  return s < 120 ? `${s}s` : s < 7200 ? `${Math.round(s / 60)}m` : `${Math.round(s / 3600)}h`;
}

export function eventTime(e) {
  return e.lastTimestamp || e.series?.lastObservedTime || e.eventTime || e.firstTimestamp || e.metadata?.creationTimestamp || '';
}
// Newest first in a table sorted ascending by key.
export const newestFirstKey = (e) => String(9e15 - (Date.parse(eventTime(e)) || 0)).padStart(17, '0') + (e.metadata?.name || '');
export function involvedLink(e) {
  const io = e.involvedObject || e.regarding || {};
  if (!io.kind) return '';
  const k = kindFor(io.apiVersion, io.kind);
  return h('a', { href: objectHash(k, io.namespace, io.name) }, `${io.kind}/${io.name}`);
}
