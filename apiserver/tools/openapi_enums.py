#!/usr/bin/env python3
"""Extract the enum values of the built-in kinds' enum-typed string fields from the Go API
types (a checkout of https://github.com/kubernetes/api, i.e. k8s.io/api) into
apiserver/src/openapi/enums.tsv, the table the OpenAPI generator applies
(src/openapi/generate.rs, `scripts/update-openapi`).

Why from the Go types: kube-apiserver's served documents carry `enum` (and a "Possible
enum values:" paragraph in the description) for every field whose Go type is a string type
marked `+enum` (kube-openapi's enum.go: the values are every constant of that type, sorted;
a pointer to it counts, slices and maps do not). The committed api/openapi-spec files and
so k8s-openapi's schemas have neither, so the types are the only source of these facts.

    apiserver/tools/openapi_enums.py PATH/TO/kubernetes-api apiserver/openapi/v2.json \
        > apiserver/src/openapi/enums.tsv

The second argument keeps the table to the definitions and properties our documents have.
"""
import json
import os
import re
import sys

TYPE_RE = re.compile(r"^(?:type\s+)?([A-Z]\w*)\s+string\s*$")
STRUCT_RE = re.compile(r"^type\s+([A-Z]\w*)\s+struct\s*\{\s*$")
CONST_RE = re.compile(r'^(?:const\s+)?([A-Za-z_]\w*)\s+((?:\w+\.)?[A-Z]\w*)\s*=\s*"((?:[^"\\]|\\.)*)"')
FIELD_RE = re.compile(r"^([A-Z]\w*)\s+(\*?)((?:\w+\.)?\w+)\s+`([^`]*)`")
EMBED_RE = re.compile(r"^(\*?)((?:\w+\.)?[A-Z]\w*)\s+`([^`]*)`")
IMPORT_RE = re.compile(r'^(?:import\s+)?(\w+\s+)?"(k8s\.io/api/[^"]+)"')


def package_files(root):
    for dirpath, _, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel.startswith(".") or "/testdata" in rel or "/fuzzer" in rel:
            continue
        gos = [
            os.path.join(dirpath, f)
            for f in sorted(files)
            if f.endswith(".go") and not f.endswith("_test.go") and not f.startswith("zz_generated")
            and not f.endswith(".pb.go")
        ]
        if gos:
            yield "k8s.io/api/" + rel.replace(os.sep, "/"), gos


def parse_package(pkg, files):
    """(enum types, constants, structs) of one package."""
    enums, consts, structs = set(), [], {}
    for path in files:
        lines = open(path, encoding="utf-8").read().split("\n")
        imports = {}
        comments = []
        struct = None
        for raw in lines:
            line = raw.strip()
            m = IMPORT_RE.match(line)
            if m:
                alias = (m.group(1) or "").strip() or m.group(2).rsplit("/", 1)[1]
                imports[alias] = m.group(2)
            if line.startswith("//"):
                text = line[2:]
                comments.append(text[1:] if text.startswith(" ") else text)
                continue
            if struct is not None:
                if line == "}":
                    struct = None
                else:
                    m = FIELD_RE.match(line)
                    tag = None
                    if m:
                        tag = re.search(r'json:"([^"]*)"', m.group(4))
                        if tag:
                            name = tag.group(1).split(",")[0]
                            if name and name != "-":
                                structs[struct].append(("field", name, qualify(m.group(3), pkg, imports)))
                    else:
                        m = EMBED_RE.match(line)
                        # `json:",inline"`, or an embedded struct without a JSON name (Go's
                        # encoding/json inlines it too: EphemeralContainerCommon).
                        if m and re.search(r'json:"(,inline)?"', m.group(3)):
                            structs[struct].append(("inline", None, qualify(m.group(2), pkg, imports)))
                comments = []
                continue
            m = STRUCT_RE.match(line)
            if m:
                struct = m.group(1)
                structs[struct] = []
                comments = []
                continue
            m = TYPE_RE.match(line)
            if m and (line.startswith("type ") or raw.startswith("\t")) and "+enum" in [c.strip() for c in comments]:
                enums.add((pkg, m.group(1)))
            m = CONST_RE.match(line)
            if m:
                value = json.loads('"' + m.group(3) + '"')
                consts.append((qualify(m.group(2), pkg, imports), m.group(1), value, list(comments)))
            comments = []
    return enums, consts, structs


def qualify(t, pkg, imports):
    if "." in t:
        alias, name = t.split(".", 1)
        return (imports.get(alias, alias), name)
    return (pkg, t)


def definition(pkg, name):
    return "io.k8s.api." + pkg[len("k8s.io/api/"):].replace("/", ".") + "." + name


def value_line(const_name, value, comment_lines):
    """kube-openapi's ` - `"value"` comment` line."""
    comment = " ".join(comment_lines).strip()
    if comment.startswith(const_name):
        comment = comment[len(const_name):]
    comment = re.sub(r"\s+", " ", comment.strip())
    return comment


def main():
    root, ours = sys.argv[1], sys.argv[2]
    ours = json.load(open(ours))["definitions"]
    enums, consts, structs = set(), [], {}
    for pkg, files in package_files(root):
        e, c, s = parse_package(pkg, files)
        enums |= e
        consts += c
        for name, members in s.items():
            structs[(pkg, name)] = members
    values = {e: [] for e in enums}
    for typ, name, value, comments in consts:
        if typ in values and all(v != value for v, _ in values[typ]):
            values[typ].append((value, value_line(name, value, comments)))

    def members(key, seen=()):
        for kind, name, typ in structs.get(key, []):
            if kind == "inline":
                if typ not in seen:
                    yield from members(typ, seen + (typ,))
            else:
                yield name, typ

    rows = []
    for (pkg, sname) in sorted(structs):
        defn = definition(pkg, sname)
        props = ours.get(defn, {}).get("properties", {})
        for prop, typ in members((pkg, sname)):
            if typ not in values or not values[typ] or prop not in props:
                continue
            if props[prop].get("type") != "string":
                continue
            lines = sorted(values[typ], key=lambda v: (" - `" + json.dumps(v[0]) + "` " + v[1]).rstrip())
            for value, desc in lines:
                rows.append((defn, prop, value, desc))
    out = sys.stdout
    out.write(
        "# The enum values of the built-in kinds' enum-typed string fields, as kube-apiserver's\n"
        "# OpenAPI v2/v3 documents carry them (`enum` and a \"Possible enum values:\" paragraph in\n"
        "# the description); k8s-openapi's schemas do not have them. Facts from the Go API types\n"
        "# (k8s.io/api, `+enum` string types and their constants), extracted by\n"
        "# apiserver/tools/openapi_enums.py; applied by src/openapi/generate.rs.\n"
        "# definition<TAB>property<TAB>value<TAB>the value's description; rows in upstream's order.\n"
    )
    for r in rows:
        out.write("\t".join(r) + "\n")
    print(f"{len(rows)} values of {len({(r[0], r[1]) for r in rows})} fields", file=sys.stderr)


if __name__ == "__main__":
    main()
