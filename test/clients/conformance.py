"""The Python client (`kubernetes` package) doing what its users do, against our cluster.

    conformance.py api URL        lists in pages, watches and resumes, creates from
                                  multi-document YAML with conflicts, reads error bodies
    conformance.py restart URL    a watch loop resuming from its last resourceVersion across
                                  an apiserver restart (prints "ready", then waits for a
                                  line on stdin: the restart is done and `after-restart` made)
    conformance.py pod URL POD    exec with stdin and its close, attach, logs with follow,
                                  port-forward, against a running pod (see client_conformance.rs)

Prints one `ok …` line per check; exits non-zero with the reason on the first failure."""

import json
import sys
import time

import kubernetes.client as k
from kubernetes import utils, watch
from kubernetes.client.rest import ApiException
from kubernetes.stream import portforward, stream
from kubernetes.stream.ws_client import STDIN_CHANNEL

cfg = k.Configuration()
cfg.host = sys.argv[2]
client = k.ApiClient(cfg)
core = k.CoreV1Api(client)
NS = "default"


def ok(what, cond, detail=""):
    if not cond:
        sys.exit(f"FAILED {what}: {detail}")
    print("ok", what, flush=True)


def api():
    # Pagination: every page within the limit, every object once, the last without a token.
    for i in range(7):
        core.create_namespaced_config_map(NS, {"metadata": {"name": f"page-{i}", "labels": {"set": "pages"}}})
    names, token, pages = [], None, 0
    while True:
        page = core.list_namespaced_config_map(NS, label_selector="set=pages", limit=3, _continue=token)
        ok(f"page {pages} within the limit", len(page.items) <= 3, len(page.items))
        names += [c.metadata.name for c in page.items]
        pages += 1
        token = page.metadata._continue
        if not token:
            break
    ok("pagination", sorted(names) == [f"page-{i}" for i in range(7)] and pages == 3, (names, pages))

    # Watch from a list's resourceVersion, then resume from the last event's.
    rv = core.list_namespaced_config_map(NS, label_selector="set=watched").metadata.resource_version
    core.create_namespaced_config_map(NS, {"metadata": {"name": "w1", "labels": {"set": "watched"}}})
    w = watch.Watch()
    seen = []
    for ev in w.stream(core.list_namespaced_config_map, NS, label_selector="set=watched",
                       resource_version=rv, timeout_seconds=5):
        seen.append((ev["type"], ev["object"].metadata.name))
        ok("watch event typed", isinstance(ev["object"], k.V1ConfigMap), type(ev["object"]))
        last = ev["object"].metadata.resource_version
        w.stop()
    ok("watch from a list", seen == [("ADDED", "w1")], seen)
    core.patch_namespaced_config_map("w1", NS, {"data": {"a": "1"}})
    seen = []
    for ev in w.stream(core.list_namespaced_config_map, NS, label_selector="set=watched",
                       resource_version=last, timeout_seconds=5):
        seen.append((ev["type"], ev["object"].metadata.name, ev["object"].data))
        w.stop()
    ok("watch resumed", seen == [("MODIFIED", "w1", {"a": "1"})], seen)

    # Multi-document creation: what exists is reported, the rest is created.
    core.create_namespaced_config_map(NS, {"metadata": {"name": "exists"}})
    docs = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n, "namespace": NS}}
            for n in ("fresh-1", "exists", "fresh-2")]
    docs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "from-yaml", "namespace": NS},
                 "spec": {"ports": [{"port": 80}]}})
    try:
        utils.create_from_yaml(client, yaml_objects=docs)
        ok("create_from_yaml reports the conflict", False, "no FailToCreateError")
    except utils.FailToCreateError as e:
        codes = [x.status for x in e.api_exceptions]
        ok("create_from_yaml reports the conflict", codes == [409], codes)
    for n in ("fresh-1", "fresh-2"):
        ok(f"create_from_yaml created {n}", core.read_namespaced_config_map(n, NS).metadata.name == n)
    ok("create_from_yaml created a Service", core.read_namespaced_service("from-yaml", NS).spec.ports[0].port == 80)

    # Error bodies: a Status, fields in Kubernetes' order, ending in a newline.
    try:
        core.create_namespaced_config_map(NS, {"metadata": {"name": "exists"}})
    except ApiException as e:
        body = e.body.decode() if isinstance(e.body, bytes) else e.body
        st = json.loads(body)
        ok("409 body", e.status == 409 and st["reason"] == "AlreadyExists" and st["details"]["name"] == "exists", body)
        ok("409 body bytes", body.startswith('{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",')
           and body.endswith('"code":409}\n'), repr(body))
    try:
        core.read_namespaced_config_map("nope", NS)
    except ApiException as e:
        st = json.loads(e.body)
        ok("404 body", e.status == 404 and st["reason"] == "NotFound" and st["message"] == 'configmaps "nope" not found',
           e.body)
    try:
        core.create_namespaced_config_map(NS, {"metadata": {"name": "Bad_Name"}})
    except ApiException as e:
        st = json.loads(e.body)
        causes = [c["field"] for c in st["details"]["causes"]]
        ok("422 body", e.status == 422 and st["reason"] == "Invalid" and causes == ["metadata.name"], e.body)


def restart():
    # What a Python controller writes: list, then watch from the list's resourceVersion and,
    # when the connection breaks, watch again from the last resourceVersion seen.
    listed = core.list_namespaced_config_map(NS)
    rv = listed.metadata.resource_version
    print("ready", flush=True)
    sys.stdin.readline()
    deadline = time.time() + 30
    names = []
    while time.time() < deadline and "after-restart" not in names:
        try:
            for ev in watch.Watch().stream(core.list_namespaced_config_map, NS, resource_version=rv, timeout_seconds=5):
                rv = ev["object"].metadata.resource_version
                names.append(ev["object"].metadata.name)
                if ev["object"].metadata.name == "after-restart":
                    break
        except Exception as e:  # the apiserver going away mid-watch
            print("watch broke:", type(e).__name__, flush=True)
            time.sleep(0.5)
    ok("watch resumed across the restart", "after-restart" in names and names.count("after-restart") == 1, names)


def pod(name):
    # exec with stdin: cat echoes a line and ends when stdin is closed (v5's CLOSE signal).
    ws = stream(core.connect_get_namespaced_pod_exec, name, NS, command=["cat"], stdin=True, stdout=True,
                stderr=True, tty=False, _preload_content=False)
    ok("exec speaks v5.channel.k8s.io", ws.subprotocol == "v5.channel.k8s.io", ws.subprotocol)
    ws.write_stdin("test-close\n")
    out, deadline = "", time.time() + 10
    while time.time() < deadline and "test-close\n" not in out:
        ws.update(timeout=1)
        out += ws.read_stdout(timeout=0) if ws.peek_stdout() else ""
    ok("exec stdin echoed", out == "test-close\n", repr(out))
    ws.close_channel(STDIN_CHANNEL)
    ws.run_forever(timeout=10)
    ok("closing stdin ends cat", not ws.is_open() and ws.returncode == 0, (ws.is_open(), ws.returncode))

    # A command's output and exit code.
    ws = stream(core.connect_get_namespaced_pod_exec, name, NS, command=["sh", "-c", "echo out; echo err >&2; exit 3"],
                stdout=True, stderr=True, stdin=False, tty=False, _preload_content=False)
    ws.run_forever(timeout=10)
    ok("exec stdout/stderr/exit code", (ws.read_stdout(), ws.read_stderr(), ws.returncode) == ("out\n", "err\n", 3),
       (ws.read_all(), ws.returncode))

    # attach: the main process's output arrives on stdout.
    ws = stream(core.connect_get_namespaced_pod_attach, name, NS, stdout=True, stderr=True, stdin=False, tty=False,
                _preload_content=False)
    got, deadline = "", time.time() + 10
    while time.time() < deadline and "tick" not in got:
        ws.update(timeout=1)
        got += ws.read_stdout(timeout=0) if ws.peek_stdout() else ""
    ws.close()
    ok("attach", "tick" in got, repr(got))

    # logs with follow: lines keep coming on one open response.
    resp = core.read_namespaced_pod_log(name, NS, follow=True, _preload_content=False)
    lines, deadline = [], time.time() + 10
    for chunk in resp.stream(64):
        lines += [l for l in chunk.decode().splitlines() if l.startswith("tick")]
        if len(set(lines)) >= 3 or time.time() > deadline:
            break
    resp.release_conn()
    ok("logs follow", len(set(lines)) >= 3, lines)

    # port-forward: an HTTP request to the pod's port 8080 through the forwarded socket.
    pf = portforward(core.connect_get_namespaced_pod_portforward, name, NS, ports="8080")
    sock = pf.socket(8080)
    sock.setblocking(True)
    sock.sendall(b"GET / HTTP/1.0\r\nHost: pod\r\n\r\n")
    reply = b""
    while True:
        data = sock.recv(4096)
        if not data:
            break
        reply += data
    sock.close()
    ok("port-forward", reply.startswith(b"HTTP/1.") and reply.rstrip().endswith(b"pong"), reply[:200])
    ok("port-forward error channel quiet", pf.error(8080) is None, pf.error(8080))
    pf.close()


if __name__ == "__main__":
    {"api": api, "restart": restart, "pod": lambda: pod(sys.argv[3])}[sys.argv[1]]()
    print("done", flush=True)
