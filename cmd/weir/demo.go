package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"weir/cmd/weir/internal/demo"
)

func newDemoCmd() *cobra.Command {
	var (
		loss    float64
		useTUN  bool
		uiAddr  string
		history int
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "run the whole appliance in memory through the seeds' scenarios (no root needed)",
		Long: "demo runs weir over in-memory transports with built-in HTTP backends and a built-in\n" +
			"load generator, on the embedded demo config (weir demo --config-dump prints it). It\n" +
			"shows, live: weighted distribution; a target reaching MaxConnections and being skipped;\n" +
			"every target at its limit → 503 naming the limit; loss injected on one target's leg →\n" +
			"its loss fraction rising and its weight falling, traffic moving away and coming back;\n" +
			"ToS marks on egress. It ends with a summary table and exits 1 if a scenario failed.\n\n" +
			"With --ui it also serves the status page on a loopback port and prints its URL: the\n" +
			"scenarios appear as plots (weights, fraction parts, loss, connections, bandwidth,\n" +
			"refusals), and the appliance keeps running after them until Ctrl-C.",
		RunE: func(cmd *cobra.Command, args []string) error {
			if dump, _ := cmd.Flags().GetBool("config-dump"); dump {
				_, err := cmd.OutOrStdout().Write(demo.Config)
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			out := cmd.OutOrStdout()
			live := false
			if f, ok := out.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
				live = true
			}
			fmt.Fprintln(out, "weir demo: the whole appliance in one process, with built-in backends (gVisor stacks behind in-memory links) and load")
			o := demo.Options{Out: out, Live: live, Loss: loss / 100}
			if on, _ := cmd.Flags().GetBool("ui"); on || cmd.Flags().Changed("ui-addr") {
				o.UI, o.History, o.Keep = uiAddr, history, true
			}
			if useTUN {
				c, err := newTUNClients()
				if err != nil {
					return err
				}
				defer c.Close()
				o.Front, o.Dial = c.dev, c.Dial
				fmt.Fprintln(out, "clients: the kernel TCP stack of a network namespace of their own, through the TUN weir-demo")
			}
			results, err := demo.Run(ctx, o)
			if err != nil {
				return err
			}
			for _, r := range results {
				if !r.OK {
					return &exitError{code: 1}
				}
			}
			return nil
		},
	}
	cmd.Flags().Float64Var(&loss, "loss", 5, "`PERCENT` of packets dropped on the lossy target's leg")
	cmd.Flags().Bool("config-dump", false, "print the embedded demo config and exit")
	cmd.Flags().Bool("ui", false, "serve the status page (/ui) on a loopback port while the scenarios run, print its URL and keep the appliance running after them until Ctrl-C")
	cmd.Flags().StringVar(&uiAddr, "ui-addr", "127.0.0.1:0", "loopback `HOST:PORT` of the status page with --ui (port 0: any free port)")
	cmd.Flags().IntVar(&history, "history", 0, "`SAMPLES` kept per plotted series with --ui (0: 720)")
	cmd.Flags().BoolVar(&useTUN, "tun", false, "clients are a network namespace's kernel stack reaching weir through a real TUN (root)")
	return cmd
}
