package cliflag

import (
	"slices"
	"testing"

	"github.com/spf13/pflag"
)

// Flags of several groups land in the order of the sections, each
// section's flags in the order they were defined.
func TestDoneOrdersBySection(t *testing.T) {
	fs := New("x")
	fs.Section("B")
	fs.Bool("b1", false, "")
	fs.Section("A")
	fs.Bool("a1", false, "")
	fs.Section("B")
	fs.Bool("b2", false, "")
	fs.Example("b2", "true")
	var got []string
	fs.Done("A", "B").VisitAll(func(f *pflag.Flag) { got = append(got, f.Name+"@"+SectionOf(f)) })
	if want := []string{"a1@A", "b1@B", "b2@B"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	if v := ExampleOf(fs.Lookup("b2"), ""); v != "true" {
		t.Errorf("example %q", v)
	}
	defer func() {
		if recover() == nil {
			t.Error("a section left out of the order did not panic")
		}
	}()
	fs.Done("A")
}

func TestList(t *testing.T) {
	l := List{"x"}
	if err := l.Set(" a, ,b "); err != nil || !slices.Equal(l, []string{"a", "b"}) || l.String() != "a,b" {
		t.Fatalf("list %q, %v", l, err)
	}
}
