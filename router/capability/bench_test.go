package capability

import (
	"fmt"
	"strings"
	"testing"
)

// benchPrompt is a chat prompt of n bytes: pasted material (prose in
// English and Italian, a code block, figures) and an instruction at the
// end, the shape of RAG and agent prompts.
func benchPrompt(n int) string {
	const material = "The quarterly report shows revenue of 4.2 million euro, up 12% on last year, " +
		"while costs rose to 3.1 million. The board met on 3 May to discuss the new pricing plan and the " +
		"expansion into Spain. Il consiglio ha approvato il bilancio e chiede una sintesi per i soci. " +
		"Customers asked for faster delivery and a clearer invoice layout; support tickets fell by a third.\n" +
		"```python\ndef growth(prev, cur):\n    return (cur - prev) / prev * 100\n```\n" +
		"Next steps: hire two engineers, review the contract with the logistics partner, and publish the report.\n\n"
	const instruction = "\nPlease summarise the text above in three bullet points and list every date mentioned."
	var b strings.Builder
	for b.Len()+len(material) < n-len(instruction) {
		b.WriteString(material)
	}
	b.WriteString(material[:n-len(instruction)-b.Len()])
	b.WriteString(instruction)
	return b.String()
}

// BenchmarkEstimate compares the keyword automaton with the regexp
// estimator it replaces, on the same prompts in the same run. Besides
// ns/op, MB/s and allocations it reports µs/KB (KB = 1024 bytes).
func BenchmarkEstimate(b *testing.B) {
	impls := []struct {
		name     string
		estimate func(string, bool) Estimate
	}{
		{"automaton", NewEstimator(func() []string { return demoDomains }).Estimate},
		{"regexp", newRegexpEstimator(func() []string { return demoDomains }).Estimate},
	}
	for _, size := range []int{2 << 10, 32 << 10, 256 << 10} {
		prompt := benchPrompt(size)
		if a, r := impls[0].estimate(prompt, false).Task, impls[1].estimate(prompt, false).Task; a != r {
			b.Fatalf("%d-byte prompt: automaton says %s, regexp %s", size, a, r)
		}
		for _, im := range impls {
			b.Run(fmt.Sprintf("%s/%dKB", im.name, size>>10), func(b *testing.B) {
				b.SetBytes(int64(len(prompt)))
				b.ReportAllocs()
				for b.Loop() {
					im.estimate(prompt, false)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3/float64(len(prompt)>>10), "µs/KB")
			})
		}
	}
}
