#!/usr/bin/env python3
"""A module for the reference Koupleless base: an HTTP server that answers with the module's
name and version and the base it runs in. The base starts it in the module's own directory
(BIZ_NAME and BIZ_VERSION in its environment); it listens on a free port of 127.0.0.1 and
writes its address to ./url, which is how `scripts/cluster`'s tour finds it."""
import http.server
import os

name, version = os.environ.get("BIZ_NAME", "?"), os.environ.get("BIZ_VERSION", "?")
base = os.path.basename(os.path.dirname(os.path.dirname(os.getcwd())))


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"hello from module {name} {version} in base {base}\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        print(fmt % args, flush=True)


server = http.server.HTTPServer(("127.0.0.1", 0), Hello)
url = f"http://127.0.0.1:{server.server_address[1]}/"
with open("url.tmp", "w") as f:
    f.write(url + "\n")
os.replace("url.tmp", "url")
print(f"module {name} {version} serving {url}", flush=True)
server.serve_forever()
