package proc

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// TailSize is how many bytes of a child's output Tail keeps.
const TailSize = 32 << 10

// waitDelay bounds how long the reap waits for the output pipes to close
// after the child has exited.
const waitDelay = 2 * time.Second

// Process is one running child.
type Process struct {
	name    string
	cmd     *exec.Cmd
	tail    *tailBuffer
	done    chan struct{} // closed when the child has been reaped
	waitErr error         // valid after done is closed
}

// Option changes how Start starts a child.
type Option func(*startOptions)

type startOptions struct {
	cpus []int
	dir  string
}

// InDir runs the child in dir (default: our working directory), for
// programs that read files relative to it.
func InDir(dir string) Option {
	return func(o *startOptions) { o.dir = dir }
}

// OnCPUs runs the child, and everything it starts, on these CPUs only
// (Linux; elsewhere Start fails). Go programs size GOMAXPROCS to them. No
// CPUs: anywhere, as without the option.
func OnCPUs(cpus ...int) Option {
	return func(o *startOptions) { o.cpus = cpus }
}

// Start starts path with args and env (nil: ours) in its own process group,
// with Pdeathsig=SIGKILL on Linux (see the package comment). stdout and
// stderr (nil discards) receive the child's output, which is also kept for
// Tail; they are written from separate goroutines unless they are the same
// *os.File. name labels errors.
func Start(name, path string, args, env []string, stdout, stderr io.Writer, opts ...Option) (*Process, error) {
	var o startOptions
	for _, opt := range opts {
		opt(&o)
	}
	p := &Process{name: name, tail: newTailBuffer(TailSize), done: make(chan struct{})}
	p.cmd = exec.Command(path, args...)
	p.cmd.Env = env
	p.cmd.Dir = o.dir
	p.cmd.Stdout = io.MultiWriter(orDiscard(stdout), p.tail)
	p.cmd.Stderr = io.MultiWriter(orDiscard(stderr), p.tail)
	p.cmd.SysProcAttr = SysProcAttr()
	// A grandchild holding the output open must not keep Wait from
	// returning once the child itself has exited.
	p.cmd.WaitDelay = waitDelay
	started := make(chan error, 1)
	go func() {
		// The child inherits the CPU affinity of the thread that forks it,
		// this one, which serves nothing else.
		if err := lockThreadOn(o.cpus); err != nil {
			started <- err
			return
		}
		if err := p.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.waitErr = p.cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return p, nil
}

// RunOnCPUs runs f on a thread of its own that runs on cpus only (no
// CPUs: anywhere, as OnCPUs), and returns what f returns. Goroutines f
// starts run anywhere.
func RunOnCPUs(cpus []int, f func() error) error {
	done := make(chan error, 1)
	go func() {
		if err := lockThreadOn(cpus); err != nil {
			done <- err
			return
		}
		done <- f()
	}()
	return <-done
}

// lockThreadOn locks the calling goroutine to its thread for good (the
// thread ends with the goroutine, its affinity with it) and restricts the
// thread to cpus, if any.
func lockThreadOn(cpus []int) error {
	runtime.LockOSThread()
	if len(cpus) == 0 {
		return nil
	}
	return setThreadCPUs(cpus)
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// Name returns the name given to Start.
func (p *Process) Name() string { return p.name }

// Pid returns the process id (also the process group id).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the child has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the child has exited and been reaped.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err returns the child's exit error (nil for exit status 0) once it has
// exited, and nil before.
func (p *Process) Err() error {
	if !p.Exited() {
		return nil
	}
	return p.waitErr
}

// ExitError describes how the child ended, wrapping its exit error (an
// *exec.ExitError for a non-zero status); nil while it runs.
func (p *Process) ExitError() error {
	switch {
	case !p.Exited():
		return nil
	case p.waitErr == nil:
		return fmt.Errorf("%s exited with status 0", p.name)
	default:
		return fmt.Errorf("%s exited: %w", p.name, p.waitErr)
	}
}

// Tail returns the last TailSize bytes of the child's output, starting at a
// line boundary.
func (p *Process) Tail() string { return p.tail.String() }

// Signal sends sig to the child alone (not its group), e.g. SIGTERM to ask
// for a graceful stop. Signalling a child that has exited is not an error.
func (p *Process) Signal(sig os.Signal) error {
	if p.Exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !p.Exited() && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal %s: %w", p.name, err)
	}
	return nil
}

// Wait waits up to timeout for the child to exit and returns its exit error.
func (p *Process) Wait(timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return p.waitErr
	case <-t.C:
		return fmt.Errorf("%s (pid %d) did not exit within %v", p.name, p.Pid(), timeout)
	}
}

// Kill SIGKILLs the child's process group and waits up to timeout for the
// child to be reaped. It is a no-op on a nil or exited Process, and does not
// report the exit status (a SIGKILLed child always "fails").
func (p *Process) Kill(timeout time.Duration) error {
	if p == nil || p.Exited() {
		return nil
	}
	if err := killGroup(p.Pid()); err != nil && !p.Exited() {
		return fmt.Errorf("kill %s: %w", p.name, err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
		return fmt.Errorf("%s (pid %d) did not exit within %v", p.name, p.Pid(), timeout)
	}
}

// Terminate asks the child to stop with SIGTERM and waits up to grace; if
// it is still running then, it kills the group. It returns the exit error of
// a child that stopped by itself (nil for status 0), or an error naming the
// kill.
func (p *Process) Terminate(grace time.Duration) error {
	if p == nil {
		return nil
	}
	if err := p.Signal(terminateSignal); err != nil {
		return errors.Join(err, p.Kill(10*time.Second))
	}
	if err := p.Wait(grace); !p.Exited() {
		return errors.Join(err, p.Kill(10*time.Second))
	}
	if p.waitErr != nil {
		return fmt.Errorf("%s exited after SIGTERM: %w", p.name, p.waitErr)
	}
	return nil
}

// FreePorts returns n distinct TCP ports that were free on 127.0.0.1 a
// moment ago. Another process may take one before the child binds it:
// callers retry when the child reports "address already in use".
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// ErrAddrInUse reports that a child could not bind a port that was free a
// moment before (see FreePorts); RetryPorts retries on it.
var ErrAddrInUse = errors.New("address already in use")

// StartupError describes an unexpected exit of the child during start-up,
// with the tail of its output; it wraps ErrAddrInUse when the output says
// a port was taken.
func (p *Process) StartupError() error {
	out := p.Tail()
	err := fmt.Errorf("%w during start-up; last output:\n%s", p.ExitError(), out)
	if strings.Contains(out, "address already in use") {
		return fmt.Errorf("%w: %w", ErrAddrInUse, err)
	}
	return err
}

// RetryPorts calls start, up to three times while it fails with
// ErrAddrInUse (a port picked free was taken before the child bound it).
func RetryPorts(start func() error) error {
	var err error
	for range 3 {
		if err = start(); !errors.Is(err, ErrAddrInUse) {
			return err
		}
	}
	return err
}

// Environ returns our environment with each "KEY=value" of overrides
// replacing the variable of that name (or added).
func Environ(overrides ...string) []string {
	drop := make(map[string]bool, len(overrides))
	for _, kv := range overrides {
		k, _, _ := strings.Cut(kv, "=")
		drop[k] = true
	}
	env := make([]string, 0, len(os.Environ())+len(overrides))
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !drop[k] {
			env = append(env, kv)
		}
	}
	return append(env, overrides...)
}
