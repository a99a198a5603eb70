package federation

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/molly-gateway/molly/router/openai"
)

// TLSFiles names a peer's certificate, its key and the CA bundle that
// signs the federation's peers (PEM files).
type TLSFiles struct {
	Cert string `json:"cert"`
	Key  string `json:"key"`
	CA   string `json:"ca"`
}

func (f TLSFiles) load() (tls.Certificate, *x509.CertPool, error) {
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("federation certificate: %w", err)
	}
	pem, err := os.ReadFile(f.CA)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("federation CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return tls.Certificate{}, nil, fmt.Errorf("federation CA %s holds no PEM certificate", f.CA)
	}
	return cert, pool, nil
}

// ServerTLS is the aggregator's TLS configuration: its certificate, and
// mutual TLS (tls.RequireAndVerifyClientCert against the CA), TLS 1.3.
// Peer names are checked per request (PeerName). Errors: unreadable
// files.
func ServerTLS(f TLSFiles) (*tls.Config, error) {
	cert, pool, err := f.load()
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}, nil
}

// ClientTLS is a participant's TLS configuration: its certificate for
// the aggregator and the CA the aggregator's certificate must chain to
// (its name is checked against the URL's host), TLS 1.3.
func ClientTLS(f TLSFiles) (*tls.Config, error) {
	cert, pool, err := f.load()
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS13}, nil
}

// PeerName is the name of the verified client certificate of cs that is
// in allowed: one of its DNS names or, failing those, its subject common
// name. ok is false when there is no verified certificate or no name is
// allowed.
func PeerName(cs *tls.ConnectionState, allowed []string) (string, bool) {
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return "", false
	}
	leaf := cs.VerifiedChains[0][0]
	for _, n := range append(slices.Clone(leaf.DNSNames), leaf.Subject.CommonName) {
		if n != "" && slices.Contains(allowed, n) {
			return n, true
		}
	}
	return "", false
}

// Paths of the federation API.
const (
	// PathRound: GET the open round of {domain} (RoundState JSON).
	PathRound = "/federation/v1/rounds/{domain}"
	// PathDeltas: POST an encoded delta (application/octet-stream) for
	// round {round} of {domain}; its header must name the same domain and
	// round (400 round_mismatch otherwise); 202 with RoundState JSON.
	PathDeltas = "/federation/v1/rounds/{domain}/{round}/deltas"
	// PathAggregate: GET the aggregate adapter GGUF of round {round} of
	// {domain}, waiting up to ?wait= (a Go duration, at most 10m) for the
	// round to close; headers X-Molly-Federation-Samples,
	// -Participants, -Rank, -Energy-Kept.
	PathAggregate = "/federation/v1/rounds/{domain}/{round}/aggregate"
)

// Handler serves the federation API for a. Every request must come over
// mutual TLS from a peer in a's list (403 otherwise). Errors are OpenAI
// error JSON ({"error":{"message","type","param","code"}}): 400 malformed
// or posted to a round its header does not name, 403 unknown peer, 404
// unknown or still open round or a path the API does not have, 405 a
// method its path does not serve (with Allow), 409 replayed or other-base
// or mismatched delta, 413 oversized, 410 a round that closed without an
// aggregate.
func (a *Aggregator) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PathRound, func(w http.ResponseWriter, r *http.Request) {
		if d := r.PathValue("domain"); !domainRe.MatchString(d) {
			writeError(w, http.StatusBadRequest, "bad_domain", fmt.Errorf("domain %q is not an identifier", d))
			return
		}
		writeJSON(w, http.StatusOK, a.Current(r.PathValue("domain")))
	})
	mux.HandleFunc("POST "+PathDeltas, func(w http.ResponseWriter, r *http.Request) {
		peer := r.Context().Value(peerKey{}).(string)
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(a.cfg.MaxDeltaBytes)))
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			err = fmt.Errorf("%w: more than %d bytes", ErrTooLarge, a.cfg.MaxDeltaBytes)
			a.cfg.Logger.Warn("federation delta refused: " + err.Error())
			writeError(w, http.StatusRequestEntityTooLarge, "delta_too_large", err)
			return
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, "unreadable_body", err)
			return
		}
		round, err := strconv.ParseUint(r.PathValue("round"), 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, "bad_round", fmt.Errorf("round %q is not a number", r.PathValue("round")))
			return
		}
		st, err := a.Submit(peer, r.PathValue("domain"), round, body)
		if err != nil {
			writeError(w, statusOf(err), codeOf(err), err)
			return
		}
		writeJSON(w, http.StatusAccepted, st)
	})
	mux.HandleFunc("GET "+PathAggregate, func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseUint(r.PathValue("round"), 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, "bad_round", fmt.Errorf("round %q is not a number", r.PathValue("round")))
			return
		}
		wait := time.Duration(0)
		if s := r.URL.Query().Get("wait"); s != "" {
			if wait, err = time.ParseDuration(s); err != nil || wait < 0 {
				writeError(w, http.StatusBadRequest, "bad_wait", fmt.Errorf("wait %q is not a duration", s))
				return
			}
			wait = min(wait, 10*time.Minute)
		}
		ctx, cancel := context.WithTimeout(r.Context(), wait)
		defer cancel()
		res, ok := a.Result(r.PathValue("domain"), id, ctx.Done())
		if !ok {
			writeError(w, http.StatusNotFound, "round_open", fmt.Errorf("round %d of %s has not closed", id, r.PathValue("domain")))
			return
		}
		if res.err != nil {
			writeError(w, http.StatusGone, "round_failed", res.err)
			return
		}
		data, err := os.ReadFile(res.Path)
		if err != nil {
			writeError(w, http.StatusInternalServerError, "aggregate_unreadable", err)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "application/octet-stream")
		h.Set("X-Molly-Federation-Samples", strconv.FormatInt(res.Samples, 10))
		h.Set("X-Molly-Federation-Participants", strconv.Itoa(len(res.Participants)))
		h.Set("X-Molly-Federation-Rank", strconv.Itoa(res.Rank))
		h.Set("X-Molly-Federation-Energy-Kept", strconv.FormatFloat(res.EnergyKept, 'g', 6, 64))
		w.Write(data)
	})
	// Anything no route above serves: 405 with the methods its path has,
	// else 404, in the same error shape (the mux's own are plain text).
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		var allow []string
		for _, m := range []string{http.MethodGet, http.MethodPost} {
			probe := r.Clone(r.Context())
			probe.Method = m
			if _, pattern := mux.Handler(probe); pattern != "/" {
				allow = append(allow, m)
			}
		}
		if len(allow) > 0 {
			openai.MethodNotAllowed(r.Method, r.URL.Path, strings.Join(allow, ", ")).Write(w)
			return
		}
		writeError(w, http.StatusNotFound, "not_found", fmt.Errorf("no route %s %s", r.Method, r.URL.Path))
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		peer, ok := PeerName(r.TLS, a.cfg.Peers)
		if !ok {
			a.cfg.Logger.Warn("federation request from an unknown peer refused")
			writeError(w, http.StatusForbidden, "unknown_peer", ErrUnknownPeer)
			return
		}
		mux.ServeHTTP(w, r.WithContext(contextWithPeer(r.Context(), peer)))
	})
}

func statusOf(err error) int {
	switch {
	case errors.Is(err, ErrTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, ErrUnknownPeer):
		return http.StatusForbidden
	case errors.Is(err, ErrWrongRound):
		return http.StatusBadRequest
	case errors.Is(err, ErrReplay), errors.Is(err, ErrFutureRound), errors.Is(err, ErrOtherBase), errors.Is(err, ErrMismatch):
		return http.StatusConflict
	}
	return http.StatusBadRequest
}

func codeOf(err error) string {
	for _, c := range []struct {
		err  error
		code string
	}{{ErrTooLarge, "delta_too_large"}, {ErrUnknownPeer, "unknown_peer"}, {ErrWrongRound, "round_mismatch"}, {ErrReplay, "replayed_delta"},
		{ErrFutureRound, "round_not_open"}, {ErrOtherBase, "other_base"}, {ErrMismatch, "delta_mismatch"}, {ErrMalformed, "malformed_delta"}} {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return "invalid_delta"
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// writeError writes OpenAI's error shape (openai.Error): type
// invalid_request_error for 4xx, server_error for 5xx, param null.
func writeError(w http.ResponseWriter, status int, code string, err error) {
	typ := "invalid_request_error"
	if status >= 500 {
		typ = "server_error"
	}
	(&openai.Error{Status: status, Type: typ, Code: code, Message: err.Error()}).Write(w)
}
