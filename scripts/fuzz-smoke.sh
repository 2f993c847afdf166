#!/usr/bin/env bash
# Runs every native fuzz target of the module for a bounded time each.
#
#   scripts/fuzz-smoke.sh [BUDGET] each target for BUDGET: a count of
#                                  executions (default 20000x) or a time (5s)
#   scripts/fuzz-smoke.sh --list   print "package target" per target, run nothing
#
# Targets are found by `go test -list '^Fuzz'`, which asks the compiled test
# binaries themselves: a new Fuzz function anywhere in the module (any file,
# any build tag that holds on this machine) is picked up without editing
# this script. Every target runs even when one fails; the exit status is 1
# if any failed, and the failures are listed at the end (a crasher is saved
# under the package's testdata/fuzz, as go test does).
#
# The default budget is a count, not a duration: with a duration, Go 1.26's
# fuzz coordinator can report "context deadline exceeded" as a failure at
# the fuzztime boundary when a loaded machine delays a worker (no input
# fails: golang/go#75804, fixed in Go 1.27). CI run 1 of 2026-12-02 failed
# FuzzSYNKey that way at 5s; a count has no deadline to race.
set -euo pipefail
cd "$(dirname "$0")/.."

list_only=false
t=20000x
case "${1:-}" in
--list) list_only=true ;;
"") ;;
*) t=$1 ;;
esac

# "pkg Fuzz1 Fuzz2 ..." per package that has fuzz targets. -list prints the
# matching names, then "ok <pkg> <time>" for that package.
if ! listing=$(go test -list '^Fuzz' -run '^$' ./... 2>&1); then
	echo "fuzz-smoke: listing the fuzz targets failed:" >&2
	echo "$listing" >&2
	exit 1
fi
targets=$(awk '
	/^Fuzz[A-Za-z0-9_]*$/ { names = names " " $1; next }
	/^ok[ \t]/ { if (names != "") print $2 names; names = "" }
' <<<"$listing")

if [ -z "$targets" ]; then
	echo "fuzz-smoke: no fuzz targets found" >&2
	exit 1
fi

if $list_only; then
	while read -r pkg names; do
		for f in $names; do echo "$pkg $f"; done
	done <<<"$targets"
	exit 0
fi

failed=()
n=0
while read -r pkg names; do
	for f in $names; do
		n=$((n + 1))
		echo "== $pkg $f ($t)"
		if ! go test -run '^$' -fuzz "^$f\$" -fuzztime "$t" "$pkg" </dev/null; then
			failed+=("$pkg $f")
		fi
	done
done <<<"$targets"

if [ ${#failed[@]} -gt 0 ]; then
	echo "fuzz-smoke: ${#failed[@]} of $n targets failed:" >&2
	printf '  %s\n' "${failed[@]}" >&2
	exit 1
fi
echo "fuzz-smoke: $n targets, $t each: ok"
