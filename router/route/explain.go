package route

import (
	"fmt"
	"strings"
)

// Describe is one candidate in the decision log:
// "lan/m q=0.7000 (learned 3) cost=0.002000 lat=1.000 score=0.6300".
func Describe(c Candidate) string {
	src := "config"
	if c.Learned > 0 {
		src = fmt.Sprintf("learned %d", c.Learned)
	}
	return fmt.Sprintf("%s/%s q=%.4f (%s) cost=%.6f lat=%.3f score=%.4f", c.Target.Name, c.Model, c.Quality, src, c.CostUSD, c.LatencyS, c.Score)
}

// Label is "<target>/<model>".
func (c Candidate) Label() string { return c.Target.Name + "/" + c.Model }

// Same reports whether c and o are the same target and model.
func (c Candidate) Same(o Candidate) bool { return c.Target == o.Target && c.Model == o.Model }

// RouteHeader is the X-Molly-Route value for chosen among cands (best
// first): "<target>/<model> score=<s>", then "; runner-up <target>/<model>
// score=<s>" for the best other candidate (or "; runner-up none"), then
// "; fallback" when chosen was not the first choice, then "; excluded
// <target>: <reason>" for each excluded target. Scores have 4 decimals.
func RouteHeader(chosen Candidate, cands []Candidate, excluded []Exclusion) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s/%s score=%.4f", chosen.Target.Name, chosen.Model, chosen.Score)
	runnerUp := false
	for _, c := range cands {
		if c.Same(chosen) {
			continue
		}
		fmt.Fprintf(&b, "; runner-up %s/%s score=%.4f", c.Target.Name, c.Model, c.Score)
		runnerUp = true
		break
	}
	if !runnerUp {
		b.WriteString("; runner-up none")
	}
	if len(cands) > 0 && !cands[0].Same(chosen) {
		b.WriteString("; fallback")
	}
	for _, e := range excluded {
		fmt.Fprintf(&b, "; excluded %s: %s", e.Target, headerSafe(e.Reason))
	}
	return b.String()
}

// ExcludedHeader is the X-Molly-Route value of a request no candidate was
// left for: "none", then "; excluded <target>: <reason>" for each
// excluded target, as in RouteHeader.
func ExcludedHeader(excluded []Exclusion) string {
	var b strings.Builder
	b.WriteString("none")
	for _, e := range excluded {
		fmt.Fprintf(&b, "; excluded %s: %s", e.Target, headerSafe(e.Reason))
	}
	return b.String()
}

// headerSafe keeps a reason printable ASCII for a header value.
func headerSafe(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r >= 0x20 && r < 0x7f {
			b.WriteRune(r)
		} else {
			b.WriteByte('?')
		}
	}
	return b.String()
}
