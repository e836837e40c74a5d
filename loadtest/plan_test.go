package loadtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParsePlan(t *testing.T) {
	good := `[{"token":"a.b.c","identities":["spiffe://cluster.local/ns/x/sa/y","spiffe://cluster.local/ns/x/sa/z"]},
	          {"token":"d.e.f","identities":["spiffe://cluster.local/ns/q/sa/r"],"clusterId":"east"}]`
	p, err := ParsePlan(strings.NewReader(good + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(p) != 2 || p[0].Token != "a.b.c" || len(p[0].Identities) != 2 || p.Identities() != 3 || p[0].ClusterID != "" || p[1].ClusterID != "east" {
		t.Fatalf("parsed %+v", p)
	}
	if got := p.Limit(1); len(got) != 1 || got[0].Token != "a.b.c" {
		t.Errorf("Limit(1) = %+v", got)
	}
	if len(p.Limit(0)) != 2 || len(p.Limit(5)) != 2 {
		t.Error("Limit(0) and Limit(5) should keep every ztunnel")
	}

	for name, in := range map[string]string{
		"empty array":      `[]`,
		"not an array":     `{"token":"a","identities":["spiffe://cluster.local/ns/x/sa/y"]}`,
		"no token":         `[{"identities":["spiffe://cluster.local/ns/x/sa/y"]}]`,
		"token w/ space":   `[{"token":"a b","identities":["spiffe://cluster.local/ns/x/sa/y"]}]`,
		"no identities":    `[{"token":"a","identities":[]}]`,
		"cluster w/ space": `[{"token":"a","identities":["spiffe://cluster.local/ns/x/sa/y"],"clusterId":"a b"}]`,
		"bad identity":     `[{"token":"a","identities":["https://example.com"]}]`,
		"unknown field":    `[{"token":"a","identities":["spiffe://cluster.local/ns/x/sa/y"],"node":"n"}]`,
		"trailing data":    `[{"token":"a","identities":["spiffe://cluster.local/ns/x/sa/y"]}] []`,
		"truncated":        `[{"token":"a"`,
		"nothing at all":   ``,
		"identity not id":  `[{"token":"a","identities":["spiffe://"]}]`,
	} {
		if _, err := ParsePlan(strings.NewReader(in)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestReadPlanFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "plan.json")
	if err := os.WriteFile(path, []byte(`[{"token":"t","identities":["spiffe://cluster.local/ns/a/sa/b"]}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	if p, err := ReadPlanFile(path); err != nil || len(p) != 1 {
		t.Fatalf("ReadPlanFile = %v, %v", p, err)
	}
	if _, err := ReadPlanFile(path + ".missing"); err == nil {
		t.Error("missing file: no error")
	}
}
