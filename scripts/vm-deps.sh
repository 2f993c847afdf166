#!/usr/bin/env bash
# Installs what `make vmtest` needs on a Debian machine: QEMU (runs under KVM
# when /dev/kvm exists, TCG software emulation otherwise), a Debian kernel with
# its modules (the VM boots it; sch_netem and veth come from its modules), and a
# static busybox (the VM's userland). Idempotent: a second run only checks.
set -euo pipefail

pkgs=(qemu-system-x86 linux-image-amd64 busybox-static)

missing=()
for p in "${pkgs[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done

if [ ${#missing[@]} -eq 0 ]; then
	echo "vm-deps: all present (${pkgs[*]})"
else
	if [ "$(id -u)" != 0 ]; then
		echo "vm-deps: missing ${missing[*]}; run as root: sudo scripts/vm-deps.sh" >&2
		exit 1
	fi
	echo "vm-deps: installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Report what the harness will use, so a failure later names the real cause.
kernel=$(ls -1 /boot/vmlinuz-* 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$kernel" ]; then
	echo "vm-deps: no /boot/vmlinuz-* after install" >&2
	exit 1
fi
command -v qemu-system-x86_64 >/dev/null || { echo "vm-deps: qemu-system-x86_64 not on PATH" >&2; exit 1; }
[ -x /bin/busybox ] || { echo "vm-deps: /bin/busybox missing" >&2; exit 1; }
if [ -e /dev/kvm ]; then accel=kvm; else accel="tcg (no /dev/kvm: slower)"; fi
echo "vm-deps: kernel $kernel, $(qemu-system-x86_64 --version | head -n 1), accel $accel"
