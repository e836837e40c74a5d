package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/workload-ca/workload-ca/internal/cliflag"
)

// WriteHelp prints a command's description, usage, subcommands and flags
// by section.
func WriteHelp(c *cobra.Command, w io.Writer) {
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

// EnvFallback sets every flag not given on the command line from the
// environment variable WORKLOAD_CA_<NAME> (dashes become underscores).
func EnvFallback(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed || err != nil {
			return
		}
		name := EnvName(f.Name)
		if v, ok := os.LookupEnv(name); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%w: %s (--%s): %w", ErrUsage, name, f.Name, e)
			}
		}
	})
	return err
}

// Execute executes a command line of root and returns the process exit
// code: 0, 1 when the work failed, 2 for a usage error (one line per
// problem, each naming its flag and an example value).
func Execute(ctx context.Context, root *cobra.Command, args []string, stderr io.Writer) int {
	root.SetArgs(args)
	if len(args) == 0 {
		WriteHelp(root, stderr)
		return 2
	}
	cmd, err := root.ExecuteContextC(ctx)
	var failed runError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &failed):
		fmt.Fprintln(stderr, "workload-ca:", failed.err)
		return 1
	case !errors.Is(err, ErrUsage):
		// cobra's own: an unknown command, or a flag group.
		msg, _, _ := strings.Cut(err.Error(), "\n")
		if strings.HasPrefix(msg, "unknown command") {
			if s := root.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			}
			msg += " (workload-ca help lists the commands)"
		}
		err = withHints(cmd, fmt.Errorf("%w: %s", ErrUsage, flagGroupMessage(msg)))
	}
	for _, line := range strings.Split(strings.TrimPrefix(err.Error(), ErrUsage.Error()+": "), "\n") {
		fmt.Fprintln(stderr, "workload-ca:", line)
	}
	return 2
}

// EnvName is the environment variable of flag name (EnvFallback).
func EnvName(name string) string {
	return "WORKLOAD_CA_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}
