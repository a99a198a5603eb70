package egress

import (
	"bytes"
	"io"
	"net/http"
	"strings"
)

// MinScrubbedKey is the shortest upstream API key Send scrubs from
// answers: a shorter one would match ordinary text.
const MinScrubbedKey = 8

// scrubbedKey replaces the upstream's key in its answers (identity.Redacted).
var scrubbedKey = []byte("REDACTED")

// scrubKey makes resp, the answer of a call authenticated with key, carry
// no copy of key: upstreams and the proxies before them echo the
// Authorization header in error messages ("you sent: Bearer sk-…"), which
// Molly relays to clients and records. Header values holding it are
// replaced, and the body is read through a keyScrubber. Keys shorter than
// MinScrubbedKey are left alone.
func scrubKey(resp *http.Response, key string) {
	if len(key) < MinScrubbedKey || resp == nil {
		return
	}
	for k, vs := range resp.Header {
		for i, v := range vs {
			if strings.Contains(v, key) {
				resp.Header[k][i] = strings.ReplaceAll(v, key, string(scrubbedKey))
			}
		}
	}
	if resp.Body != nil && resp.Body != http.NoBody {
		resp.Body = &keyScrubber{rc: resp.Body, key: []byte(key)}
	}
}

// keyScrubber reads rc with every occurrence of key replaced by
// scrubbedKey, including one split across reads. It holds back only the
// longest end of what it read that begins key (a stream's events, which
// end in blank lines, are passed on as they arrive) and releases it at
// the next read or at the end. The result is never longer than rc's bytes
// (len(key) ≥ len(scrubbedKey)).
type keyScrubber struct {
	rc   io.ReadCloser
	key  []byte
	buf  []byte
	out  []byte // scrubbed, ready
	held []byte // may begin key
	err  error
}

func (s *keyScrubber) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		if s.err != nil {
			if len(s.held) == 0 {
				return 0, s.err
			}
			s.out, s.held = s.held, nil
			break
		}
		if s.buf == nil {
			s.buf = make([]byte, 32<<10)
		}
		n, err := s.rc.Read(s.buf)
		s.err = err
		if n == 0 {
			continue
		}
		data := bytes.ReplaceAll(append(s.held, s.buf[:n]...), s.key, scrubbedKey)
		h := heldPrefix(data, s.key)
		s.out, s.held = data[:len(data)-h], bytes.Clone(data[len(data)-h:])
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	return n, nil
}

func (s *keyScrubber) Close() error { return s.rc.Close() }

// heldPrefix is the length of the longest end of data that is a proper
// prefix of key.
func heldPrefix(data, key []byte) int {
	for l := min(len(key)-1, len(data)); l > 0; l-- {
		if bytes.HasSuffix(data, key[:l]) {
			return l
		}
	}
	return 0
}

// The same scrubbing for a data plane that carries the answer itself
// (Envoy, through pipeline.Carried): the answer's header, a whole body and
// a streamed body, each without copies of the dispatch's target key.

// ScrubHeader replaces the target's key in h's values, in place.
func (d *Dispatch) ScrubHeader(h http.Header) {
	scrubKey(&http.Response{Header: h}, d.key())
}

// ScrubAnswer returns body with every copy of the target's key replaced.
func (d *Dispatch) ScrubAnswer(body []byte) []byte {
	if k := d.key(); len(k) >= MinScrubbedKey {
		return bytes.ReplaceAll(body, []byte(k), scrubbedKey)
	}
	return body
}

// ScrubReader reads rc with every copy of the target's key replaced,
// including one cut across reads (keyScrubber).
func (d *Dispatch) ScrubReader(rc io.ReadCloser) io.ReadCloser {
	if k := d.key(); len(k) >= MinScrubbedKey {
		return &keyScrubber{rc: rc, key: []byte(k)}
	}
	return rc
}

func (d *Dispatch) key() string {
	if u, ok := d.egress.clients[d.target.Name]; ok {
		return u.apiKey
	}
	return ""
}
