package loadtest

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// WriteText writes s for people.
func (s *Summary) WriteText(w io.Writer) error {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("ztunnels      %d (%d identities, at most %d requests in flight each)\n", s.Ztunnels, s.Identities, s.InFlight)
	switch s.Mode {
	case "once":
		p("mode          cold-start storm: every identity once, all ztunnels at once, retries %s\n", s.Retry)
		if s.AllDoneSeconds > 0 {
			p("all done in   %.3fs (median ztunnel %.3fs)\n", s.AllDoneSeconds, s.ZtunnelDoneP50Secs)
		} else {
			p("all done in   never: %d of %d ztunnels got all their certificates within %.1fs\n", s.ZtunnelsDone, s.Ztunnels, s.WindowSeconds)
		}
	case "rate":
		p("mode          open loop at %.1f requests/s, latency from when each was due\n", s.TargetRate)
		p("window        %.1fs after a %.1fs warm-up\n", s.WindowSeconds, s.WarmupSeconds)
	default:
		p("mode          closed loop at the maximum rate\n")
		p("window        %.1fs after a %.1fs warm-up\n", s.WindowSeconds, s.WarmupSeconds)
	}
	p("certs/s       %.1f\n", s.CertsPerSec)
	p("certs         %d\n", s.Certs)
	l := s.LatencyMS
	p("latency ms    p50 %.2f  p90 %.2f  p99 %.2f  p99.9 %.2f  max %.2f  mean %.2f\n", l.P50, l.P90, l.P99, l.P999, l.Max, l.Mean)
	if g := s.StartLagMS; g != nil {
		p("sent late ms  p50 %.2f  p90 %.2f  p99 %.2f  p99.9 %.2f  max %.2f  (due to sent, part of the latency)\n", g.P50, g.P90, g.P99, g.P999, g.Max)
	}
	p("errors        %d", s.Errors)
	codes := make([]string, 0, len(s.ErrorsByCode))
	for c := range s.ErrorsByCode {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	for _, c := range codes {
		p("  %s=%d", c, s.ErrorsByCode[c])
	}
	if s.Mode == "once" {
		p("\nsetup         %.2fs (keys and CSRs; connecting is part of the storm)\n", s.SetupSeconds)
	} else {
		p("\nsetup         %.2fs (keys, CSRs and connections)\n", s.SetupSeconds)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
