package classify

import (
	"compress/gzip"
	"compress/zlib"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Body read limits when none is set: a whole body within a minute, and
// after a grace of 5 s at least 240 bytes per second, Kestrel's
// MinRequestBodyDataRate defaults (ASP.NET Core's KestrelServerLimits): a
// body trickled a byte every few seconds holds no connection for long.
const (
	DefaultBodyTimeout      = 60 * time.Second
	DefaultMinBodyRate      = 240
	DefaultMinBodyRateGrace = 5 * time.Second
)

// readBody reads r's body under the size limit, the total deadline and
// the minimum data rate, as read deadlines on the connection moved on
// with every read: start + grace + read/rate, never past start + timeout.
// A body too slow fails with os.ErrDeadlineExceeded. The deadline is
// cleared once the body is read, so the rest of the request (the upstream
// call) is not cut short by it.
//
// A body with Content-Encoding gzip (or x-gzip) or deflate (zlib, RFC 9110
// §8.4.1) is decoded, and the decoded body is held to the same size limit
// (a small body that inflates past it fails as one too large would, so a
// zip bomb costs at most the limit); the header is then removed. Any other
// encoding (br, zstd, a list of codings) fails with an
// *UnsupportedEncodingError before the body is read.
//
// A body whose Content-Length already exceeds the limit (the bytes as
// sent, which the limit bounds whatever their encoding) fails with
// *http.MaxBytesError before any of it is read: the client is not asked
// to send it (no 100 Continue to an Expect: 100-continue, RFC 9110
// §10.1.1) and is not left sending bytes that could only be refused.
func (c *Classify) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	enc := strings.ToLower(strings.TrimSpace(strings.Join(r.Header.Values("Content-Encoding"), ",")))
	switch enc {
	case "", "identity", "gzip", "x-gzip", "deflate":
	default:
		return nil, &UnsupportedEncodingError{Encoding: enc}
	}
	if r.ContentLength > c.MaxBodyBytes {
		// The body stays unread: the server closes the connection after
		// the answer rather than drain it.
		w.Header().Set("Connection", "close")
		return nil, &http.MaxBytesError{Limit: c.MaxBodyBytes}
	}
	body, err := c.readRaw(w, r, enc)
	if err == nil && enc != "" && enc != "identity" {
		r.Header.Del("Content-Encoding")
	}
	return body, err
}

// UnsupportedEncodingError is a request body's Content-Encoding that
// readBody does not decode.
type UnsupportedEncodingError struct{ Encoding string }

func (e *UnsupportedEncodingError) Error() string {
	return fmt.Sprintf("content encoding %q is not supported", e.Encoding)
}

// decoded is r (compressed bytes) decoded as enc, its output limited to
// limit bytes: past it a read fails with *http.MaxBytesError.
func decoded(r io.Reader, enc string, limit int64) (io.Reader, error) {
	var d io.Reader
	var err error
	switch enc {
	case "gzip", "x-gzip":
		d, err = gzip.NewReader(r)
	case "deflate":
		d, err = zlib.NewReader(r)
	default:
		return r, nil
	}
	if err != nil {
		return nil, &decodeError{enc: enc, err: err}
	}
	return &limitedReader{r: d, left: limit, limit: limit}, nil
}

// decodeError is a body that could not be decoded as its Content-Encoding
// says: "gzip: invalid header", "deflate: invalid header" (the decoder's
// own message, named by the client's encoding rather than the package's:
// compress/gzip's already names gzip, compress/zlib's says zlib).
type decodeError struct {
	enc string
	err error
}

func (e *decodeError) Error() string {
	msg := e.err.Error()
	for _, pkg := range []string{"gzip: ", "zlib: ", "flate: "} {
		msg = strings.TrimPrefix(msg, pkg)
	}
	return e.enc + ": " + msg
}

func (e *decodeError) Unwrap() error { return e.err }

// limitedReader fails with *http.MaxBytesError once more than limit bytes
// were read through it.
type limitedReader struct {
	r           io.Reader
	left, limit int64
}

func (l *limitedReader) Read(b []byte) (int, error) {
	if l.left < 0 {
		return 0, &http.MaxBytesError{Limit: l.limit}
	}
	if int64(len(b)) > l.left+1 {
		b = b[:l.left+1]
	}
	n, err := l.r.Read(b)
	l.left -= int64(n)
	if l.left < 0 {
		return n, &http.MaxBytesError{Limit: l.limit}
	}
	return n, err
}

// readRaw reads the body as sent, decoding enc, under the limits.
func (c *Classify) readRaw(w http.ResponseWriter, r *http.Request, enc string) ([]byte, error) {
	rd := http.MaxBytesReader(w, r.Body, c.MaxBodyBytes)
	rc := http.NewResponseController(w)
	start := time.Now()
	timeout, rate, grace := time.Duration(c.BodyTimeout), c.MinBodyRate, time.Duration(c.MinBodyRateGrace)
	deadline := func(read int64) time.Time {
		var d time.Time
		if timeout > 0 {
			d = start.Add(timeout)
		}
		if rate > 0 {
			m := start.Add(grace + time.Duration(float64(read)/float64(rate)*float64(time.Second)))
			if d.IsZero() || m.Before(d) {
				d = m
			}
		}
		return d
	}
	if err := rc.SetReadDeadline(deadline(0)); err != nil {
		// No deadlines on this connection (HTTP/3): the server's own timeouts apply.
		d, err := decoded(rd, enc, c.MaxBodyBytes)
		if err != nil {
			return nil, err
		}
		return readBody(d, r.ContentLength, c.MaxBodyBytes)
	}
	defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	p := &paced{r: rd, set: func(n int64) { _ = rc.SetReadDeadline(deadline(n)) }}
	d, err := decoded(p, enc, c.MaxBodyBytes)
	if err != nil {
		return nil, err
	}
	return readBody(d, r.ContentLength, c.MaxBodyBytes)
}

// paced moves the read deadline on after every read.
type paced struct {
	r   io.Reader
	n   int64
	set func(read int64)
}

func (p *paced) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.n += int64(n)
	if n > 0 {
		p.set(p.n)
	}
	return n, err
}
