// Package cliflag is what an options group needs to define its flags for
// the CA's commands: a pflag.FlagSet whose flags are kept in definition
// order and grouped in help sections (Section), each with the example
// value a usage error shows (Example), arranged in the sections' order
// once every group has added its flags (Done), and the comma-separated
// list flag (List).
//
// It does not parse, validate or print anything: each group validates its
// own values, and the command prints the help and the configuration
// reference from the sections (Groups).
package cliflag
