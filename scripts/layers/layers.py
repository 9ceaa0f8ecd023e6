#!/usr/bin/env python3
"""The house's rules over src/, read from the code as the compiler sees it.

A Rust lexer blanks comments and string contents (line numbers kept), `#[cfg(test)]` items and
files are set apart, every path (`use` trees expanded, `crate::`, `self::`, `super::` and child
module names resolved to the full module path) is checked against the rooms' rules, and sizes
are counted in lines of code (a line with anything left once comments are removed).

Today's violations are listed in scripts/layers/baseline.txt, one `rule file symbol` a line (no
line numbers: a move within a file changes nothing). The check fails on a violation the
baseline does not list and on a baseline line that no longer occurs, so the list only shrinks.
`--write-baseline` writes the list anew.
"""

import os
import re
import sys
from collections import defaultdict

FILE_BUDGET = 700  # lines of code before a file's tests, at most
FN_BUDGET = 80  # lines of code of a function, tests included: fewer than this
DUPLICATE_LINES = 9  # the two store backends share no run of this many lines
REQUIRED_ROOMS = [
    "src/facilitator/evm",
    "src/facilitator/svm",
    "src/facilitator/protocol",
    "src/facilitator/settlement",
    "src/server",
]
FAMILY_WORDS = {"svm", "solana"}
BASELINE = "scripts/layers/baseline.txt"

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def is_ident_char(c):
    return c.isalnum() or c == "_"


def lex(src):
    """Two views of `src`, each as long as it with its newlines where they were: `code`, with
    comments and the contents of string and char literals blanked (their quotes kept), and
    `text`, with only comments blanked."""
    code, text = list(src), list(src)
    n, i = len(src), 0

    def blank(views, a, b):
        for view in views:
            for k in range(a, b):
                if view[k] != "\n":
                    view[k] = " "

    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            blank((code, text), i, j)
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank((code, text), i, j)
            i = j
        elif c == "r" and (i == 0 or not is_ident_char(src[i - 1]) or (
                src[i - 1] == "b" and (i < 2 or not is_ident_char(src[i - 2])))) and re.match(
                    r'r#*"', src[i:i + 64]):
            hashes = re.match(r'r(#*)"', src[i:]).group(1)
            start = i + 2 + len(hashes)
            end = src.find('"' + hashes, start)
            end = n if end < 0 else end
            blank((code,), start, end)
            i = end + 1 + len(hashes)
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            blank((code,), i + 1, min(j, n))
            i = j + 1
        elif c == "'":
            if src.startswith("\\", i + 1):
                j = src.find("'", i + 3)
                blank((code,), i + 1, j)
                i = j + 1
            elif i + 2 < n and src[i + 2] == "'":
                blank((code,), i + 1, i + 2)
                i += 3
            else:
                i += 1  # a lifetime or a label
        else:
            i += 1
    return "".join(code), "".join(text)


def match_close(code, i, open_c="{", close_c="}"):
    """The index just past the bracket that closes the one at `i`."""
    depth = 0
    for j in range(i, len(code)):
        if code[j] == open_c:
            depth += 1
        elif code[j] == close_c:
            depth -= 1
            if depth == 0:
                return j + 1
    return len(code)


def item_end(code, i):
    """Where the item starting at `i` ends: its `;` or its closing brace, at depth 0."""
    depth = 0
    j = i
    while j < len(code):
        c = code[j]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == ";" and depth == 0:
            return j + 1
        elif c == "{" and depth == 0:
            return match_close(code, j)
        j += 1
    return len(code)


# `#[cfg(test)]`, and `#[cfg(all(test, ...))]`: code that only tests compile.
CFG_TEST = re.compile(r"#\s*\[\s*cfg\s*\(\s*(?:test|all\s*\(\s*test\b[^\]]*\))\s*\)\s*\]")
ATTR = re.compile(r"\s*#\s*\[")


def test_ranges(code):
    """The (start, end) of each `#[cfg(test)]` item, its attributes included."""
    ranges = []
    for m in CFG_TEST.finditer(code):
        if any(a <= m.start() < b for a, b in ranges):
            continue
        j = m.end()
        while True:
            a = ATTR.match(code, j)
            if not a:
                break
            j = match_close(code, a.end() - 1, "[", "]")
        ranges.append((m.start(), item_end(code, j)))
    return ranges


def line_of(s, pos):
    return s.count("\n", 0, pos) + 1


class File:
    def __init__(self, root, rel):
        self.rel = rel
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            self.src = f.read()
        self.code, self.text = lex(self.src)
        self.tests = test_ranges(self.code)
        self.all_tests = bool(re.match(r"\s*#!\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]", self.code))
        self.module = module_of(rel)
        self._lines = None

    def in_tests(self, pos):
        return self.all_tests or any(a <= pos < b for a, b in self.tests)

    def line(self, pos):
        return line_of(self.code, pos)

    def main_code(self):
        """`code` with its tests blanked."""
        if self.all_tests:
            return re.sub(r"[^\n]", " ", self.code)
        out = list(self.code)
        for a, b in self.tests:
            for k in range(a, b):
                if out[k] != "\n":
                    out[k] = " "
        return "".join(out)

    def code_lines(self, include_tests):
        """Line numbers (1-based) of the lines of code: something left once comments are gone."""
        lines = self.text.split("\n")
        starts, pos = [], 0
        for line in lines:
            starts.append(pos)
            pos += len(line) + 1
        return [k + 1 for k, line in enumerate(lines)
                if line.strip() and (include_tests or not self.in_tests(starts[k]))]


def module_of(rel):
    """`src/a/b.rs` -> [crate, a, b]; `src/a/mod.rs` -> [crate, a]; `src/main.rs` -> [main]."""
    parts = rel[len("src/"):-len(".rs")].split("/")
    if parts == ["main"]:
        return ["main"]
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return ["crate"] + parts


def parse_use_tree(s, i, prefix, out):
    """Expands the use tree at `s[i:]` into full paths appended to `out`; returns where it ends."""
    segs = list(prefix)
    while i < len(s):
        m = re.compile(r"\s*").match(s, i)
        i = m.end()
        if s.startswith("::", i):
            i += 2
            continue
        if s.startswith("{", i):
            i += 1
            while True:
                i = parse_use_tree(s, i, segs, out)
                m = re.compile(r"\s*([,}])").match(s, i)
                if not m:
                    return len(s)
                i = m.end()
                if m.group(1) == "}":
                    return i
                if re.compile(r"\s*}").match(s, i):
                    return re.compile(r"\s*}").match(s, i).end()
        if s.startswith("*", i):
            out.append(segs)
            return i + 1
        m = re.compile(IDENT).match(s, i)
        if not m:
            if segs != list(prefix):
                out.append(segs)
            return i
        segs = segs + [m.group(0)]
        i = m.end()
        a = re.compile(r"\s+as\s+" + IDENT).match(s, i)
        if a:
            out.append(segs)
            return a.end()
        if not re.compile(r"\s*::").match(s, i):
            out.append(segs)
            return i
    return i


USE = re.compile(r"\buse\s+")
PATH = re.compile(r"(?<![\w:])(?:::\s*)?" + IDENT + r"(?:\s*::\s*" + IDENT + r")+")


class Tree:
    def __init__(self, root):
        self.root = root
        self.files = []
        for base, dirs, names in os.walk(os.path.join(root, "src")):
            dirs.sort()
            for name in sorted(names):
                if name.endswith(".rs"):
                    rel = os.path.relpath(os.path.join(base, name), root).replace(os.sep, "/")
                    self.files.append(File(root, rel))
        self.modules = {tuple(f.module) for f in self.files}
        self.inline = {}  # file -> [(start, end, name)]
        for f in self.files:
            spans = []
            for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{", f.code):
                spans.append((m.start(), match_close(f.code, m.end() - 1), m.group(1)))
                self.modules.add(tuple(f.module + [m.group(1)]))
            self.inline[f.rel] = spans
        self.mark_test_files()

    def mark_test_files(self):
        """A file its parent declares under `#[cfg(test)]` is all tests, and so is all below it."""
        by_module = {tuple(f.module): f for f in self.files}
        for f in sorted(self.files, key=lambda f: len(f.module)):
            parent = by_module.get(tuple(f.module[:-1]))
            if parent is None or len(f.module) < 2:
                continue
            if parent.all_tests:
                f.all_tests = True
                continue
            decl = re.compile(r"\bmod\s+" + re.escape(f.module[-1]) + r"\s*;")
            for m in decl.finditer(parent.code):
                if parent.in_tests(m.start()):
                    f.all_tests = True

    def module_at(self, f, pos):
        names = [name for a, b, name in self.inline[f.rel] if a <= pos < b]
        return f.module + names

    def resolve(self, f, segs, pos):
        """The full path (`crate::...`) `segs` names, or None for another crate's."""
        segs = [s.strip() for s in segs if s.strip()]
        if not segs:
            return None
        here = self.module_at(f, pos)
        head = segs[0]
        if head == "routerd" and f.module == ["main"]:
            head = segs[0] = "crate"
        elif head == "crate" and f.module == ["main"]:
            return None  # the binary's own crate
        if head == "crate":
            return [s for s in segs if s != "self"]  # `use crate::a::{self}` names `a`
        if head in ("self", "super"):
            out = list(here)
            while segs and segs[0] in ("self", "super"):
                if segs.pop(0) == "super":
                    out.pop()
            segs = [s for s in segs if s != "self"]
            return out + segs if out and out[0] == "crate" else None
        if tuple(here + [head]) in self.modules and here[0] == "crate":
            return here + [s for s in segs if s != "self"]
        return None

    def paths(self, f):
        """Every (position, full path) the non-test code of `f` names."""
        code = f.main_code()
        found, uses = [], []
        for m in USE.finditer(code):
            leaves = []
            end = parse_use_tree(code, m.end(), [], leaves)
            uses.append((m.start(), end))
            for leaf in leaves:
                found.append((m.start(), leaf))
        for m in PATH.finditer(code):
            if any(a <= m.start() < b for a, b in uses):
                continue
            found.append((m.start(), re.split(r"\s*::\s*", m.group(0).lstrip(":").strip())))
        out = []
        for pos, segs in found:
            full = self.resolve(f, segs, pos)
            if full:
                out.append((pos, full))
        return out


def parse_map(lib):
    """The rooms of lib.rs's map and what each may import: {room: set or None (anything below)}."""
    lines = []
    for line in lib.src.split("\n"):
        if not line.startswith("//!"):
            break
        lines.append(line[3:].removeprefix(" "))
    text = "\n".join(lines)
    m = re.search(r"```text\n(.*?)```", text, re.S)
    if not m:
        return None
    entries = []
    in_sub_room = False
    for line in m.group(1).split("\n"):
        if not line.strip():
            continue
        if not line.startswith(" "):
            head = re.split(r"\s{2,}", line, maxsplit=1)
            names = [n.strip() for n in head[0].split(",")]
            entries.append([names, line[len(head[0]):]])
            in_sub_room = False
        elif re.match(r"^ {1,3}" + IDENT, line):
            # A sub-room of the room above (`  svm  ...`): its own rules are the named checks',
            # and its arrow is not its parent's.
            in_sub_room = True
        elif entries and not in_sub_room:
            entries[-1][1] += " " + line.strip()
    declared = set(re.findall(r"^(?:pub\s+)?mod\s+(" + IDENT + r")\s*;", lib.code, re.M))
    known = declared | {"main"}
    allowed = {}
    for k, (names, rest) in enumerate(entries):
        below = {n for later in entries[k + 1:] for n in later[0]}
        arrow = rest.rsplit("->", 1)
        words = arrow[1].split() if len(arrow) == 2 else None
        if words == ["every", "room", "below"] or (words is None and k == 0):
            rooms = below
        elif words is not None and all(w in known for w in words):
            rooms = set(words)
        elif k == 0:
            rooms = below
        else:
            rooms = set()
        for name in names:
            # The top line is the wiring: its rooms may use each other and everything below.
            allowed[name] = rooms | (set(names) - {name} if k == 0 else set())
    return allowed, declared


class Violation:
    def __init__(self, rule, file, line, symbol, detail):
        self.rule, self.file, self.line, self.symbol, self.detail = rule, file, line, symbol, detail

    def key(self):
        return f"{self.rule} {self.file} {self.symbol}"

    def __str__(self):
        return f"{self.file}:{self.line}: {self.rule}: {self.detail}"


def under(path, prefix):
    return path[:len(prefix)] == prefix


def family_words(ident):
    words = re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", ident)
    return {w.lower() for w in words} & FAMILY_WORDS


# (rule, the modules it holds, the paths they may not name, what the message says)
PATH_RULES = [
    ("server-imports", ["crate", "server"],
     [["crate", "evm"], ["crate", "svm"], ["crate", "facilitator", "evm"],
      ["crate", "facilitator", "svm"]], "the transport names a family leaf"),
    ("evm-svm", ["crate", "facilitator", "evm"], [["crate", "facilitator", "svm"]],
     "facilitator::evm and facilitator::svm never import each other"),
    ("evm-svm", ["crate", "facilitator", "svm"], [["crate", "facilitator", "evm"]],
     "facilitator::evm and facilitator::svm never import each other"),
    ("protocol-imports", ["crate", "facilitator", "protocol"],
     [["crate", "facilitator", "evm"], ["crate", "facilitator", "svm"],
      ["crate", "facilitator", "settlement"]], "the wire imports no mechanism"),
    ("settlement-imports", ["crate", "facilitator", "settlement"],
     [["crate", "evm"], ["crate", "svm"], ["crate", "chain", "evm"], ["crate", "chain", "svm"],
      ["crate", "facilitator", "evm"], ["crate", "facilitator", "svm"]],
     "the shared settlement core names no family"),
    ("ledger-imports", ["crate", "ledger"], [["crate", "evm"], ["crate", "svm"]],
     "the ledger imports no family leaf"),
]


def check_paths(tree, allowed, declared):
    out = []
    for f in tree.files:
        for pos, full in tree.paths(f):
            name = "::".join(full)
            here = tree.module_at(f, pos)
            for rule, holds, banned, why in PATH_RULES:
                if under(here, holds) and any(under(full, b) for b in banned):
                    out.append(Violation(rule, f.rel, f.line(pos), name, f"{name}: {why}"))
            room = "main" if f.module == ["main"] else (here[1] if len(here) > 1 else None)
            used = full[1] if len(full) > 1 else None
            if room in allowed and used in declared and used not in (room, "testing") \
                    and used not in allowed[room]:
                rooms = " ".join(sorted(allowed[room])) or "nothing"
                why = f"{room} imports {used} (its line in src/lib.rs allows: {rooms})"
                out.append(Violation("room-imports", f.rel, f.line(pos), f"crate::{used}", why))
    return out


def check_words(tree):
    out = []
    for f in tree.files:
        code = f.main_code()
        server = under(f.module, ["crate", "server"])
        for m in re.finditer(r"\b" + IDENT, code):
            word = m.group(0)
            if word == "is_solana":
                out.append(Violation("is-solana", f.rel, f.line(m.start()), word,
                                     "is_solana: a family is declared, not guessed from a name"))
            elif server and family_words(word):
                out.append(Violation("server-family", f.rel, f.line(m.start()), word,
                                     f"{word}: the transport names no family"))
    return out


def check_sizes(tree):
    out = []
    for f in tree.files:
        if f.all_tests:
            continue
        lines = f.code_lines(include_tests=False)
        if len(lines) > FILE_BUDGET:
            why = f"{len(lines)} lines of code before its tests (at most {FILE_BUDGET})"
            out.append(Violation("file-size", f.rel, lines[FILE_BUDGET], "-", why))
    return out


FN = re.compile(r"\bfn\s+(" + IDENT + r")")
IMPL = re.compile(r"\b(impl|trait)\b([^{;]*)\{")


def owner_of(header, kind):
    """`impl<T> A<T> for B` -> B; `impl A` -> A; `trait T` -> T."""
    header = re.sub(r"\bwhere\b.*", "", header, flags=re.S)
    if kind == "impl":
        header = re.sub(r"^\s*<.*?>", "", header, flags=re.S)
        header = header.split(" for ", 1)[-1]
    names = re.findall(IDENT, re.sub(r"<.*", "", header, flags=re.S))
    return names[-1] if names else "?"


def check_functions(tree):
    out = []
    for f in tree.files:
        owners = [(m.start(), match_close(f.code, m.end() - 1), owner_of(m.group(2), m.group(1)))
                  for m in IMPL.finditer(f.code)]
        owners += [(a, b, name) for a, b, name in tree.inline[f.rel]]
        code_lines = set(f.code_lines(include_tests=True))
        for m in FN.finditer(f.code):
            body = item_end(f.code, m.end())
            if f.code[body - 1] != "}":
                continue  # a declaration without a body
            first, last = f.line(m.start()), f.line(body - 1)
            count = sum(1 for k in range(first, last + 1) if k in code_lines)
            if count >= FN_BUDGET:
                scope = [name for a, b, name in sorted(owners) if a <= m.start() < b]
                symbol = "::".join(scope + [m.group(1)])
                why = f"fn {m.group(1)} has {count} lines of code (fewer than {FN_BUDGET})"
                out.append(Violation("fn-length", f.rel, first, symbol, why))
    return out


def backend_of(rel):
    m = re.match(r"src/store/(sled|postgres)\b", rel)
    return m.group(1) if m else None


def check_duplicates(tree):
    """Runs of DUPLICATE_LINES lines of code (comments gone, indentation ignored) that stand in
    both store backends. A run of braces and keywords alone is no repetition."""
    windows = {"sled": defaultdict(list), "postgres": defaultdict(list)}
    for f in tree.files:
        backend = backend_of(f.rel)
        if not backend:
            continue
        main = f.main_code().split("\n")
        text = f.text.split("\n")
        lines = [(k + 1, text[k].strip()) for k in range(len(text)) if main[k].strip()]
        for k in range(len(lines) - DUPLICATE_LINES + 1):
            run = tuple(t for _, t in lines[k:k + DUPLICATE_LINES])
            if sum(1 for t in run if re.search(r"[A-Za-z0-9_]{3}", t)) >= DUPLICATE_LINES // 2:
                windows[backend][run].append((f.rel, lines[k][0]))
    pairs = {}
    for run, places in windows["sled"].items():
        for pg in windows["postgres"].get(run, []):
            for sled in places:
                key = (sled[0], pg[0])
                if key not in pairs or sled[1] < pairs[key][0][1]:
                    pairs[key] = (sled, pg)
    out = []
    for (sled_file, pg_file), (sled, pg) in sorted(pairs.items()):
        out.append(Violation("store-duplicates", sled_file, sled[1], pg_file,
                             f"{DUPLICATE_LINES} or more lines stand again at {pg_file}:{pg[1]}"))
    return out


def check(root):
    out = []
    for room in REQUIRED_ROOMS:
        if not os.path.isdir(os.path.join(root, room)):
            out.append(Violation("rooms", room, 0, "-", "this room must exist"))
    tree = Tree(root)
    lib = next((f for f in tree.files if f.rel == "src/lib.rs"), None)
    parsed = parse_map(lib) if lib else None
    if parsed is None:
        why = "lib.rs opens with the map of the rooms (a ```text block in its //! lines)"
        out.append(Violation("lib-map", "src/lib.rs", 1, "-", why))
        allowed, declared = {}, set()
    else:
        allowed, declared = parsed
        for room in sorted(declared - set(allowed) - {"fuzzing", "testing"}):
            why = f"room {room} is not on the map"
            out.append(Violation("lib-map", "src/lib.rs", 1, room, why))
    out += check_paths(tree, allowed, declared)
    out += check_words(tree)
    out += check_sizes(tree)
    out += check_functions(tree)
    out += check_duplicates(tree)
    return out


def read_baseline(path):
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


BASELINE_HEADER = """\
# Violations of scripts/check-layers that the tree still has, one `rule file symbol` a line.
# This list only shrinks: fix one and delete its line. `scripts/check-layers --write-baseline`
# writes it anew (after a merge or a move, never to let a new violation in).
"""


def run(root, write_baseline=False, out=sys.stdout, err=sys.stderr):
    violations = check(root)
    keys = sorted({v.key() for v in violations})
    path = os.path.join(root, BASELINE)
    if write_baseline:
        with open(path, "w", encoding="utf-8") as f:
            f.write(BASELINE_HEADER + "".join(k + "\n" for k in keys))
        print(f"check-layers: wrote {len(keys)} lines to {BASELINE}", file=out)
        return 0
    baseline = read_baseline(path)
    known = set(baseline)
    new = [v for v in violations if v.key() not in known]
    seen = {}
    for v in sorted(new, key=lambda v: (v.file, v.line, v.rule)):
        seen.setdefault((v.file, v.line, v.rule, v.symbol), v)
    for v in seen.values():
        print(f"check-layers: {v}", file=err)
    stale = [line for line in baseline if line not in set(keys)]
    for line in stale:
        print(f"check-layers: {BASELINE}: `{line}` no longer occurs: delete the line", file=err)
    if new or stale:
        print("check-layers: the rooms and their rules are in src/lib.rs and "
              "scripts/layers/layers.py", file=err)
        return 1
    print(f"check-layers: every room keeps its rules ({len(baseline)} known violations "
          f"in {BASELINE})", file=out)
    return 0


if __name__ == "__main__":
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    args = sys.argv[1:]
    if args not in ([], ["--write-baseline"]):
        print("usage: scripts/check-layers [--write-baseline]", file=sys.stderr)
        sys.exit(2)
    sys.exit(run(root, write_baseline=args == ["--write-baseline"]))
