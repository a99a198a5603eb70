package route

import (
	"fmt"
	"strconv"
	"strings"
)

// Describe is one candidate in the decision log:
// "lan/m q=0.7000 (learned 3) cost=0.002000 lat=1.000 score=0.6300".
func Describe(c Candidate) string { return string(AppendDescribe(nil, c)) }

// AppendDescribe appends Describe(c) to b (numbers as fmt's %.4f, %.6f
// and %.3f write them: strconv's 'f' format).
func AppendDescribe(b []byte, c Candidate) []byte {
	b = append(append(append(b, c.Target.Name...), '/'), c.Model...)
	b = strconv.AppendFloat(append(b, " q="...), c.Quality, 'f', 4, 64)
	if c.Learned > 0 {
		b = append(strconv.AppendInt(append(b, " (learned "...), int64(c.Learned), 10), ')')
	} else {
		b = append(b, " (config)"...)
	}
	b = strconv.AppendFloat(append(b, " cost="...), c.CostUSD, 'f', 6, 64)
	b = strconv.AppendFloat(append(b, " lat="...), c.LatencyS, 'f', 3, 64)
	return strconv.AppendFloat(append(b, " score="...), c.Score, 'f', 4, 64)
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
	b := make([]byte, 0, 128)
	b = append(append(append(b, chosen.Target.Name...), '/'), chosen.Model...)
	b = strconv.AppendFloat(append(b, " score="...), chosen.Score, 'f', 4, 64)
	runnerUp := false
	for _, c := range cands {
		if c.Same(chosen) {
			continue
		}
		b = append(append(append(append(b, "; runner-up "...), c.Target.Name...), '/'), c.Model...)
		b = strconv.AppendFloat(append(b, " score="...), c.Score, 'f', 4, 64)
		runnerUp = true
		break
	}
	if !runnerUp {
		b = append(b, "; runner-up none"...)
	}
	if len(cands) > 0 && !cands[0].Same(chosen) {
		b = append(b, "; fallback"...)
	}
	for _, e := range excluded {
		b = append(append(append(append(b, "; excluded "...), e.Target...), ": "...), headerSafe(e.Reason)...)
	}
	return string(b)
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
