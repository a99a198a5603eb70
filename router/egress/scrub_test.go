package egress

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// chunkReader returns its chunks one Read at a time.
type chunkReader struct{ chunks []string }

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.chunks[0])
	c.chunks[0] = c.chunks[0][n:]
	if c.chunks[0] == "" {
		c.chunks = c.chunks[1:]
	}
	return n, nil
}

func (c *chunkReader) Close() error { return nil }

// TestKeyScrubberReplacesTheKeyAcrossEverySplit: a body holding the key
// twice (and a near miss), cut into two reads at every offset and into
// one-byte reads, reads as strings.ReplaceAll of it.
func TestKeyScrubberReplacesTheKeyAcrossEverySplit(t *testing.T) {
	const key = "sk-proj-0123456789abcdef"
	body := `{"error":{"message":"Bearer ` + key + ` is wrong; sk-proj-0123 is not it; ` + key + `"}}`
	want := strings.ReplaceAll(body, key, "REDACTED")
	read := func(chunks []string) string {
		b, err := io.ReadAll(&keyScrubber{rc: &chunkReader{chunks: chunks}, key: []byte(key)})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for i := 0; i <= len(body); i++ {
		if got := read([]string{body[:i], body[i:]}); got != want {
			t.Fatalf("split at %d: %s", i, got)
		}
	}
	var bytesOf []string
	for i := range body {
		bytesOf = append(bytesOf, body[i:i+1])
	}
	if got := read(bytesOf); got != want {
		t.Fatalf("one byte a read: %s", got)
	}
}

// TestKeyScrubberPassesAStreamEventOnAtOnce: an SSE event, which ends in a
// blank line, is returned whole by the Read that received it; only an end
// that begins the key waits for the next read.
func TestKeyScrubberPassesAStreamEventOnAtOnce(t *testing.T) {
	const key = "sk-upstream-secret"
	s := &keyScrubber{rc: &chunkReader{chunks: []string{"data: {\"a\":1}\n\n", "data: sk-up", "stream-secret\n\n"}}, key: []byte(key)}
	p := make([]byte, 100)
	n, _ := s.Read(p)
	if got := string(p[:n]); got != "data: {\"a\":1}\n\n" {
		t.Fatalf("first read %q", got)
	}
	n, _ = s.Read(p)
	if got := string(p[:n]); got != "data: " {
		t.Fatalf("second read %q, want the part before what may begin the key", got)
	}
	rest, _ := io.ReadAll(s)
	if string(rest) != "REDACTED\n\n" {
		t.Fatalf("rest %q", rest)
	}
}

// TestScrubKeyLeavesShortKeysAndScrubsHeaders: headers holding the key are
// replaced; a key under MinScrubbedKey bytes changes nothing.
func TestScrubKeyLeavesShortKeysAndScrubsHeaders(t *testing.T) {
	resp := &http.Response{Header: http.Header{"X-Echo": {"Bearer sk-0123456789"}}, Body: io.NopCloser(strings.NewReader("sk-0123456789"))}
	scrubKey(resp, "sk-0123456789")
	b, _ := io.ReadAll(resp.Body)
	if resp.Header.Get("X-Echo") != "Bearer REDACTED" || string(b) != "REDACTED" {
		t.Fatalf("header %q body %q", resp.Header.Get("X-Echo"), b)
	}
	resp = &http.Response{Header: http.Header{}, Body: io.NopCloser(strings.NewReader("abc abc"))}
	scrubKey(resp, "abc")
	if b, _ := io.ReadAll(resp.Body); !bytes.Equal(b, []byte("abc abc")) {
		t.Fatalf("a 3-byte key scrubbed: %q", b)
	}
}
