// Package accesslog keeps credentials out of Caddy's logs: the log field
// filter caddy.logging.encoders.filter.molly_credentials replaces the
// value of every credential header (Authorization, X-Api-Key, Cookie, …,
// or any header whose value is a bearer token or an API key) and query
// parameter (api_key=, key=, access_token=, …) with REDACTED
// (identity.ScrubHeader, identity.ScrubURI), and the encoder
// caddy.logging.encoders.molly is Caddy's filter encoder with that filter
// on request>headers and request>uri already set:
//
//	log {
//		format molly        # or: format molly { wrap console }
//	}
//
// Caddy itself only hides Authorization, Proxy-Authorization, Cookie and
// Set-Cookie, and no query parameter.
package accesslog

import (
	"encoding/json"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/logging"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/molly-gateway/molly/router/identity"
)

func init() {
	caddy.RegisterModule(Credentials{})
	caddy.RegisterModule(Encoder{})
}

// Credentials is the log field filter molly_credentials. On a headers
// object (request>headers, resp_headers) it redacts credential headers;
// on a string (request>uri, uri) credential query parameters and path
// segments (identity.ScrubURI). Other fields pass unchanged.
type Credentials struct{}

// CaddyModule returns the Caddy module information.
func (Credentials) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "caddy.logging.encoders.filter.molly_credentials", New: func() caddy.Module { return new(Credentials) }}
}

// UnmarshalCaddyfile parses `molly_credentials` (no arguments).
func (Credentials) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// Filter redacts the credentials in one field.
func (Credentials) Filter(in zapcore.Field) zapcore.Field {
	switch v := in.Interface.(type) {
	case caddyhttp.LoggableHTTPHeader:
		v.Header = identity.ScrubHeader(v.Header)
		return zap.Object(in.Key, v)
	case http.Header:
		return zap.Object(in.Key, caddyhttp.LoggableHTTPHeader{Header: identity.ScrubHeader(v)})
	}
	if in.Type == zapcore.StringType {
		in.String = identity.ScrubURI(in.String)
	}
	return in
}

// Encoder is the log encoder molly: Caddy's filter encoder (wrap defaults
// to JSON, or console on a terminal) with molly_credentials on the
// request's headers and URI, and on the response's headers. Fields set in
// its own config (Caddy's filter syntax) are added to those.
type Encoder struct {
	logging.FilterEncoder
}

// CaddyModule returns the Caddy module information.
func (Encoder) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "caddy.logging.encoders.molly", New: func() caddy.Module { return new(Encoder) }}
}

// CredentialFields are the fields Encoder filters with molly_credentials:
// an access log's request headers and URI and response headers, and the
// URI of the admin endpoint's "received request" lines (admin.api's uri).
var CredentialFields = []string{"request>headers", "request>uri", "resp_headers", "uri"}

// Provision adds the credential filters and provisions the filter encoder.
func (e *Encoder) Provision(ctx caddy.Context) error {
	if e.FieldsRaw == nil {
		e.FieldsRaw = map[string]json.RawMessage{}
	}
	for _, f := range CredentialFields {
		if _, set := e.FieldsRaw[f]; !set {
			e.FieldsRaw[f] = json.RawMessage(`{"filter":"molly_credentials"}`)
		}
	}
	return e.FilterEncoder.Provision(ctx)
}

// UnmarshalCaddyfile parses `molly` with the filter encoder's optional block.
func (e *Encoder) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return e.FilterEncoder.UnmarshalCaddyfile(d)
}

// Interface guards.
var (
	_ logging.LogFieldFilter = Credentials{}
	_ caddyfile.Unmarshaler  = (*Credentials)(nil)
	_ caddy.Provisioner      = (*Encoder)(nil)
	_ zapcore.Encoder        = (*Encoder)(nil)
	_ caddyfile.Unmarshaler  = (*Encoder)(nil)
)
