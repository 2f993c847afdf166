//go:build weirdocs

package main

// This file is only in a build with -tags weirdocs, which packaging/cmd/mkdeb
// makes to write the Debian package's man pages and shell completions from
// the real command tree. The weir binary a user runs is built without the tag:
// it carries neither cobra/doc nor go-md2man.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

func init() { buildCommands = append(buildCommands, newGenDocsCmd) }

func newGenDocsCmd() *cobra.Command {
	var man, completions, date string
	cmd := &cobra.Command{
		Use:    "gen-docs --man DIR --completions DIR",
		Short:  "write weir's man pages (section 1) and bash, zsh and fish completions",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if man == "" && completions == "" {
				return errors.New("gen-docs: give --man DIR, --completions DIR or both")
			}
			root := cmd.Root()
			if man != "" {
				// A fixed date (the commit's) keeps the pages reproducible.
				when := time.Now()
				if date != "" {
					t, err := time.Parse(time.DateOnly, date)
					if err != nil {
						return fmt.Errorf("--date: %w", err)
					}
					when = t
				}
				if err := os.MkdirAll(man, 0o755); err != nil {
					return err
				}
				hdr := &doc.GenManHeader{Title: "WEIR", Section: "1", Source: "weir " + version, Manual: "weir manual", Date: &when}
				if err := doc.GenManTree(root, hdr, man); err != nil {
					return fmt.Errorf("man pages: %w", err)
				}
			}
			if completions != "" {
				if err := os.MkdirAll(completions, 0o755); err != nil {
					return err
				}
				gens := []struct {
					file string
					gen  func(string) error
				}{
					{"weir.bash", func(f string) error { return root.GenBashCompletionFileV2(f, true) }},
					{"_weir", root.GenZshCompletionFile},
					{"weir.fish", func(f string) error { return root.GenFishCompletionFile(f, true) }},
				}
				for _, g := range gens {
					if err := g.gen(filepath.Join(completions, g.file)); err != nil {
						return fmt.Errorf("completion %s: %w", g.file, err)
					}
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&man, "man", "", "write the man pages into `DIR`")
	cmd.Flags().StringVar(&completions, "completions", "", "write weir.bash, _weir (zsh) and weir.fish into `DIR`")
	cmd.Flags().StringVar(&date, "date", "", "the pages' date, `YYYY-MM-DD` (default today)")
	return cmd
}
