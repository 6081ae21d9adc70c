#!/usr/bin/env python3
"""k8s_mutate: writes a broken copy of one manifest, for k8s_check's negative tests.

    k8s_mutate.py FILE PATH set JSON_VALUE     set a field (created if absent)
    k8s_mutate.py FILE PATH del                delete a field
    k8s_mutate.py FILE PATH ren NEW_KEY        rename a key (keeps its value)

Edits FILE in place (run it on a copy). FILE holds one YAML document. PATH is dotted
with list indices: spec.template.spec.containers[0].ports[0].name. Exit 1 when PATH
does not lead anywhere, so a test never passes because its mutation silently missed.
"""
import json
import re
import sys

import yaml


def walk(doc, path):
    """Returns (parent, last key or index) of PATH inside doc."""
    steps = []
    for part in path.split("."):
        m = re.fullmatch(r"([^\[\]]+)((?:\[\d+\])*)", part)
        if not m:
            raise KeyError(f"bad path element {part!r}")
        steps.append(m.group(1))
        steps += [int(i) for i in re.findall(r"\[(\d+)\]", m.group(2))]
    node = doc
    for s in steps[:-1]:
        node = node[s]
    return node, steps[-1]


def mutate(path, field, op, value=None):
    """Applies one edit to the YAML file at path; KeyError when field is not there."""
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    try:
        parent, key = walk(doc, field)
        if op == "set":
            parent[key] = json.loads(value)
        elif op == "del":
            del parent[key]
        elif op == "ren":
            parent[value] = parent.pop(key)
        else:
            raise KeyError(f"unknown op {op!r}")
    except (IndexError, TypeError) as e:
        raise KeyError(str(e)) from e
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(doc, f, sort_keys=False)


def main(argv):
    if len(argv) < 4 or argv[3] not in ("set", "del", "ren") or (argv[3] != "del" and len(argv) != 5):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    try:
        mutate(argv[1], argv[2], argv[3], argv[4] if len(argv) == 5 else None)
    except KeyError as e:
        print(f"k8s_mutate: {argv[2]} not found in {argv[1]}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
