// Package policy is weir's decision model: the instance, virtual-server
// classes, virtual servers, targets, policy rules and actions, the performance
// monitor and balancer settings (model.go); the sliding-window bandwidth of the
// Sun Web Server QoS feature (window.go); and the QoS engine — admission limits
// at three levels and the z/OS Sysplex Distributor weight fractions.
//
// A Config is built once (by policy/config from a file, or in code), passed
// through Compile, and then never modified: readers hold it through an
// atomic.Pointer and a reload swaps it whole.
//
// policy is a pure library. It imports the standard library only: never a
// logger, a YAML or JSON library, flag, or gVisor. It returns values and counts;
// the control plane logs and serves them. The parser in policy/config is the
// one subpackage allowed a YAML library.
package policy
