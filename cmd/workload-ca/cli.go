package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/workload-ca/workload-ca/internal/cliflag"
)

// errUsage is wrapped by invalid command lines: they exit 2.
var errUsage = errors.New("usage")

// commandDef is one subcommand: its flags, how their values (and the
// arguments) become a validated configuration T, and what runs with it.
// Parsing, the environment fallback and validation all happen before run,
// so no usage error is found after a network call.
type commandDef[T any] struct {
	use, short, long string
	// flags defines the flags, and returns what validates them once
	// parsed, with the positional arguments.
	flags func() (*pflag.FlagSet, func(args []string) (T, error))
	// args are allowed positional arguments; false: none.
	args bool
	// exclusive are groups of flags of which at most one may be given;
	// oneOf, groups of which one must be (shell completion offers these
	// first and hides the rest of an exclusive group once one is given).
	exclusive, oneOf [][]string
	// values completes enumerated flags; dirs and files complete paths.
	values      map[string][]string
	dirs, files []string
	run         func(ctx context.Context, c T, stdout, stderr io.Writer) error
}

// command builds the cobra command of d.
func (d commandDef[T]) command(stdout, stderr io.Writer) *cobra.Command {
	fs, validate := d.flags()
	var cfg T
	cmd := &cobra.Command{
		Use:   d.use,
		Short: d.short,
		Long:  d.long,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 && !d.args {
				// A word that is not a flag, often a stray "false"
				// after a boolean flag.
				return fmt.Errorf("%w: unexpected arguments %q (boolean flags take --flag=false)", errUsage, args)
			}
			return nil
		},
		PreRunE: func(cmd *cobra.Command, args []string) error {
			err := envFallback(fs)
			if err == nil {
				cfg, err = validate(args)
			}
			return withHints(cmd, err)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := d.run(cmd.Context(), cfg, stdout, stderr); err != nil {
				return runError{err}
			}
			return nil
		},
	}
	cmd.SilenceErrors, cmd.SilenceUsage = true, true
	cmd.SetFlagErrorFunc(flagError)
	cmd.Flags().SortFlags = false
	cmd.Flags().AddFlagSet(fs)
	for _, g := range d.exclusive {
		cmd.MarkFlagsMutuallyExclusive(g...)
	}
	for _, g := range d.oneOf {
		cmd.MarkFlagsOneRequired(g...)
	}
	for name, values := range d.values {
		must(cmd.RegisterFlagCompletionFunc(name, cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp)))
	}
	for _, name := range d.dirs {
		must(cmd.MarkFlagDirname(name))
	}
	for _, name := range d.files {
		must(cmd.MarkFlagFilename(name))
	}
	return cmd
}

// flagError makes an error of parsing the flags a usage error.
func flagError(cmd *cobra.Command, err error) error {
	return withHints(cmd, fmt.Errorf("%w: %w", errUsage, err))
}

// usageError is a usage error whose every line (one per problem) ends
// with an example for the flag it names.
type usageError struct{ lines []string }

func (e usageError) Error() string { return strings.Join(e.lines, "\n") }
func (e usageError) Unwrap() error { return errUsage }

// withHints adds the examples to a usage error of cmd; other errors are
// returned as they are.
func withHints(cmd *cobra.Command, err error) error {
	if err == nil || !errors.Is(err, errUsage) {
		return err
	}
	if u := (usageError{}); errors.As(err, &u) {
		return err
	}
	var u usageError
	for _, line := range strings.Split(strings.TrimPrefix(err.Error(), errUsage.Error()+": "), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			u.lines = append(u.lines, line+hint(cmd, line))
		}
	}
	return u
}

// must panics on an error that only a wrong flag name in a definition
// can cause (every command is built by the tests).
func must(err error) {
	if err != nil {
		panic(err)
	}
}

// runError is an error of a command's work, not of its command line: it
// exits 1.
type runError struct{ err error }

func (e runError) Error() string { return e.err.Error() }
func (e runError) Unwrap() error { return e.err }

// newRoot is the command tree; every command writes to stdout and stderr.
func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "workload-ca <command>",
		Short: "A certificate authority for SPIFFE workload identities",
		Long: `workload-ca: a certificate authority for SPIFFE workload identities.
It serves Istio's certificate service protocol (IstioCertificateService) to
ztunnel and istio-agent, authenticates callers by their Kubernetes tokens,
and publishes its roots as ClusterTrustBundles.`,
		Version:       readBuild().String(),
		SilenceErrors: true,
		SilenceUsage:  true,
		// Without a command, print the help and exit 2.
		RunE: func(*cobra.Command, []string) error {
			return fmt.Errorf("%w: a command is required", errUsage)
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetFlagErrorFunc(flagError)
	root.SetHelpFunc(func(c *cobra.Command, _ []string) { writeHelp(c, c.OutOrStdout()) })
	root.SetUsageFunc(func(c *cobra.Command) error { writeHelp(c, c.OutOrStderr()); return nil })
	root.AddCommand(
		serveCommand().command(stdout, stderr),
		requestCommand().command(stdout, stderr),
		loadtestCommand().command(stdout, stderr),
		inspectCommand().command(stdout, stderr),
		&cobra.Command{
			Use:   "version",
			Short: "Print the version, commit, its date and the Go version",
			Args:  cobra.NoArgs,
			Run:   func(*cobra.Command, []string) { fmt.Fprintln(stdout, readBuild()) },
		},
		&cobra.Command{
			Use:   "config-reference",
			Short: "Print the reference of serve's flags as Markdown (docs/configuration-reference.md)",
			Args:  cobra.NoArgs,
			RunE:  func(*cobra.Command, []string) error { return writeConfigReference(stdout) },
		},
	)
	root.SetHelpCommand(&cobra.Command{
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
				return fmt.Errorf("%w: help %q: no such command (workload-ca help lists them)", errUsage, strings.Join(args, " "))
			}
			writeHelp(target, stdout)
			return nil
		},
	})
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

// run executes a command line and returns the process exit code: 0, 1
// when the work failed, 2 for a usage error (one line per problem, each
// naming its flag and an example value).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	if len(args) == 0 {
		writeHelp(root, stderr)
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
	case !errors.Is(err, errUsage):
		// cobra's own: an unknown command, or a flag group.
		msg, _, _ := strings.Cut(err.Error(), "\n")
		if strings.HasPrefix(msg, "unknown command") {
			if s := root.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			}
			msg += " (workload-ca help lists the commands)"
		}
		err = withHints(cmd, fmt.Errorf("%w: %s", errUsage, flagGroupMessage(msg)))
	}
	for _, line := range strings.Split(strings.TrimPrefix(err.Error(), errUsage.Error()+": "), "\n") {
		fmt.Fprintln(stderr, "workload-ca:", line)
	}
	return 2
}

// cobraGroup finds the flags of cobra's message about a flag group.
var cobraGroup = regexp.MustCompile(`^(if any flags in the group|at least one of the flags in the group) \[([a-z0-9 -]+)\]`)

// flagGroupMessage says cobra's message about a group of flags (declared
// exclusive or one of them required) in the words of the other usage
// errors.
func flagGroupMessage(msg string) string {
	m := cobraGroup.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	flags := strings.Fields(m[2])
	for i := range flags {
		flags[i] = "--" + flags[i]
	}
	list := strings.Join(flags, ", ")
	if len(flags) == 2 {
		list = flags[0] + " and " + flags[1]
	}
	if strings.HasPrefix(m[1], "if any") {
		return list + " exclude each other: give one"
	}
	return "one of " + list + " is required"
}

// flagInText finds the first --flag a message names.
var flagInText = regexp.MustCompile(`--([a-z0-9][a-z0-9-]*)`)

// hint is an example for the flag a usage error names, as
// ` (e.g. --default-ttl=24h)`, or "" when the message has one already or
// names no flag of cmd.
func hint(cmd *cobra.Command, msg string) string {
	m := flagInText.FindStringSubmatch(msg)
	if m == nil || strings.Contains(msg, "e.g.") || strings.Contains(msg, "want ") || strings.Contains(msg, "exclu") {
		if strings.HasPrefix(msg, "unknown flag") || strings.HasPrefix(msg, "unknown shorthand") {
			return " (workload-ca " + cmd.Name() + " --help lists the flags)"
		}
		return ""
	}
	f := cmd.Flags().Lookup(m[1])
	if f == nil {
		return " (workload-ca " + cmd.Name() + " --help lists the flags)"
	}
	switch f.Value.Type() {
	case "duration":
		return " (--" + f.Name + " wants a duration, e.g. --" + f.Name + "=" + shortDuration(cliflag.ExampleOf(f, "24h")) + ")"
	case "int":
		return " (--" + f.Name + " wants a whole number, e.g. --" + f.Name + "=" + cliflag.ExampleOf(f, "4") + ")"
	case "float64":
		return " (--" + f.Name + " wants a number, e.g. --" + f.Name + "=" + cliflag.ExampleOf(f, "50") + ")"
	case "bool":
		return " (--" + f.Name + " is true or false, e.g. --" + f.Name + "=false)"
	}
	if v := cliflag.ExampleOf(f, ""); v != "" {
		return " (e.g. --" + f.Name + "=" + v + ")"
	}
	return ""
}

// shortDuration drops the zero units time.Duration.String keeps: 24h0m0s
// is 24h, 1m0s is 1m.
func shortDuration(s string) string {
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
