package fault

// SetRates changes the faults of both directions from now on: write for
// packets written to the wrapper, read for packets read from it. Packets
// already waiting in the delay queue keep their fate. A test or the demo
// uses it to turn loss on and off on a running connection.
func (d *Device) SetRates(write, read Rates) {
	if write.delays() || read.delays() {
		d.allocDelayBuffers()
	}
	for i, r := range [2]Rates{dirWrite: write, dirRead: read} {
		dr := &d.dirs[i]
		dr.mu.Lock()
		dr.rates = r
		dr.faulty.Store(r != (Rates{}))
		dr.mu.Unlock()
	}
}

// Rates returns the faults in force for writes and reads.
func (d *Device) Rates() (write, read Rates) {
	for i, p := range [2]*Rates{dirWrite: &write, dirRead: &read} {
		dr := &d.dirs[i]
		dr.mu.Lock()
		*p = dr.rates
		dr.mu.Unlock()
	}
	return write, read
}
