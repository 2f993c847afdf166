#!/usr/bin/env bash
# Installs what `make bench-e2e` needs beyond scripts/deps.sh: iperf3 and
# haproxy (the yardstick column; Debian's packages) and ip (iproute2).
# Idempotent: a second run only checks.
set -euo pipefail

need_apt=()
command -v iperf3 >/dev/null 2>&1 || need_apt+=(iperf3)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
# /usr/sbin is not on every root PATH.
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need_apt+=(haproxy)
if [ ${#need_apt[@]} -eq 0 ]; then
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "bench-deps: missing ${need_apt[*]}; run as root to install them (make bench-e2e needs root anyway)" >&2
	exit 1
fi
echo "bench-deps: installing ${need_apt[*]}"
# iperf3's package asks whether to start a daemon: answer no, the harness
# starts its own server inside the server namespace.
echo "iperf3 iperf3/start_daemon boolean false" | debconf-set-selections 2>/dev/null || true
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
# The package starts its own service where systemd runs (with the stock
# config, which listens nowhere); the harness starts the HAProxy it measures
# in the router namespace, so the service is stopped and left disabled.
if [[ " ${need_apt[*]} " == *" haproxy "* ]] && [ -d /run/systemd/system ]; then
	systemctl disable --now haproxy >/dev/null 2>&1 || true
fi
