package classify

import (
	"io"
	"net/http"
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
func (c *Classify) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
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
		return readBody(rd, r.ContentLength, c.MaxBodyBytes)
	}
	defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	p := &paced{r: rd, set: func(n int64) { _ = rc.SetReadDeadline(deadline(n)) }}
	return readBody(p, r.ContentLength, c.MaxBodyBytes)
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
