package policy

import (
	"slices"
	"strings"
)

// sortByName puts policies in the order a Set decides in.
func sortByName(ps []*Compiled) {
	slices.SortFunc(ps, func(a, b *Compiled) int { return strings.Compare(a.Name, b.Name) })
}
