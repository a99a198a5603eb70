package router

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/redaction"
)

// benchPara is a mixed English/Italian prompt paragraph (~600 bytes) with a
// value of most types in every paragraph: the worst realistic case for
// redaction, since every paragraph gets placeholders and every placeholder
// comes back in the echoed answer to be restored.
const benchPara = `Hi, I'm writing about my order ORD-2024-118734 placed on 2024-03-15 (version 1.4.2 of the app).
Please refund card 4111 1111 1111 1111 or send the money to IBAN IT60 X054 2811 1010 0000 0123 456.
You can reach me at mario.rossi@example.it or +39 333 123 4567; my colleague is on (415) 555-2671.
Il mio codice fiscale è RSSMRA85T10A562S e il server è 192.168.1.10. Grazie mille per l'aiuto,
ci sentiamo presto: the meeting is at 10:30 in room 4, budget 12.500,00 EUR.
`

// BenchmarkRedactionOverhead measures the end-to-end latency redaction adds
// to one chat request (classify, Forwarder.Serve to a T3 upstream on
// loopback that echoes the prompt, answer restored), for a 2 KB and a 64 KB
// prompt, as ratios against the same request in the same run:
//
//   - x-vs-off: full redaction (scan, placeholders, restore) over the
//     request with no scanning and nothing redacted;
//   - x-vs-scan: over the request scanned (as classification always does,
//     for the sensitivity class) but with nothing redacted for T3, i.e. the
//     cost of the vault and the restore alone.
//
// The three variants alternate inside one loop so that they see the same
// machine state; on-µs, scan-µs and off-µs are their median latencies,
// added-µs is on-µs minus off-µs, and the ratios are of the medians.
func BenchmarkRedactionOverhead(b *testing.B) {
	for _, size := range []int{2 << 10, 64 << 10} {
		b.Run(fmt.Sprintf("%dKB", size>>10), func(b *testing.B) { benchRedactionOverhead(b, size) })
	}
}

func benchRedactionOverhead(b *testing.B, size int) {
	up := upstreamtest.Start("cloud")
	b.Cleanup(up.Close)
	cat := newCatalogue(b, &Target{Name: "cloud", Tier: "T3", Endpoint: up.URL(), Models: []string{"m"}})
	f := &Forwarder{Catalogue: cat, Weights: DefaultWeights}
	prompt := strings.Repeat(benchPara, size/len(benchPara)+1)[:size]
	body := []byte(chatBody(prompt))

	scanning := testClassifier(b)
	off := NewClassifier(testScanner(b), nil)
	off.scan = func(string) []redaction.Finding { return nil }
	off.scanAcross = func([]string) []redaction.SegmentFinding { return nil }
	all := redaction.BuiltinTypes()
	redact := allowTiers(b, []string{"T3"}, map[string][]string{"T3": all})
	plain := allowTiers(b, []string{"T3"}, nil)

	run := func(c *Classifier, d any) (time.Duration, string) {
		start := time.Now()
		a, err := c.Classify(EndpointChat, body, "", "")
		if err != nil {
			b.Fatal(err)
		}
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		dec := redact
		if d == nil {
			dec = plain
		}
		if err := f.Serve(rec, req, a, dec); err != nil || rec.Code != 200 {
			b.Fatalf("Serve = %v, status %d", err, rec.Code)
		}
		return time.Since(start), rec.Body.String()
	}
	// Warm up connections and caches, and check the variants do what they say.
	if _, answer := run(scanning, true); !strings.Contains(answer, "mario.rossi@example.it") ||
		!up.Contains("[EMAIL_1]") || up.Contains("mario.rossi@example.it") {
		b.Fatal("the redacted request was not redacted and restored")
	}
	if _, answer := run(off, nil); !strings.Contains(answer, "mario.rossi@example.it") || !up.Contains("mario.rossi@example.it") {
		b.Fatal("the plain request was changed")
	}
	var tOn, tScan, tOff []time.Duration
	b.SetBytes(int64(size))
	b.ResetTimer()
	for b.Loop() {
		el, _ := run(scanning, true)
		tOn = append(tOn, el)
		el, _ = run(scanning, nil)
		tScan = append(tScan, el)
		el, _ = run(off, nil)
		tOff = append(tOff, el)
	}
	mOn, mScan, mOff := median(tOn), median(tScan), median(tOff)
	b.ReportMetric(mOn/mOff, "x-vs-off")
	b.ReportMetric(mOn/mScan, "x-vs-scan")
	b.ReportMetric(mOn/1e3, "on-µs")
	b.ReportMetric(mScan/1e3, "scan-µs")
	b.ReportMetric(mOff/1e3, "off-µs")
	b.ReportMetric((mOn-mOff)/1e3, "added-µs")
}

// median returns the median of ds in nanoseconds: on shared machines a
// few slow iterations skew a mean, not a median.
func median(ds []time.Duration) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return float64(s[len(s)/2])
}
