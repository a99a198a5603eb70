package pipeline

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// TestSplitAcrossPromptAndSuffixDoesNotReachT3: a card number cut between
// a /v1/completions prompt and its suffix (in either order) reaches the
// external upstream with neither part in clear. The oracle is the card's
// digits, searched in what the T3 upstream received (prompt and suffix
// joined, digits only), not the detectors' output.
func TestSplitAcrossPromptAndSuffixDoesNotReachT3(t *testing.T) {
	h := canaryGateways(t)
	canaryMu.Lock()
	defer canaryMu.Unlock()
	const card = "4111111111111111"
	for _, body := range []string{
		`{"model":"m","prompt":"my card is 4111 1111","suffix":"1111 1111 thanks","max_tokens":5}`,
		`{"model":"m","prompt":"1111 1111 is the rest","suffix":"my card is 4111 1111","max_tokens":5}`,
	} {
		for _, r := range h.t3 {
			r.drain()
		}
		req := httptest.NewRequest(http.MethodPost, "/v1/completions", bytes.NewReader([]byte(body)))
		w := httptest.NewRecorder()
		h.gateways["single"].ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			t.Fatalf("%s: status %d: %s", body, w.Code, w.Body.String())
		}
		n := 0
		for _, r := range h.t3 {
			for _, got := range r.drain() {
				n++
				prompt, suffix := gjson.GetBytes(got, "prompt").String(), gjson.GetBytes(got, "suffix").String()
				digits := func(s string) string {
					return strings.Map(func(r rune) rune {
						if r >= '0' && r <= '9' {
							return r
						}
						return -1
					}, s)
				}
				if j := digits(prompt) + digits(suffix) + digits(prompt); strings.Contains(j, card) || strings.Contains(string(got), "1111 1111") {
					t.Errorf("the card cut between prompt and suffix reached T3:\nsent:     %s\nreceived: %s", body, got)
				}
			}
		}
		if n == 0 {
			t.Fatalf("%s: no request reached the T3 upstream", body)
		}
	}
}
