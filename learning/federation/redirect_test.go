package federation

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// TestParticipantFollowsNoRedirect: an aggregator address that answers
// 307 or 308 naming another host (one the participant's CA would trust)
// gets an *APIError with that status from Round and Send, and the other
// host receives no request: a delta goes only to the aggregator
// configured.
func TestParticipantFollowsNoRedirect(t *testing.T) {
	p := newPKI(t, "molly federation redirect CA")
	var elsewhere atomic.Int64
	other := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		w.WriteHeader(http.StatusAccepted)
	}))
	tc, err := ServerTLS(p.issue("elsewhere"))
	if err != nil {
		t.Fatal(err)
	}
	other.TLS = tc
	other.StartTLS()
	defer other.Close()
	for _, status := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		redirect := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+r.URL.Path, status)
		}))
		tc, err := ServerTLS(p.issue("aggregator"))
		if err != nil {
			t.Fatal(err)
		}
		redirect.TLS = tc
		redirect.StartTLS()
		part, err := NewParticipant(ParticipantConfig{Aggregator: redirect.URL, TLS: p.issue("peer")})
		if err != nil {
			t.Fatal(err)
		}
		_, err = part.Round(context.Background(), "orders")
		var ae *APIError
		if !errors.As(err, &ae) || ae.Status != status {
			t.Errorf("%d: Round: %v, want an *APIError with status %d", status, err, status)
		}
		d := delta(1, 5, 2, 2, func(i int) float32 { return float32(i) }, "blk.0.attn_q.weight")
		_, err = part.Send(context.Background(), d)
		if !errors.As(err, &ae) || ae.Status != status {
			t.Errorf("%d: Send: %v, want an *APIError with status %d", status, err, status)
		}
		redirect.Close()
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the host the redirects named received %d requests, want 0", n)
	}
}
