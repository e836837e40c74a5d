package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"go.step.sm/crypto/kms/apiv1"

	"github.com/workload-ca/workload-ca/ca/keystore"
)

// envFallback sets every flag not given on the command line from the
// environment variable WORKLOAD_CA_<NAME> (dashes become underscores).
func envFallback(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		name := envName(f.Name)
		if v, ok := os.LookupEnv(name); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%w: %s: %w", errUsage, name, e)
			}
		}
	})
	return err
}

// listFlag is a comma-separated list.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	*l = nil
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*l = append(*l, v)
		}
	}
	return nil
}

// example is a hint for a flag whose value did not parse, as
// ` (--flag wants a duration, e.g. 24h)`, or "" when the error names no flag.
func example(fs *flag.FlagSet, err error) string {
	_, rest, ok := strings.Cut(err.Error(), " for flag -")
	if !ok {
		return ""
	}
	name, _, _ := strings.Cut(rest, ":")
	f := fs.Lookup(name)
	if f == nil {
		return ""
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return ""
	}
	switch g.Get().(type) {
	case time.Duration:
		return " (--" + name + " wants a duration, e.g. 24h, 90s)"
	case int, int64, uint, uint64:
		return " (--" + name + " wants a whole number, e.g. 4)"
	case float64:
		return " (--" + name + " wants a number, e.g. 50)"
	case bool:
		return " (--" + name + " is true or false: --" + name + "=false)"
	}
	return ""
}

// checkKeyURI refuses a --ca-key-uri that is not a URI of a KMS type
// go.step.sm/crypto knows, before anything is opened.
func checkKeyURI(raw string) []error {
	if _, err := keystore.RedactKeyURI(raw); err != nil {
		return []error{fmt.Errorf("--ca-key-uri: %w", err)}
	}
	if _, err := apiv1.TypeOf(raw); err != nil {
		scheme, _, _ := strings.Cut(raw, ":")
		return []error{fmt.Errorf("--ca-key-uri: unknown KMS %q (want pkcs11, awskms, cloudkms, azurekms or softkms)", scheme)}
	}
	return nil
}
