// Command weir is the weir appliance: a userspace, packet-level QoS appliance
// and load balancer. Run `weir --help` for its subcommands.
package main

import (
	"fmt"
	"os"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "version" {
		fmt.Println("weir", version)
		return
	}
	fmt.Fprintln(os.Stderr, "usage: weir version")
	os.Exit(2)
}
