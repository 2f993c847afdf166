package host

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// keptCaps are the capabilities weir run keeps once it is set up:
// CAP_NET_ADMIN, because a reload routes new VIPs through the TUN
// (netlink). Nothing else: the TUN, the admin listener and the open files
// are already there, traffic runs in userspace and targets are dialled
// with ordinary sockets.
var keptCaps = []int{unix.CAP_NET_ADMIN}

// DropPlan is who weir becomes with --user: PlanDrop decides it,
// DropPrivileges applies it.
type DropPlan struct {
	UID, GID int
	Groups   []int
}

// PlanDrop looks up name (a user name or a numeric uid) before anything is
// set up, so that a typo stops weir at once.
func PlanDrop(name string) (*DropPlan, error) {
	u, err := user.Lookup(name)
	if err != nil {
		var unknown user.UnknownUserError
		if _, nerr := strconv.Atoi(name); nerr != nil || !errors.As(err, &unknown) {
			return nil, fmt.Errorf("no user %q: %w", name, err)
		}
		if u, err = user.LookupId(name); err != nil {
			// A numeric uid with no passwd entry: its own group, no others.
			id, _ := strconv.Atoi(name)
			if id <= 0 {
				return nil, fmt.Errorf("uid %d: want a uid above 0", id)
			}
			return &DropPlan{UID: id, GID: id}, nil
		}
	}
	p := &DropPlan{}
	if p.UID, err = strconv.Atoi(u.Uid); err != nil {
		return nil, fmt.Errorf("user %q: uid %q: %w", name, u.Uid, err)
	}
	if p.GID, err = strconv.Atoi(u.Gid); err != nil {
		return nil, fmt.Errorf("user %q: gid %q: %w", name, u.Gid, err)
	}
	if p.UID == 0 {
		return nil, fmt.Errorf("user %q is root: give an unprivileged user, or leave --user out (weir drops its capabilities either way)", name)
	}
	if gids, err := u.GroupIds(); err == nil {
		for _, g := range gids {
			if id, err := strconv.Atoi(g); err == nil {
				p.Groups = append(p.Groups, id)
			}
		}
	}
	if len(p.Groups) == 0 {
		p.Groups = []int{p.GID}
	}
	return p, nil
}

// ErrCgo says why a cgo build cannot drop privileges.
var ErrCgo = errors.New("this weir binary was built with cgo: changing the capabilities of every thread at once needs " +
	"a CGO_ENABLED=0 build (make build)")

// DropPrivileges keeps only keptCaps on every thread of the process: it
// empties the bounding set of everything else, and with p becomes p's
// user and groups (Linux would clear the capabilities on that change;
// PR_SET_KEEPCAPS keeps the permitted ones), then sets the effective,
// permitted and inheritable sets to keptCaps, raises them as ambient
// capabilities (so a program weir might start keeps them too, and only
// them) and sets no_new_privs. Capabilities are per thread in Linux: each
// step runs on every thread of the process (syscall.AllThreadsSyscall;
// syscall.Setresuid and friends do so since Go 1.16).
//
// On error nothing has changed if the first step failed (a cgo build,
// no CAP_SETPCAP); after that the process may be part-way, and weir run
// stops.
func DropPrivileges(p *DropPlan) error {
	if p == nil && holdsOnlyKeptCaps() {
		// Started with CAP_NET_ADMIN alone (a unit without CAP_NET_RAW): nothing to drop.
		return allThreads6(unix.PR_SET_NO_NEW_PRIVS, 1, 0)
	}
	keep := map[int]bool{}
	for _, c := range keptCaps {
		keep[c] = true
	}
	last := lastCap()
	if p == nil && !holdsEffective(unix.CAP_SETPCAP) {
		// Started unprivileged with more than keptCaps (weir@.service adds
		// CAP_NET_RAW for the host capture, opened by now): without
		// CAP_SETPCAP the bounding set cannot shrink, but the permitted
		// set can, and with no_new_privs nothing dropped comes back.
		last = -1
	}
	for c := 0; c <= last; c++ {
		if keep[c] {
			continue
		}
		if err := allThreads(unix.PR_CAPBSET_DROP, uintptr(c), 0); err != nil {
			if errors.Is(err, syscall.EINVAL) {
				continue // a capability this kernel does not know
			}
			return fmt.Errorf("drop %s from the bounding set: %w", capName(c), err)
		}
	}
	if p != nil {
		if err := allThreads(unix.PR_SET_KEEPCAPS, 1, 0); err != nil {
			return fmt.Errorf("PR_SET_KEEPCAPS: %w", err)
		}
		if err := syscall.Setgroups(p.Groups); err != nil {
			return fmt.Errorf("setgroups %v: %w", p.Groups, err)
		}
		if err := syscall.Setresgid(p.GID, p.GID, p.GID); err != nil {
			return fmt.Errorf("setresgid %d: %w", p.GID, err)
		}
		if err := syscall.Setresuid(p.UID, p.UID, p.UID); err != nil {
			return fmt.Errorf("setresuid %d: %w", p.UID, err)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	for _, c := range keptCaps {
		bit := uint32(1) << (c % 32)
		data[c/32].Effective |= bit
		data[c/32].Permitted |= bit
		data[c/32].Inheritable |= bit
	}
	_, _, errno := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0)
	runtime.KeepAlive(&hdr)
	runtime.KeepAlive(&data)
	if errno != 0 {
		return fmt.Errorf("capset: %w", errno)
	}
	for _, c := range keptCaps {
		if err := allThreads6(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, uintptr(c)); err != nil {
			return fmt.Errorf("raise ambient %s: %w", capName(c), err)
		}
	}
	if p != nil {
		if err := allThreads(unix.PR_SET_KEEPCAPS, 0, 0); err != nil {
			return fmt.Errorf("PR_SET_KEEPCAPS off: %w", err)
		}
	}
	if err := allThreads6(unix.PR_SET_NO_NEW_PRIVS, 1, 0); err != nil {
		return fmt.Errorf("PR_SET_NO_NEW_PRIVS: %w", err)
	}
	return nil
}

// allThreads runs prctl(option, arg2, arg3) on every thread.
func allThreads(option int, arg2, arg3 uintptr) error {
	_, _, errno := syscall.AllThreadsSyscall(unix.SYS_PRCTL, uintptr(option), arg2, arg3)
	return threadsErr(errno)
}

// allThreads6 runs prctl(option, arg2, arg3, 0, 0) on every thread: the
// options that insist on zero trailing arguments.
func allThreads6(option int, arg2, arg3 uintptr) error {
	_, _, errno := syscall.AllThreadsSyscall6(unix.SYS_PRCTL, uintptr(option), arg2, arg3, 0, 0, 0)
	return threadsErr(errno)
}

func threadsErr(errno syscall.Errno) error {
	switch errno {
	case 0:
		return nil
	case syscall.ENOTSUP:
		return ErrCgo
	}
	return errno
}

// lastCap is the highest capability number the kernel knows.
func lastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return unix.CAP_LAST_CAP
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return unix.CAP_LAST_CAP
	}
	return n
}

func capName(c int) string {
	switch c {
	case unix.CAP_NET_ADMIN:
		return "CAP_NET_ADMIN"
	case unix.CAP_NET_RAW:
		return "CAP_NET_RAW"
	}
	return "capability " + strconv.Itoa(c)
}
