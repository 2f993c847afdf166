package host

import "golang.org/x/sys/unix"

// HaveNetAdmin reports whether the calling thread holds CAP_NET_ADMIN in
// its effective set: what creating the TUN, addressing it and routing the
// VIPs need. A service started by systemd as an unprivileged user with
// AmbientCapabilities=CAP_NET_ADMIN (the Debian package's weir@.service)
// has it without being root. Capabilities are per thread in Linux, but a
// process given them at exec time has them on every thread.
func HaveNetAdmin() bool { return holdsEffective(unix.CAP_NET_ADMIN) }

// holdsEffective reports whether the calling thread has capability c
// in its effective set.
func holdsEffective(c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[c/32].Effective&(1<<(c%32)) != 0
}

// holdsOnlyKeptCaps reports whether the process can hold no capability but
// keptCaps: neither its permitted nor its bounding set has another one.
// A unit that gives CAP_NET_ADMIN alone (User=weir, CapabilityBoundingSet=
// and AmbientCapabilities=CAP_NET_ADMIN) starts weir so; there is nothing
// left to drop, and trying would fail for want of CAP_SETPCAP.
func holdsOnlyKeptCaps() bool {
	keep := map[int]bool{}
	for _, c := range keptCaps {
		keep[c] = true
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	for c := 0; c <= lastCap(); c++ {
		if keep[c] {
			continue
		}
		if data[c/32].Permitted&(1<<(c%32)) != 0 {
			return false
		}
		if in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err != nil || in != 0 {
			return false
		}
	}
	return true
}
