#!/usr/bin/env python3
"""The module include graph of a C folder, and whether it has a circle.

A module is a .c file and its .h (daemon/conn.c + daemon/conn.h = "conn"); module A
depends on B when a file of A does #include "B.h" and B.h is in the folder. Headers of
other folders (proto/, client/) are leaves here. A circle between modules is what makes
one module unreadable without the others, so it fails even when no header includes
itself (the .c files break the file-level circle but not the design one).

  include_graph.py DIR [--forbid A:B ...] [--print]

--forbid A:B fails when module A reaches B (directly or through others). Exit 1 on a
circle or a forbidden path, naming it; --print writes "A -> B C" lines.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)\.h"', re.M)


def graph(folder):
    files = [f for f in os.listdir(folder) if f.endswith(('.c', '.h'))]
    mods = {os.path.splitext(f)[0] for f in files}
    headers = {os.path.splitext(f)[0] for f in files if f.endswith('.h')}
    deps = {m: set() for m in mods}
    for f in files:
        m = os.path.splitext(f)[0]
        with open(os.path.join(folder, f), encoding='utf-8', errors='replace') as fh:
            for inc in INCLUDE.findall(fh.read()):
                name = os.path.basename(inc)
                if name in headers and name != m:
                    deps[m].add(name)
    return deps


def find_cycle(deps):
    """A list of modules forming a circle (first == last), or None."""
    state = {}
    stack = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(deps[m]):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                c = visit(d)
                if c:
                    return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(deps):
        if m not in state:
            c = visit(m)
            if c:
                return c
    return None


def path(deps, a, b):
    """A dependency path a -> ... -> b, or None."""
    seen = {a}
    todo = [[a]]
    while todo:
        p = todo.pop(0)
        for d in sorted(deps.get(p[-1], ())):
            if d == b:
                return p + [d]
            if d not in seen:
                seen.add(d)
                todo.append(p + [d])
    return None


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    folder = argv[1]
    forbid = []
    show = False
    i = 2
    while i < len(argv):
        if argv[i] == '--forbid' and i + 1 < len(argv) and ':' in argv[i + 1]:
            forbid.append(tuple(argv[i + 1].split(':', 1)))
            i += 2
        elif argv[i] == '--print':
            show = True
            i += 1
        else:
            print('include_graph.py: unknown argument %r' % argv[i], file=sys.stderr)
            return 2
    deps = graph(folder)
    if show:
        for m in sorted(deps):
            print('%s -> %s' % (m, ' '.join(sorted(deps[m])) or '-'))
    bad = 0
    c = find_cycle(deps)
    if c:
        print('%s: circle between modules: %s' % (folder, ' -> '.join(c)))
        bad = 1
    for a, b in forbid:
        if a not in deps:
            print('%s: --forbid names no module %r' % (folder, a))
            bad = 1
            continue
        p = path(deps, a, b)
        if p:
            print('%s: %s must not depend on %s: %s' % (folder, a, b, ' -> '.join(p)))
            bad = 1
    return bad


if __name__ == '__main__':
    sys.exit(main(sys.argv))
