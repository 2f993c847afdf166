#!/usr/bin/env bash
# Installs what weir's tests need on a fresh Debian machine with Go.
# Idempotent: a second run only checks.
set -euo pipefail

need_apt=()
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
# packaging/deb_test.go: systemd-sysusers (postinst in a throwaway root), systemd-analyze verify
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
if [ ${#need_apt[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ]; then
		echo "deps: installing ${need_apt[*]}"
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
	else
		echo "deps: missing ${need_apt[*]} (root needed to install; tests that need them will skip)"
	fi
fi

gobin=$(go env GOPATH)/bin
if [ ! -x "$gobin/staticcheck" ]; then
	echo "deps: installing staticcheck"
	go install honnef.co/go/tools/cmd/staticcheck@v0.8.2
fi
