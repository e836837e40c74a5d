package proc

import (
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// sh starts /bin/sh -c script and stops it in t.Cleanup.
func sh(t *testing.T, script string) *Process {
	t.Helper()
	p, err := Start("sh", "/bin/sh", []string{"-c", script}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Kill(5 * time.Second) })
	return p
}

// waitOutput waits until the tail holds a complete first line and returns it.
func waitOutput(t *testing.T, p *Process) string {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if line, _, ok := strings.Cut(p.Tail(), "\n"); ok {
			return line
		}
	}
	t.Fatalf("%s printed nothing; exited=%v", p.Name(), p.Exited())
	return ""
}

func TestKillTakesTheWholeGroup(t *testing.T) {
	p := sh(t, "sleep 300 & echo $!; wait")
	grandchild, err := strconv.Atoi(waitOutput(t, p))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Kill(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if !p.Exited() {
		t.Fatal("not reaped after Kill")
	}
	if !waitGone(grandchild, 5*time.Second) {
		t.Errorf("grandchild %d survived the group kill", grandchild)
	}
	if err := p.Kill(time.Second); err != nil {
		t.Errorf("second Kill: %v", err)
	}
}

func TestTerminate(t *testing.T) {
	t.Run("a child that stops on SIGTERM", func(t *testing.T) {
		p := sh(t, `trap 'echo bye; exit 0' TERM; echo ready; while :; do sleep 0.05; done`)
		waitOutput(t, p)
		if err := p.Terminate(5 * time.Second); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(p.Tail(), "bye") {
			t.Errorf("trap did not run; output %q", p.Tail())
		}
	})
	t.Run("a child that ignores SIGTERM is killed after the grace period", func(t *testing.T) {
		p := sh(t, `trap '' TERM; echo ready; while :; do sleep 1; done`)
		waitOutput(t, p)
		began := time.Now()
		err := p.Terminate(300 * time.Millisecond)
		if err == nil || !strings.Contains(err.Error(), "did not exit") {
			t.Errorf("Terminate = %v, want a did-not-exit error", err)
		}
		if !p.Exited() || time.Since(began) > 5*time.Second {
			t.Errorf("exited=%v after %v", p.Exited(), time.Since(began))
		}
	})
	t.Run("a non-zero exit after SIGTERM is reported", func(t *testing.T) {
		p := sh(t, `trap 'exit 3' TERM; echo ready; while :; do sleep 0.05; done`)
		waitOutput(t, p)
		var exitErr *exec.ExitError
		if err := p.Terminate(5 * time.Second); !errors.As(err, &exitErr) || exitErr.ExitCode() != 3 {
			t.Errorf("Terminate = %v, want exit status 3", err)
		}
	})
}

func TestExitAndTail(t *testing.T) {
	p := sh(t, `i=0; while [ $i -lt 5000 ]; do echo "line $i"; i=$((i+1)); done; echo oops >&2; exit 4`)
	if err := p.Wait(10 * time.Second); err == nil {
		t.Fatal("exit status 4 reported as success")
	}
	if p.Err() == nil || !p.Exited() {
		t.Errorf("Err = %v, Exited = %v", p.Err(), p.Exited())
	}
	tail := p.Tail()
	if len(tail) > TailSize || !strings.HasPrefix(tail, "line ") ||
		!strings.Contains(tail, "line 4999\n") || !strings.Contains(tail, "oops\n") { // stdout and stderr interleave freely
		t.Errorf("tail (%d bytes) starts %q, ends %q", len(tail), tail[:min(20, len(tail))], tail[max(0, len(tail)-20):])
	}
	if err := p.Signal(terminateSignal); err != nil {
		t.Errorf("Signal after exit: %v", err)
	}
}

func TestStartErrors(t *testing.T) {
	if _, err := Start("missing", "/nonexistent/binary", nil, nil, nil, nil); err == nil {
		t.Fatal("Start of a missing binary succeeded")
	}
}

func TestFreePorts(t *testing.T) {
	ports, err := FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 3 || ports[0] == ports[1] || ports[1] == ports[2] || ports[0] == ports[2] {
		t.Errorf("ports %v are not 3 distinct ports", ports)
	}
}

func TestEnviron(t *testing.T) {
	t.Setenv("PROC_TEST_A", "old")
	env := Environ("PROC_TEST_A=new", "PROC_TEST_B=b")
	var got []string
	for _, kv := range env {
		if strings.HasPrefix(kv, "PROC_TEST_") {
			got = append(got, kv)
		}
	}
	if strings.Join(got, " ") != "PROC_TEST_A=new PROC_TEST_B=b" {
		t.Errorf("PROC_TEST_ variables %v", got)
	}
}

func waitGone(pid int, timeout time.Duration) bool {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if Gone(pid) {
			return true
		}
	}
	return Gone(pid)
}

func TestExitError(t *testing.T) {
	p := sh(t, "exit 0")
	if err := p.Wait(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := p.ExitError(); err == nil || !strings.Contains(err.Error(), "status 0") {
		t.Errorf("ExitError = %v", err)
	}
	q := sh(t, "exit 5")
	_ = q.Wait(5 * time.Second)
	var exitErr *exec.ExitError
	if err := q.ExitError(); !errors.As(err, &exitErr) || exitErr.ExitCode() != 5 {
		t.Errorf("ExitError = %v, want exit status 5", err)
	}
}
