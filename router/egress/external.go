package egress

import (
	"net/http"
	"net/url"

	"github.com/molly-gateway/molly/router/openai"
)

// The request a dispatch makes, for Send and for a data plane that carries
// the bytes itself (Envoy, through the ext_proc policy point of package
// envoy): the method, the URL and the headers, so that both send exactly
// the same thing.

// Method is the HTTP method of the upstream call: GET for the model
// listing, POST otherwise.
func (d *Dispatch) Method() string {
	if d.endpoint == openai.EndpointModels {
		return http.MethodGet
	}
	return http.MethodPost
}

// URL is the upstream URL of the call: the target's base URL (for kind
// engine http://engine.molly.internal/v1) with the endpoint's path
// appended, e.g. http://10.0.0.5:8000/v1/chat/completions. A new value on
// every call.
func (d *Dispatch) URL() *url.URL {
	u := *d.egress.clients[d.target.Name].base
	u.Path += d.endpoint.Path()
	return &u
}

// Header is the request header of the upstream call made for a client
// whose request carried hdr: Content-Type and Accept of an OpenAI call, the
// ForwardHeaders that hdr has, X-Molly-Decision-Id for a target that is not
// T3 (external APIs learn nothing about Molly's decisions), and
// "Authorization: Bearer <key>" when the target has an API key. Nothing
// else of the client's reaches the upstream. To every tier but T0 (the
// values were never classified, so the decision did not see them), a
// forwarded value in which the detectors find anything (an e-mail address
// as a request id, a card number or a token in tracestate) is left out; a
// request id so left out is replaced by a fresh "req_" id; an id Molly
// made (openai.Minted) is forwarded without that scan. A new value on
// every call; it holds the upstream key, so never log it.
func (d *Dispatch) Header(hdr http.Header) http.Header {
	out := make(http.Header, 6)
	out.Set("Content-Type", "application/json")
	out.Set("Accept", "application/json, text/event-stream")
	for _, k := range ForwardHeaders {
		v := hdr.Get(k)
		if v == "" {
			continue
		}
		if k == openai.HeaderRequestID && openai.Minted(v) {
			// Molly's own id (openai.NewRequestID): nothing of the
			// client's is in it.
			out.Set(k, v)
			continue
		}
		if d.guard != nil && len(d.guard.Scan(v)) > 0 {
			if k != openai.HeaderRequestID {
				continue
			}
			v = openai.NewRequestID()
		}
		out.Set(k, v)
	}
	if d.target.Tier != "T3" {
		out.Set("X-Molly-Decision-Id", d.decisionID)
	}
	if key := d.egress.clients[d.target.Name].apiKey; key != "" {
		out.Set("Authorization", "Bearer "+key)
	}
	return out
}
