package cliflag

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

const (
	// sectionAnnotation holds the help section of a flag.
	sectionAnnotation = "workload-ca/group"
	// exampleAnnotation holds a flag's example value where its default
	// is not one (an empty default, or 0 meaning "choose for me").
	exampleAnnotation = "workload-ca/example"
)

// FlagSet is a pflag.FlagSet whose flags are kept in definition order and
// grouped in sections for the help and the configuration reference.
type FlagSet struct {
	*pflag.FlagSet
	section string
}

// New returns an empty FlagSet for the command name.
func New(name string) *FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SortFlags = false
	return &FlagSet{FlagSet: fs}
}

// Section starts a section: the flags defined after it are in it. Several
// groups may add flags to the same section.
func (fs *FlagSet) Section(name string) {
	fs.close()
	fs.section = name
}

// Example sets the example value a usage error about flag name shows.
func (fs *FlagSet) Example(name, value string) {
	must(fs.SetAnnotation(name, exampleAnnotation, []string{value}))
}

// Done ends the last section and returns the flags: in the order of
// sections given, each section's flags in definition order; without
// sections, in definition order. A flag of a section not given is a
// mistake of the command's definition, and panics.
func (fs *FlagSet) Done(sections ...string) *pflag.FlagSet {
	fs.close()
	if len(sections) == 0 {
		return fs.FlagSet
	}
	out := pflag.NewFlagSet(fs.Name(), pflag.ContinueOnError)
	out.SortFlags = false
	for _, s := range sections {
		fs.VisitAll(func(f *pflag.Flag) {
			if SectionOf(f) == s {
				out.AddFlag(f)
			}
		})
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if !slices.Contains(sections, SectionOf(f)) {
			panic(fmt.Sprintf("cliflag: flag --%s is in section %q, which is not in the order", f.Name, SectionOf(f)))
		}
	})
	return out
}

func (fs *FlagSet) close() {
	if fs.section == "" {
		return
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if _, ok := f.Annotations[sectionAnnotation]; !ok {
			must(fs.SetAnnotation(f.Name, sectionAnnotation, []string{fs.section}))
		}
	})
}

// SectionOf is f's section; "Flags" when it has none.
func SectionOf(f *pflag.Flag) string {
	if s := f.Annotations[sectionAnnotation]; len(s) > 0 {
		return s[0]
	}
	return "Flags"
}

// Groups are the flags of fs by section, in order; flags of no section
// are under "Flags".
func Groups(fs *pflag.FlagSet) (names []string, groups map[string]*pflag.FlagSet) {
	groups = map[string]*pflag.FlagSet{}
	fs.VisitAll(func(f *pflag.Flag) {
		name := SectionOf(f)
		if groups[name] == nil {
			names = append(names, name)
			groups[name] = pflag.NewFlagSet(name, pflag.ContinueOnError)
			groups[name].SortFlags = false
		}
		groups[name].AddFlag(f)
	})
	return names, groups
}

// ExampleOf is f's example: its Example, else its default unless that is
// empty or zero, else def.
func ExampleOf(f *pflag.Flag, def string) string {
	if v := f.Annotations[exampleAnnotation]; len(v) > 0 {
		return v[0]
	}
	switch f.DefValue {
	case "", "0", "0s", "false", "[]":
		return def
	}
	return f.DefValue
}

// List is a comma-separated list; each use of the flag replaces it.
type List []string

func (l *List) String() string { return strings.Join(*l, ",") }

// Type names the flag's type in the help.
func (l *List) Type() string { return "list" }

// Set replaces the list with the values of s, trimmed, empty ones dropped.
func (l *List) Set(s string) error {
	*l = nil
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*l = append(*l, v)
		}
	}
	return nil
}

// must panics on an error that only a wrong flag name in a definition
// can cause (every command is built by the tests).
func must(err error) {
	if err != nil {
		panic(err)
	}
}
