#!/usr/bin/env python3
"""scripts/check_library.py - libidem as a service would use it.

Installs a build with `meson install --destdir` into a temporary directory,
then compiles every C example of docs/library.md against the installed
headers and library through pkg-config (libidem.pc), exactly as a user
following that page would, and runs each one.  An example is a fenced code
block that starts with ```c and whose first line is a comment naming it:

    /* example: store_claim.c */
    /* example: tx_sqlite.c  pkg-config: libidem sqlite3 */

(the pkg-config packages to build with; libidem alone when not named)

A program exits 0 when what it shows worked; the check fails on a compile
error, a warning (-Werror), a non-zero exit or a time-out.  The examples
that need Redis or PostgreSQL read IDEM_TEST_REDIS_URL / IDEM_TEST_PG_URL.

Usage: scripts/check_library.py [BUILD_DIR]      (default: build)
Prints one line per example and ends with `N passed, N failed`.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "library.md")
BLOCK_RE = re.compile(r"^```c\n(/\* example: ([A-Za-z0-9_]+\.c)([^\n]*)\*/\n.*?)^```", re.S | re.M)
PKGS_RE = re.compile(r"pkg-config:\s*([A-Za-z0-9_ .+-]+)")


def examples(text):
    out = []
    for m in BLOCK_RE.finditer(text):
        pk = PKGS_RE.search(m.group(3))
        out.append((m.group(2), m.group(1), pk.group(1).split() if pk else ["libidem"]))
    return out


def main():
    build = os.path.join(ROOT, sys.argv[1] if len(sys.argv) > 1 else "build")
    with open(DOC) as f:
        found = examples(f.read())
    if not found:
        print("check_library: docs/library.md has no examples")
        print("0 passed, 1 failed")
        return 1
    tmp = tempfile.mkdtemp(prefix="idem-libcheck-")
    passed = failed = 0
    try:
        dest = os.path.join(tmp, "root")
        r = subprocess.run(["meson", "install", "-C", build, "--destdir", dest, "--no-rebuild",
                            "--quiet"], capture_output=True, text=True)
        if r.returncode != 0:
            print("check_library: meson install failed:\n" + r.stdout + r.stderr)
            print("0 passed, 1 failed")
            return 1
        pcs = glob.glob(os.path.join(dest, "**", "libidem.pc"), recursive=True)
        if len(pcs) != 1:
            print(f"check_library: expected one libidem.pc under the install, found {pcs}")
            print("0 passed, 1 failed")
            return 1
        pcdir = os.path.dirname(pcs[0])
        # The .pc names prefix=/usr/local (or the configured prefix); point
        # it at the staged copy, as a package built with DESTDIR would be.
        prefix = subprocess.run(["pkg-config", "--variable=prefix", "libidem"],
                                env=dict(os.environ, PKG_CONFIG_PATH=pcdir),
                                capture_output=True, text=True).stdout.strip()
        staged = dest + prefix

        def pkg_flags(pkgs):
            # libidem from the staged copy; the others as the system has them.
            out = []
            for pkg in pkgs:
                define = ["--define-variable=prefix=" + staged] if pkg == "libidem" else []
                r = subprocess.run(["pkg-config"] + define + ["--cflags", "--libs", pkg],
                                   env=dict(os.environ, PKG_CONFIG_PATH=pcdir),
                                   capture_output=True, text=True)
                if r.returncode != 0:
                    return None
                out += r.stdout.split()
            return out
        libdir = subprocess.run(["pkg-config", "--define-variable=prefix=" + staged,
                                 "--variable=libdir", "libidem"],
                                env=dict(os.environ, PKG_CONFIG_PATH=pcdir),
                                capture_output=True, text=True).stdout.strip()
        for name, code, pkgs in found:
            work = os.path.join(tmp, name[:-2])
            os.makedirs(work)
            src = os.path.join(work, name)
            with open(src, "w") as f:
                f.write(code)
            exe = os.path.join(work, "prog")
            cc = ["cc", "-std=c17", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE", src, "-o", exe]
            flags = pkg_flags(pkgs)
            if flags is None:
                failed += 1
                print(f"  {name}: pkg-config {' '.join(pkgs)} failed", flush=True)
                continue
            cc += flags
            r = subprocess.run(cc, capture_output=True, text=True)
            if r.returncode != 0:
                failed += 1
                print(f"  {name}: does not compile\n{r.stderr}", flush=True)
                continue
            env = dict(os.environ, LD_LIBRARY_PATH=libdir)
            try:
                r = subprocess.run([exe], cwd=work, env=env, capture_output=True, text=True,
                                   timeout=60)
            except subprocess.TimeoutExpired:
                failed += 1
                print(f"  {name}: timed out", flush=True)
                continue
            if r.returncode != 0:
                failed += 1
                print(f"  {name}: exit {r.returncode}\n{r.stdout}{r.stderr}", flush=True)
            else:
                passed += 1
                print(f"  {name}: ok", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
