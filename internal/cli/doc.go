// Package cli is how the CA's commands behave on a command line, whatever
// they do: a subcommand defined by its flags, the validation that turns
// them into its configuration, and its work (Command); the environment
// fallback WORKLOAD_CA_<FLAG>; the help by section; usage errors, one
// line per problem, each ending with an example for the flag it names;
// shell completion; and the exit codes (Execute: 0, 1 when the work
// failed, 2 for a usage error).
//
// It does not define any command or flag (cmd and the option groups do),
// nor hold state: every command writes to the writers it is given.
package cli
