#!/usr/bin/env bash
# Installs what weir's tests need on a fresh Debian machine with Go.
# Idempotent: a second run only checks.
set -euo pipefail

# command → Debian package, for every tool a test runs: ip (namespaces and
# routes), iperf3 (the harness smoke test in bench/cmd/weirbench), nft
# (random loss in a test's own namespace: numgen), tcpdump (reading the
# pcap that weir run --capture writes), systemd-analyze and systemd-sysusers
# (packaging/deb_test.go: the unit verified, postinst in a throwaway root),
# chromium (the status page test loads /ui in a headless browser),
# redis-server (cmd/weir/internal/cluster: each test starts its own on a
# loopback port, without persistence), ab (apache2-utils: the http request
# tests in cmd/weir/e2e/e2e_requests_test.go run ApacheBench in their namespace),
# openssl and curl (cmd/weir/e2e/e2e_sni_test.go: openssl s_server TLS
# backends behind a tls VIP, curl --resolve and openssl s_client -servername).
# dnsmasq (dnsmasq-base) and dig (bind9-dnsutils: the udp service tests in
# cmd/weir/e2e/e2e_udp_test.go serve DNS per target and query it through weir).
# haproxy (cmd/weir/e2e/e2e_proxyproto_test.go: the PROXY protocol's other
# end, started in the test's namespace; the package's own service is stopped
# and disabled).
need_apt=()
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v iperf3 >/dev/null 2>&1 || need_apt+=(iperf3)
command -v nft >/dev/null 2>&1 || need_apt+=(nftables)
command -v tcpdump >/dev/null 2>&1 || need_apt+=(tcpdump)
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v ab >/dev/null 2>&1 || need_apt+=(apache2-utils)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v dnsmasq >/dev/null 2>&1 || [ -x /usr/sbin/dnsmasq ] || need_apt+=(dnsmasq-base)
command -v dig >/dev/null 2>&1 || need_apt+=(bind9-dnsutils)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need_apt+=(haproxy)
if [ ${#need_apt[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ]; then
		echo "deps: installing ${need_apt[*]}"
		# iperf3's package asks whether to start a daemon: no, the tests
		# start their own servers inside their namespaces.
		echo "iperf3 iperf3/start_daemon boolean false" | debconf-set-selections 2>/dev/null || true
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
		# The package starts its service where systemd runs (the stock
		# config listens nowhere); the tests start their own HAProxy.
		if [[ " ${need_apt[*]} " == *" haproxy "* ]] && [ -d /run/systemd/system ]; then
			systemctl disable --now haproxy >/dev/null 2>&1 || true
		fi
	else
		echo "deps: missing ${need_apt[*]} (root needed to install; tests that need them will skip)"
	fi
fi

gobin=$(go env GOPATH)/bin
if [ ! -x "$gobin/staticcheck" ]; then
	echo "deps: installing staticcheck"
	go install honnef.co/go/tools/cmd/staticcheck@v0.8.2
fi
