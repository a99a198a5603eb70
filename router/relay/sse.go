// Package relay reads and writes the answers Molly passes on: server-sent
// event streams (one decoder and one encoder for every place a stream is
// read or rewritten), placeholder restoration in whole answers and in
// streams cut at arbitrary points, and the chunk rewrites OpenAI clients
// rely on.
package relay

import (
	"bytes"
	"errors"
	"io"
	"strconv"
)

// Event is one server-sent event as the WHATWG HTML standard's event
// stream interpretation defines it (§9.2.6 "Interpreting an event
// stream"): the "event" field (Type, "" for the default "message"), the
// "data" lines joined with LF (Data), the last "id" (ID, HasID) and
// "retry" (Retry, milliseconds, 0 when absent) fields, and the comment
// lines seen since the previous event (Comments, without the leading ':').
type Event struct {
	Type     string
	Data     []byte
	ID       string
	HasID    bool
	Retry    int
	Comments []string
}

// IsDone reports the OpenAI stream terminator "data: [DONE]".
func (e Event) IsDone() bool { return bytes.Equal(e.Data, []byte("[DONE]")) }

// MaxLine bounds one line of an event stream (8 MiB); a longer line is a
// decoding error, so a stream without line ends cannot exhaust memory.
const MaxLine = 8 << 20

// ErrLineTooLong is returned for a line over MaxLine bytes.
var ErrLineTooLong = errors.New("event stream line over the length limit")

// Parser is the event-stream decoder: bytes in, as they arrive (in any
// pieces), events out. Lines end with LF, CRLF or a bare CR, and a CRLF
// pair may be split across writes; "data:" with or without the space;
// several data lines make one multi-line data; unknown fields are ignored;
// a blank line dispatches the event (an event with no data field is not
// dispatched and its type is dropped, but its comments are kept for the
// next one); a line over MaxLine bytes is an error. Decoder reads a stream
// through one; a writer that is handed a stream (a response translated on
// its way out) feeds one directly. The zero value is ready.
type Parser struct {
	lastCR  bool // the previous line ended with CR: a following LF belongs to it
	line    []byte
	pending Event
	hasData bool
}

// Write parses b and calls emit with each event dispatched, in order. It
// returns emit's first error, or ErrLineTooLong; the parser keeps what
// follows an unterminated line for the next Write.
func (p *Parser) Write(b []byte, emit func(Event) error) error {
	for len(b) > 0 {
		if p.lastCR {
			p.lastCR = false
			if b[0] == '\n' && len(p.line) == 0 {
				b = b[1:] // the LF of a CRLF split across writes
				continue
			}
		}
		i := bytes.IndexAny(b, "\r\n")
		if i < 0 {
			if len(p.line)+len(b) > MaxLine {
				return ErrLineTooLong
			}
			p.line = append(p.line, b...)
			return nil
		}
		if len(p.line)+i > MaxLine {
			return ErrLineTooLong
		}
		p.line = append(p.line, b[:i]...)
		p.lastCR = b[i] == '\r'
		b = b[i+1:]
		ev, ok := p.endLine()
		p.line = p.line[:0]
		if ok {
			if err := emit(ev); err != nil {
				return err
			}
		}
	}
	return nil
}

// End reports how the stream ended: io.EOF after a whole event, or
// io.ErrUnexpectedEOF when it ended inside an event or a line, which is
// discarded, as the standard says.
func (p *Parser) End() error {
	if p.hasData || len(p.line) > 0 {
		return io.ErrUnexpectedEOF
	}
	return io.EOF
}

// endLine interprets the complete line p.line; ok when it dispatches ev.
func (p *Parser) endLine() (ev Event, ok bool) {
	line := p.line
	if len(line) == 0 {
		if !p.hasData {
			p.pending.Type = "" // the standard empties the event type buffer too
			return Event{}, false
		}
		ev = p.pending
		p.pending = Event{ID: ev.ID, HasID: ev.HasID}
		p.hasData = false
		if n := len(ev.Data); n > 0 && ev.Data[n-1] == '\n' {
			ev.Data = ev.Data[:n-1]
		}
		return ev, true
	}
	if line[0] == ':' {
		p.pending.Comments = append(p.pending.Comments, string(bytes.TrimPrefix(line[1:], []byte(" "))))
		return Event{}, false
	}
	name, value, found := bytes.Cut(line, []byte(":"))
	if found && len(value) > 0 && value[0] == ' ' {
		value = value[1:]
	}
	switch string(name) {
	case "data":
		p.pending.Data = append(append(p.pending.Data, value...), '\n')
		p.hasData = true
	case "event":
		p.pending.Type = string(value)
	case "id":
		if bytes.IndexByte(value, 0) < 0 {
			p.pending.ID, p.pending.HasID = string(value), true
		}
	case "retry":
		if n, err := strconv.Atoi(string(value)); err == nil && n >= 0 {
			p.pending.Retry = n
		}
	}
	return Event{}, false
}

// Decoder reads events from a stream with a Parser. At the end of the
// stream an unterminated event is discarded.
type Decoder struct {
	r      io.Reader
	p      Parser
	buf    []byte
	queue  []Event // parsed, not yet returned
	err    error   // the read error or end, once seen
	failed error   // a parse error: the stream is unusable from here
}

// NewDecoder returns a decoder reading r.
func NewDecoder(r io.Reader) *Decoder {
	return &Decoder{r: r, buf: make([]byte, 32<<10)}
}

// Next returns the next event. At the end of the stream it returns io.EOF
// (io.ErrUnexpectedEOF when it ended inside an event), ErrLineTooLong for
// a line over MaxLine; a read error is returned as it is.
func (d *Decoder) Next() (Event, error) {
	for len(d.queue) == 0 {
		if d.failed != nil {
			return Event{}, d.failed
		}
		if d.err != nil {
			if d.err == io.EOF {
				return Event{}, d.p.End()
			}
			return Event{}, d.err
		}
		n, err := d.r.Read(d.buf)
		if n > 0 {
			if perr := d.p.Write(d.buf[:n], func(ev Event) error { d.queue = append(d.queue, ev); return nil }); perr != nil {
				d.failed = perr
			}
		}
		if err != nil {
			d.err = err
		}
	}
	ev := d.queue[0]
	d.queue = d.queue[1:]
	return ev, nil
}

// AppendEvent appends the encoding of ev to dst: "event:" when Type is set
// and not "message", one "data:" line per line of Data, "id:" and
// "retry:" only when keep is true, comments first when keep is true, and
// the blank line. LF line ends throughout.
func AppendEvent(dst []byte, ev Event, keep bool) []byte {
	if keep {
		for _, c := range ev.Comments {
			dst = append(append(append(dst, ": "...), c...), '\n')
		}
	}
	if ev.Type != "" && ev.Type != "message" {
		dst = append(append(append(dst, "event: "...), ev.Type...), '\n')
	}
	if keep && ev.HasID {
		dst = append(append(append(dst, "id: "...), ev.ID...), '\n')
	}
	if keep && ev.Retry > 0 {
		dst = append(append(dst, "retry: "...), strconv.Itoa(ev.Retry)+"\n"...)
	}
	for line := range bytes.SplitSeq(ev.Data, []byte("\n")) {
		dst = append(append(append(dst, "data: "...), line...), '\n')
	}
	return append(dst, '\n')
}

// AppendData appends a single-line "data: <data>\n\n" event.
func AppendData(dst, data []byte) []byte {
	return AppendEvent(dst, Event{Data: data}, false)
}

// AppendComment appends a comment line ": <text>\n\n" (a keep-alive, or a
// progress note clients ignore).
func AppendComment(dst []byte, text string) []byte {
	return append(append(append(dst, ": "...), text...), "\n\n"...)
}
