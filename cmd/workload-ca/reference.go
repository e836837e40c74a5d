package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"

	"github.com/workload-ca/workload-ca/internal/cli"
	"github.com/workload-ca/workload-ca/internal/cliflag"
)

// writeConfigReference writes the configuration reference of `workload-ca
// serve` as Markdown, from the flag definitions themselves
// (docs/configuration-reference.md; `make lint` checks it is current).
func writeConfigReference(w io.Writer) error {
	fs, _ := serveFlags()
	var b strings.Builder
	b.WriteString(`# Configuration reference: ` + "`workload-ca serve`" + `

Generated from the flag definitions by ` + "`make config-reference`" + `; do not edit.
Every flag can also be set as the environment variable in its row; a flag
on the command line wins. The configuration is validated once at start and
every problem is reported together. [configuration.md](configuration.md)
explains the main ones by task. The sections are those of
` + "`workload-ca serve --help`" + `.
`)
	names, groups := cliflag.Groups(fs)
	for _, name := range names {
		b.WriteString("\n## " + name + "\n\n| flag | environment variable | default | meaning |\n| --- | --- | --- | --- |\n")
		groups[name].VisitAll(func(f *pflag.Flag) {
			def := f.DefValue
			if def != "" {
				def = "`" + def + "`"
			}
			fmt.Fprintf(&b, "| `--%s` | `%s` | %s | %s |\n", f.Name, cli.EnvName(f.Name), def, cell(f.Usage))
		})
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// cell makes text safe in a Markdown table cell.
func cell(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "|", `\|`), "\n", " ")
}
