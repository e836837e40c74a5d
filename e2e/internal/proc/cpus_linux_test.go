package proc

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// allowedCPUs reads Cpus_allowed_list from a /proc status file.
func allowedCPUs(t *testing.T, status string) string {
	t.Helper()
	for line := range strings.Lines(status) {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no Cpus_allowed_list in %q", status)
	return ""
}

// cpusOfRunOnCPUs returns the Cpus_allowed_list of the thread that
// RunOnCPUs(cpus, f) runs f on.
func cpusOfRunOnCPUs(t *testing.T, cpus []int) string {
	t.Helper()
	var inside string
	err := RunOnCPUs(cpus, func() error {
		b, err := os.ReadFile("/proc/thread-self/status")
		inside = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return allowedCPUs(t, inside)
}

func TestOnCPUs(t *testing.T) {
	cpus, err := CPUs()
	if err != nil {
		t.Fatal(err)
	}
	if len(cpus) < 2 {
		t.Skip("needs two CPUs to tell a placement from none")
	}
	last := cpus[len(cpus)-1]
	want := strconv.Itoa(last)

	t.Run("the child and what it starts run on the given CPUs", func(t *testing.T) {
		p, err := Start("sh", "/bin/sh", []string{"-c", "grep Cpus_allowed_list /proc/self/status; sh -c 'grep Cpus_allowed_list /proc/self/status'"},
			nil, nil, nil, OnCPUs(last))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Wait(5 * time.Second); err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(p.Tail()), "\n")
		if len(lines) != 2 {
			t.Fatalf("output %q", p.Tail())
		}
		for _, l := range lines {
			if got := allowedCPUs(t, l); got != want {
				t.Errorf("child on CPUs %s, want %s", got, want)
			}
		}
	})
	t.Run("without the option the child may run anywhere", func(t *testing.T) {
		p := sh(t, "grep Cpus_allowed_list /proc/self/status")
		if got := allowedCPUs(t, waitOutput(t, p)); got == want {
			t.Errorf("child on CPUs %s only, want all of %v", got, cpus)
		}
	})
	t.Run("with the option and no CPUs the child may run anywhere", func(t *testing.T) {
		p, err := Start("sh", "/bin/sh", []string{"-c", "grep Cpus_allowed_list /proc/self/status"}, nil, nil, nil, OnCPUs())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Kill(5 * time.Second) })
		if got := allowedCPUs(t, waitOutput(t, p)); got == want {
			t.Errorf("child on CPUs %s only, want all of %v", got, cpus)
		}
	})
	t.Run("RunOnCPUs runs f on the CPUs and leaves the process as it was", func(t *testing.T) {
		if got := cpusOfRunOnCPUs(t, []int{last}); got != want {
			t.Errorf("f ran on CPUs %s, want %s", got, want)
		}
		after, err := CPUs()
		if err != nil || len(after) != len(cpus) {
			t.Errorf("after RunOnCPUs this thread may run on %v (%v), want %v", after, err, cpus)
		}
	})
	t.Run("RunOnCPUs with no CPUs runs f anywhere", func(t *testing.T) {
		if got := cpusOfRunOnCPUs(t, nil); got == want {
			t.Errorf("f ran on CPUs %s only, want all of %v", got, cpus)
		}
	})
	t.Run("an impossible CPU is an error", func(t *testing.T) {
		if _, err := Start("sh", "/bin/sh", []string{"-c", "true"}, nil, nil, nil, OnCPUs(1<<12-1)); err == nil {
			t.Error("Start on a CPU that does not exist succeeded")
		}
	})
}
