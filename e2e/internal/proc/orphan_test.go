//go:build linux

package proc

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// envOrphanChild makes the test binary act as the parent that gets killed.
const envOrphanChild = "WORKLOAD_CA_PROC_ORPHAN_CHILD"

// TestNoOrphanAfterSIGKILL re-runs the test binary as a child that starts
// `sleep` with Start, SIGKILLs that child, and checks that sleep dies too.
func TestNoOrphanAfterSIGKILL(t *testing.T) {
	if os.Getenv(envOrphanChild) != "" {
		runOrphanChild()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestNoOrphanAfterSIGKILL$", "-test.v=false")
	cmd.Env = Environ(envOrphanChild + "=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "PID %d", &pid); err == nil {
			break
		}
	}
	if pid == 0 {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal("child printed no PID")
	}
	t.Cleanup(func() {
		if !Gone(pid) {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
	})
	if Gone(pid) {
		t.Fatalf("sleep %d not running before the kill", pid)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if !waitGone(pid, 5*time.Second) {
		t.Fatalf("sleep %d still running 5s after its parent was SIGKILLed", pid)
	}
}

func runOrphanChild() {
	p, err := Start("sleep", "/bin/sleep", []string{"300"}, nil, nil, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Printf("PID %d\n", p.Pid())
	<-p.Done() // until SIGKILLed
	os.Exit(3)
}

// TestSurvivesExitOfStartingThread calls Start on a locked thread that then
// exits: had the child been forked on that thread, Pdeathsig would kill it.
func TestSurvivesExitOfStartingThread(t *testing.T) {
	var p *Process
	var err error
	onMain := false
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread() // exits locked: the runtime ends this thread
		if syscall.Gettid() == syscall.Getpid() {
			runtime.UnlockOSThread() // the main thread never ends; no test here
			onMain = true
		} else {
			p, err = Start("sleep", "/bin/sleep", []string{"300"}, nil, nil, nil)
		}
		close(done)
	}()
	<-done
	if onMain {
		t.Skip("landed on the main thread")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Kill(5 * time.Second) })
	time.Sleep(300 * time.Millisecond) // let the thread exit
	if p.Exited() || Gone(p.Pid()) {
		t.Fatalf("sleep died with the thread that called Start: %v", p.Err())
	}
	if !strings.Contains(p.Name(), "sleep") {
		t.Errorf("name %q", p.Name())
	}
}
