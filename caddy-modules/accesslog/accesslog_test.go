package accesslog

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// TestTheEncoderWritesAccessLogsWithoutCredentials encodes an access log
// entry as Caddy's server writes it (the request as LoggableHTTPRequest)
// through the molly encoder: no credential reaches the output, the rest does.
func TestTheEncoderWritesAccessLogsWithoutCredentials(t *testing.T) {
	ctx, err := caddy.ProvisionContext(&caddy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	enc := &Encoder{}
	if err := enc.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("POST", "/v1/chat/completions?api_key=sk-query-0123456789&key=AIzaQuery0123&stream=true", nil)
	r.Header.Set("Authorization", "Bearer sk-molly-header0123456789")
	r.Header.Set("X-Api-Key", "xapikey-0123456789")
	r.Header.Set("Api-Key", "apikey-0123456789")
	r.Header.Set("X-Forwarded-Secret", "fwd-0123456789")
	r.Header.Set("X-Trace", "sk-proj-valueonly0123456789")
	r.Header.Set("User-Agent", "openai-python/1.0")
	buf, err := enc.EncodeEntry(zapcore.Entry{Time: time.Now(), Message: "handled request"}, []zapcore.Field{
		zap.Object("request", caddyhttp.LoggableHTTPRequest{Request: r}),
		zap.Int("status", 200),
	})
	if err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, secret := range []string{"sk-query-0123456789", "AIzaQuery0123", "sk-molly-header0123456789", "xapikey-0123456789", "apikey-0123456789", "fwd-0123456789", "valueonly0123456789"} {
		if strings.Contains(out, secret) {
			t.Errorf("the log line holds %s:\n%s", secret, out)
		}
	}
	for _, kept := range []string{`"uri":"/v1/chat/completions?api_key=REDACTED&key=REDACTED&stream=true"`, `"X-Api-Key":["REDACTED"]`, "openai-python/1.0", `"status":200`} {
		if !strings.Contains(out, kept) {
			t.Errorf("the log line lacks %s:\n%s", kept, out)
		}
	}
}
