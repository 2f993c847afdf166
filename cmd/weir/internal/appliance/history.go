package appliance

// record hands the status after a sampling step to Options.OnSample (the
// status page's history), outside SampleNow so that the demo's and tests'
// extra sampling steps do not add samples out of rhythm.
func (a *Appliance) record() {
	if a.opts.OnSample != nil {
		a.opts.OnSample(a.Status())
	}
}
