#!/usr/bin/env python3
"""Offline JSON schemas for kubeconform, used by `cargo xtask chart-check` (stdlib + PyYAML).

  chart-schemas.py swagger OPENAPI_V2.json OUTDIR   built-in kinds, from the apiserver
  chart-schemas.py crd CRD.yaml OUTDIR              each served version of a CRD

Both write strict, stand-alone schemas in the layout kubeconform expects:
<kind>-<group prefix>-<version>.json.
"""
import copy
import json
import os
import sys

import yaml


def kind_suffix(group, version):
    # Mirrors kubeconform's {{ .KindSuffix }}: first label of the group, then the version.
    return f"-{group.split('.')[0].lower()}-{version.lower()}" if group else f"-{version.lower()}"


def schema_file(kind, group, version):
    return f"{kind.lower()}{kind_suffix(group, version)}.json"


def allow_null(s):
    """A copy of schema s that also accepts null (optional fields may be written as null)."""
    t = s.get("type")
    if isinstance(t, str):
        s = dict(s, type=[t, "null"])
        if "enum" in s and None not in s["enum"]:
            s["enum"] = s["enum"] + [None]
        return s
    return s  # $ref'd objects stay non-null: clearer kubeconform errors


def strictify(s, crd):
    """JSON-schema-ify one OpenAPI schema node, recursively, for kubeconform -strict:
    closed objects, int-or-string, nullable, optional fields nullable."""
    if not isinstance(s, dict):
        return s
    s = dict(s)
    if s.get("format") == "int-or-string" or s.get("x-kubernetes-int-or-string"):
        out = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
        if "description" in s:
            out["description"] = s["description"]
        return out
    if crd and s.pop("nullable", False):
        s = allow_null(s)
    props = s.get("properties")
    if isinstance(props, dict):
        required = set(s.get("required", []))
        new = {}
        for name, sub in props.items():
            sub = strictify(sub, crd)
            if not crd and name not in required:
                sub = allow_null(sub)
            new[name] = sub
        s["properties"] = new
        if "additionalProperties" not in s and not s.get("x-kubernetes-preserve-unknown-fields"):
            s["additionalProperties"] = False
    if isinstance(s.get("additionalProperties"), dict):
        s["additionalProperties"] = strictify(s["additionalProperties"], crd)
    if isinstance(s.get("items"), dict):
        s["items"] = strictify(s["items"], crd)
    for key in ("allOf", "anyOf", "oneOf"):
        if isinstance(s.get(key), list):
            s[key] = [strictify(x, crd) for x in s[key]]
    return s


def refs(node, acc):
    if isinstance(node, dict):
        r = node.get("$ref")
        if isinstance(r, str) and r.startswith("#/definitions/"):
            acc.add(r[len("#/definitions/"):])
        for v in node.values():
            refs(v, acc)
    elif isinstance(node, list):
        for v in node:
            refs(v, acc)


def cmd_swagger(swagger_path, outdir):
    """Built-in kinds from the apiserver's /openapi/v2: one stand-alone strict schema
    per group/version/kind, holding the definitions it references transitively."""
    defs = json.load(open(swagger_path))["definitions"]
    defs = {k: v for k, v in defs.items() if k.startswith("io.k8s.")}  # no CRD types
    q = "io.k8s.apimachinery.pkg.api.resource.Quantity"
    if q in defs:  # "1", 1 and 0.5 are all valid quantities
        defs[q] = {"oneOf": [{"type": "string"}, {"type": "number"}], "description": "Quantity"}
    fixed = {k: strictify(v, crd=False) for k, v in defs.items()}
    os.makedirs(outdir, exist_ok=True)
    count = 0
    for name, d in defs.items():
        for gvk in d.get("x-kubernetes-group-version-kind", []):
            closure, todo = set(), {name}
            while todo:
                n = todo.pop()
                if n in closure or n not in fixed:
                    continue
                closure.add(n)
                acc = set()
                refs(fixed[n], acc)
                todo |= acc - closure
            doc = copy.deepcopy(fixed[name])
            doc["definitions"] = {n: fixed[n] for n in sorted(closure)}
            path = os.path.join(outdir, schema_file(gvk["kind"], gvk["group"], gvk["version"]))
            with open(path, "w") as f:
                json.dump(doc, f)
            count += 1
    if count < 50:
        sys.exit(f"only {count} schemas from {swagger_path}; is it the apiserver's /openapi/v2?")
    print(count)


def cmd_crd(crd_path, outdir):
    """Each served version of a CRD file: its openAPIV3Schema, strict, plus the fields
    every object has (apiVersion, kind, metadata), which CRD schemas leave implicit."""
    os.makedirs(outdir, exist_ok=True)
    for crd in yaml.safe_load_all(open(crd_path)):
        if not crd or crd.get("kind") != "CustomResourceDefinition":
            continue
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for v in crd["spec"]["versions"]:
            s = strictify(copy.deepcopy(v["schema"]["openAPIV3Schema"]), crd=True)
            props = s.setdefault("properties", {})
            props.setdefault("apiVersion", {"type": "string", "enum": [f"{group}/{v['name']}"]})
            props.setdefault("kind", {"type": "string", "enum": [kind]})
            props.setdefault("metadata", {"type": "object"})
            s.setdefault("additionalProperties", False)
            s["required"] = sorted(set(s.get("required", [])) | {"apiVersion", "kind", "metadata"})
            path = os.path.join(outdir, schema_file(kind, group, v["name"]))
            with open(path, "w") as f:
                json.dump(s, f, indent=1)
            print(path)


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"swagger": cmd_swagger, "crd": cmd_crd}[cmd](*args)
