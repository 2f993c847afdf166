// Command weir is the weir appliance: a userspace, packet-level QoS appliance
// and load balancer. Run `weir --help` for its subcommands.
//
// cmd/weir is the control plane: it reads files, parses flags, logs and serves
// HTTP, and wires the pure libraries (policy, balancer) to the datapath and
// netstack. It may import every package of the module. Each subcommand lives
// in its own file (check.go, version.go, …) and is added in root.go.
package main

import "os"

func main() {
	os.Exit(execute(os.Args[1:], os.Stdout, os.Stderr))
}
