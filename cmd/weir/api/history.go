package api

import "time"

// History is the recent past of the appliance, as /history serves it and the
// status page (/ui) draws it: one series per target, per QoS level and per
// refusal kind, each the last Capacity samples (one per sampling interval),
// oldest first.
//
// Series are columnar: the i-th element of every slice of a series belongs
// to the i-th sample time At[i] (Unix milliseconds), so a long history stays
// a small document. A series missing from a sample (a target a reload
// removed) simply has no element for it.
type History struct {
	Capacity int       `json:"capacity"` // samples each series keeps
	Now      time.Time `json:"now"`      // when the document was made
	// Interval is the sampling interval of the running configuration: the
	// time between two samples.
	Interval time.Duration `json:"interval"`
	// Reloads are the configuration reloads (and rejected reloads) since
	// the oldest sample kept.
	Reloads  []ReloadEvent   `json:"reloads"`
	Targets  []TargetSeries  `json:"targets"`  // by service (configuration order), then target
	Levels   []LevelSeries   `json:"levels"`   // in /status's order
	Refusals []RefusalSeries `json:"refusals"` // by level then limit
}

// ReloadEvent is one reload on the time axis.
type ReloadEvent struct {
	At         int64  `json:"at"`              // Unix milliseconds
	Generation int64  `json:"generation"`      // the generation in force after it
	Error      string `json:"error,omitempty"` // set when the configuration was rejected and the old one kept
}

// TargetSeries is one target's weights and their explanation over time.
// Fractions are in percent, loss ratios in tenths of a percent.
type TargetSeries struct {
	Service string  `json:"service"`
	Target  string  `json:"target"`
	At      []int64 `json:"at"` // Unix milliseconds

	Weight    []int `json:"weight"`    // WLM (base) weight
	Effective []int `json:"effective"` // weight after the QoS fraction

	// The parts of the fraction, which add up to it: loss and timeout (the
	// default QoS fraction), pressure (the rest of the default fraction when
	// active connections reached 90 % of maxConnections), and conn and
	// minrate (what a policy action's MaxConnWeightFr or MinRate verdict
	// adds on top of the default fraction).
	LossPart     []int `json:"loss_part"`
	TimeoutPart  []int `json:"timeout_part"`
	PressurePart []int `json:"pressure_part"`
	ConnPart     []int `json:"conn_part"`
	MinRatePart  []int `json:"min_rate_part"`

	// LossFromTarget is the loss ratio over the sampling interval of the
	// data segments the target sent, LossToTarget that of weir's own sends
	// toward it (from Target.Segments: retransmitted / data segments); -1
	// where a direction is not measured (source "none" or "estimate", and
	// at a series' first sample). Without Segments, LossFromTarget is the
	// explanation's loss ratio.
	LossFromTarget []int `json:"loss_from_target"`
	LossToTarget   []int `json:"loss_to_target"`

	Open []int64 `json:"open"` // open connections
	Max  []int64 `json:"max"`  // maxConnections; ≤ 0: no limit
}

// LevelSeries is one QoS level's measurements against its limits over time.
type LevelSeries struct {
	Level          string  `json:"level"` // "instance", "class" or "virtual server"
	Name           string  `json:"name"`
	At             []int64 `json:"at"`              // Unix milliseconds
	Bandwidth      []int64 `json:"bandwidth"`       // bytes/s over the metric interval
	MaxBandwidth   []int64 `json:"max_bandwidth"`   // bytes/s; 0: no limit
	Connections    []int64 `json:"connections"`     // counted now
	MaxConnections []int64 `json:"max_connections"` // 0: no limit
}

// RefusalSeries is one limit's refusals over time: Count[i] is the total at
// At[i] (since start), so the refusals of an interval are the difference of
// two neighbours.
type RefusalSeries struct {
	Level string   `json:"level"`
	Limit string   `json:"limit"`
	At    []int64  `json:"at"` // Unix milliseconds
	Count []uint64 `json:"count"`
}
