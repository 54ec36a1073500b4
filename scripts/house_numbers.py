#!/usr/bin/env python3
"""The house's numbers, held against ARCHITECTURE.md's "Layering (checked)" section.

Reads the crate's sources (src/, outside test modules) and checks:
- layering: no module imports a module of a layer above it, except the imports the
  `layer-exceptions` block names (file -> module, with why), at most 2;
- circles: the modules that import each other in a loop are the ones the `circles` block names;
- file sizes: a source file over 500 lines is one the `one-concept-files` block names;
- ceilings: public types and duplicated passages (pairs of places sharing six or more
  identical lines) at most the `ceilings` block's figures, so that they cannot drift back.
Prints every figure; exits 1 on the first broken rule it reports (all are reported).

Usage: scripts/house_numbers.py [REPO]   (default: the repository this script is in)
"""

import hashlib
import itertools
import pathlib
import re
import sys
from collections import defaultdict

# Check and tool code above every layer: not held to the layering.
OUTSIDE = {"testing", "model", "bin", "lib", "guide"}
MAX_EXCEPTIONS = 2
LONG_FILE = 500
WINDOW = 6
TOO_COMMON = 8


def blocks(architecture):
    """The fenced blocks of ARCHITECTURE.md by their info string."""
    found = {}
    for name, body in re.findall(r"```([a-z-]+)\n(.*?)```", architecture, re.S):
        found[name] = [line for line in body.splitlines() if line.strip()]
    return found


def module_of(path, src):
    """The crate's top-level module a file belongs to."""
    rel = path.relative_to(src)
    return rel.parts[0].removesuffix(".rs")


def module_path(path, src):
    """A file's module path: src/store/dynamodb/writes.rs -> store, dynamodb, writes."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return parts


def code_of(text):
    """A file's code outside its unit tests, without whole-line comments (a trailing comment
    that names a module counts: a false alarm, never a false pass)."""
    # A test module runs to its closing brace at column 0 (rustfmt indents what is inside);
    # code after it counts.
    text = re.sub(r"(?ms)^#\[cfg\(test\)\]\s*\nmod \w+ \{\n.*?^\}$", "", text)
    return re.sub(r"(?m)^\s*//.*$", "", text)


def sources(src):
    return sorted(p for p in src.rglob("*.rs") if module_of(p, src) not in {"testing", "model"})


IDENT = re.compile(r"[A-Za-z_][A-Za-z_0-9]*|\*")


def use_tree(text, i):
    """The paths of the use tree (or inline path) starting at text[i], as segment lists, and
    where it ends: `a::{b, c::d}` -> [a, b], [a, c, d]."""
    segments = []
    while True:
        while i < len(text) and text[i] in " \t\n":
            i += 1
        if i < len(text) and text[i] == "{":
            i += 1
            paths = []
            while True:
                while i < len(text) and text[i] in " \t\n,":
                    i += 1
                if i >= len(text) or text[i] == "}":
                    return [segments + p for p in paths] or [segments], i + 1
                sub, i = use_tree(text, i)
                paths += sub
        match = IDENT.match(text, i)
        if not match:
            return [segments], i
        segments.append(match.group())
        i = match.end()
        if text.startswith("::", i):
            i += 2
            continue
        return [segments], i


def references(path, src, text):
    """Every path from the crate's root this file names (crate::…, super::… reaching the root),
    each with whether it stands in a `pub use` statement (a re-export)."""
    reexports = [(m.start(), m.end()) for m in re.finditer(r"pub use [^;]*;", text)]
    found = []
    here = module_path(path, src)
    for match in re.finditer(r"\b(crate|(?:super::)+)(::)?", text):
        if match.group(1) == "crate":
            if not match.group(2):
                continue
            base = []
        else:
            ups = match.group(1).count("super")
            base = here[: len(here) - ups] if ups <= len(here) else []
            if base:
                continue  # within the file's own top-level module
        trees, _ = use_tree(text, match.end())
        in_reexport = any(a <= match.start() < b for a, b in reexports)
        found += [(tree, in_reexport) for tree in trees if tree]
    return found


def root_names(src):
    """What lib.rs re-exports at the root: name -> the top-level module it comes from."""
    names = {}
    text = code_of((src / "lib.rs").read_text())
    for match in re.finditer(r"pub use ([^;]*);", text):
        for tree in use_tree(match.group(1), 0)[0]:
            if len(tree) >= 2:
                names[tree[-1]] = tree[0]
    return names


def imports(src, exceptions, repo):
    """(file, its module) -> {(imported module, whether a re-export allows it)}: every module
    named as crate::m, through a root re-export (crate::Name), through a named exception's
    re-export (crate::execution::ExecutionContext is the engine's), or by super:: reaching the
    root."""
    roots = root_names(src)
    # Names an exception re-exports belong to the module it re-exports them from.
    owners = {}
    for file, module in exceptions:
        text = code_of((repo / file).read_text())
        owner_module = module_of(repo / file, src)
        for match in re.finditer(r"pub use crate::([^;]*);", text):
            for tree in use_tree(match.group(1), 0)[0]:
                if tree and tree[0] == module:
                    owners[(owner_module, tree[-1])] = module
    edges = defaultdict(set)
    for path in sources(src):
        module = module_of(path, src)
        if module in OUTSIDE:
            continue
        for tree, in_reexport in references(path, src, code_of(path.read_text())):
            first = tree[0]
            if first in ("self", "*"):
                continue
            name = first if first[0].islower() else roots.get(first)
            if name is None:
                continue
            leaf = tree[-1] if first[0].islower() else first
            name = owners.get((name, leaf), name)
            if name != module:
                edges[(path, module)].add((name, in_reexport))
    return edges


def circles(edges, exceptions, repo):
    """Sets of modules that import each other in a loop (Tarjan's strongly connected parts),
    the named exceptions (re-exports at an earlier path) left out."""
    graph = defaultdict(set)
    for (path, module), names in edges.items():
        file = str(path.relative_to(repo))
        graph[module] |= {
            n for n, reexport in names if not (reexport and (file, n) in exceptions) and n not in OUTSIDE
        }
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = set()
            while True:
                top = stack.pop()
                on.discard(top)
                part.add(top)
                if top == node:
                    break
            if len(part) > 1:
                found.append(frozenset(part))

    for node in list(graph):
        if node not in index:
            visit(node)
    return found


def public_types(src):
    names = set()
    for path in sources(src):
        if module_of(path, src) in OUTSIDE:
            continue
        for kind, name in re.findall(
            r"^\s*pub (struct|enum|trait|type) ([A-Za-z0-9_]+)", code_of(path.read_text()), re.M
        ):
            names.add((kind, name))
    return len(names)


def duplicated_passages(src):
    """Pairs of places (two files, or two parts of one) sharing a run of WINDOW or more
    identical significant lines; a run found in more than TOO_COMMON places is boilerplate."""
    windows = defaultdict(list)
    for path in sorted(src.rglob("*.rs")):
        lines = [
            (n, line.strip())
            for n, line in enumerate(path.read_text().splitlines(), 1)
            if len(line.strip()) > 3 and not line.strip().startswith("//")
        ]
        for i in range(len(lines) - WINDOW + 1):
            run = "\n".join(text for _, text in lines[i : i + WINDOW])
            windows[hashlib.sha1(run.encode()).digest()].append((str(path), i))
    runs = defaultdict(list)
    for places in windows.values():
        if len(places) < 2 or len(places) > TOO_COMMON:
            continue
        for (a, i), (b, j) in itertools.combinations(sorted(places), 2):
            if a == b and abs(i - j) < WINDOW:
                continue
            runs[(a, b, j - i)].append(i)
    pairs = 0
    for starts in runs.values():
        starts.sort()
        # Consecutive windows at one offset are one passage.
        pairs += 1 + sum(1 for x, y in zip(starts, starts[1:]) if y != x + 1)
    return pairs


def main():
    repo = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
    src = repo / "src"
    spec = blocks((repo / "ARCHITECTURE.md").read_text())
    broken = []

    layers = {}
    for depth, line in enumerate(spec["layers"]):
        for module in line.split():
            layers[module] = depth
    exceptions = {}
    for line in spec["layer-exceptions"]:
        file, rest = line.split(" -> ", 1)
        module, why = rest.split(":", 1)
        exceptions[(file.strip(), module.strip())] = why.strip()
    if len(exceptions) > MAX_EXCEPTIONS:
        broken.append(f"{len(exceptions)} layering exceptions named, at most {MAX_EXCEPTIONS}")

    edges = imports(src, exceptions, repo)
    upward = set()
    allowed = set()
    for (path, module), names in sorted(edges.items()):
        file = str(path.relative_to(repo))
        if module not in layers:
            broken.append(f"{file}: module `{module}` is in no layer of ARCHITECTURE.md")
            continue
        for name, in_reexport in sorted(names):
            if name in OUTSIDE:
                broken.append(f"{file} imports `{name}`, which stands above every layer")
            elif name in layers and layers[name] < layers[module]:
                if in_reexport and (file, name) in exceptions:
                    allowed.add((file, name))
                else:
                    upward.add((file, name))
    for file, name in sorted(upward):
        broken.append(f"{file} imports `{name}`, a layer above it, and ARCHITECTURE.md names no exception for it (only a `pub use` re-export can be one)")
    for file, name in exceptions:
        if (file, name) not in allowed:
            broken.append(f"the exception {file} -> {name} no longer exists: remove it from ARCHITECTURE.md")
    print(f"layering: no import of a layer above but {len(allowed)} named re-exports (at most {MAX_EXCEPTIONS})")

    named_circles = {frozenset(line.split(":", 1)[0].split()) for line in spec["circles"]}
    found = set(circles(edges, exceptions, repo))
    for part in found - named_circles:
        broken.append(f"a circle ARCHITECTURE.md does not name: {' '.join(sorted(part))}")
    for part in named_circles - found:
        broken.append(f"the named circle {' '.join(sorted(part))} is gone: remove it from ARCHITECTURE.md")
    print(f"circles between modules: {len(found)} ({'; '.join(' '.join(sorted(p)) for p in found) or 'none'})")

    concepts = {line.split(":", 1)[0].strip() for line in spec["one-concept-files"]}
    long_files = {
        str(p.relative_to(repo)): len(p.read_text().splitlines())
        for p in sources(src)
        if len(p.read_text().splitlines()) > LONG_FILE
    }
    for file, length in sorted(long_files.items()):
        if file not in concepts:
            broken.append(f"{file} has {length} lines, over {LONG_FILE}, and is not named as one concept")
    for file in sorted(concepts - long_files.keys()):
        broken.append(f"{file} is named as a long file but has {LONG_FILE} lines or fewer: remove it")
    print(f"files over {LONG_FILE} lines: {len(long_files)}, each named as one concept")

    ceilings = {}
    for line in spec["ceilings"]:
        name, rest = line.split(":", 1)
        ceilings[name.strip()] = int(rest.split()[0])
    for name, figure in [
        ("public types", public_types(src)),
        ("duplicated passages", duplicated_passages(src)),
    ]:
        ceiling = ceilings[name]
        print(f"{name}: {figure} (ceiling {ceiling})")
        if figure > ceiling:
            broken.append(f"{name}: {figure}, over the ceiling of {ceiling}")

    sys.stdout.flush()
    for line in broken:
        print(f"BROKEN: {line}", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
