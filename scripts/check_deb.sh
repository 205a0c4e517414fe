#!/usr/bin/env bash
# scripts/check_deb.sh - the Debian packages checked as a user would meet them.
#
# Builds the packages (`make deb`), or takes those already in DIR, then:
# lintian must report no error; the four packages are unpacked with
# `dpkg -x` into a temporary root (nothing is installed on this machine, so
# it works in a container or a chroot, as root, with no input) and from that
# root: the unit file passes `systemd-analyze verify` and keeps its hardening
# score, the installed idemd prints its version, accepts the installed
# /etc/idem/idem.yaml, and proxies a keyed POST to a small upstream and
# replays it (sent with the installed idemctl), then exits 0 on SIGTERM; the
# manual pages render without a groff warning and name every option and
# configuration key; libidem.pc works through pkg-config and a small program
# compiled against the unpacked headers links both libraries and prints
# idem_version(); the unpacked libidem.so.0 and libidem.a export the
# IDEM_EXTERN API of include/idem/ and nothing else (scripts/check_exports.py).
#
# systemd-analyze verify needs systemd's own units (sysinit.target, ...)
# under its --root: the host's /lib/systemd/system is copied beside the
# package's unit in the temporary root, which also lets it run where systemd
# is not PID 1.
#
# Usage: scripts/check_deb.sh [DIR]     (DIR: .deb files already built)
# Prints `ok - ...` or `FAIL - ...` per check and ends with
# `N passed, N failed`; exits 1 when any check failed.
set -uo pipefail

cd "$(dirname "$0")/.."
root_dir=$(pwd)
passed=0
failed=0
ok() { echo "ok - $*"; passed=$((passed + 1)); }
fail() { echo "FAIL - $*"; failed=$((failed + 1)); }
# check NAME CMD...: one check from a command's exit status; its output is
# shown only when it fails.
check() {
    local name=$1 out
    shift
    if out=$("$@" 2>&1); then
        ok "$name"
    else
        fail "$name"
        [ -n "$out" ] && printf '%s\n' "$out" | sed 's/^/    /' | tail -n 30
    fi
}
finish() {
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit $?
}

tmp=$(mktemp -d /tmp/idem-check-deb.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

scripts/deps.sh deb || { fail "scripts/deps.sh deb"; finish; }

# (a) The packages.
if [ $# -ge 1 ]; then
    debdir=$(cd "$1" && pwd)
else
    if make --no-print-directory deb >"$tmp/make-deb.log" 2>&1; then
        ok "make deb"
    else
        fail "make deb"
        tail -n 30 "$tmp/make-deb.log" | sed 's/^/    /'
        finish
    fi
    debdir=$root_dir/build/deb
fi
version=$(dpkg-parsechangelog -l debian/changelog -S Version)
upstream=${version%-*}
arch=$(dpkg --print-architecture)
ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
debs=()
for p in idemd idemctl libidem0 libidem-dev; do
    f=$debdir/${p}_${version}_${arch}.deb
    if [ -f "$f" ]; then debs+=("$f"); else fail "package $p: no $f"; fi
done
[ ${#debs[@]} -eq 4 ] || finish
ok "packages idemd idemctl libidem0 libidem-dev $version"

meson_version=$(sed -n "s/^ *version *: *'\([^']*\)'.*/\1/p" meson.build | head -n1)
if [ "$meson_version" = "$upstream" ]; then
    ok "debian/changelog's version $version follows meson's $meson_version"
else
    fail "debian/changelog's version $version, meson's $meson_version"
fi

# (b) lintian: errors fail, warnings are listed.
changes=$(ls "$debdir"/*.changes 2>/dev/null | head -n1)
if [ -n "$changes" ]; then targets=("$changes"); else targets=("${debs[@]}"); fi
lintian --fail-on error --info --display-info "${targets[@]}" >"$tmp/lintian.txt" 2>&1
lintian_rc=$?
errors=$(grep -c '^E:' "$tmp/lintian.txt")
warnings=$(grep -c '^W:' "$tmp/lintian.txt")
if [ "$lintian_rc" -eq 0 ] && [ "$errors" -eq 0 ]; then
    ok "lintian ${targets[*]##*/}: 0 errors, $warnings warnings"
else
    fail "lintian ${targets[*]##*/}: $errors errors, $warnings warnings (exit $lintian_rc)"
    grep -vE '^[EWIN]:|^N:' "$tmp/lintian.txt" | grep -v 'root privileges' | sed 's/^/    /' | tail -n 20
fi
grep -E '^[EW]:' "$tmp/lintian.txt" | sed 's/^/    /'

# (c) Unpacked into a throwaway root, never installed here.
dest=$tmp/root
mkdir -p "$dest"
for f in "${debs[@]}"; do dpkg -x "$f" "$dest" || fail "dpkg -x $f"; done
idemd=$dest/usr/sbin/idemd
idemctl=$dest/usr/bin/idemctl
conf=$dest/etc/idem/idem.yaml
unit=$dest/lib/systemd/system/idemd.service
libdir=$dest/usr/lib/$ma

expect_files() {
    local missing=0
    for f in usr/sbin/idemd lib/systemd/system/idemd.service etc/idem/idem.yaml \
             usr/share/man/man8/idemd.8.gz usr/share/man/man5/idem.yaml.5.gz \
             usr/bin/idemctl usr/share/man/man1/idemctl.1.gz \
             "usr/lib/$ma/libidem.so.0" "usr/lib/$ma/libidem.so" "usr/lib/$ma/libidem.a" \
             "usr/lib/$ma/pkgconfig/libidem.pc" usr/include/idem/idem.h usr/include/idem/version.h; do
        [ -e "$dest/$f" ] || { echo "missing: $f"; missing=1; }
    done
    objdump -p "$libdir/libidem.so.0" | grep -q 'SONAME *libidem\.so\.0$' || { echo "soname is not libidem.so.0"; missing=1; }
    return $missing
}
check "the packages hold the daemon, unit, conffile, CLI, library, headers and man pages" expect_files

conffile() {
    dpkg-deb --ctrl-tarfile "$debdir/idemd_${version}_${arch}.deb" | tar -xOf - ./conffiles | grep -qx /etc/idem/idem.yaml
}
check "/etc/idem/idem.yaml is a conffile of idemd" conffile
check "idemd's maintainer scripts parse (sh -n)" sh -c \
    "dpkg-deb -e '$debdir/idemd_${version}_${arch}.deb' '$tmp/ctrl' && sh -n '$tmp/ctrl/postinst' && sh -n '$tmp/ctrl/postrm'"

# systemd-analyze verify --root wants systemd's units in the root too.
verify_unit() {
    cp -an /lib/systemd/system/. "$dest/lib/systemd/system/" || return 1
    # ExecReload names /bin/kill, of procps, which idemd Depends on: the
    # root holds the package alone, so the file is put there as installed.
    mkdir -p "$dest/bin" && cp -an /bin/kill "$dest/bin/kill" || return 1
    local out
    out=$(MANPATH=$dest/usr/share/man SYSTEMD_LOG_COLOR=0 \
          systemd-analyze verify --root="$dest" idemd.service 2>&1) || { echo "$out"; return 1; }
    # A misspelt key is only a warning to verify: any output fails the check.
    [ -z "$out" ] || { echo "$out"; return 1; }
}
check "systemd-analyze verify idemd.service (in the unpacked root)" verify_unit
check "systemd-analyze security idemd.service: exposure at most 2.0" \
    systemd-analyze security --offline=yes --root="$dest" --threshold=20 --no-pager idemd.service
unit_has() {
    local missing=0
    for line in "User=idem" "ProtectSystem=strict" "ProtectHome=yes" "PrivateTmp=yes" \
                "NoNewPrivileges=yes" "CapabilityBoundingSet=" "StateDirectory=idem" \
                "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX" "SystemCallFilter=@system-service" \
                "ExecStart=/usr/sbin/idemd --config /etc/idem/idem.yaml"; do
        grep -qx "$line" "$unit" || { echo "idemd.service lacks: $line"; missing=1; }
    done
    return $missing
}
check "idemd.service runs as idem with its sandbox" unit_has

# (d) The installed idemd.
check "idemd --version prints $upstream" sh -c "'$idemd' --version | grep -qx 'idemd $upstream'"
check "idemctl --version prints $upstream" sh -c "'$idemctl' --version | grep -q '^idemctl $upstream '"
check "idemd -t --config <installed /etc/idem/idem.yaml>" "$idemd" -t --config "$conf"
# The commented-out defaults, uncommented, must be valid too.
sed -E 's/^#([a-z_]+:|  +(- )?[a-z_]+:)/\1/' "$conf" >"$tmp/uncommented.yaml"
check "idem.yaml with every commented key uncommented passes idemd -t" \
    "$idemd" -t --config "$tmp/uncommented.yaml"

ports=$(python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')
read -r up_port port admin_port <<<"$ports"

# An upstream that counts the POSTs it executed and says how many.
cat >"$tmp/upstream.py" <<'PY'
import http.server, json, sys
count = 0
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        global count
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        count += 1
        body = json.dumps({"executions": count}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
python3 "$tmp/upstream.py" "$up_port" &
pids+=($!)
"$idemd" --config "$conf" --listen "127.0.0.1:$port" --admin "127.0.0.1:$admin_port" \
    --upstream "http://127.0.0.1:$up_port" --store "lmdb:$tmp/store" 2>"$tmp/idemd.log" &
idemd_pid=$!
pids+=($idemd_pid)
up=0
for _ in $(seq 100); do
    if "$idemctl" keys get nothing --admin "http://127.0.0.1:$admin_port" -m 1 >/dev/null 2>&1 ||
       [ $? -eq 22 ]; then
        up=1
        break
    fi
    sleep 0.1
done
if [ $up -eq 1 ]; then ok "the installed idemd starts with the installed config on 127.0.0.1:$port"
else fail "the installed idemd did not answer on 127.0.0.1:$admin_port"; sed 's/^/    /' "$tmp/idemd.log"; fi

key="check-deb-$$"
first=$("$idemctl" request -i --key "$key" "http://127.0.0.1:$port/pay" -d amount=1 2>&1)
second=$("$idemctl" request -i --key "$key" "http://127.0.0.1:$port/pay" -d amount=1 2>&1)
if grep -q '"executions": 1' <<<"$first" && ! grep -qi '^X-Idempotent-Replay:' <<<"$first"; then
    ok "a POST with an Idempotency-Key (sent by idemctl) reaches the upstream once"
else
    fail "the first POST: $first"
fi
if grep -qi '^X-Idempotent-Replay: true' <<<"$second" && grep -q '"executions": 1' <<<"$second"; then
    ok "the same POST again is a replay (X-Idempotent-Replay: true, executions 1)"
else
    fail "the second POST is not a replay: $second"
fi
kill -TERM "$idemd_pid" 2>/dev/null
rc=124
for _ in $(seq 100); do
    if ! kill -0 "$idemd_pid" 2>/dev/null; then wait "$idemd_pid"; rc=$?; break; fi
    sleep 0.1
done
if [ $rc -eq 0 ]; then ok "idemd exits 0 on SIGTERM"
else fail "idemd on SIGTERM: exit $rc"; sed 's/^/    /' "$tmp/idemd.log"; fi

# The manual pages: no groff warning, and every option and key named.
for page in man8/idemd.8 man1/idemctl.1 man5/idem.yaml.5; do
    f=$dest/usr/share/man/$page.gz
    warn=$(LC_ALL=C.UTF-8 MANROFFSEQ='' MANWIDTH=80 man --warnings -E UTF-8 -l -Tutf8 -Z "$f" 2>&1 >/dev/null)
    if [ -f "$f" ] && [ -z "$warn" ]; then ok "man -l $page renders without warnings"
    else fail "man -l $page: ${warn:-missing}"; fi
done
render() { LC_ALL=C.UTF-8 MANWIDTH=200 man -l "$dest/usr/share/man/$1.gz" 2>/dev/null; }
names_all() {   # names_all PAGE WORD...: each WORD appears in the rendered PAGE
    local page=$1 text missing=0
    shift
    text=$(render "$page")
    for w in "$@"; do grep -qF -- "$w" <<<"$text" || { echo "$page does not name $w"; missing=1; }; done
    return $missing
}
check "idemd(8) names every option of idemd --help" \
    names_all man8/idemd.8 $("$idemd" --help | grep -oE -- '(^|[ [])--?[a-zA-Z][a-z-]*' | tr -d '[' | sort -u)
check "idemctl(1) names every option of idemctl --help" \
    names_all man1/idemctl.1 $("$idemctl" --help | grep -oE -- '(^|[ [])--?[a-zA-Z][a-z-]*' | tr -d '[' | sort -u)
check "idem.yaml(5) names every key of docs/configuration.md" \
    names_all man5/idem.yaml.5 $(grep -oE '^\| `[a-z_]+` \|' docs/configuration.md | tr -d '|` ' | sort -u)

# libidem-dev: pkg-config on the unpacked libidem.pc, a program on both libraries.
export PKG_CONFIG_SYSROOT_DIR=$dest PKG_CONFIG_PATH=$libdir/pkgconfig
check "pkg-config --modversion libidem is $upstream" sh -c "[ \"\$(pkg-config --modversion libidem)\" = '$upstream' ]"
if flags=$(pkg-config --cflags --libs libidem 2>&1); then ok "pkg-config --cflags --libs libidem: $flags"
else fail "pkg-config --cflags --libs libidem: $flags"; fi
cat >"$tmp/version.c" <<'C'
/* the smallest libidem program: the library's version against the header's */
#include <stdio.h>
#include <string.h>

#include <idem/idem.h>

int main(void)
{
    printf("%s\n", idem_version());
    return strcmp(idem_version(), IDEM_VERSION_STRING) != 0;
}
C
check "a program compiles and links against libidem.so (pkg-config)" \
    cc -std=c17 -Wall -Wextra -Werror "$tmp/version.c" -o "$tmp/version-shared" $flags
check "it runs on the unpacked libidem.so.0 and prints $upstream" sh -c \
    "LD_LIBRARY_PATH='$libdir' ldd '$tmp/version-shared' | grep -q '$libdir/libidem.so.0' &&
     [ \"\$(LD_LIBRARY_PATH='$libdir' '$tmp/version-shared')\" = '$upstream' ]"
# libidem.a with its dependencies linked as shared libraries (Debian ships
# no static libpq to link fully statically): the modules of its
# Requires.private, and -pthread.
private=$(pkg-config --print-requires-private libidem | awk '{print $1}' | paste -sd' ')
check "a program links libidem.a with the shared libraries of its Requires.private ($private) and prints $upstream" sh -c \
    "cc -std=c17 -Wall -Werror '$tmp/version.c' -o '$tmp/version-static' \$(pkg-config --cflags libidem) \
        '$libdir/libidem.a' \$(pkg-config --libs $private) -pthread &&
     ! ldd '$tmp/version-static' | grep -q libidem && [ \"\$('$tmp/version-static')\" = '$upstream' ]"
unset PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_PATH
check "the packaged libidem.so.0 and libidem.a export only the IDEM_EXTERN API" \
    python3 scripts/check_exports.py "$libdir"

finish
