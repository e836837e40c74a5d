package cli

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/workload-ca/workload-ca/internal/cliflag"
)

// ErrUsage is wrapped by invalid command lines: they exit 2.
var ErrUsage = errors.New("usage")

// FlagError makes an error of parsing the flags a usage error (cobra's
// FlagErrorFunc).
func FlagError(cmd *cobra.Command, err error) error {
	return withHints(cmd, fmt.Errorf("%w: %w", ErrUsage, err))
}

// usageError is a usage error whose every line (one per problem) ends
// with an example for the flag it names.
type usageError struct{ lines []string }

func (e usageError) Error() string { return strings.Join(e.lines, "\n") }
func (e usageError) Unwrap() error { return ErrUsage }

// withHints adds the examples to a usage error of cmd; other errors are
// returned as they are.
func withHints(cmd *cobra.Command, err error) error {
	if err == nil || !errors.Is(err, ErrUsage) {
		return err
	}
	if u := (usageError{}); errors.As(err, &u) {
		return err
	}
	var u usageError
	for _, line := range strings.Split(strings.TrimPrefix(err.Error(), ErrUsage.Error()+": "), "\n") {
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
