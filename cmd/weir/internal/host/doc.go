// Package host is weir run's process plumbing on the host: the Go
// runtime's memory settings (GOGC, the soft memory limit from a flag or
// the cgroup), GOMAXPROCS, the capabilities weir keeps and the user it
// becomes, and whether the host forwards what the back arm sends.
//
// Each setting is a pure decision and an apply: DecideMemory/ApplyMemory,
// DecideProcs/ApplyProcs, PlanDrop/DropPrivileges. A decision reads only
// its arguments (the environment comes in as a getenv function) and
// changes nothing, so that its table tests need no process of their own;
// the apply puts it into effect.
package host
