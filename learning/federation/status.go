package federation

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// WriteStatus prints s for `molly federation status`: the ε spent at δ
// (Mironov's RDP accountant over every release), the budget and what is
// left, then one line per delta sent.
func (s State) WriteStatus(w io.Writer) error {
	if s.Accountant.Rounds == 0 {
		fmt.Fprintf(w, "differential privacy: no noised release yet (ε spent 0)\n")
	} else {
		fmt.Fprintf(w, "differential privacy: ε spent %.4g at δ=%g over %d releases (RDP accountant, Mironov 2017)\n",
			s.Epsilon, s.Delta, s.Accountant.Rounds)
	}
	if s.EpsilonBudget > 0 {
		left := max(0, s.EpsilonBudget-s.Epsilon)
		fmt.Fprintf(w, "budget: ε %.4g, %.4g left\n", s.EpsilonBudget, left)
	}
	fmt.Fprintf(w, "deltas sent: %d\n", len(s.Sent))
	if len(s.Sent) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DOMAIN\tROUND\tSAMPLES\tBYTES\tNORM\tε ROUND\tε TOTAL\tSENT")
	for _, r := range s.Sent {
		eps, total := "-", "-"
		if r.Total > 0 {
			eps, total = fmt.Sprintf("%.4g", r.Epsilon), fmt.Sprintf("%.4g", r.Total)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.4g\t%s\t%s\t%s\n", r.Domain, r.Round, r.Samples, r.Bytes, r.Norm, eps, total,
			r.At.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}
