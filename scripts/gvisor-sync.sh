#!/usr/bin/env bash
# Rebuilds third_party/gvisor: the gVisor packages weir builds, at the
# version go.mod requires (gvisor.dev/gvisor), with third_party/patches/
# gvisor-*.patch applied in order. go.mod replaces gvisor.dev/gvisor with
# that directory; TestThirdPartyGVisor checks it is exactly this. To move
# to a newer gVisor: `go get gvisor.dev/gvisor@<version>` (the replace
# stays), run this script, drop or refresh any patch that no longer
# applies (upstream may have fixed the bug: say so in the commit), then
# make test.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
ver=$(go list -m -f '{{.Version}}' gvisor.dev/gvisor 2>/dev/null || true)
if [ -z "$ver" ] || [ "$ver" = "<nil>" ]; then
	ver=$(awk '$1 == "gvisor.dev/gvisor" && $2 ~ /^v/ { print $2; exit }' go.mod)
fi
[ -n "$ver" ] || { echo "gvisor-sync: go.mod requires no gvisor.dev/gvisor" >&2; exit 1; }
dir=$(go mod download -json "gvisor.dev/gvisor@$ver" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$dir" ] || { echo "gvisor-sync: gvisor.dev/gvisor@$ver not downloaded" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Which packages weir (and its tests) import: go mod vendor in a copy of the
# tracked files (as they are now) without the replace.
git ls-files -z | tar --null -T - -c | tar -x -C "$tmp"
(cd "$tmp" && go mod edit -dropreplace gvisor.dev/gvisor && go mod vendor)
out="$tmp/gvisor"
cp -r "$tmp/vendor/gvisor.dev/gvisor" "$out"
for f in go.mod LICENSE AUTHORS; do
	cp "$dir/$f" "$out/$f"
done
chmod -R u+w "$out"
for p in third_party/patches/gvisor-*.patch; do
	[ -e "$p" ] || continue
	echo "gvisor-sync: applying $p"
	(cd "$out" && git apply -p1 "$root/$p")
done
rm -rf third_party/gvisor
mv "$out" third_party/gvisor
echo "gvisor-sync: third_party/gvisor is gVisor $ver, $(find third_party/gvisor -name '*.go' | wc -l) Go files, with $(ls third_party/patches/gvisor-*.patch 2>/dev/null | wc -l) patch(es)"
