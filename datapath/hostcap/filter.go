package hostcap

import (
	"net/netip"
	"slices"

	"golang.org/x/net/bpf"
)

// The kernel filter
//
// The socket is bound to every interface (ifindex 0) and a classic BPF
// program, run by the kernel on each packet before it is queued, keeps only
// TCP segments from or to one of the targets weir dials (address and port,
// IPv4 and IPv6) and cuts them to SnapLen bytes: everything else costs the
// kernel one filter run and the reader nothing. The program reads the
// network header at SKF_NET_OFF, the same for every link type, and
// skb->protocol to tell IPv4 from IPv6:
//
//	ld  skb->protocol ─┬─ 0x86dd: next header TCP? then per target:
//	                   │    src == addr && sport == port ─► ret SnapLen
//	                   │    dst == addr && dport == port ─► ret SnapLen
//	                   │  ─► ret 0
//	                   └─ 0x0800: protocol TCP, not a later fragment?
//	                        x = IHL; per target as above ─► ret 0
//
// An IPv6 segment with extension headers before TCP is not kept (weir's
// kernel sockets send none). A program longer than the kernel's limit
// (BPF_MAXINSNS, 4096: about 180 IPv6 or 400 IPv4 targets) gives way to
// one that keeps every TCP segment; the reader then checks the addresses
// itself.

// SnapLen is the most of a packet the capture keeps: an Ethernet header
// with two VLAN tags (22 bytes), IPv4 with options (60) and TCP with
// options (60).
const SnapLen = 160

// netOff is SKF_NET_OFF: a load relative to the network header.
const netOff = 0xfff00000 // -0x100000

const maxInsns = 4096

// filterFor returns the filter program for targets.
func filterFor(targets []netip.AddrPort) ([]bpf.RawInstruction, error) {
	prog := program(targets)
	if len(prog) > maxInsns {
		prog = allTCP()
	}
	return bpf.Assemble(prog)
}

// program keeps the TCP segments from or to one of targets.
func program(targets []netip.AddrPort) []bpf.Instruction {
	var v4, v6 []netip.AddrPort
	for _, t := range targets {
		a := t.Addr().Unmap()
		switch {
		case a.Is4():
			v4 = append(v4, netip.AddrPortFrom(a, t.Port()))
		case a.Is6():
			v6 = append(v6, t)
		}
	}
	slices.SortFunc(v4, netip.AddrPort.Compare)
	v4 = slices.Compact(v4)
	slices.SortFunc(v6, netip.AddrPort.Compare)
	v6 = slices.Compact(v6)

	reject := bpf.RetConstant{Val: 0}
	accept := bpf.RetConstant{Val: SnapLen}
	var s6 []bpf.Instruction
	s6 = append(s6, bpf.LoadAbsolute{Off: netOff + 6, Size: 1},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: 6, SkipTrue: 1}, reject)
	for _, t := range v6 {
		a := t.Addr().As16()
		for _, end := range []struct{ addr, port uint32 }{{8, 40}, {24, 42}} {
			// 4 words, then the port: each mismatch skips to the next
			// block (past the remaining loads, compares and the ret).
			for w := 0; w < 4; w++ {
				val := uint32(a[4*w])<<24 | uint32(a[4*w+1])<<16 | uint32(a[4*w+2])<<8 | uint32(a[4*w+3])
				left := uint8(2*(3-w) + 3) // instructions after this compare in the block
				s6 = append(s6, bpf.LoadAbsolute{Off: netOff + end.addr + uint32(4*w), Size: 4},
					bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: val, SkipTrue: left})
			}
			s6 = append(s6, bpf.LoadAbsolute{Off: netOff + end.port, Size: 2},
				bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: uint32(t.Port()), SkipTrue: 1}, accept)
		}
	}
	s6 = append(s6, reject)

	var s4 []bpf.Instruction
	s4 = append(s4, bpf.LoadAbsolute{Off: netOff + 9, Size: 1},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: 6, SkipTrue: 1}, reject,
		bpf.LoadAbsolute{Off: netOff + 6, Size: 2},
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x1fff, SkipFalse: 1}, reject,
		bpf.LoadMemShift{Off: netOff})
	for _, t := range v4 {
		a := t.Addr().As4()
		val := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
		for _, end := range []struct{ addr, port uint32 }{{12, 0}, {16, 2}} {
			s4 = append(s4, bpf.LoadAbsolute{Off: netOff + end.addr, Size: 4},
				bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: val, SkipTrue: 3},
				bpf.LoadIndirect{Off: netOff + end.port, Size: 2},
				bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: uint32(t.Port()), SkipTrue: 1}, accept)
		}
	}
	s4 = append(s4, reject)

	prog := []bpf.Instruction{
		bpf.LoadExtension{Num: bpf.ExtProto},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0x86dd, SkipTrue: 1},
		bpf.Jump{Skip: uint32(len(s6))},
	}
	// IPv6 falls into s6; the rest jumps past it to the IPv4 test.
	prog = append(prog, s6...)
	prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0x0800, SkipTrue: 1}, reject)
	return append(prog, s4...)
}

// allTCP keeps every TCP segment (IPv4 not a later fragment, IPv6 with TCP
// as its first next header).
func allTCP() []bpf.Instruction {
	return []bpf.Instruction{
		/* 0 */ bpf.LoadExtension{Num: bpf.ExtProto},
		/* 1 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0x86dd, SkipFalse: 2},
		/* 2 */ bpf.LoadAbsolute{Off: netOff + 6, Size: 1},
		/* 3 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: 6, SkipTrue: 5, SkipFalse: 6},
		/* 4 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0x0800, SkipFalse: 5},
		/* 5 */ bpf.LoadAbsolute{Off: netOff + 9, Size: 1},
		/* 6 */ bpf.JumpIf{Cond: bpf.JumpEqual, Val: 6, SkipFalse: 3},
		/* 7 */ bpf.LoadAbsolute{Off: netOff + 6, Size: 2},
		/* 8 */ bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x1fff, SkipTrue: 1},
		/* 9 */ bpf.RetConstant{Val: SnapLen},
		/* 10 */ bpf.RetConstant{Val: 0},
	}
}
