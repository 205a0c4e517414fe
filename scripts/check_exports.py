#!/usr/bin/env python3
"""scripts/check_exports.py - libidem exports its public API and nothing else.

libidem is compiled with hidden visibility (src/core, src/store and src/tx
set meson's gnu_symbol_visibility to 'hidden'), and every declaration of
its public API in include/idem/ begins with IDEM_EXTERN (idem/extern.h),
which gives it default visibility again.  This check keeps that boundary:

  - every function and variable declared in include/idem/*.h (version.h.in
    included) is marked IDEM_EXTERN; a `static inline` helper, which is
    compiled into the caller, is the one exception;
  - `nm -D --defined-only libidem.so` lists exactly the IDEM_EXTERN names:
    an internal (an idem__ hook, a helper that lost its `static`) that
    leaks out fails, and so does a public function that is not exported;
  - libidem.a, when it is there, holds the same objects: every global
    symbol it defines with default visibility is an IDEM_EXTERN name (the
    rest are hidden, so a program or shared object that links libidem.a
    re-exports none of them), and every IDEM_EXTERN name is defined there;
  - debian/libidem0.symbols, the ABI list dpkg-gensymbols holds the package
    to, names exactly the IDEM_EXTERN names.

The headers are read as text: comments and preprocessor lines are dropped,
the rest is split into top-level statements, and a statement that declares
a name followed by `(` (a function) or starts with `extern` or IDEM_EXTERN
(a variable) is a declaration.  Typedefs, struct, union and enum
definitions declare no symbol and are skipped.

Usage: scripts/check_exports.py LIB_DIR      (default: build; the directory
                                              of libidem.so and libidem.a,
                                              a build tree or an install)
       scripts/check_exports.py --annotate   (prefixes IDEM_EXTERN to every
                                              unmarked declaration, in place)
Prints `ok - ...` or `FAIL - ...` per check and ends with
`N passed, N failed`; exits 1 when any check failed.
"""
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADERS = os.path.join(ROOT, "include", "idem")
SYMBOLS = os.path.join(ROOT, "debian", "libidem0.symbols")
MARK = "IDEM_EXTERN"
IDENT_PAREN_RE = re.compile(r"([A-Za-z_]\w*)\s*\(")
LAST_IDENT_RE = re.compile(r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*$")


def blank(text):
    """The text with comments, string literals and preprocessor lines turned
    into spaces; newlines and offsets are kept, so an offset into the result
    is an offset into the file."""
    out = list(text)
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c in " \t":
            i += 1
            continue
        if line_start and c == "#":
            # A preprocessor line, with its backslash continuations.
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out[i] = " "
                    i += 2
                    continue
                out[i] = " "
                i += 1
            continue
        line_start = c == "\n"
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            for j in range(i, end):
                if out[j] != "\n":
                    out[j] = " "
            i = end
        elif text.startswith("//", i):
            while i < n and text[i] != "\n":
                out[i] = " "
                i += 1
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            for k in range(i + 1, min(j, n)):
                if out[k] != "\n":
                    out[k] = " "
            i = j + 1
        else:
            i += 1
    return "".join(out)


def statements(code):
    """Top-level statements as (start offset, text): split at ';' outside
    braces and parentheses, and after the body of a function definition."""
    out = []
    depth = 0
    start = None
    i = 0
    while i < len(code):
        c = code[i]
        if start is None:
            if c.isspace():
                i += 1
                continue
            start = i
        if c in "({[":
            if c == "{" and depth == 0:
                head = code[start:i]
                if "(" in head and "=" not in head and not re.match(r"\s*(typedef|struct|union|enum)\b", head):
                    # A function body (a static inline helper): skip it whole.
                    d = 0
                    while i < len(code):
                        if code[i] == "{":
                            d += 1
                        elif code[i] == "}":
                            d -= 1
                            if d == 0:
                                break
                        i += 1
                    out.append((start, code[start:i + 1]))
                    start = None
                    i += 1
                    continue
            depth += 1
        elif c in ")}]":
            depth -= 1
        elif c == ";" and depth == 0:
            out.append((start, code[start:i + 1]))
            start = None
        i += 1
    return out


def declarations(path):
    """What the header at path declares: a list of dicts with name, kind
    ('function' or 'variable'), marked (begins with IDEM_EXTERN), inline
    (a static inline definition) and offset (where the statement starts)."""
    with open(path) as f:
        text = f.read()
    found = []
    for offset, stmt in statements(blank(text)):
        s = " ".join(stmt.split())
        if s.startswith("typedef ") or (re.match(r"(struct|union|enum)\b", s) and
                                        ("{" in s or "(" not in s)):
            continue
        marked = s.startswith(MARK + " ")
        body = s[len(MARK) + 1:] if marked else s
        inline = body.startswith("static ")
        head = body.split("{", 1)[0] if inline else body
        m = IDENT_PAREN_RE.search(head)
        if m and not head[:m.start()].rstrip().endswith("("):
            name, kind = m.group(1), "function"
        else:
            m = re.search(r"\(\s*\*\s*([A-Za-z_]\w*)\s*\)", head)   # a function pointer variable
            if m:
                name, kind = m.group(1), "variable"
            elif body.startswith("extern ") or marked:
                m = LAST_IDENT_RE.search(head.rstrip(";").split("=")[0].rstrip())
                if not m:
                    continue
                name, kind = m.group(1), "variable"
            else:
                continue
        found.append({"name": name, "kind": kind, "marked": marked, "inline": inline,
                      "offset": offset, "file": os.path.relpath(path, ROOT)})
    return found


def header_files():
    return sorted(glob.glob(os.path.join(HEADERS, "*.h")) +
                  glob.glob(os.path.join(HEADERS, "*.h.in")))


def annotate():
    """Prefix IDEM_EXTERN to each unmarked, non-inline declaration."""
    for path in header_files():
        todo = [d for d in declarations(path) if not d["marked"] and not d["inline"]]
        if not todo:
            continue
        with open(path) as f:
            text = f.read()
        for d in sorted(todo, key=lambda d: -d["offset"]):
            text = text[:d["offset"]] + MARK + " " + text[d["offset"]:]
        with open(path, "w") as f:
            f.write(text)
        print(f"{os.path.relpath(path, ROOT)}: {len(todo)} marked")
    return 0


def dynamic_exports(lib):
    r = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip()
    names = set()
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3:
            names.add(parts[2].split("@")[0])
    return names, None


def archive_defaults(archive):
    """The global or weak symbols libidem.a defines with default visibility,
    and those it defines hidden."""
    r = subprocess.run(["readelf", "-sW", archive], capture_output=True, text=True)
    if r.returncode != 0:
        return None, None, r.stderr.strip()
    default, hidden = set(), set()
    for line in r.stdout.splitlines():
        f = line.split()
        # Num: Value Size Type Bind Vis Ndx Name
        if len(f) < 8 or not f[0].endswith(":") or f[4] not in ("GLOBAL", "WEAK"):
            continue
        if f[6] == "UND":
            continue
        (default if f[5] == "DEFAULT" else hidden).add(f[7])
    return default, hidden, None


def check(build):
    passed = failed = 0

    def ok(msg):
        nonlocal passed
        passed += 1
        print(f"ok - {msg}", flush=True)

    def fail(msg, items=()):
        nonlocal failed
        failed += 1
        print(f"FAIL - {msg}", flush=True)
        for item in sorted(items):
            print(f"    {item}", flush=True)

    decls = [d for path in header_files() for d in declarations(path)]
    public = {d["name"] for d in decls if d["marked"]}
    unmarked = [f"{d['file']}: {d['name']}" for d in decls if not d["marked"] and not d["inline"]]
    marked_inline = [f"{d['file']}: {d['name']}" for d in decls if d["marked"] and d["inline"]]
    if not public:
        fail("include/idem declares nothing with IDEM_EXTERN")
    elif unmarked or marked_inline:
        fail("include/idem: every declaration begins with IDEM_EXTERN, static inline ones excepted",
             [u + " (not marked)" for u in unmarked] + [m + " (static inline)" for m in marked_inline])
    else:
        ok(f"include/idem declares {len(public)} names, each with IDEM_EXTERN")

    so = os.path.join(build, "libidem.so")
    exported, err = dynamic_exports(so)
    if exported is None:
        fail(f"nm -D {so}: {err}")
    else:
        extra = exported - public
        missing = public - exported
        if extra:
            fail(f"libidem.so exports {len(extra)} names not declared IDEM_EXTERN in include/idem",
                 extra)
        else:
            ok(f"libidem.so exports {len(exported)} names, every one declared IDEM_EXTERN")
        if missing:
            fail(f"libidem.so lacks {len(missing)} names declared IDEM_EXTERN", missing)
        else:
            ok("every IDEM_EXTERN name is exported by libidem.so")

    archive = os.path.join(build, "libidem.a")
    if os.path.exists(archive):
        default, hidden, err = archive_defaults(archive)
        if default is None:
            fail(f"readelf -s {archive}: {err}")
        else:
            extra = default - public
            missing = public - default
            if extra:
                fail(f"libidem.a defines {len(extra)} names with default visibility that are not "
                     "IDEM_EXTERN", extra)
            else:
                ok(f"libidem.a: {len(default)} names with default visibility, all IDEM_EXTERN; "
                   f"{len(hidden)} hidden")
            if missing:
                fail(f"libidem.a lacks {len(missing)} IDEM_EXTERN names", missing)
            else:
                ok("libidem.a defines every IDEM_EXTERN name")

    if os.path.exists(SYMBOLS):
        listed = set()
        with open(SYMBOLS) as f:
            for line in f:
                if line.startswith(" "):
                    listed.add(line.split()[0].split("@")[0])
        extra = listed - public
        missing = public - listed
        if extra or missing:
            fail("debian/libidem0.symbols lists the IDEM_EXTERN names",
                 [f"{n} (listed, not IDEM_EXTERN)" for n in extra] +
                 [f"{n} (IDEM_EXTERN, not listed)" for n in missing])
        else:
            ok(f"debian/libidem0.symbols lists the {len(listed)} IDEM_EXTERN names")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def main():
    if sys.argv[1:] == ["--annotate"]:
        return annotate()
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    return check(os.path.join(ROOT, build) if not os.path.isabs(build) else build)


if __name__ == "__main__":
    sys.exit(main())
