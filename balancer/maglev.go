package balancer

// Maglev consistent hashing (Eisenbud et al., "Maglev: A Fast and Reliable
// Software Network Load Balancer", NSDI 2016, section 3.4).
//
// Every target has a permutation of the M table slots, derived from its name
// alone: offset = h1(name) mod M, skip = h2(name) mod (M−1) + 1, and its j-th
// preference is (offset + j·skip) mod M. M is prime, so every permutation
// visits every slot. Targets take turns claiming their next unclaimed
// preference until the table is full. Because the permutations depend only on
// names and M, two weir instances with the same targets build the same table,
// so ECMP can spray a flow to either and it reaches the same target.
//
// With equal weights every target claims one slot per round, so each ends up
// with ⌊M/N⌋ or ⌈M/N⌉ slots. Weights are honoured by credit: each round a
// target earns its weight, and claims a slot for every maxWeight of credit, so
// its slot count is proportional to its weight. When a target leaves, the
// slots it held go to others and a few more slots change hands; the paper
// measures that extra disruption as small when M ≫ N.

// maglevSizes are the table sizes used: the smallest with at least 100 slots
// per primary (the paper's M ≫ N), so the default for up to 655 targets is
// 65537. The size only moves when the count of primaries crosses a step,
// since a new size reshuffles every flow.
var maglevSizes = [...]int{65537, 262147, 1048583, 4194319}

func maglevSize(n int) int {
	for _, m := range maglevSizes {
		if m >= 100*n {
			return m
		}
	}
	return maglevSizes[len(maglevSizes)-1]
}

// buildMaglev populates a lookup table of size m (prime) over targets with
// the given names and weights (at least one positive). Entries are indices
// into names.
func buildMaglev(names []string, ws []int, m int) []uint32 {
	const empty = ^uint32(0)
	n := len(names)
	pos := make([]uint64, n)  // the slot each target prefers next
	skip := make([]uint64, n) // its permutation's step
	credit := make([]int, n)
	maxW := 0
	for i, name := range names {
		h := fnv64a(name)
		pos[i] = mix(h) % uint64(m)
		skip[i] = mix(h^0x5bd1e9955bd1e995)%uint64(m-1) + 1
		maxW = max(maxW, ws[i])
	}
	if maxW == 0 {
		return nil
	}
	table := make([]uint32, m)
	for i := range table {
		table[i] = empty
	}
	// advance moves target i to its next preference:
	// (offset + (j+1)·skip) mod M from (offset + j·skip) mod M.
	advance := func(i int) {
		pos[i] += skip[i]
		if pos[i] >= uint64(m) {
			pos[i] -= uint64(m)
		}
	}
	filled := 0
	for filled < m {
		for i := 0; i < n && filled < m; i++ {
			if ws[i] <= 0 {
				continue
			}
			credit[i] += ws[i]
			for credit[i] >= maxW && filled < m {
				credit[i] -= maxW
				for table[pos[i]] != empty {
					advance(i)
				}
				table[pos[i]] = uint32(i)
				advance(i)
				filled++
			}
		}
	}
	return table
}

// fnv64a is FNV-1a: a fixed hash of a target name, the same in every process
// (unlike hash/maphash), which is what lets instances agree on the table.
func fnv64a(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}
