// Package classify is the Caddy handler http.handlers.molly_classify: it
// reads the request body once, validates it and attaches the router
// annotation (capability and sovereignty profile) to the request context.
package classify

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/molly-gateway/molly/api"
	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router"
)

// DefaultMaxBodyBytes is the request body limit when none is set (8 MiB).
const DefaultMaxBodyBytes = 8 << 20

// Classify is the molly_classify handler.
type Classify struct {
	// MaxBodyBytes bounds the request body; larger bodies get 413. Default 8 MiB.
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty"`
	// PhoneRegion is the default region for phone numbers without a country
	// code (ISO 3166-1 alpha-2, default "US").
	PhoneRegion string `json:"phone_region,omitempty"`
	// Entities restricts detection to these entity types; empty means all.
	Entities []string `json:"entities,omitempty"`
	// Sensitivity maps an entity type to the class its presence implies,
	// overriding router.DefaultEntityClasses (e.g. {"EMAIL": "public"}).
	Sensitivity map[string]string `json:"sensitivity,omitempty"`

	classifier *router.Classifier
}

func init() { caddy.RegisterModule(Classify{}) }

// CaddyModule returns the Caddy module information.
func (Classify) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.molly_classify", New: func() caddy.Module { return new(Classify) }}
}

// Provision builds the scanner and classifier.
func (c *Classify) Provision(caddy.Context) error {
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	scanner, err := redaction.NewScanner(redaction.Config{DefaultRegion: c.PhoneRegion, Types: c.Entities})
	if err != nil {
		return fmt.Errorf("molly_classify: %w", err)
	}
	overrides := map[string]router.Sensitivity{}
	for typ, class := range c.Sensitivity {
		s, err := router.ParseSensitivity(class)
		if err != nil {
			return fmt.Errorf("molly_classify: sensitivity %s: %w", typ, err)
		}
		overrides[typ] = s
	}
	c.classifier = router.NewClassifier(scanner, overrides)
	return nil
}

// Validate rejects a negative body limit.
func (c *Classify) Validate() error {
	if c.MaxBodyBytes < 0 {
		return fmt.Errorf("molly_classify: max_body_bytes must be positive")
	}
	return nil
}

// ServeHTTP classifies the request and calls next with the annotation in
// the context; bad requests are answered with OpenAI errors.
func (c *Classify) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	ep, aerr := router.EndpointOf(r.Method, r.URL.Path)
	if aerr != nil {
		aerr.Write(w)
		return nil
	}
	var body []byte
	if ep != router.EndpointModels && r.Body != nil {
		var err error
		body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, c.MaxBodyBytes))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				(&api.Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
					Message: fmt.Sprintf("The request body is larger than the limit of %d bytes.", c.MaxBodyBytes)}).Write(w)
				return nil
			}
			return caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("reading request body: %w", err))
		}
	}
	ann, err := c.classifier.Classify(ep, body, r.Header.Get("X-Molly-Sensitivity"), r.Header.Get("X-Molly-Residency"))
	if err != nil {
		api.WriteError(w, err)
		return nil
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r = r.WithContext(router.WithAnnotation(r.Context(), ann))
	return next.ServeHTTP(w, r)
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Classify)(nil)
	_ caddy.Validator             = (*Classify)(nil)
	_ caddyhttp.MiddlewareHandler = (*Classify)(nil)
)
