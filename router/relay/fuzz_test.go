package relay

import (
	"testing"

	"github.com/tidwall/gjson"
)

// FuzzStreamNormalise feeds any bytes, cut anywhere, through the parser
// and every JSON event through Stream.Chunk: nothing panics, every chunk
// that comes out is JSON, and the last chunk is JSON with the merged usage.
func FuzzStreamNormalise(f *testing.F) {
	for _, c := range providerStream {
		f.Add([]byte("data: "+c+"\r\n\r\n"), 7)
	}
	f.Add([]byte("event: ping\ndata: {\"type\":\"ping\"}\n\n: x\rdata: [DONE]\r\r"), 3)
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":\"x\",\"id\":5}]},\"finish_reason\":7}],\"usage\":[1]}\n\n"), 10)
	f.Fuzz(func(t *testing.T, stream []byte, cut int) {
		var p Parser
		s := NewStream(chatAnswer(true))
		emit := func(ev Event) error {
			if !gjson.ValidBytes(ev.Data) || ev.IsDone() {
				return nil
			}
			if out := s.Chunk(ev.Data); out != nil && !gjson.ValidBytes(out) {
				t.Fatalf("chunk %q became %q", ev.Data, out)
			}
			return nil
		}
		if cut < 0 || cut > len(stream) {
			cut = len(stream) / 2
		}
		_ = p.Write(stream[:cut], emit)
		_ = p.Write(stream[cut:], emit)
		if fin := s.Final(1, 1); !gjson.ValidBytes(fin) || gjson.GetBytes(fin, "choices.#").Int() != 0 {
			t.Fatalf("final chunk %q", fin)
		}
	})
}
