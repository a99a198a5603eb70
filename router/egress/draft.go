package egress

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"go.uber.org/zap"
)

// Drafter is implemented by an in-process engine that can draft for a
// remote Molly engine (serving.Engine.RemoteDrafter): it returns a
// function that answers a chat completions request (its body given) as
// the engine at verifyURL would at temperature 0, drafting tokens locally
// and having that engine verify them (POST verifyURL, with header), and
// reports true; or declines with false, having written nothing, and the
// request is sent as usual. tokens is the draft length per verify call
// (0: the engine's default); logf is told why requests are not drafted.
type Drafter interface {
	RemoteDrafter(verifyURL string, header http.Header, client *http.Client, tokens int, logf func(format string, args ...any)) func(w http.ResponseWriter, r *http.Request, body []byte) bool
}

// VerifyURL is the verify endpoint of the Molly engine behind an OpenAI
// base URL: the endpoint with a trailing "/v1" replaced by
// "/molly/engine/verify" (http://10.0.0.5:8000/v1 →
// http://10.0.0.5:8000/molly/engine/verify; a path prefix is kept, so
// http://h/engine/v1 → http://h/engine/molly/engine/verify).
func VerifyURL(base *url.URL) string {
	u := *base
	u.Path = strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), "/v1") + "/molly/engine/verify"
	u.RawPath = ""
	return u.String()
}

// draftTransport is the transport of a target with DraftWithEngine: a
// chat completions POST is first offered to the engine's drafting (in
// process, as handlerTransport calls the engine), and sent over next when
// the engine declines it; every other request goes over next.
type draftTransport struct {
	serve func(w http.ResponseWriter, r *http.Request, body []byte) bool
	next  http.RoundTripper
}

func (t *draftTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPost || req.Body == nil || !strings.HasSuffix(req.URL.Path, "/chat/completions") {
		return t.next.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, err
	}
	resp, served, err := serveInProcess(req, func(w http.ResponseWriter, r *http.Request) bool { return t.serve(w, r, body) })
	if served {
		return resp, err
	}
	plain := req.Clone(req.Context())
	plain.Body = io.NopCloser(bytes.NewReader(body))
	plain.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	plain.ContentLength = int64(len(body))
	return t.next.RoundTrip(plain)
}

// SetLogger sets where drafting targets log why requests are not drafted
// (once per reason); nil, the default, is silent.
func (e *Egress) SetLogger(l *zap.Logger) { e.logger.Store(l) }

// drafting wraps u's transport for target name: drafts by engine against
// the verify endpoint of u's base URL, with u's API key.
func (e *Egress) drafting(name string, u *upstream, engine Drafter, tokens int) {
	header := http.Header{}
	if u.apiKey != "" {
		header.Set("Authorization", "Bearer "+u.apiKey)
	}
	next := u.client.Transport
	logf := func(format string, args ...any) {
		if l := e.logger.Load(); l != nil {
			l.Info(fmt.Sprintf(format, args...), zap.String("target", name))
		}
	}
	serve := engine.RemoteDrafter(VerifyURL(u.base), header, &http.Client{Transport: next, CheckRedirect: noRedirect}, tokens, logf)
	u.client = &http.Client{Transport: &draftTransport{serve: serve, next: next}, CheckRedirect: noRedirect}
}
