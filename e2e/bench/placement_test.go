package main

import (
	"slices"
	"testing"

	"github.com/workload-ca/workload-ca/e2e/internal/proc"
)

func TestChoosePlacement(t *testing.T) {
	cpus, err := proc.CPUs()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("shared: anywhere", func(t *testing.T) {
		p, err := choosePlacement("shared")
		if err != nil || p.name != "shared" || p.server != nil || p.client != nil {
			t.Errorf("got %+v, %v", p, err)
		}
	})
	t.Run("an unknown mode is an error", func(t *testing.T) {
		if _, err := choosePlacement("spread"); err == nil {
			t.Error("no error")
		}
	})
	t.Run("split: the CPUs in two halves, the larger for the CA", func(t *testing.T) {
		p, err := choosePlacement("split")
		if err != nil {
			t.Fatal(err)
		}
		if len(cpus) < 2 {
			if p.name != "shared" || p.server != nil {
				t.Errorf("one CPU: got %+v, want shared", p)
			}
			return
		}
		if p.name != "split" || len(p.client) == 0 || len(p.server) < len(p.client) || len(p.server)-len(p.client) > 1 {
			t.Fatalf("got %+v for CPUs %v", p, cpus)
		}
		if all := append(slices.Clone(p.server), p.client...); !slices.Equal(all, cpus) {
			t.Errorf("server %v + client %v, want a partition of %v", p.server, p.client, cpus)
		}
	})
}
