// The JavaScript client (`@kubernetes/client-node`, pinned in test/clients/package.json)
// doing what its users do, against our cluster. Same sections as conformance.py:
//
//   node conformance.mjs api URL        typed CRUD (every verb's answer as the library's
//                                       type), pages, watch and resume, multi-document
//                                       creation with conflicts, error bodies
//   node conformance.mjs restart URL    an informer kept running across an apiserver restart
//                                       (prints "ready", waits for a line on stdin)
//   node conformance.mjs pod URL POD    exec with stdin and its close, attach, logs with
//                                       follow, port-forward
//
// Prints one `ok …` line per check; exits non-zero with the reason on the first failure.

import * as k8s from '@kubernetes/client-node';
import net from 'node:net';
import readline from 'node:readline';
import { PassThrough, Writable } from 'node:stream';

const [section, server, podName] = process.argv.slice(2);
const kc = new k8s.KubeConfig();
kc.loadFromOptions({
    clusters: [{ name: 'c', server, skipTLSVerify: true }],
    users: [{ name: 'u' }],
    contexts: [{ name: 'x', cluster: 'c', user: 'u' }],
    currentContext: 'x',
});
const core = kc.makeApiClient(k8s.CoreV1Api);
const namespace = 'default';

function ok(what, cond, detail = '') {
    if (!cond) {
        console.log(`FAILED ${what}: ${typeof detail === 'string' ? detail : JSON.stringify(detail)}`);
        process.exit(1);
    }
    console.log(`ok ${what}`);
}

async function failure(promise) {
    try {
        await promise;
    } catch (e) {
        return e;
    }
    return null;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function api() {
    // Typed CRUD: each verb's answer is the model class the API declares.
    const svc = { metadata: { name: 'js-svc' }, spec: { ports: [{ port: 80 }] } };
    ok('create service', (await core.createNamespacedService({ namespace, body: svc })) instanceof k8s.V1Service);
    ok('read service', (await core.readNamespacedService({ namespace, name: 'js-svc' })) instanceof k8s.V1Service);
    const patched = await core.patchNamespacedService(
        { namespace, name: 'js-svc', body: { metadata: { labels: { a: 'b' } } } },
        k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
    );
    ok('patch service', patched instanceof k8s.V1Service && patched.metadata.labels.a === 'b', patched);
    const gone = await core.deleteNamespacedService({ namespace, name: 'js-svc' });
    ok('delete service answers the Service', gone instanceof k8s.V1Service && gone.metadata.name === 'js-svc', gone);
    await core.createNamespacedConfigMap({ namespace, body: { metadata: { name: 'js-cm' }, data: { k: 'v' } } });
    const replaced = await core.replaceNamespacedConfigMap({
        namespace, name: 'js-cm', body: { metadata: { name: 'js-cm' }, data: { k: 'w' } },
    });
    ok('replace configmap', replaced instanceof k8s.V1ConfigMap && replaced.data.k === 'w', replaced);
    const status = await core.deleteNamespacedConfigMap({ namespace, name: 'js-cm' });
    ok('delete configmap answers a Status', status instanceof k8s.V1Status && status.status === 'Success', status);

    // Pagination.
    for (let i = 0; i < 7; i++) {
        await core.createNamespacedConfigMap({ namespace, body: { metadata: { name: `js-page-${i}`, labels: { set: 'js-pages' } } } });
    }
    let names = [], token, pages = 0;
    do {
        const page = await core.listNamespacedConfigMap({ namespace, labelSelector: 'set=js-pages', limit: 3, _continue: token });
        ok(`page ${pages} within the limit`, page.items.length <= 3, page.items.length);
        names.push(...page.items.map((c) => c.metadata.name));
        token = page.metadata._continue;
        pages++;
    } while (token);
    ok('pagination', names.sort().join() === [...Array(7).keys()].map((i) => `js-page-${i}`).join() && pages === 3, names);

    // Watch from a list's resourceVersion; resume from the last event's.
    const watcher = new k8s.Watch(kc);
    const path = '/api/v1/namespaces/default/configmaps';
    const watchOnce = async (resourceVersion, act) => {
        const events = [];
        let req;
        const done = new Promise((resolve, reject) => {
            watcher.watch(path, { labelSelector: 'set=js-watched', resourceVersion }, (type, obj) => {
                events.push({ type, obj });
                resolve();
            }, (err) => (err ? reject(err) : resolve())).then((r) => { req = r; });
        });
        await act();
        await Promise.race([done, sleep(5000)]);
        req?.abort();
        return events;
    };
    const listed = await core.listNamespacedConfigMap({ namespace, labelSelector: 'set=js-watched' });
    let events = await watchOnce(listed.metadata.resourceVersion, () =>
        core.createNamespacedConfigMap({ namespace, body: { metadata: { name: 'js-w1', labels: { set: 'js-watched' } } } }));
    ok('watch from a list', events.length === 1 && events[0].type === 'ADDED' && events[0].obj.metadata.name === 'js-w1', events);
    const last = events[0].obj.metadata.resourceVersion;
    events = await watchOnce(last, () =>
        core.patchNamespacedConfigMap({ namespace, name: 'js-w1', body: { data: { a: '1' } } },
            k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch)));
    ok('watch resumed', events.length === 1 && events[0].type === 'MODIFIED' && events[0].obj.data.a === '1', events);

    // Multi-document YAML through the generic object API: the conflict is a 409, the rest created.
    await core.createNamespacedConfigMap({ namespace, body: { metadata: { name: 'js-exists' } } });
    const docs = k8s.loadAllYaml(['js-fresh-1', 'js-exists', 'js-fresh-2']
        .map((n) => `apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ${n}\n  namespace: default\n`).join('---\n'));
    const objects = k8s.KubernetesObjectApi.makeApiClient(kc);
    const codes = [];
    for (const doc of docs) {
        const e = await failure(objects.create(doc));
        codes.push(e ? e.code : 201);
    }
    ok('multi-document create', codes.join() === '201,409,201', codes);
    const read = await objects.read({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'js-fresh-2', namespace } });
    ok('generic read', read.kind === 'ConfigMap' && read.metadata.name === 'js-fresh-2', read);

    // Error bodies: a Status in Kubernetes' field order, ending in a newline.
    let e = await failure(core.createNamespacedConfigMap({ namespace, body: { metadata: { name: 'js-exists' } } }));
    const body = typeof e.body === 'string' ? e.body : JSON.stringify(e.body);
    ok('409 error', e instanceof k8s.ApiException && e.code === 409 && JSON.parse(body).reason === 'AlreadyExists', body);
    ok('409 body bytes', body.startsWith('{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",')
        && body.endsWith('"code":409}\n'), body);
    e = await failure(core.readNamespacedConfigMap({ namespace, name: 'nope' }));
    ok('404 error', e.code === 404 && JSON.parse(e.body).message === 'configmaps "nope" not found', e.body);
}

async function restart() {
    const path = '/api/v1/namespaces/default/configmaps';
    const informer = k8s.makeInformer(kc, path, () => core.listNamespacedConfigMap({ namespace }));
    const added = [];
    let errors = 0;
    informer.on('add', (obj) => added.push(obj.metadata.name));
    // What the library's documentation tells its users to do: start again after an error.
    informer.on('error', () => {
        errors++;
        setTimeout(() => informer.start().catch(() => {}), 500);
    });
    await informer.start();
    console.log('ready');
    const rl = readline.createInterface({ input: process.stdin });
    await new Promise((resolve) => rl.once('line', resolve));
    rl.close();
    const deadline = Date.now() + 30000;
    while (Date.now() < deadline && !informer.list(namespace).some((o) => o.metadata.name === 'after-restart')) {
        await sleep(200);
    }
    const cached = informer.list(namespace).map((o) => o.metadata.name);
    ok('informer caught up after the restart', cached.includes('after-restart'), { cached, errors });
    ok('informer added it once', added.filter((n) => n === 'after-restart').length === 1, added);
    await informer.stop();
}

function collector() {
    const chunks = [];
    const stream = new Writable({ write(c, _e, cb) { chunks.push(Buffer.from(c)); cb(); } });
    return { stream, text: () => Buffer.concat(chunks).toString() };
}

async function until(cond, ms = 10000) {
    const deadline = Date.now() + ms;
    while (Date.now() < deadline && !cond()) {
        await sleep(100);
    }
    return cond();
}

async function pod(name) {
    // exec with stdin: cat echoes, and ends when stdin ends (v5's CLOSE signal).
    const exec = new k8s.Exec(kc);
    let out = collector(), err = collector(), stdin = new PassThrough(), status = null;
    const ws = await exec.exec(namespace, name, 'main', ['cat'], out.stream, err.stream, stdin, false, (s) => { status = s; });
    ok('exec speaks v5.channel.k8s.io', ws.protocol === 'v5.channel.k8s.io', ws.protocol);
    stdin.write('test-close\n');
    ok('exec stdin echoed', await until(() => out.text() === 'test-close\n'), out.text());
    stdin.end();
    ok('ending stdin ends cat', await until(() => status !== null), status);
    ok('exec status Success', status.status === 'Success', status);

    out = collector(); err = collector(); status = null;
    await exec.exec(namespace, name, 'main', ['sh', '-c', 'echo out; echo err >&2; exit 3'], out.stream, err.stream, null, false,
        (s) => { status = s; });
    await until(() => status !== null);
    const code = status?.details?.causes?.find((c) => c.reason === 'ExitCode')?.message;
    ok('exec stdout/stderr/exit code', out.text() === 'out\n' && err.text() === 'err\n' && code === '3',
        { out: out.text(), err: err.text(), status });

    // attach: the main process's output.
    out = collector();
    const attached = await new k8s.Attach(kc).attach(namespace, name, 'main', out.stream, null, null, false);
    ok('attach', await until(() => out.text().includes('tick')), out.text());
    attached.close();

    // logs with follow.
    out = collector();
    const req = await new k8s.Log(kc).log(namespace, name, 'main', out.stream, { follow: true });
    const ticks = () => new Set(out.text().split('\n').filter((l) => l.startsWith('tick'))).size;
    ok('logs follow', await until(() => ticks() >= 3), out.text());
    req.abort();

    // port-forward: HTTP to the pod's port 8080 through a local listener, as the library's
    // own example does.
    const forward = new k8s.PortForward(kc);
    const listener = net.createServer((socket) => {
        forward.portForward(namespace, name, [8080], socket, null, socket);
    });
    await new Promise((r) => listener.listen(0, '127.0.0.1', r));
    const reply = await new Promise((resolve, reject) => {
        const c = net.connect(listener.address().port, '127.0.0.1', () => c.write('GET / HTTP/1.0\r\nHost: pod\r\n\r\n'));
        const got = [];
        c.on('data', (d) => {
            got.push(d);
            if (Buffer.concat(got).toString().trimEnd().endsWith('pong')) {
                resolve(Buffer.concat(got).toString());
                c.destroy();
            }
        });
        c.on('error', reject);
        setTimeout(() => resolve(Buffer.concat(got).toString()), 10000);
    });
    listener.close();
    ok('port-forward', reply.startsWith('HTTP/1.') && reply.trimEnd().endsWith('pong'), reply.slice(0, 200));
}

const sections = { api, restart, pod: () => pod(podName) };
try {
    await sections[section]();
    console.log('done');
    process.exit(0);
} catch (e) {
    console.log(`FAILED ${section}: ${e?.stack ?? e}`, e?.body ?? '');
    process.exit(1);
}
