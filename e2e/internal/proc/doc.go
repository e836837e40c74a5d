// Package proc starts the servers of the end-to-end tests and the demo
// (etcd, kube-apiserver, workload-ca) as child processes that never outlive
// the process that started them.
//
// Each child runs in its own process group with Pdeathsig=SIGKILL (Linux).
// Pdeathsig fires when the thread that forked the child exits, not when the
// process does, and the Go runtime may run a goroutine on any thread; so the
// fork happens on a goroutine locked to its OS thread that stays alive,
// waiting for the child, for as long as the child runs. A SIGKILLed test
// binary therefore takes its servers with it. Kill SIGKILLs the whole group;
// Signal sends one signal (SIGTERM for a graceful stop) to the child alone.
//
// It owns process lifetime, the tail of a child's output for error messages
// and picking free loopback ports. It does not know what the children are,
// how to tell that they are ready, or where their logs go.
package proc
