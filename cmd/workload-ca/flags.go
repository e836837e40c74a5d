package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// groupAnnotation holds the help section of a flag.
const groupAnnotation = "workload-ca/group"

// flagSet is a pflag.FlagSet whose flags are kept in definition order and
// grouped in sections for the help and the configuration reference.
type flagSet struct {
	*pflag.FlagSet
	group string
}

func newFlagSet(name string) *flagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SortFlags = false
	return &flagSet{FlagSet: fs}
}

// section starts a group: the flags defined after it are in it.
func (fs *flagSet) section(name string) {
	fs.close()
	fs.group = name
}

// done ends the last section and returns the flags.
func (fs *flagSet) done() *pflag.FlagSet {
	fs.close()
	return fs.FlagSet
}

func (fs *flagSet) close() {
	if fs.group == "" {
		return
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if _, ok := f.Annotations[groupAnnotation]; !ok {
			must(fs.SetAnnotation(f.Name, groupAnnotation, []string{fs.group}))
		}
	})
}

// example sets the example value a usage error about flag name shows.
func (fs *flagSet) example(name, value string) {
	must(fs.SetAnnotation(name, exampleAnnotation, []string{value}))
}

// flagGroups are the flags of fs by section, in order; flags of no
// section are under "Flags".
func flagGroups(fs *pflag.FlagSet) (names []string, groups map[string]*pflag.FlagSet) {
	groups = map[string]*pflag.FlagSet{}
	fs.VisitAll(func(f *pflag.Flag) {
		name := "Flags"
		if g := f.Annotations[groupAnnotation]; len(g) > 0 {
			name = g[0]
		}
		if groups[name] == nil {
			names = append(names, name)
			groups[name] = pflag.NewFlagSet(name, pflag.ContinueOnError)
			groups[name].SortFlags = false
		}
		groups[name].AddFlag(f)
	})
	return names, groups
}

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
	names, groups := flagGroups(c.Flags())
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

// listFlag is a comma-separated list; each use of the flag replaces it.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Type() string { return "list" }

func (l *listFlag) Set(s string) error {
	*l = nil
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*l = append(*l, v)
		}
	}
	return nil
}
