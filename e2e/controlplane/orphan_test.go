//go:build linux

package controlplane

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/e2e/internal/proc"
)

// envOrphanChild, when set to a work dir, makes TestNoOrphansAfterSIGKILL
// act as the child: start a control plane there, print the PIDs, wait.
const envOrphanChild = "WORKLOAD_CA_CONTROLPLANE_ORPHAN_CHILD"

// TestNoOrphansAfterSIGKILL re-runs the test binary as a child that starts a
// control plane, SIGKILLs the child, and checks that etcd and kube-apiserver
// die with it.
func TestNoOrphansAfterSIGKILL(t *testing.T) {
	if dir := os.Getenv(envOrphanChild); dir != "" {
		runOrphanChild(dir)
		return
	}
	if os.Getenv(EnvBinDir) == "" {
		t.Skipf("%s is unset", EnvBinDir)
	}
	runtime.LockOSThread() // the child's Pdeathsig is tied to this thread
	defer runtime.UnlockOSThread()

	cmd := exec.Command(os.Args[0], "-test.run=^TestNoOrphansAfterSIGKILL$", "-test.v=false")
	cmd.Env = append(os.Environ(), envOrphanChild+"="+t.TempDir())
	cmd.SysProcAttr = proc.SysProcAttr()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pids, err := readPIDs(out, 90*time.Second)
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child: %v; stderr:\n%s", err, stderr.String())
	}
	t.Cleanup(func() { killLeftovers(pids) })
	for _, pid := range pids {
		if proc.Gone(pid) {
			t.Fatalf("pid %d not running before the kill", pid)
		}
	}

	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for _, pid := range pids {
		if !waitGone(pid, 5*time.Second) {
			t.Fatalf("pid %d still running 5s after the test binary was SIGKILLed", pid)
		}
	}
	t.Logf("etcd %d and kube-apiserver %d gone %v after SIGKILL of the test binary",
		pids[0], pids[1], time.Since(killed).Round(time.Millisecond))
}

// TestSurvivesExitOfStartingThread calls Start on a locked OS thread that
// exits right after. Had the servers been forked on that thread, Pdeathsig
// would kill them with it.
func TestSurvivesExitOfStartingThread(t *testing.T) {
	if os.Getenv(EnvBinDir) == "" {
		t.Skipf("%s is unset", EnvBinDir)
	}
	var c *ControlPlane
	var err error
	onExitingThread(func() { c, err = Start(context.Background(), Options{}) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	time.Sleep(time.Second)
	etcd, apiserver := c.PIDs()
	for _, pid := range []int{etcd, apiserver} {
		if proc.Gone(pid) {
			t.Fatalf("pid %d died with the thread that called Start", pid)
		}
	}
	if err := c.readyz(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// onExitingThread runs f on a goroutine locked to a thread other than the
// main one (the runtime never ends the main thread) and lets the goroutine
// exit locked, which makes the runtime end the thread.
func onExitingThread(f func()) {
	var held []chan struct{}
	defer func() {
		for _, release := range held {
			close(release)
		}
	}()
	for {
		onMain, done := make(chan bool), make(chan struct{})
		release := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			if syscall.Gettid() == syscall.Getpid() {
				onMain <- true
				<-release // keep the main thread busy while we retry
				runtime.UnlockOSThread()
				return
			}
			onMain <- false
			f()
			close(done)
		}()
		if !<-onMain {
			<-done
			time.Sleep(100 * time.Millisecond) // let the thread exit
			return
		}
		held = append(held, release)
	}
}

// runOrphanChild is the child side: it never returns normally.
func runOrphanChild(dir string) {
	c, err := Start(context.Background(), Options{WorkDir: dir})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	etcd, apiserver := c.PIDs()
	fmt.Printf("PIDS %d %d\n", etcd, apiserver)
	time.Sleep(5 * time.Minute) // until SIGKILLed
	_ = c.Stop()
	os.Exit(3)
}

// readPIDs reads the child's "PIDS <etcd> <apiserver>" line.
func readPIDs(r io.Reader, timeout time.Duration) ([]int, error) {
	type result struct {
		pids []int
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			var e, a int
			if _, err := fmt.Sscanf(sc.Text(), "PIDS %d %d", &e, &a); err == nil {
				ch <- result{pids: []int{e, a}}
				return
			}
		}
		ch <- result{err: errors.New("exited without printing PIDS")}
	}()
	select {
	case r := <-ch:
		return r.pids, r.err
	case <-time.After(timeout):
		return nil, fmt.Errorf("no PIDS after %v", timeout)
	}
}

func waitGone(pid int, timeout time.Duration) bool {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if proc.Gone(pid) {
			return true
		}
	}
	return proc.Gone(pid)
}

// killLeftovers kills the servers the child started if they survived.
func killLeftovers(pids []int) {
	for _, pid := range pids {
		if !proc.Gone(pid) {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
	}
}
