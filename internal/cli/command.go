package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Command is one subcommand: its flags, how their values (and the
// arguments) become a validated configuration T, and what runs with it.
// Parsing, the environment fallback and validation all happen before run,
// so no usage error is found after a network call.
type Command[T any] struct {
	Use, Short, Long string
	// Flags defines the flags, and returns what validates them once
	// parsed, with the positional arguments.
	Flags func() (*pflag.FlagSet, func(args []string) (T, error))
	// Args are allowed positional arguments; false: none.
	Args bool
	// Exclusive are groups of flags of which at most one may be given;
	// OneOf, groups of which one must be (shell completion offers these
	// first and hides the rest of an exclusive group once one is given).
	Exclusive, OneOf [][]string
	// Values completes enumerated flags; Dirs and Files complete paths.
	Values      map[string][]string
	Dirs, Files []string
	Run         func(ctx context.Context, c T, stdout, stderr io.Writer) error
}

// Cobra builds the cobra command of d.
func (d Command[T]) Cobra(stdout, stderr io.Writer) *cobra.Command {
	fs, validate := d.Flags()
	var cfg T
	cmd := &cobra.Command{
		Use:   d.Use,
		Short: d.Short,
		Long:  d.Long,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 && !d.Args {
				// A word that is not a flag, often a stray "false"
				// after a boolean flag.
				return fmt.Errorf("%w: unexpected arguments %q (boolean flags take --flag=false)", ErrUsage, args)
			}
			return nil
		},
		PreRunE: func(cmd *cobra.Command, args []string) error {
			err := EnvFallback(fs)
			if err == nil {
				cfg, err = validate(args)
			}
			return withHints(cmd, err)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := d.Run(cmd.Context(), cfg, stdout, stderr); err != nil {
				return runError{err}
			}
			return nil
		},
	}
	cmd.SilenceErrors, cmd.SilenceUsage = true, true
	cmd.SetFlagErrorFunc(FlagError)
	cmd.Flags().SortFlags = false
	cmd.Flags().AddFlagSet(fs)
	for _, g := range d.Exclusive {
		cmd.MarkFlagsMutuallyExclusive(g...)
	}
	for _, g := range d.OneOf {
		cmd.MarkFlagsOneRequired(g...)
	}
	for name, values := range d.Values {
		must(cmd.RegisterFlagCompletionFunc(name, cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp)))
	}
	for _, name := range d.Dirs {
		must(cmd.MarkFlagDirname(name))
	}
	for _, name := range d.Files {
		must(cmd.MarkFlagFilename(name))
	}
	return cmd
}
