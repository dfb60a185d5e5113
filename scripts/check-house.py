#!/usr/bin/env python3
"""What src/lib.rs's map and docs/architecture.md's walks promise of the house, checked
(scripts/test.sh runs it).

- Every `file.rs` path lib.rs's doors table names exists under src/; each door's service and
  transport have a file of the door's name; a module with children is `name/mod.rs`.
- Top-level modules form layers: no cycle among the arrows `crate::other` draws between them,
  and lib.rs's "uses" column is those arrows.
- Inside a module, no cycle among sibling files: a file points at a sibling when it names it
  (`super::sibling`) or an item the sibling defines (`super::Item`, `super::{A, B}`).
  `mod.rs` re-exports are not arrows: a child naming its parent's items points up, not across.
- No file over 600 lines, no function over 80.
- Each file a walk of docs/architecture.md names exists and is called by one named before it.
- `server/` names no door outside `server/doors.rs`.
- Every code name a page or a comment quotes exists.
- Each module's `//!` opener names the children lib.rs's tables give it.
- No type name defined twice in src/ (test code left out), but for the few listed with why.
- No tuple-typed field in src/ but a name with its value (labels, tags), listed.

Exits 1 naming each failure. Usage: python3 scripts/check-house.py [SRC_DIR]
"""
import os
import re
import sys

SRC = sys.argv[1] if len(sys.argv) > 1 else "src"
# The repository: the folder holding SRC (its docs, tests, benches, examples).
ROOT = os.path.dirname(os.path.abspath(SRC.rstrip("/"))) or "."
MAX_LINES = 600
failures = []


def code_of(path):
    text = open(path, encoding="utf-8").read()
    # Test modules and comments draw no arrows.
    text = re.sub(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*;", "", text)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return re.sub(r"//[^\n]*", "", "".join(out))


def cycles(edges):
    """Every node on a cycle, as sorted lists of strongly connected components (Tarjan)."""
    index, low, stack, on, comps, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return comps


# 2. Top-level modules.
top = {}
for entry in sorted(os.listdir(SRC)):
    full = os.path.join(SRC, entry)
    name = entry.removesuffix(".rs")
    if entry in ("lib.rs", "main.rs"):
        continue
    files = []
    if os.path.isdir(full):
        for root, _, fs in os.walk(full):
            if "tests" in os.path.relpath(root, full).split(os.sep):
                continue
            files += [os.path.join(root, f) for f in fs if f.endswith(".rs") and f != "tests.rs"]
    elif entry.endswith(".rs"):
        files = [full]
    top[name] = files
edges = {}
for name, files in top.items():
    used = set()
    for f in files:
        used |= set(re.findall(r"\bcrate::([a-z_]+)", code_of(f)))
    edges[name] = sorted(u for u in used if u in top and u != name)
for comp in cycles(edges):
    failures.append("a cycle between top-level modules: " + " -> ".join(comp))

# 2b. The "uses" column of src/lib.rs's table is what the code imports.
lib = open(os.path.join(SRC, "lib.rs"), encoding="utf-8").read()
rows = re.findall(r"^//! \| (`[^|]*`) \| [^|]* \| ([^|]*) \|$", lib, re.M)
seen = set()
for first, uses in rows:
    mods = [m.removesuffix(".rs") for m in re.findall(r"`([a-z_.]+)`", first)]
    said = set(re.findall(r"`([a-z_]+)`", uses))
    for m in mods:
        if m == "main":
            continue
        seen.add(m)
        if m not in top:
            failures.append(f"src/lib.rs's table names a module {m}, which does not exist")
        elif said != set(edges[m]):
            failures.append(f"src/lib.rs's table: {m} uses {', '.join(edges[m]) or 'nothing'}, "
                            f"not {', '.join(sorted(said)) or 'nothing'}")
for m in sorted(set(top) - seen):
    failures.append(f"src/lib.rs's table leaves out the module {m}")

# 3. Sibling files inside each module.
DEF = re.compile(r"^\s*pub(?:\([a-z:]+\))?\s+(?:async\s+)?(?:struct|enum|fn|trait|type|const|static)\s+(\w+)", re.M)
for root, dirs, fs in os.walk(SRC):
    if os.path.samefile(root, SRC):
        continue
    nodes = {f.removesuffix(".rs"): os.path.join(root, f) for f in fs
             if f.endswith(".rs") and f not in ("mod.rs", "tests.rs")}
    for d in dirs:
        if os.path.exists(os.path.join(root, d, "mod.rs")):
            nodes[d] = os.path.join(root, d, "mod.rs")
    texts = {n: code_of(p) for n, p in nodes.items()}
    defines = {}
    for n, t in texts.items():
        for item in DEF.findall(t):
            defines.setdefault(item, set()).add(n)
    edges = {}
    for n, t in texts.items():
        named = set()
        for m in re.finditer(r"\bsuper::(\{[^;]*?\}|[A-Za-z_][A-Za-z0-9_:]*)", t):
            named |= set(re.findall(r"[A-Za-z_]\w*", m.group(1)))
        edges[n] = sorted({s for s in nodes if s != n and (s in named or named & {i for i, o in defines.items() if s in o})})
    for comp in cycles(edges):
        failures.append(f"a cycle between the files of {os.path.relpath(root, SRC)}/: " + ", ".join(comp))

# 4. File sizes.
for root, _, fs in os.walk(SRC):
    for f in fs:
        if f.endswith(".rs"):
            p = os.path.join(root, f)
            n = sum(1 for _ in open(p, encoding="utf-8"))
            if n > MAX_LINES:
                failures.append(f"{p} has {n} lines (at most {MAX_LINES})")

# 4b. Function sizes: from `fn` to its closing brace, comments included, at most 80 lines.
MAX_FN_LINES = 80
FN = re.compile(r"\s*(?:pub(?:\([^)]*\))?\s+)?(?:async\s+)?(?:const\s+)?(?:unsafe\s+)?fn\s+(\w+)")
for root, _, fs in os.walk(SRC):
    for f in fs:
        if not f.endswith(".rs"):
            continue
        p = os.path.join(root, f)
        lines = open(p, encoding="utf-8").read().split("\n")
        for i, line in enumerate(lines):
            m = FN.match(line)
            if not m:
                continue
            depth, started, j = 0, False, i
            while j < len(lines):
                code = re.sub(r'"(?:\\.|[^"\\])*"', '""', re.sub(r"//.*", "", lines[j]))
                code = re.sub(r"'(?:\\.|[^'\\])'", "''", code)
                if not started and ";" in code and "{" not in code:
                    break
                for ch in code:
                    depth += {"{": 1, "}": -1}.get(ch, 0)
                    started = started or ch == "{"
                if started and depth == 0:
                    break
                j += 1
            if started and j - i + 1 > MAX_FN_LINES:
                failures.append(f"{p}:{i + 1}: fn {m.group(1)} has {j - i + 1} lines "
                                f"(at most {MAX_FN_LINES})")

# 5. The walks in docs/architecture.md: every file they name exists, and each one after the first is
# called by a file named before it: that file names its module (`mod x`, `x::`), a type it
# defines (`pub struct`, `enum`, `trait`, `type`) or one of its free functions, the names
# many files define left out.
every = {os.path.relpath(os.path.join(r, f), SRC) for r, _, fs in os.walk(SRC) for f in fs
         if f.endswith(".rs")}
ITEM = re.compile(r"^(?:pub(?:\([a-z:]+\))?\s+(?:async\s+)?fn|\s*pub(?:\([a-z:]+\))?\s+"
                  r"(?:struct|enum|trait|type))\s+(\w+)", re.M)
defined, texts = {}, {}
for p in every:
    texts[p] = code_of(os.path.join(SRC, p))
    for item in set(ITEM.findall(texts[p])):
        defined.setdefault(item, set()).add(p)
common = {n for n, ps in defined.items() if len(ps) > 6}


def module_names(path):
    """The names a caller may use for the module of `path` (`limiter/shard/mod.rs`: shard)."""
    parts = path.removesuffix(".rs").split("/")
    if parts[-1] == "mod":
        parts = parts[:-1]
    return {parts[-1]} if parts else set()


def calls(caller, callee):
    t = texts[caller]
    for m in module_names(callee):
        if re.search(rf"\bmod\s+{m}\b|\b{m}::", t):
            return True
    items = {n for n, ps in defined.items() if callee in ps} - common
    return any(re.search(rf"\b{re.escape(n)}\b", t) for n in items)


ARCH = os.path.join(ROOT, "docs", "architecture.md")
arch = open(ARCH, encoding="utf-8").read() if os.path.exists(ARCH) else ""
for title in ("## The walk of one decision", "## The walk of a decision through Redis",
              "## The walk of a save", "## The walk of a Limitador call"):
    at = arch.find(title)
    if at < 0:
        failures.append(f"docs/architecture.md has no walk titled {title!r}")
        continue
    end = arch.find("\n## ", at + 1)
    text = arch[at:end if end > 0 else len(arch)]
    text = text[:text.find("\nAt start")] if "\nAt start" in text else text
    named = []
    for path in re.findall(r"`src/([a-z_/]+\.rs)`", text):
        if path not in named:
            named.append(path)
    for i, path in enumerate(named):
        if path not in every:
            failures.append(f"docs/architecture.md's walk names src/{path}, which does not exist")
        elif i and not any(calls(c, path) for c in named[:i] if c in every):
            failures.append(f"docs/architecture.md's walk names src/{path}, which no file before "
                            "it calls")

# 5b. The doors: every file src/lib.rs's doors section names exists, and `server/` names no
# door's module or service outside `server/doors.rs`, where doors are built (a door wired
# anywhere else would skip what the seam keeps).
at = lib.find("# The doors")
# Each row of the doors table: the door's name and its cells, `| file | ... |`.
DOOR_ROWS = []
if at < 0:
    failures.append("src/lib.rs has no section titled '# The doors'")
else:
    end = lib.find("\n//! # ", at + 1)
    DOOR_ROWS = re.findall(r"^//! \| `([a-z]+)`[^|]*((?:\|[^|\n]*)+)\|$", lib[at:], re.M)
    for path in set(re.findall(r"`([a-z_]+/[a-z_/]+\.rs)`", lib[at:end])):
        if not path.startswith("tests/") and path not in every:
            failures.append(f"src/lib.rs's doors section names {path}, which does not exist")
    for path in set(re.findall(r"`(tests/[a-z_/]+(?:\.rs|/))`", lib[at:end])):
        if not os.path.exists(os.path.join(ROOT, path)):
            failures.append(f"src/lib.rs's doors section names {path}, which does not exist")
DOOR_NAMES = re.compile(
    r"\b(Limitador\w*|Kuadrant\w*|Gocc\w*|Throttle\w*|Rlqs\w*"
    r"|LabelsExpr|CustomLabels)\b|\b(limitador|kuadrant|rlqs|throttle|gocc|quota)::")
for p in sorted(every):
    if p.startswith("server/") and p != "server/doors.rs":
        for n, line in enumerate(texts[p].splitlines(), 1):
            m = DOOR_NAMES.search(line)
            if m:
                failures.append(f"src/{p}:{n} names the door `{m.group(0)}` outside server/doors.rs")

# 6. The code names the docs and the comments use, in backquotes, exist: a path into one of
# the crate's modules (`limiter::shard::Backing`, `crate::config::LiveConfig`) names, segment
# by segment, modules and items defined in src/ or tests/; a macro (`with_decider!`) is one
# defined there, or Rust's own. A rename cannot leave a page or a comment pointing at nothing.
trees = [os.path.join(ROOT, d) for d in ("src", "tests", "benches", "examples", "fuzz")]
rust = [os.path.join(r, f) for t in trees for r, _, fs in os.walk(t) for f in fs
        if f.endswith(".rs") and "/target/" not in r]
DEF = re.compile(r"\b(?:macro_rules!|struct|enum|trait|fn|type|mod|const|static)\s+(\w+)")
VARIANT = re.compile(r"^\s+([A-Z]\w*)\s*(?:[,({]|$)", re.M)
names, macros = set(), set()
for p in rust:
    t = open(p, encoding="utf-8").read()
    names.update(DEF.findall(t))
    names.update(VARIANT.findall(t))
    macros.update(re.findall(r"macro_rules!\s+(\w+)", t))
names.update(os.path.basename(p).removesuffix(".rs") for p in rust)
names.update(d for p in rust for d in os.path.dirname(p).split(os.sep))
RUST_MACROS = {"assert", "assert_eq", "assert_ne", "debug_assert", "debug_assert_eq", "format",
               "include_str", "include_bytes", "matches", "panic", "println", "eprintln",
               "unreachable", "todo", "vec", "write", "writeln", "select", "join", "pin",
               "json", "env", "concat", "cfg", "macro_rules", "info", "warn", "debug", "error",
               "trace", "format_args", "thread_local", "try_join", "smallvec", "compile_error"}
crate_mods = set(top) | {"crate", "turnstile"}


def module_file(parts, tree="src"):
    """The file of the module at `parts` under `tree` (`["limiter", "shard"]`), if one is."""
    base = os.path.join(ROOT, tree, *parts)
    for f in (base + ".rs", os.path.join(base, "mod.rs")):
        if os.path.exists(f):
            return f
    return None


def resolve(first, rest, tree="src"):
    """Why the path `first::rest...` names nothing, or None. Module by module, each next
    segment is a child module, or an item its module's file defines or `use`s (re-exports);
    past the first item, a method or variant defined anywhere."""
    scope = [] if first in ("crate", "turnstile") else [first]
    for i, s in enumerate(rest):
        if scope is None:
            if s not in names:
                return f"no `{s}` is defined"
            continue
        if module_file(scope + [s], tree):
            scope = scope + [s]
            continue
        f = module_file(scope, tree) if scope else os.path.join(ROOT, tree, "lib.rs")
        t = open(f, encoding="utf-8").read() if f else ""
        uses = " ".join(re.findall(r"\buse\s[^;]*;", t))
        if not (re.search(rf"\b(?:macro_rules!|struct|enum|trait|fn|type|mod|const|static)\s+{s}\b", t)
                or re.search(rf"\b{s}\b", uses)):
            return f"`{'::'.join(scope)}` has no `{s}`"
        scope = None
    return None
# BENCHMARKS.md is a history: the names it gives are those of the day it was measured.
pages = [os.path.join(ROOT, f) for f in ("README.md", "SECURITY.md")]
docs_dir = os.path.join(ROOT, "docs")
pages += [os.path.join(docs_dir, f) for f in os.listdir(docs_dir) if f.endswith(".md")]
said = [(p, open(p, encoding="utf-8").read()) for p in pages if os.path.exists(p)]
said += [(p, "\n".join(re.findall(r"//[/!]?([^\n]*)", open(p, encoding="utf-8").read())))
         for p in rust]
for p, text in said:
    where = os.path.relpath(p, ROOT)
    for quoted in set(re.findall(r"`([^`\n]+)`", text)):
        m = re.fullmatch(r"(?:\w+::)*(\w+)!", quoted)
        if m and "_" in m.group(1) and m.group(1) not in macros | RUST_MACROS:
            failures.append(f"{where} names the macro `{quoted}`, which no file defines")
        m = re.fullmatch(r"(\w+)((?:::\w+)+)(?:\(\))?", quoted)
        if not m or m.group(1) not in crate_mods:
            continue
        wrong = resolve(m.group(1), m.group(2).split("::")[1:])
        # The black-box tests' comments may name their own modules (`service::answers`).
        if wrong and where.startswith("tests/it/") and m.group(1) != "crate":
            wrong = resolve(m.group(1), m.group(2).split("::")[1:], "tests/it")
        if wrong:
            failures.append(f"{where} names `{quoted}`: {wrong}")

# 7. Each module's `//!` opener names what src/lib.rs's tables give it: a child module the
# module table's "what it holds" names in backquotes, and on the way to each file of a door,
# the child module that leads to it (`transport/http/gocc.rs`: `http` in transport's opener,
# `gocc` in transport/http's); a door whose file is a top-level module's own names the door.


def opener(path):
    """The leading `//!` lines of the file of module `path` (`service`, `transport/http`)."""
    for f in (os.path.join(SRC, path + ".rs"), os.path.join(SRC, path, "mod.rs")):
        if os.path.exists(f):
            text = []
            for line in open(f, encoding="utf-8"):
                if not line.startswith("//!"):
                    break
                text.append(line[3:])
            return " ".join(text)
    return None


def must_name(module, word, why):
    said = opener(module)
    if said is not None and not re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", said, re.I):
        failures.append(f"src/{module}'s //! opener does not name {word} ({why})")


for first, holds in re.findall(r"^//! \| (`[^|]*`) \| ([^|]*) \| [^|]* \|$", lib, re.M):
    for m in re.findall(r"`([a-z_]+)`", first):
        for word in re.findall(r"`([a-z_]+)`", holds):
            if module_file([m, word]):
                must_name(m, word, "src/lib.rs's module table")
for door, cells in DOOR_ROWS:
    for path in re.findall(r"`([a-z_/]+\.rs)`", cells):
        parts = path.removesuffix(".rs").split("/")
        if parts[-1] == "mod":
            parts = parts[:-1]
        if len(parts) == 1:
            must_name(parts[0], door, "src/lib.rs's doors table")
        for i in range(1, len(parts)):
            must_name("/".join(parts[:i]), parts[i], f"the {door} door's {path}")

# 7b. One module-file convention: a module with children is `name/mod.rs`, never `name.rs`
# beside a `name/` folder; and each door is named one way in every layer: its service's file
# and one of its transport's files carry the door's name (src/lib.rs's doors table).
for root, dirs, fs in os.walk(SRC):
    for d in dirs:
        if d + ".rs" in fs:
            failures.append(f"{os.path.join(root, d)}.rs beside its folder: use "
                            f"{os.path.join(root, d, 'mod.rs')}")
head = re.search(r"^//! \| door \|(.*)\|$", lib, re.M)
layers = [c.strip() for c in head.group(1).split("|")] if head else []
for door, cells in DOOR_ROWS:
    for layer, cell in zip(layers, cells.strip("|").split("|")):
        paths = re.findall(r"`([a-z_/]+\.rs)`", cell)
        if layer in ("service", "transport") and paths and not any(
                door in p.removesuffix(".rs").split("/") for p in paths):
            failures.append(f"src/lib.rs's doors table: the {door} door's {layer} has no file "
                            f"named for it ({', '.join(paths)})")

# 8. One type name, one thing: no struct, enum, union, trait or type alias is defined twice in
# src/. Associated types (`type Future = ...` in an `impl`, `type Io;` in a trait) and the test
# code (`#[cfg(test)]` items and modules, `tests.rs`, `tests/`) are left out: a test's fixture
# names what it tests. A name two parts need alike is listed here with why.
SAME_NAME_OK = {
    # name: "why the two are one thing", e.g. a private adapter each gRPC file keeps alike.
}
ITEM_TOKEN = re.compile(r"""//[^\n]*|/\*.*?\*/|b?r(\#*)".*?"\1|b?"(?:\\.|[^"\\])*"|b?'(?:\\.|[^'\\])'
    |'\w+|(\#\[cfg\(test\)\])|\b(impl|trait|struct|enum|union|type|mod|fn)\b\s*(\w+)?|([{};])""",
                        re.S | re.X)


def type_names(path):
    """The type names `path` defines at item level, test code left out."""
    names, stack, opening, test = [], [], None, False
    for m in ITEM_TOKEN.finditer(open(path, encoding="utf-8").read()):
        if m.group(2):
            test = True
        elif m.group(3):
            kw, name = m.group(3), m.group(4)
            shown = not test and "test" not in stack
            in_impl = bool(stack) and stack[-1] in ("impl", "trait")
            if name and shown and kw in ("trait", "struct", "enum", "union"):
                names.append(name)
            elif name and shown and kw == "type" and not in_impl:
                names.append(name)
            opening = "test" if test else kw if kw in ("impl", "trait", "mod") else "item"
            test = False
        elif m.group(5):
            if m.group(5) == "{":
                stack.append("test" if test else opening or "block")
            elif m.group(5) == "}" and stack:
                stack.pop()
            opening, test = None, False
    return names


where_defined = {}
for root, _, fs in os.walk(SRC):
    if "tests" in os.path.relpath(root, SRC).split(os.sep):
        continue
    for f in sorted(fs):
        if f.endswith(".rs") and f != "tests.rs":
            p = os.path.join(root, f)
            for name in type_names(p):
                where_defined.setdefault(name, []).append(os.path.relpath(p, SRC))
for name, ps in sorted(where_defined.items()):
    if len(ps) > 1 and name not in SAME_NAME_OK:
        failures.append(f"the type name {name} is defined {len(ps)} times: " + ", ".join(sorted(ps)))

# 9. Named fields where tuples are: a struct's or a variant's field whose type holds a tuple
# gives its parts no names. Allowed: a name with its value, handed on in order (labels, tags,
# metadata, headers, descriptor entries), listed here; test code left out.
NAME_VALUE_PAIRS = {
    "StatsdSettings.extra_tags", "Mogrifier.tags", "Format.Statsd.tags", "Format.Dog.tags",
    "Family.series", "Naming.Glob.labels", "Naming.Regex.labels", "Mapping.Mapped.labels",
    "CustomLabels.labels", "XdsSettings.node_metadata", "XdsSettings.headers", "Walk.left",
}


def strip_test_items(text):
    """`text` with its `#[cfg(test)]` items blanked out, lines kept where they were."""
    out = list(text)
    for m in re.finditer(r"#\[cfg\(test\)\]", text):
        j = m.end()
        # The item ends at a ';' before any '{', or at the '}' matching its first '{'.
        while j < len(text) and text[j] not in "{;":
            j += 1
        if j < len(text) and text[j] == "{":
            depth, j = 1, j + 1
            while j < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
        for k in range(m.start(), min(j + 1, len(text))):
            if out[k] != "\n":
                out[k] = " "
    return "".join(out)



def strip_comments(text):
    return re.sub(r"//[^\n]*", lambda m: " " * len(m.group()), text)



def has_tuple(ty):
    """Whether the type `ty` holds a tuple: a '(' not after Fn/FnMut/FnOnce/fn, with a comma
    at its top level."""
    for m in re.finditer(r"\(", ty):
        before = ty[:m.start()].rstrip()
        if re.search(r"\b(Fn|FnMut|FnOnce|fn)$", before):
            continue
        depth, j, comma = 1, m.end(), False
        angle = 0
        while j < len(ty) and depth:
            c = ty[j]
            depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(c, 0)
            angle += {"<": 1, ">": -1}.get(c, 0)
            comma = comma or (c == "," and depth == 1 and angle == 0)
            j += 1
        if comma:
            return True
    return False



def split_top(body):
    """`body` split at its top-level commas."""
    parts, depth, cur = [], 0, ""
    for c in body:
        depth += {"(": 1, "[": 1, "{": 1, "<": 1, ")": -1, "]": -1, "}": -1, ">": -1}.get(c, 0)
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return parts


def block(text, i, open_c, close_c):
    """The text between the bracket `open_c` at `i` and its match, and the index after it."""
    depth, j = 1, i + 1
    while j < len(text) and depth:
        depth += {open_c: 1, close_c: -1}.get(text[j], 0)
        j += 1
    return text[i + 1:j - 1], j


def tuple_fields(text):
    """(item, field, line) of each field of a struct or an enum variant whose type holds a tuple."""
    out = []
    for m in re.finditer(r"\b(struct|enum)\s+(\w+)[^;{(]*?([{(;])", text):
        kind, name, opener = m.group(1), m.group(2), m.group(3)
        if opener == ";":
            continue
        i = m.end() - 1
        if opener == "(":
            body, _ = block(text, i, "(", ")")
            fields = [(str(k), p) for k, p in enumerate(split_top(body))]
        else:
            body, _ = block(text, i, "{", "}")
            fields = []
            for p in split_top(body):
                if kind == "struct":
                    if ":" in p:
                        n, t = p.split(":", 1)
                        fields.append((n.split()[-1], t))
                    continue
                vm = re.match(r"\s*(?:#\[[^\]]*\]\s*)*(\w+)\s*([({])(.*)[)}]\s*$", p, re.S)
                if not vm:
                    continue
                v, o, inner = vm.groups()
                for k, q in enumerate(split_top(inner)):
                    if o == "{" and ":" in q:
                        n, t = q.split(":", 1)
                        fields.append((v + "." + n.split()[-1], t))
                    elif o == "(":
                        fields.append((v + "." + str(k), q))
        for n, t in fields:
            if has_tuple(re.sub(r"#\[[^\]]*\]", "", t)):
                out.append((name, n, text[:m.start()].count("\n") + 1))
    return out


for root, _, fs in os.walk(SRC):
    if "tests" in os.path.relpath(root, SRC).split(os.sep):
        continue
    for f in sorted(fs):
        if not f.endswith(".rs") or f == "tests.rs":
            continue
        p = os.path.join(root, f)
        text = strip_comments(strip_test_items(open(p, encoding="utf-8").read()))
        for item, field, line in tuple_fields(text):
            if f"{item}.{field}" not in NAME_VALUE_PAIRS:
                failures.append(f"{p}:{line}: {item}.{field} is a tuple: name its parts")

for f in failures:
    print(f"check-house: {f}", file=sys.stderr)
sys.exit(1 if failures else 0)
