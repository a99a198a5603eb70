package identity

import (
	"net/http"
	"net/url"
	"strings"
)

// Redacted replaces a credential's value in logs (Caddy's word for it).
const Redacted = "REDACTED"

// credentialWords are the parts of header and query parameter names that
// carry credentials (lower case, "-" read as "_"): Authorization,
// Proxy-Authorization, X-Api-Key, Api-Key, X-Auth-Token, api_key, key,
// access_token, client_secret, password, Cookie, X-Amz-Signature, sig...
var credentialWords = []string{"auth", "key", "token", "secret", "passw", "credential", "session", "cookie", "signature", "bearer", "jwt"}

// credentialNames are whole names too short to match by part.
var credentialNames = map[string]bool{"sig": true, "pwd": true, "pass": true, "code": true}

// credentialPrefixes start values that are credentials whatever their name:
// HTTP authentication schemes (RFC 7235 §2.1) and common API key formats
// (OpenAI and Molly sk-, GitHub ghp_/gho_/github_pat_, Slack xox, AWS AKIA,
// Google AIza).
var credentialPrefixes = []string{"bearer ", "basic ", "digest ", "sk-", "ghp_", "gho_", "github_pat_", "xoxb-", "xoxp-", "akia", "aiza"}

// IsCredentialName reports whether a header or query parameter named name
// carries a credential, by the words in its name (case-insensitive).
func IsCredentialName(name string) bool {
	n := strings.ToLower(strings.ReplaceAll(name, "-", "_"))
	if credentialNames[n] {
		return true
	}
	for _, w := range credentialWords {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// IsCredentialValue reports whether a value looks like a credential
// whatever its name: an HTTP authentication scheme and its token, or a
// well-known API key format.
func IsCredentialValue(v string) bool {
	v = strings.ToLower(strings.TrimSpace(v))
	for _, p := range credentialPrefixes {
		if strings.HasPrefix(v, p) && len(v) > len(p)+4 {
			return true
		}
	}
	return false
}

// ScrubHeader returns a copy of h with the value of every credential
// header (by name or by value) replaced by Redacted; h itself is not
// changed. A header without credentials is returned as is.
func ScrubHeader(h http.Header) http.Header {
	var out http.Header
	for k, vs := range h {
		byName := IsCredentialName(k)
		for i, v := range vs {
			if !byName && !IsCredentialValue(v) {
				continue
			}
			if out == nil {
				out = h.Clone()
			}
			out[k][i] = Redacted
		}
	}
	if out == nil {
		return h
	}
	return out
}

// ScrubURI returns uri (a request URI: path and query) with the value of
// every credential query parameter (by name or by value) replaced by
// Redacted, and every path segment that is a credential value longer than
// MaxKeyHint bytes (a whole API key sent where a key's display prefix
// belongs, as in DELETE /molly/keys/<prefix>) replaced by its first
// MaxKeyHint bytes and Redacted. The rest of the query is kept byte for
// byte; an unparsable pair is kept only if it holds no "=" (a bare word).
func ScrubURI(uri string) string {
	path, query, ok := strings.Cut(uri, "?")
	path = scrubPath(path)
	if !ok || query == "" {
		if ok {
			return path + "?"
		}
		return path
	}
	parts := strings.Split(query, "&")
	changed := false
	for i, p := range parts {
		k, v, hasValue := strings.Cut(p, "=")
		name, err := url.QueryUnescape(k)
		if err != nil {
			name = k
		}
		value, err := url.QueryUnescape(v)
		if err != nil {
			value = v
		}
		if hasValue && (IsCredentialName(name) || IsCredentialValue(value)) || !hasValue && IsCredentialValue(name) {
			if hasValue {
				parts[i] = k + "=" + Redacted
			} else {
				parts[i] = Redacted
			}
			changed = true
		}
	}
	if !changed {
		return path + "?" + query
	}
	return path + "?" + strings.Join(parts, "&")
}

// MaxKeyHint is the longest start of a credential ScrubURI keeps in a
// path: a Molly key's display prefix ("sk-molly-" and 8 characters), which
// names a key without being one.
const MaxKeyHint = 17

// scrubPath is path with every segment that is (once unescaped) a
// credential value longer than MaxKeyHint cut to MaxKeyHint bytes and
// Redacted.
func scrubPath(path string) string {
	segs := strings.Split(path, "/")
	changed := false
	for i, s := range segs {
		v, err := url.PathUnescape(s)
		if err != nil {
			v = s
		}
		if len(v) > MaxKeyHint && IsCredentialValue(v) {
			segs[i] = v[:MaxKeyHint] + Redacted
			changed = true
		}
	}
	if !changed {
		return path
	}
	return strings.Join(segs, "/")
}
