#!/bin/sh
# scripts/lint.sh - refuse the C library calls the house style bans.
#
# sprintf, vsprintf, strcpy, strcat, atoi, atol, atoll, strtok and gets either
# write past a buffer they cannot see the end of or hide a parse error
# (STYLE.md, "Ban sprintf, strcpy, ...").  Use snprintf, memcpy with a known
# length, strtol/strtoull with an end pointer and errno, strtok_r or a
# hand-written splitter, fgets.
#
# Usage: scripts/lint.sh [DIR...]    default: src examples tests
# Looks at every *.c and *.h under the directories (relative to the
# repository root, whatever the current directory), prints file:line: text
# for each call, and exits 1 when it found any, 0 otherwise.  A name counts
# as a call when "(" follows it, so snprintf, strtok_r, fgets and a word in
# prose do not match; a comment that writes a banned name followed by "("
# is flagged too: write it without the parenthesis.
set -u

cd "$(dirname "$0")/.." || exit 2
[ "$#" -gt 0 ] || set -- src examples tests

banned='(^|[^A-Za-z0-9_])(sprintf|vsprintf|strcpy|strcat|atoi|atol|atoll|strtok|gets)[[:space:]]*\('
status=0
for dir in "$@"; do
    [ -d "$dir" ] || continue
    hits=$(find "$dir" -type f \( -name '*.c' -o -name '*.h' \) -exec grep -HnE "$banned" {} +)
    if [ -n "$hits" ]; then
        printf '%s\n' "$hits"
        status=1
    fi
done
if [ "$status" -ne 0 ]; then
    echo "lint: banned call(s) above; see STYLE.md" >&2
fi
exit "$status"
