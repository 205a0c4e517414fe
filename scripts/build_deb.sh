#!/usr/bin/env bash
# scripts/build_deb.sh - `make deb`: the Debian packages of idem, from this
# source tree, into build/deb/.
#
# dpkg-buildpackage builds in the tree it is given and writes its results
# into that tree's parent, so it is given a copy: build/deb/src/idem-VERSION,
# holding the files git knows (tracked, or new and not ignored) as they are
# in the working tree now, or, outside a git checkout, the tree less what
# .gitignore lists.  The .deb, .ddeb, .buildinfo and .changes files are
# moved up into build/deb/ and the copy is removed, so the source tree gets
# no debian/.debhelper, debian/tmp or obj-* of its own.  The packages are
# described in debian/ (debian/rules says which meson options it uses).
#
# Usage: scripts/build_deb.sh      (scripts/deps.sh deb installs the tools)
# Prints the packages it made, one per line.  Exits non-zero when
# dpkg-buildpackage fails; its output is then in build/deb/build.log.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
out="$root/build/deb"
version=$(dpkg-parsechangelog -l debian/changelog -S Version)
upstream=${version%-*}
src="$out/src/idem-$upstream"

rm -rf "$out"
mkdir -p "$src"

if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # Tracked and new files, without those deleted in the working tree.
    git -C "$root" ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do
            [ -e "$f" ] || [ -L "$f" ] && printf '%s\0' "$f"
        done |
        tar -C "$root" --null -T - -cf - | tar -C "$src" -xf -
else
    tar -C "$root" --exclude='./build*' --exclude='./obj-*' --exclude='./.git' \
        --exclude='./idem-data' --exclude='./.run' --exclude='__pycache__' \
        --exclude='*.pyc' --exclude='./fuzz/corpus-work' --exclude='./bench/results' \
        --exclude='./bench/express/node_modules' -cf - . | tar -C "$src" -xf -
fi

# At most two compiler jobs (the machine is shared); the meson tests are off
# in debian/rules anyway.
export DEB_BUILD_OPTIONS="parallel=2 nocheck ${DEB_BUILD_OPTIONS:-}"
echo "deb: dpkg-buildpackage in $src (log: build/deb/build.log)" >&2
if ! (cd "$src" && dpkg-buildpackage -us -uc -b) >"$out/build.log" 2>&1; then
    tail -n 40 "$out/build.log" >&2
    echo "deb: dpkg-buildpackage failed; the whole log is build/deb/build.log" >&2
    exit 1
fi

shopt -s nullglob
for f in "$out"/src/*.deb "$out"/src/*.ddeb "$out"/src/*.buildinfo "$out"/src/*.changes; do
    mv "$f" "$out/"
done
rm -rf "$out/src"
ls -1 "$out"/*.deb
