// Package relay reads and writes the answers Molly passes on: server-sent
// event streams (one decoder and one encoder for every place a stream is
// read or rewritten), placeholder restoration in whole answers and in
// streams cut at arbitrary points, and the chunk rewrites OpenAI clients
// rely on.
package relay

import (
	"bufio"
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

// Decoder reads events from a stream. Lines end with LF, CRLF or a bare
// CR, a CRLF pair may be split across reads; "data:" with or without the
// space; several data lines make one multi-line data; unknown fields are
// ignored; a blank line dispatches the event (an event with no data
// field is not dispatched and its type is dropped, but its comments are
// kept for the next one). At the end of the stream an unterminated event
// is discarded, as the standard says.
type Decoder struct {
	r       *bufio.Reader
	lastCR  bool // the previous line ended with CR: a following LF belongs to it
	line    []byte
	pending Event
	hasData bool
}

// NewDecoder returns a decoder reading r.
func NewDecoder(r io.Reader) *Decoder {
	return &Decoder{r: bufio.NewReaderSize(r, 64<<10)}
}

// Buffered returns the bytes read from the source but not yet decoded.
func (d *Decoder) Buffered() int { return d.r.Buffered() }

// Next returns the next event. At the end of the stream it returns io.EOF
// (io.ErrUnexpectedEOF when it ended inside an event); a read error is
// returned as it is.
func (d *Decoder) Next() (Event, error) {
	for {
		line, err := d.readLine()
		if err != nil {
			if err == io.EOF && (d.hasData || len(d.line) > 0) {
				err = io.ErrUnexpectedEOF
			}
			return Event{}, err
		}
		if len(line) == 0 {
			if !d.hasData {
				d.pending.Type = "" // the standard empties the event type buffer too
				continue
			}
			ev := d.pending
			d.pending = Event{ID: ev.ID, HasID: ev.HasID}
			d.hasData = false
			if n := len(ev.Data); n > 0 && ev.Data[n-1] == '\n' {
				ev.Data = ev.Data[:n-1]
			}
			return ev, nil
		}
		if line[0] == ':' {
			d.pending.Comments = append(d.pending.Comments, string(bytes.TrimPrefix(line[1:], []byte(" "))))
			continue
		}
		name, value, found := bytes.Cut(line, []byte(":"))
		if found && len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
		switch string(name) {
		case "data":
			d.pending.Data = append(append(d.pending.Data, value...), '\n')
			d.hasData = true
		case "event":
			d.pending.Type = string(value)
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				d.pending.ID, d.pending.HasID = string(value), true
			}
		case "retry":
			if n, err := strconv.Atoi(string(value)); err == nil && n >= 0 {
				d.pending.Retry = n
			}
		}
	}
}

// readLine returns the next line without its terminator.
func (d *Decoder) readLine() ([]byte, error) {
	d.line = d.line[:0]
	for {
		b, err := d.r.ReadByte()
		if err != nil {
			return nil, err
		}
		if d.lastCR {
			d.lastCR = false
			if b == '\n' && len(d.line) == 0 {
				continue // the LF of a CRLF split across lines
			}
		}
		switch b {
		case '\n':
			return d.line, nil
		case '\r':
			d.lastCR = true
			return d.line, nil
		}
		if len(d.line) >= MaxLine {
			return nil, ErrLineTooLong
		}
		d.line = append(d.line, b)
	}
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
