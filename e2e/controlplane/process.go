package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"time"
)

// errAddrInUse reports that a server could not bind a port that was free a
// moment before; Start retries with fresh ports.
var errAddrInUse = errors.New("address already in use")

// process is one running server.
type process struct {
	name    string
	cmd     *exec.Cmd
	tail    *tailBuffer
	done    chan struct{} // closed when the process has been reaped
	waitErr error         // valid after done is closed
}

// startProcess starts path with args in its own process group, with
// Pdeathsig=SIGKILL on Linux.
//
// Pdeathsig fires when the thread that forked the child exits, not the
// process, and the Go runtime may run a goroutine on any thread. So the
// fork happens on a goroutine locked to its OS thread, and that goroutine
// stays alive (waiting for the child) as long as the child runs. It never
// unlocks, so the runtime discards the thread after the child is reaped.
func startProcess(name, path string, args, env []string, stdout, stderr io.Writer) (*process, error) {
	p := &process{name: name, tail: newTailBuffer(32 << 10), done: make(chan struct{})}
	p.cmd = exec.Command(path, args...)
	p.cmd.Env = env
	p.cmd.Stdout = io.MultiWriter(stdout, p.tail)
	p.cmd.Stderr = io.MultiWriter(stderr, p.tail)
	p.cmd.SysProcAttr = sysProcAttr()
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
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

// pid returns the process id.
func (p *process) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// exitError describes an unexpected exit, with the tail of the log.
func (p *process) exitError() error {
	out := p.tail.String()
	err := fmt.Errorf("%s exited early (%v); last output:\n%s", p.name, p.waitErr, out)
	if strings.Contains(out, "address already in use") {
		return fmt.Errorf("%w: %w", errAddrInUse, err)
	}
	return err
}

// kill SIGKILLs the process group and waits up to timeout for the reap.
func (p *process) kill(timeout time.Duration) error {
	if p == nil || p.exited() {
		return nil
	}
	if err := killGroup(p.pid()); err != nil && !p.exited() {
		return fmt.Errorf("kill %s: %w", p.name, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("%s (pid %d) did not exit within %v", p.name, p.pid(), timeout)
	}
}

// freePorts returns n distinct free TCP ports on 127.0.0.1. Another process
// may take one before the server binds it; Start retries on errAddrInUse.
func freePorts(n int) ([]int, error) {
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

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func newTailBuffer(max int) *tailBuffer { return &tailBuffer{max: max} }

func (t *tailBuffer) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(b), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.buf
	if i := bytes.IndexByte(b, '\n'); i >= 0 && len(b) == t.max {
		b = b[i+1:] // drop the partial first line
	}
	return string(b)
}

// childEnv is the environment for the servers: ours, with TMPDIR pointed
// into the work dir.
func childEnv(tmpDir string) []string {
	env := make([]string, 0, len(os.Environ())+1)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TMPDIR=") {
			env = append(env, kv)
		}
	}
	return append(env, "TMPDIR="+tmpDir)
}
