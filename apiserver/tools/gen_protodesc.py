#!/usr/bin/env python3
"""Generate apiserver/src/protobuf/descriptors.txt from the k8s-pb crate's sources.

k8s-pb (kube-rs) carries prost types for every Kubernetes protobuf message, with the Go
doc comments (`+patchMergeKey=`, `+patchStrategy=`). This script turns them into a compact
table the apiserver reads at startup: the wire layout of each message (tags, types) for
decoding `application/vnd.kubernetes.protobuf` bodies, and each field's patch metadata for
the OpenAPI documents and strategic merge patch.

Usage: gen_protodesc.py <path to k8s-pb-x.y.z/src> > apiserver/src/protobuf/descriptors.txt

Format (tab-separated):
  M <message>                          message, e.g. api.core.v1.PodSpec
  F <tag> <rust_field> <label> <type> <mergeKey> <strategy>
     label: opt | rep | map ; type: a scalar (string int32 int64 bool double float bytes)
     or a message name; for map the value type (keys are strings). '-' for none.
"""
import os
import re
import sys

SCALARS = {"string", "int32", "int64", "bool", "double", "float", "bytes", "uint32", "uint64", "sint32", "sint64"}
SKIP_WORDS = {"core", "option", "Option", "prost", "alloc", "vec", "Vec", "boxed", "Box", "string", "String",
              "std", "collections", "BTreeMap", "HashMap", "u8"}


def resolve(type_expr, module):
    # The innermost non-container path in the type expression.
    paths = re.findall(r"(?:(?:super|[A-Za-z_][A-Za-z0-9_]*)::)*[A-Za-z_][A-Za-z0-9_]*", type_expr)
    cands = [p for p in paths if p.split("::")[-1] not in SKIP_WORDS and p.split("::")[-1][0].isupper()]
    if not cands:
        return None
    p = cands[-1].split("::")
    mod = list(module)
    while p and p[0] == "super":
        mod.pop()
        p = p[1:]
    return ".".join(mod + p)


def main(root):
    out = []
    for dirpath, _, files in sorted(os.walk(root)):
        for f in sorted(files):
            if f != "mod.rs":
                continue
            rel = os.path.relpath(dirpath, root)
            if rel == ".":
                continue
            module = rel.split(os.sep)
            # Only the served (GA) versions; alpha/beta groups, metrics and test APIs are not served.
            if module[0] in ("metrics",) or "testapigroup" in module:
                continue
            if module[0] != "apimachinery" and re.search(r"v\d+(alpha|beta)", module[-1]):
                continue
            lines = open(os.path.join(dirpath, f)).read().split("\n")
            comments = []
            attr = None
            in_struct = False
            pending = ""
            for line in lines:
                s = line.strip()
                # rustfmt splits long field types over several lines: join them.
                if pending or (s.startswith("pub ") and ":" in s and not s.endswith(",") and not s.endswith("{")):
                    pending += (" " if pending else "") + s
                    if not (pending.endswith(",") and pending.count("<") == pending.count(">")):
                        continue
                    s, pending = pending, ""
                m = re.match(r"pub struct (\w+) \{", s)
                if m:
                    out.append("M\t" + ".".join(module + [m.group(1)]))
                    in_struct = True
                    comments = []
                    continue
                if s == "}":
                    in_struct = False
                    continue
                if not in_struct:
                    continue
                if s.startswith("///"):
                    comments.append(s[3:].strip())
                    continue
                m = re.match(r"#\[prost\((.*)\)\]", s)
                if m:
                    attr = m.group(1)
                    continue
                m = re.match(r"pub (r#)?(\w+): (.*),$", s)
                if m and attr:
                    name, ty = m.group(2), m.group(3)
                    tag = re.search(r'tag = "(\d+)"', attr).group(1)
                    mk = next((c.split("=", 1)[1] for c in comments if c.startswith("+patchMergeKey=")), "-")
                    st = next((c.split("=", 1)[1] for c in comments if c.startswith("+patchStrategy=")), "-")
                    mm = re.match(r'btree_map = "string, (\w+)"', attr)
                    if mm:
                        label = "map"
                        vt = mm.group(1)
                        typ = vt if vt in SCALARS else resolve(ty.split(",", 1)[1], module)
                    else:
                        kind = attr.split(",")[0].split("=")[0].strip()
                        label = "rep" if "repeated" in attr else "opt"
                        typ = kind if kind in SCALARS else resolve(ty, module)
                    out.append("\t".join(["F", tag, name, label, typ or "?", mk, st]))
                    attr = None
                    comments = []
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1])
