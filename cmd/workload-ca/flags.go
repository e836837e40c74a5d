package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/workload-ca/workload-ca/internal/cliflag"
)

// writeHelp prints a command's description, usage, subcommands and flags
// by section.
func writeHelp(c *cobra.Command, w io.Writer) {
	var b strings.Builder
	if c.Long != "" {
		b.WriteString(strings.TrimSpace(c.Long) + "\n\n")
	} else if c.Short != "" {
		b.WriteString(c.Short + "\n\n")
	}
	b.WriteString("Usage:\n  " + c.UseLine() + "\n")
	if c.HasAvailableSubCommands() {
		b.WriteString("\nCommands:\n")
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() || sub.Name() == "help" {
				fmt.Fprintf(&b, "  %-17s %s\n", sub.Name(), sub.Short)
			}
		}
	}
	c.InitDefaultHelpFlag()
	names, groups := cliflag.Groups(c.Flags())
	for _, name := range names {
		title := name
		if name == "Flags" && len(names) > 1 {
			title = "Other flags"
		}
		fmt.Fprintf(&b, "\n%s:\n%s", title, groups[name].FlagUsagesWrapped(100))
	}
	if c.HasAvailableSubCommands() {
		b.WriteString("\nRun \"workload-ca help <command>\" for the flags of a command.\n")
	} else if c.HasAvailableLocalFlags() && c.Name() != "help" {
		b.WriteString("\nEvery flag can also be set as the environment variable WORKLOAD_CA_<FLAG>\n(upper case, dashes as underscores); a flag on the command line wins.\n")
	}
	_, _ = io.WriteString(w, b.String())
}

// envFallback sets every flag not given on the command line from the
// environment variable WORKLOAD_CA_<NAME> (dashes become underscores).
func envFallback(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed || err != nil {
			return
		}
		name := envName(f.Name)
		if v, ok := os.LookupEnv(name); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%w: %s (--%s): %w", errUsage, name, f.Name, e)
			}
		}
	})
	return err
}
