// The dashboard in a real browser: Debian's Chromium driven by playwright-core.
//
//   DASHBOARD_URL=https://127.0.0.1:PORT/ KUBECONFIG_FILE=admin.kubeconfig VIEWER_TOKEN=… \
//   EXPIRED_TOKEN=… NAMESPACE=dash-e2e SCREENSHOT_DIR=/tmp/shots [PODS_1000=ns-with-1000-pods] \
//   node dashboard.mjs
//
// NAMESPACE holds (or gets, created here through the dashboard with the admin's session) a
// Deployment `web` of busybox pods printing `tick N` every second, and a ConfigMap `doomed`.
// Each step prints one JSON line {"step":…,"ok":true,"ms":N}; the first failure saves
// failure.png, prints {"step":…,"ok":false,"error":…} and exits 1.

import { chromium } from 'playwright-core';
import fs from 'node:fs';
import path from 'node:path';

const env = process.env;
const BASE = (env.DASHBOARD_URL || 'https://127.0.0.1:8443/').replace(/\/?$/, '/');
const NS = env.NAMESPACE || 'default';
const SHOTS = env.SCREENSHOT_DIR || '.';
const TIMEOUT = 60000;
fs.mkdirSync(SHOTS, { recursive: true });

const browser = await chromium.launch({
  executablePath: env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
const context = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1280, height: 900 } });
const page = await context.newPage();
page.setDefaultTimeout(TIMEOUT);
const consoleErrors = [];
page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
page.on('pageerror', (e) => consoleErrors.push(`pageerror: ${e.message}`));

const shot = (name) => page.screenshot({ path: path.join(SHOTS, name), fullPage: true });

async function step(name, fn) {
  const t0 = Date.now();
  try {
    const extra = (await fn()) || {};
    console.log(JSON.stringify({ step: name, ok: true, ms: Date.now() - t0, ...extra }));
  } catch (e) {
    try { await shot('failure.png'); } catch { /* the page may be gone */ }
    console.log(JSON.stringify({ step: name, ok: false, ms: Date.now() - t0, error: String(e.message || e).split('\n')[0] }));
    console.error(`FAILED ${name}: ${e.stack || e}`);
    if (consoleErrors.length) console.error(`browser console errors:\n  ${consoleErrors.slice(-10).join('\n  ')}`);
    await browser.close().catch(() => {});
    process.exit(1);
  }
}

// Poll a predicate in the page until it holds; fail with `what` after the timeout.
async function until(what, fn, arg, timeout = TIMEOUT) {
  try {
    return await page.waitForFunction(fn, arg, { timeout, polling: 200 });
  } catch (e) {
    throw new Error(`timed out after ${timeout / 1000}s waiting for ${what}`);
  }
}
function check(cond, msg) { if (!cond) throw new Error(msg); }

const text = (sel) => page.evaluate((s) => document.querySelector(s)?.textContent || '', sel);
const h1Is = (t) => until(`the heading "${t}"`, (x) => document.querySelector('#page h1')?.textContent === x, t);
const go = (hash) => page.evaluate((h) => { location.hash = h; }, hash);
// A fresh load of the page at `hash` (page.goto to the same document with another hash is only a hashchange).
const fresh = async (hash) => { await page.goto(`${BASE}${hash}`); await page.reload(); };
const nav = (name) => page.locator('#nav').getByRole('link', { name, exact: true });

// Through the dashboard's own proxy with the logged-in user's session (what the page does).
const api = (method, p, body, contentType = 'application/json') => page.evaluate(async ([m, p, b, ct]) => {
  const headers = { Accept: 'application/json' };
  if (m !== 'GET') headers['X-Dashboard'] = '1';
  if (b) headers['Content-Type'] = ct;
  const res = await fetch('/k8s' + p, { method: m, headers, body: b ? JSON.stringify(b) : undefined });
  return { status: res.status, body: await res.text() };
}, [method, p, body, contentType]);

async function loginWithKubeconfig() {
  await page.getByLabel('Kubeconfig file').setInputFiles(env.KUBECONFIG_FILE);
  await until('the kubeconfig text read from the file', () => document.getElementById('kubeconfig').value.includes('apiVersion'));
  await page.getByRole('button', { name: 'Log in with kubeconfig' }).click();
  await until('the app after the login', () => !document.getElementById('app').hidden);
}

async function loginWithToken(token) {
  await page.getByLabel('Bearer token').fill(token);
  await page.getByRole('button', { name: 'Log in with token' }).click();
}

// ---------------------------------------------------------------------------------------------

await step('login-error', async () => {
  await page.goto(BASE);
  await page.getByRole('heading', { name: 'MiniK8s dashboard', level: 1 }).waitFor();
  await loginWithToken(env.EXPIRED_TOKEN || 'not-a-valid-token');
  await until('the login error message', () => {
    const e = document.getElementById('login-error');
    return e && !e.hidden && e.textContent.trim().length > 0;
  });
  const msg = await text('#login-error');
  check(await page.locator('#login-error').isVisible(), 'the error is not visible');
  check(await page.locator('#app').isHidden(), 'the app is shown after a refused token');
  await shot('login-error.png');
  return { message: msg };
});

let firstRender = 0;
await step('overview', async () => {
  check(env.KUBECONFIG_FILE, 'KUBECONFIG_FILE is not set');
  await page.getByLabel('Kubeconfig file').setInputFiles(env.KUBECONFIG_FILE);
  await until('the kubeconfig text read from the file', () => document.getElementById('kubeconfig').value.includes('apiVersion'));
  const t0 = Date.now();
  await page.getByRole('button', { name: 'Log in with kubeconfig' }).click();
  await until('a Ready node on the overview', () =>
    [...document.querySelectorAll('[data-section=nodes] tbody td[data-col=status]')].some((td) => /^Ready\b/.test(td.textContent)));
  firstRender = Date.now() - t0;
  const nodes = await page.evaluate(() => [...document.querySelectorAll('[data-section=nodes] tbody tr[data-uid]')]
    .map((tr) => `${tr.dataset.name}=${tr.querySelector('[data-col=status]').textContent}`));
  const user = await text('#user');
  check(user, 'no user in the header');
  await until('the page title', () => document.title.startsWith('Overview'));
  await shot('overview.png');
  return { first_render_ms: firstRender, user, nodes };
});

// Fixtures, through the admin's session: Deployment web (if missing) and ConfigMap doomed.
async function fixtures() {
  let r = await api('GET', `/api/v1/namespaces/${NS}`);
  if (r.status === 404) r = await api('POST', '/api/v1/namespaces', { apiVersion: 'v1', kind: 'Namespace', metadata: { name: NS } });
  check(r.status < 300, `namespace ${NS}: ${r.status} ${r.body}`);
  r = await api('GET', `/apis/apps/v1/namespaces/${NS}/deployments/web`);
  if (r.status === 404) {
    r = await api('POST', `/apis/apps/v1/namespaces/${NS}/deployments`, {
      apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name: 'web' },
      spec: {
        replicas: 1, selector: { matchLabels: { app: 'web' } },
        template: { metadata: { labels: { app: 'web' } }, spec: { containers: [{ name: 'web', image: 'busybox',
          command: ['sh', '-c', 'i=0; while true; do echo tick $i; i=$((i+1)); sleep 1; done'] }] } },
      },
    });
  }
  check(r.status < 300, `deployment web: ${r.status} ${r.body}`);
  r = await api('POST', `/api/v1/namespaces/${NS}/configmaps`, { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'doomed' }, data: { a: 'b' } });
  check(r.status < 300 || r.status === 409, `configmap doomed: ${r.status} ${r.body}`);
}

let deployHash = '';
await step('scale', async () => {
  await fixtures();
  await until(`namespace ${NS} in the selector`, (ns) => [...document.querySelectorAll('#namespace option')].some((o) => o.value === ns), NS);
  await page.getByLabel('Namespace').selectOption(NS);
  await nav('Deployments').click();
  await h1Is('Deployments');
  await page.locator('table tbody').getByRole('link', { name: 'web', exact: true }).click();
  await h1Is('Deployment web');
  deployHash = await page.evaluate(() => location.hash.split('?')[0]);
  await page.evaluate(() => { window.__noReload = true; });
  await page.getByLabel('Replicas', { exact: true }).fill('3');
  await page.getByRole('button', { name: 'Scale', exact: true }).click();
  await until('the "Scaled" message', () => /Scaled/.test(document.getElementById('notice').textContent));
  await until('3 Running pods among the children', () => {
    const rows = [...document.querySelectorAll('[data-section=children-pods] tbody tr[data-uid]')];
    return rows.length === 3 && rows.every((tr) => tr.querySelector('[data-col=status]').textContent === 'Running');
  });
  check(await page.evaluate(() => window.__noReload === true), 'the page reloaded');
  await shot('deployment.png');
});

let podName = '';
await step('logs', async () => {
  const link = page.locator('[data-section=children-pods] tbody tr[data-uid]').first().getByRole('link').first();
  podName = (await link.textContent()).trim();
  await link.click();
  await h1Is(`Pod ${podName}`);
  await page.getByRole('tab', { name: 'Logs' }).click();
  const re = /tick (\d+)/g;
  await until('a "tick N" line in the logs', () => /tick \d+/.test(document.querySelector('pre.logs')?.textContent || ''));
  const maxAtOpen = Math.max(...[...(await text('pre.logs')).matchAll(re)].map((m) => +m[1]));
  await until(`a line "tick N" with N > ${maxAtOpen}`, (max) =>
    [...(document.querySelector('pre.logs')?.textContent || '').matchAll(/tick (\d+)/g)].some((m) => +m[1] > max), maxAtOpen);
  await shot('logs.png');
  return { pod: podName, max_at_open: maxAtOpen };
});

await step('terminal', async () => {
  await page.getByRole('tab', { name: 'Terminal' }).click();
  await until('the terminal to connect', () => /Connected/.test(document.querySelector('pre.term')?.textContent || ''));
  await page.getByLabel('Command', { exact: true }).fill('echo hi');
  await page.getByLabel('Command', { exact: true }).press('Enter');
  await until('"hi" in the terminal output', () => (document.querySelector('pre.term')?.textContent || '').split('\n').some((l) => l.trim() === 'hi'));
  await shot('terminal.png');
});

// The Deployment's CPU and memory plots: from Prometheus when the cluster runs one
// (scripts/cluster up --monitoring), else sampled from the metrics API.
await step('plots', async () => {
  await go(deployHash);
  await h1Is('Deployment web');
  await page.getByRole('tab', { name: 'Metrics' }).click();
  await until('a CPU plot with data', () => {
    const fig = document.querySelector('figure.chart');
    return fig && /CPU/.test(fig.querySelector('figcaption')?.textContent || '') && /\(now /.test(fig.querySelector('.legend')?.textContent || '')
      && fig.querySelector('svg path, svg circle');
  }, undefined, 90000);
  const note = await text('figure.chart figcaption');
  const legend = await text('figure.chart .legend');
  await shot('metrics.png');
  return { source: /Prometheus/.test(note) ? 'prometheus' : 'metrics API', legend };
});

await step('yaml-error', async () => {
  await go(deployHash);
  await h1Is('Deployment web');
  await page.getByRole('tab', { name: 'YAML' }).click();
  await until('the YAML', () => /kind: "?Deployment/.test(document.querySelector('pre.view')?.textContent || ''));
  await page.getByRole('button', { name: 'Edit', exact: true }).click();
  const editor = page.getByRole('textbox', { name: 'YAML', exact: true });
  const lines = (await editor.inputValue()).split('\n');
  const spec = lines.findIndex((l) => l === 'spec:');
  const idx = lines.findIndex((l, i) => i > spec && /^  replicas: \d+/.test(l));
  check(spec >= 0 && idx > spec, 'no spec.replicas line in the YAML');
  lines[idx] = '  replicas: -1';
  const lineNo = idx + 1;
  await editor.fill(lines.join('\n'));
  await page.getByRole('button', { name: 'Save', exact: true }).click();
  await until(`the error beside line ${lineNo}`, (n) => {
    const el = document.querySelector(`.annotated .line.bad[data-line="${n}"]`);
    return el && /must be greater than or equal to 0/.test(el.textContent) && /replicas: -1/.test(el.textContent);
  }, lineNo);
  const beside = await text(`.annotated .line.bad[data-line="${lineNo}"]`);
  check(/spec\.replicas/.test(beside), `the message beside line ${lineNo} does not name spec.replicas: ${beside}`);
  check(/Invalid|invalid/.test(await text('.yaml-errors [role=alert]')), 'no Status message on top');
  await shot('yaml-error.png');
  await page.getByRole('button', { name: 'Cancel', exact: true }).click();
  return { line: lineNo };
});

await step('deleted', async () => {
  await nav('ConfigMaps').click();
  await h1Is('ConfigMaps');
  await page.locator('table tbody').getByRole('link', { name: 'doomed', exact: true }).click();
  await h1Is('ConfigMap doomed');
  await page.getByRole('button', { name: 'Delete', exact: true }).click();
  await page.getByRole('button', { name: 'Confirm delete' }).click();
  await until('"This ConfigMap was deleted"', () => /This ConfigMap was deleted/.test(document.querySelector('#page')?.textContent || ''));
  check(await page.getByRole('alert').filter({ hasText: 'This ConfigMap was deleted' }).isVisible(), 'the deleted banner is not visible');
  await shot('configmap-deleted.png');
});

await step('forbidden', async () => {
  if (!env.VIEWER_TOKEN) return { skipped: 'VIEWER_TOKEN is not set' };
  await page.getByRole('button', { name: 'Log out' }).click();
  await page.getByLabel('Bearer token').waitFor();
  await loginWithToken(env.VIEWER_TOKEN);
  await until('the app after the viewer login', () => !document.getElementById('app').hidden);
  await go(deployHash);
  await h1Is('Deployment web');
  await page.getByLabel('Replicas', { exact: true }).fill('2');
  await page.getByRole('button', { name: 'Scale', exact: true }).click();
  await until('a visible "forbidden" message', () => {
    const n = document.getElementById('notice');
    return /forbidden/i.test(n.textContent) && n.offsetParent !== null;
  });
  await shot('viewer-forbidden.png');
  const message = (await text('#notice')).replace(/×$/, '');
  // back to the admin for the rest
  await page.getByRole('button', { name: 'Log out' }).click();
  await loginWithKubeconfig();
  return { message };
});

await step('narrow', async () => {
  // Keyboard, wide: Tab from the top of a fresh page reaches the first nav link, focus visible.
  await fresh(`#/pods?ns=${encodeURIComponent(NS)}`);
  await h1Is('Pods');
  const tabToNav = async (max) => {
    for (let i = 0; i < max; i++) {
      await page.keyboard.press('Tab');
      const a = await page.evaluate(() => {
        const e = document.activeElement;
        return { tag: e?.tagName, inNav: !!e?.closest('#nav'), text: e?.textContent.trim(), menu: e?.id === 'menu-button',
          outline: e ? getComputedStyle(e).outlineStyle : '' };
      });
      if (a.menu) { await page.keyboard.press('Enter'); continue; }
      if (a.inNav) return a;
    }
    return null;
  };
  let a = await tabToNav(8);
  check(a && a.tag === 'A' && a.text === 'Overview', `Tab did not reach the first nav link (got ${JSON.stringify(a)})`);
  check(a.outline !== 'none', 'the focused nav link shows no focus outline');

  await page.setViewportSize({ width: 400, height: 800 });
  await fresh(`#/pods?ns=${encodeURIComponent(NS)}`);
  await h1Is('Pods');
  await until('pod rows', () => document.querySelectorAll('tbody tr[data-uid]').length > 0);
  const widths = await page.evaluate(() => ({ doc: document.documentElement.scrollWidth, body: document.body.scrollWidth }));
  check(widths.doc <= 400, `the document is ${widths.doc}px wide in a 400px window`);
  // the navigation is behind the Menu button, and reachable
  const menu = page.getByRole('button', { name: 'Menu' });
  check(await menu.isVisible(), 'no Menu button in a narrow window');
  await menu.click();
  check(await nav('Pods').isVisible(), 'the nav links are not visible after opening the menu');
  const wider = await page.evaluate(() => document.documentElement.scrollWidth);
  check(wider <= 400, `with the menu open the document is ${wider}px wide`);
  await shot('narrow.png');
  await menu.click();
  // keyboard, narrow: Tab to Menu, Enter, Tab on to the first nav link
  await fresh(`#/pods?ns=${encodeURIComponent(NS)}`);
  await h1Is('Pods');
  a = await tabToNav(8);
  check(a && a.tag === 'A' && a.text === 'Overview', `Tab (narrow) did not reach the first nav link (got ${JSON.stringify(a)})`);
  await page.setViewportSize({ width: 1280, height: 900 });
  return { scroll_width: widths.doc };
});

if (env.PODS_1000) {
  await step('1000-pods', async () => {
    const want = +(env.PODS_1000_COUNT || 1000);
    await fresh('#/overview');
    await page.locator('#page h1').waitFor();
    const t0 = Date.now();
    await go(`#/pods?ns=${encodeURIComponent(env.PODS_1000)}`);
    await until(`${want} pod rows`, (n) => document.querySelectorAll('tbody tr[data-uid]').length >= n || /error/.test(document.querySelector('.live')?.textContent), want);
    const err = await text('.live');
    check(!/error/.test(err), `the pods list failed: ${err}`);
    const ms = Date.now() - t0;
    // still responsive: a click on the filter answers within a frame or two
    const t1 = Date.now();
    await page.getByLabel('Filter by name').fill('zzz-no-such-pod');
    await until('the filter to hide the rows', () => document.querySelector('tbody tr.empty') !== null);
    await shot('pods-1000.png');
    return { ms, rows: want, filter_ms: Date.now() - t1 };
  });
}

await browser.close();
