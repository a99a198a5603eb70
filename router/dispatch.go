package router

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/tidwall/sjson"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/redaction"
)

// ErrNotAllowed is returned by NewDispatch for a target the decision does
// not allow.
var ErrNotAllowed = errors.New("target not allowed by the policy decision")

// ErrScanFailed is returned by NewDispatch for a tier whose decision
// requires redaction when a detector failed on the request
// (Sovereignty.ScanFailed): what it missed cannot be redacted, so the
// request may only go where the policy sends it unredacted.
var ErrScanFailed = errors.New("content scan failed, so the redaction the policy requires cannot be guaranteed")

// Dispatch is a request ready to leave for one target: the body is already
// redacted as the decision requires for the target's tier. NewDispatch is the
// only way to make one, and a Dispatch is the only thing the upstream call
// accepts, so no code path can send bytes to a tier the policy did not allow
// or skip the redaction it asked for (DESIGN.md §2, residency invariant).
type Dispatch struct {
	target     *Target
	model      string
	decisionID string
	endpoint   Endpoint
	body       []byte
	vault      *redaction.Vault // placeholders to restore in the answer; nil when nothing was redacted
	redacted   int              // distinct values replaced, in any mode
	// dropLogprobs: the logprobs in a relayed stream's chunks were asked
	// for by a cascade, not the client; relaySSE sets them to null.
	dropLogprobs bool
}

// NewDispatch checks c against d and builds the body for c's tier: the model
// name rewritten to the upstream's, and every finding whose type the decision
// lists for the tier replaced by a placeholder (or a mask or keyed
// pseudonym, per the classifier's WithRedactionModes); the parts of a value
// split across fields are replaced each in its field. Errors: ErrNotAllowed
// (wrapped) when the tier or region is not allowed; ErrScanFailed (wrapped)
// when the tier requires redaction and a detector failed on the request; an
// error when the decision asks to redact a type the classifier did not scan
// for (fail closed) or the body cannot be rewritten.
func NewDispatch(d *policies.Decision, a *Annotation, c Candidate) (*Dispatch, error) {
	t := c.Target
	if t == nil || !d.AllowsTier(t.Tier) || !regionAllowed(d, t) {
		name := "<nil>"
		if t != nil {
			name = t.Name + " (" + t.Tier + ")"
		}
		return nil, fmt.Errorf("%s: %w", name, ErrNotAllowed)
	}
	disp := &Dispatch{target: t, model: c.Model, decisionID: d.ID(), endpoint: a.Endpoint}
	if a.Endpoint == EndpointModels {
		return disp, nil
	}
	body, err := sjson.SetBytes(slices.Clone(a.Body), "model", c.Model)
	if err == nil && a.Stream && !a.IncludeUsage && (a.Endpoint == EndpointChat || a.Endpoint == EndpointCompletions) {
		// Usage is recorded for streams too: always ask for the usage chunk;
		// the forwarder strips it again for a client that did not ask.
		body, err = sjson.SetBytes(body, "stream_options.include_usage", true)
	}
	if err != nil {
		return nil, fmt.Errorf("rewriting model for %s: %w", t.Name, err)
	}
	types := d.Redact(t.Tier)
	if len(types) > 0 {
		if a.ScanFailed {
			return nil, fmt.Errorf("%s (%s redacts %s): %w", t.Name, t.Tier, strings.Join(types, ","), ErrScanFailed)
		}
		set := make(map[string]bool, len(types))
		for _, ty := range types {
			if !slices.Contains(a.Scanned, ty) {
				return nil, fmt.Errorf("policy requires redacting %s for %s, which no detector finds; refusing to send", ty, t.Tier)
			}
			set[ty] = true
		}
		vault := redaction.NewVault(a.vaultOpts...)
		// Reserve every placeholder-shaped string the client wrote, in any
		// field and in the raw body, before issuing one: otherwise a literal
		// "[EMAIL_1]" in a field without findings (or in a later field) could
		// be issued for a real value and "restored" into it in the answer.
		vault.Redact(string(a.Body), nil, nil)
		for _, field := range a.Fields {
			vault.Redact(field.Text, nil, nil)
		}
		for i := 0; i < len(a.Findings); {
			f := a.Findings[i].Field
			var fs []redaction.Finding
			for ; i < len(a.Findings) && a.Findings[i].Field == f; i++ {
				fs = append(fs, a.Findings[i].Finding)
			}
			field := a.Fields[f]
			red := vault.Redact(field.Text, fs, set)
			if red == field.Text {
				continue
			}
			if strings.HasPrefix(field.Path, "messages.") && strings.HasSuffix(field.Path, ".name") {
				red = participantName(red)
			}
			if body, err = sjson.SetBytes(body, field.Path, red); err != nil {
				return nil, fmt.Errorf("redacting %s for %s: %w", field.Path, t.Name, err)
			}
		}
		if vault.Len() > 0 {
			disp.vault = vault
		}
		disp.redacted = vault.Replaced()
	}
	disp.body = body
	return disp, nil
}

// Target returns the target the dispatch goes to.
func (d *Dispatch) Target() *Target { return d.target }

// Body returns the bytes that will be sent (after redaction).
func (d *Dispatch) Body() []byte { return d.body }

// Redacted reports how many distinct values were replaced, by placeholders,
// masks or pseudonyms (a value split across fields counts once per part).
func (d *Dispatch) Redacted() int { return d.redacted }

// send performs the upstream call. It is the only place that builds a
// request to an upstream.
func (d *Dispatch) send(ctx context.Context) (*http.Response, error) {
	u := *d.target.base
	u.Path += d.endpoint.Path()
	method, body := http.MethodPost, bytes.NewReader(d.body)
	if d.endpoint == EndpointModels {
		method, body = http.MethodGet, nil
	}
	var req *http.Request
	var err error
	if body != nil {
		req, err = http.NewRequestWithContext(ctx, method, u.String(), body)
	} else {
		req, err = http.NewRequestWithContext(ctx, method, u.String(), nil)
	}
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if d.target.Tier != "T3" { // external APIs learn nothing about our decisions
		req.Header.Set("X-Molly-Decision-Id", d.decisionID)
	}
	if d.target.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+d.target.apiKey)
	}
	return d.target.client.Do(req)
}

// participantName makes a redacted message name fit OpenAI's pattern for
// participant names, ^[a-zA-Z0-9_-]+$ ("[EMAIL_1]" becomes "EMAIL_1",
// "[EMAIL#3f2a...]" becomes "EMAIL_3f2a..."), so that an upstream does not
// refuse the request for the placeholder's brackets.
func participantName(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '[' || r == ']':
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	if b.Len() == 0 {
		return "redacted"
	}
	return b.String()
}

// followUp derives a dispatch to the same target and tier from d: d's body
// (already redacted as the decision asks for the tier) with msgs appended
// to its messages, as a short non-streamed request without logprobs or
// tools. Placeholders in msgs restore as d's do.
func (d *Dispatch) followUp(msgs ...map[string]any) (*Dispatch, error) {
	body := d.body
	var err error
	for _, p := range []string{"logprobs", "top_logprobs", "tools", "tool_choice", "stream_options", "n", "max_tokens"} {
		if body, err = sjson.DeleteBytes(body, p); err != nil {
			return nil, err
		}
	}
	if body, err = sjson.SetBytes(body, "stream", false); err != nil {
		return nil, err
	}
	if body, err = sjson.SetBytes(body, "max_completion_tokens", 8); err != nil {
		return nil, err
	}
	for _, m := range msgs {
		if body, err = sjson.SetBytes(body, "messages.-1", m); err != nil {
			return nil, err
		}
	}
	f := *d
	f.body = body
	return &f, nil
}
