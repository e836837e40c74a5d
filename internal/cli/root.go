package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// NewRoot returns the root of a command tree with the subcommands cmds:
// without a command it prints the help and exits 2; help, usage and
// errors are written as the other commands write them, to stdout and
// stderr.
func NewRoot(root *cobra.Command, stdout, stderr io.Writer, cmds ...*cobra.Command) *cobra.Command {
	root.SilenceErrors, root.SilenceUsage = true, true
	root.RunE = func(*cobra.Command, []string) error {
		return fmt.Errorf("%w: a command is required", ErrUsage)
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetFlagErrorFunc(FlagError)
	root.SetHelpFunc(func(c *cobra.Command, _ []string) { WriteHelp(c, c.OutOrStdout()) })
	root.SetUsageFunc(func(c *cobra.Command) error { WriteHelp(c, c.OutOrStderr()); return nil })
	root.AddCommand(cmds...)
	root.SetHelpCommand(helpCommand(stdout))
	// Flag groups are checked by each command's own validation first, with
	// a message naming the flags; keep cobra's suggestions for mistyped
	// commands.
	root.SuggestionsMinimumDistance = 2
	// What Execute would add, here so that the help lists it too.
	root.InitDefaultHelpFlag()
	root.InitDefaultVersionFlag()
	root.InitDefaultCompletionCmd()
	return root
}

// helpCommand is `help [command]`, which completes the commands' names.
func helpCommand(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "Help about a command",
		ValidArgsFunction: func(c *cobra.Command, _ []string, _ string) ([]string, cobra.ShellCompDirective) {
			var names []string
			for _, sub := range c.Root().Commands() {
				if sub.IsAvailableCommand() {
					names = append(names, sub.Name())
				}
			}
			return names, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(c *cobra.Command, args []string) error {
			target, rest, err := c.Root().Find(args)
			if err != nil || len(rest) > 0 || (target == c.Root() && len(args) > 0) {
				return fmt.Errorf("%w: help %q: no such command (workload-ca help lists them)", ErrUsage, strings.Join(args, " "))
			}
			WriteHelp(target, stdout)
			return nil
		},
	}
}
