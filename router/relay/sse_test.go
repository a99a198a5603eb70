package relay

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

// decodeAll reads every event of stream, and the error that ended it.
func decodeAll(r io.Reader) ([]Event, error) {
	d := NewDecoder(r)
	var out []Event
	for {
		ev, err := d.Next()
		if err != nil {
			return out, err
		}
		out = append(out, ev)
	}
}

func data(s string) Event { return Event{Data: []byte(s)} }

func TestDecoder(t *testing.T) {
	tests := []struct {
		name   string
		stream string
		want   []Event
		err    error
	}{
		{"LF line ends", "data: a\n\ndata: b\n\n", []Event{data("a"), data("b")}, io.EOF},
		{"CRLF line ends", "data: a\r\n\r\ndata: b\r\n\r\n", []Event{data("a"), data("b")}, io.EOF},
		{"bare CR line ends", "data: a\r\rdata: b\r\r", []Event{data("a"), data("b")}, io.EOF},
		{"mixed line ends", "data: a\r\n\ndata: b\r\r\ndata: c\n\r\n", []Event{data("a"), data("b"), data("c")}, io.EOF},
		{"several data lines are one multi-line data", "data: a\ndata: b\ndata:\n\n", []Event{data("a\nb\n")}, io.EOF},
		{"data without the space, and only one space removed", "data:x\n\ndata:  y\n\n", []Event{data("x"), data(" y")}, io.EOF},
		{"a field without a colon is a field name with an empty value", "data\n\n", []Event{data("")}, io.EOF},
		{"comments are kept for the next dispatched event", ": keep-alive\n\n:no space\ndata: a\n\n",
			[]Event{{Data: []byte("a"), Comments: []string{"keep-alive", "no space"}}}, io.EOF},
		{"the event type", "event: error\ndata: {}\n\ndata: x\n\n", []Event{{Type: "error", Data: []byte("{}")}, data("x")}, io.EOF},
		{"the last event id persists to later events", "id: 7\ndata: a\n\ndata: b\n\nid\ndata: c\n\n",
			[]Event{{ID: "7", HasID: true, Data: []byte("a")}, {ID: "7", HasID: true, Data: []byte("b")}, {ID: "", HasID: true, Data: []byte("c")}}, io.EOF},
		{"an id holding NUL is ignored", "id: a\x00b\ndata: a\n\n", []Event{data("a")}, io.EOF},
		{"retry in milliseconds; a value that is no number is ignored", "retry: 3000\ndata: a\n\nretry: soon\ndata: b\n\n",
			[]Event{{Retry: 3000, Data: []byte("a")}, data("b")}, io.EOF},
		{"unknown fields are ignored", "foo: bar\ndata: a\n\n", []Event{data("a")}, io.EOF},
		{"an event without data is not dispatched, and its type does not carry over", "event: ping\n\ndata: a\n\n", []Event{data("a")}, io.EOF},
		{"the OpenAI terminator", "data: {\"x\":1}\n\ndata: [DONE]\n\n", []Event{data(`{"x":1}`), data("[DONE]")}, io.EOF},
		{"a stream that ends inside an event discards it", "data: a\n\ndata: b\n", []Event{data("a")}, io.ErrUnexpectedEOF},
		{"a stream that ends inside a line discards it", "data: a\n\ndata: b", []Event{data("a")}, io.ErrUnexpectedEOF},
		{"an empty stream", "", nil, io.EOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, r := range []struct {
				name string
				r    io.Reader
			}{{"whole", strings.NewReader(tt.stream)}, {"one byte per read", iotest.OneByteReader(strings.NewReader(tt.stream))}} {
				got, err := decodeAll(r.r)
				if !errors.Is(err, tt.err) || !sameEvents(got, tt.want) {
					t.Fatalf("%s: events %+v, %v\nwant %+v, %v", r.name, got, err, tt.want, tt.err)
				}
			}
		})
	}
}

func sameEvents(a, b []Event) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Type != b[i].Type || !bytes.Equal(a[i].Data, b[i].Data) || a[i].ID != b[i].ID || a[i].HasID != b[i].HasID ||
			a[i].Retry != b[i].Retry || !reflect.DeepEqual(a[i].Comments, b[i].Comments) {
			return false
		}
	}
	return true
}

// splitReader returns its chunks one per Read, as a network would.
type splitReader struct{ chunks []string }

func (s *splitReader) Read(p []byte) (int, error) {
	if len(s.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.chunks[0])
	s.chunks[0] = s.chunks[0][n:]
	if s.chunks[0] == "" {
		s.chunks = s.chunks[1:]
	}
	return n, nil
}

func TestDecoderJoinsACRLFSplitAcrossReads(t *testing.T) {
	// The CR ends the line; the LF arriving in the next read belongs to it,
	// not to a blank line that would dispatch an event early.
	r := &splitReader{chunks: []string{"data: a\r", "\ndata: b\r", "\n\r", "\n"}}
	got, err := decodeAll(r)
	if err != io.EOF || !sameEvents(got, []Event{data("a\nb")}) {
		t.Fatalf("events %+v, %v; want one event a\\nb", got, err)
	}
}

func TestDecoderBoundsALine(t *testing.T) {
	long := "data: " + strings.Repeat("x", MaxLine) + "\n\n"
	_, err := decodeAll(strings.NewReader(long))
	if !errors.Is(err, ErrLineTooLong) {
		t.Fatalf("err = %v, want ErrLineTooLong", err)
	}
	ok := "data: " + strings.Repeat("x", MaxLine-len("data: ")) + "\n\n"
	if got, err := decodeAll(strings.NewReader(ok)); err != io.EOF || len(got) != 1 || len(got[0].Data) != MaxLine-len("data: ") {
		t.Fatalf("a line of exactly MaxLine bytes: %d events, %v", len(got), err)
	}
}

func TestIsDone(t *testing.T) {
	if !data("[DONE]").IsDone() || data("[DONE] ").IsDone() || data(`{"done":true}`).IsDone() {
		t.Fatal("IsDone does not match exactly data: [DONE]")
	}
}

func TestAppendEvent(t *testing.T) {
	ev := Event{Type: "error", Data: []byte("a\nb"), ID: "7", HasID: true, Retry: 1500, Comments: []string{"note"}}
	if got, want := string(AppendEvent(nil, ev, true)), ": note\nevent: error\nid: 7\nretry: 1500\ndata: a\ndata: b\n\n"; got != want {
		t.Fatalf("keep: %q, want %q", got, want)
	}
	if got, want := string(AppendEvent(nil, ev, false)), "event: error\ndata: a\ndata: b\n\n"; got != want {
		t.Fatalf("without keep: %q, want %q", got, want)
	}
	if got, want := string(AppendEvent([]byte("x"), Event{Type: "message", Data: []byte("m")}, false)), "xdata: m\n\n"; got != want {
		t.Fatalf("message type: %q, want %q", got, want)
	}
	if got := string(AppendData(nil, []byte("[DONE]"))); got != "data: [DONE]\n\n" {
		t.Fatalf("AppendData = %q", got)
	}
	if got := string(AppendComment(nil, "keep-alive")); got != ": keep-alive\n\n" {
		t.Fatalf("AppendComment = %q", got)
	}
	t.Run("what is encoded decodes to the same event", func(t *testing.T) {
		got, err := decodeAll(bytes.NewReader(AppendEvent(nil, ev, true)))
		if err != io.EOF || !sameEvents(got, []Event{ev}) {
			t.Fatalf("round trip %+v, %v", got, err)
		}
	})
}

func TestParserFedInAnyPiecesDecodesTheSame(t *testing.T) {
	stream := "data: a\r\n\r\n: note\revent: x\rdata: b\r\rid: 3\ndata:c\ndata: d\n\n"
	want, _ := decodeAll(strings.NewReader(stream))
	if len(want) != 3 {
		t.Fatalf("%d events from the whole stream", len(want))
	}
	for cut := 0; cut <= len(stream); cut++ {
		var p Parser
		var got []Event
		collect := func(ev Event) error { got = append(got, ev); return nil }
		if err := p.Write([]byte(stream[:cut]), collect); err != nil {
			t.Fatal(err)
		}
		if err := p.Write([]byte(stream[cut:]), collect); err != nil {
			t.Fatal(err)
		}
		if !sameEvents(got, want) || p.End() != io.EOF {
			t.Fatalf("cut at %d: %+v, want %+v", cut, got, want)
		}
	}
}
