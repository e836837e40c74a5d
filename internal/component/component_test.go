package component

import (
	"context"
	"testing"
)

func TestSynced(t *testing.T) {
	synced := false
	ready := Synced(func() bool { return synced })
	if err := ready(context.Background()); err == nil {
		t.Fatal("ready before the initial list")
	}
	synced = true
	if err := ready(context.Background()); err != nil {
		t.Fatalf("not ready after the initial list: %v", err)
	}
}
