#!/usr/bin/env python3
"""Fails when files of the library's crate import each other in a circle.

Usage: python3 scripts/import-cycles.py [SRC_DIR]   (default: src; src/bin/hipobj
for the command, whose main.rs is its root)

Each file of SRC_DIR (but src/bin/, whose programs are crates of their own)
is a module; a file depends on another when its code (its unit tests
apart) names a path into it: `crate::a::b::Item`, `super::b::Item`,
`self::b`, or an item of a `use crate::{...}` / `use super::{...}` group.
A path is taken to the deepest module file it reaches, so an item of
`gateway/mod.rs` is that file's. A module's own parent and children (a
`mod.rs` naming its files by bare paths) are not counted: a module and its
parts are one concern; so are the files of each folder in ONE_CONCERN,
whose objects keep each other by design (the reason beside each). Any
strongly connected set of two files or more is printed, with the edges
that make it, and the exit status is 1.
"""

import os
import re
import sys


# Folders whose files are one concern: their circles are not reported.
ONE_CONCERN = {
    # A device context makes its queues, regions and windows, which keep
    # their context (and the loaded library's table) alive.
    ("platform", "verbs"): "the libibverbs binding",
    # The loaded runtime's table makes the owners of device memory and
    # events, which call the table to free them.
    ("platform", "gpu"): "the GPU runtimes' binding",
}


def concern_of(module):
    """The ONE_CONCERN folder `module` is in, else the module itself."""
    for folder in ONE_CONCERN:
        if module[: len(folder)] == folder:
            return folder
    return module


def module_of(path, root):
    """src/a/b.rs -> ('a', 'b'); src/a/mod.rs -> ('a',); src/lib.rs -> ()."""
    parts = os.path.relpath(path, root)[: -len(".rs")].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def code_of(text):
    """The file's code without comments and without its unit tests."""
    cut = text.find("#[cfg(test)]\nmod tests")
    if cut >= 0:
        text = text[:cut]
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def groups(code):
    """(head, [item paths]) of each `use crate::{...}` / `use super::{...}`,
    nested braces read: `use super::{a::{B, C}, d}` gives a::B, a::C, d."""
    for m in re.finditer(r"\buse\s+(crate|super)::\{", code):
        depth, start, i = 1, m.end(), m.end()
        while i < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        yield m.group(1), list(flatten("", code[start : i - 1]))


def flatten(prefix, body):
    """The paths of a use group's body, each with `prefix`."""
    depth, item = 0, ""
    for ch in body + ",":
        if ch == "," and depth == 0:
            item = item.strip()
            if item:
                m = re.match(r"([\w:]*?)::\{(.*)\}$", item, re.S)
                if m:
                    yield from flatten(prefix + m.group(1) + "::", m.group(2))
                else:
                    yield prefix + item.split(" as ")[0].strip()
            item = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        item += ch
    return


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "src"
    files = {}
    for directory, _, names in os.walk(root):
        if os.path.relpath(directory, root).split(os.sep)[0] == "bin":
            continue
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as f:
                    files[path] = f.read()
    by_module = {module_of(p, root): p for p in files}

    def target(parts):
        for n in range(len(parts), 0, -1):
            if tuple(parts[:n]) in by_module:
                return by_module[tuple(parts[:n])]
        return None

    edges = {p: {} for p in files}
    for path, text in files.items():
        code = code_of(text)
        me = module_of(path, root)

        def reach(head, rest, why):
            if head == "crate":
                parts = rest
            elif head == "self":
                parts = list(me) + rest
            else:  # super: the module's parent
                parts = list(me[:-1]) + rest
            t = target([p for p in parts if p])
            if t is None or t == path:
                return
            # A module and its own parts are one concern.
            tm = module_of(t, root)
            if tm == me[: len(tm)] or me == tm[: len(me)]:
                return
            if concern_of(tm) == concern_of(me) and concern_of(me) in ONE_CONCERN:
                return
            edges[path].setdefault(t, why)

        for m in re.finditer(r"\b(crate|super|self)((?:::[a-z_][a-z0-9_]*)+)", code):
            reach(m.group(1), m.group(2).strip(":").split("::"), m.group(0))
        for head, items in groups(code):
            for item in items:
                parts = [p for p in item.split("::") if re.fullmatch(r"[a-z_][a-z0-9_]*", p)]
                if parts:
                    reach(head, parts, f"{head}::{{{item}}}")

    index, low, stack, on, sets, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(100000)

    def connect(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                sets.append(sorted(members))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    if not sets:
        print(f"import-cycles: no circle between the {len(files)} files of {root} (its bin/ apart)")
        return 0
    for members in sets:
        print(f"import-cycles: these files import each other in a circle: {', '.join(members)}")
        for m in members:
            for t, why in sorted(edges[m].items()):
                if t in members:
                    print(f"  {m} -> {t} ({why})")
    print("Move what both need below both, or let the lower one take a trait the upper one implements.")
    return 1


if __name__ == "__main__":
    sys.exit(main())
