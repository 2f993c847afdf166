// Package vmtest is weir's QEMU harness: it boots a Linux kernel with weir
// inside and runs the end-to-end scenarios there, where netem gives real loss
// and delay. It uses only the standard library and the built binary; the
// scenario tests themselves use what the code they test uses (netlink to
// build the topology, x/sys for TCP_INFO, weir's packages).
//
// # Running
//
//	sudo scripts/vm-deps.sh   # once: qemu-system-x86, linux-image-amd64, busybox-static
//	sudo make vmtest          # go test -count=1 -timeout 30m ./vmtest/ -run VM -v
//
// Installing needs root. Running needs none where the kernel image is
// world-readable (Debian); some distributions (Ubuntu) install
// /boot/vmlinuz-* readable only by root, hence sudo. QEMU runs unprivileged
// and needs no KVM: it emulates the CPU with TCG, slower but anywhere
// (WEIR_VMTEST_ACCEL=kvm uses KVM instead, where /dev/kvm is known to boot
// guests: on some hosts a nested /dev/kvm opens but its guests hang after
// the BIOS). The scenarios are root inside the VM whoever runs QEMU.
// Where the emulator, a readable kernel or a static busybox is missing, the
// VM tests skip and say what to run. They also skip unless asked for (any
// -run pattern, as `make vmtest` passes, or WEIR_VMTEST=1): each costs a
// minute or more of emulated CPU, too much for every `go test ./...`. The other tests of this package test
// the harness itself and need nothing.
//
// # How it works
//
// A scenario is an ordinary test whose name contains VM:
//
//	func TestVMNetemLoss(t *testing.T) {
//		if !vmtest.InVM() {
//			vmtest.RunTest(t, vmtest.Options{Modules: []string{"veth", "sch_netem"}})
//			return
//		}
//		// the scenario: runs inside the VM, as root, in a fresh kernel
//	}
//
// On the host, RunTest takes a static build of the test binary (the binary
// itself when it is static, else `go test -c` with CGO_ENABLED=0, once per
// process) and calls Boot, which:
//
//  1. builds an initramfs: cpio "newc" archives written by this package
//     (cpio.go). The base archive (busybox, the kernel modules, /dev/console)
//     is cached under vmtest/cache/ (gitignored), keyed by its inputs; a
//     second archive, appended to it (the kernel unpacks concatenated
//     archives), holds /init, the binary as /test and Options.Files (such as
//     "/bin/weir").
//  2. resolves Options.Modules through the kernel's modules.dep, dependencies
//     first, skipping those in modules.builtin; /init loads them with insmod.
//  3. boots qemu-system-x86_64 -kernel /boot/vmlinuz-<newest> -initrd …
//     -append "console=ttyS0 quiet panic=-1 mitigations=off" -nographic
//     -no-reboot -nic none
//     -m 512 -smp 2 -cpu max (KVM when /dev/kvm opens, else TCG).
//  4. /init mounts proc, sysfs, devtmpfs and tmpfs, brings lo up, prints
//     VMTEST-START, runs /test with WEIR_IN_VM=1 and the -test.run pattern
//     selecting exactly the calling test, prints VMTEST-EXIT=<status> and
//     reboots, which ends QEMU. A failed insmod prints VMTEST-ERROR=<why>.
//  5. streams the serial console into the test log line by line while the VM
//     runs, maps the exit line to the host test's result (no exit line, an
//     /init error or Options.Timeout, default 5 minutes, fail it; QEMU is
//     killed at the timeout) and logs the boot and total times.
//
// Run is the same without testing.T, for any static program.
//
// # Scenarios
//
// Both build, inside the VM, two network namespaces joined by a veth pair
// (198.18.0.1/24 ↔ 198.18.0.2/24, one segment per packet: gso_max_segs 1)
// with a discard server on the far side, put netem loss on the sender's
// veth, and send a bounded bulk transfer (at most 4 MB and 20 s each).
//
//   - TestVMNetemLoss: kernel sockets; the sender's TCP_INFO
//     total_retrans/segs_out must be within a factor of 2.5 of the netem loss
//     (5 % and 10 %), and under 1 % without netem.
//   - TestVMWeirHostDialerLoss: the same through weir's target leg,
//     netstack.HostDialer, whose Counters (Retransmits/SegmentsSent) feed the
//     QoS loss ratio; same bounds at 0 % and 5 %, and with 50 ms netem delay
//     the leg's RTT lies within [50 ms, 250 ms].
//   - TestVMWeirRunLoss: the whole appliance: the real `weir run` on a TUN
//     in the VM, two HTTP targets each behind its own veth, 5 % netem loss
//     toward one; clients upload through the VIP for a dozen 1 s sampling
//     intervals. The lossy target's measured loss ratio must lie within
//     [2 %, 12.5 %] (read 4.3-5.5 %), the clean one's under 2 % (0.07-0.9 %);
//     the lossy target's fraction rises, its effective weight falls below the
//     clean one's and it gets fewer new connections (25-38 %); SIGTERM exits 0.
//   - TestVMExitStatus: the harness itself: a file from Options.Files
//     arrives intact, a static weir (WeirBinary) runs `weir version` inside,
//     and the program's exit status 7 comes back as Result.ExitCode.
//   - TestVMTimeoutKillsQEMU: Options.Timeout kills QEMU and Run says so.
//
// Under TCG on a two-core host a VM boots in about 15-25 s and the whole
// `make vmtest` takes about a minute once the static test binary is built.
package vmtest
