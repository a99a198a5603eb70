package progress

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestBarFitsTheTerminal: the rendered line for fixed states and widths,
// written out by hand, and never wider than the terminal.
func TestBarFitsTheTerminal(t *testing.T) {
	half := State{Name: "demo model", Done: 5 << 20, Total: 10 << 20, Unit: Bytes, Elapsed: 1500 * time.Millisecond}
	for _, c := range []struct {
		name  string
		s     State
		width int
		want  string
	}{
		{"half way on 80 columns: a 30-column bar", half, 80,
			"demo model [###############...............]  50% 5.0/10.0 MiB 1.5s"},
		{"on 50 columns the bar takes the 14 columns left", half, 50,
			"demo model [#######.......]  50% 5.0/10.0 MiB 1.5s"},
		{"a note goes after when it fits", State{Name: "adapters", Done: 3, Total: 4, Unit: Items, Note: "legal.gguf"}, 80,
			"adapters [######################........]  75% 3/4 0.0s legal.gguf"},
		{"no total: no bar, what is done and the time", State{Name: "quantize", Done: 2048, Unit: Bytes, Elapsed: 2 * time.Second}, 80,
			"quantize 2.0 KiB 2.0s"},
		{"over the total is a full bar, 20 columns on 40", State{Name: "x", Done: 12, Total: 10, Unit: Items}, 40,
			"x [####################] 100% 12/10 0.0s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Bar(c.s, c.width); got != c.want {
				t.Fatalf("Bar(%+v, %d)\n got %q\nwant %q", c.s, c.width, got, c.want)
			}
		})
	}
	for w := 0; w <= 120; w++ {
		if got := Bar(half, w); len(got) > w {
			t.Fatalf("width %d: %d columns: %q", w, len(got), got)
		}
	}
}

// screen is a one-line terminal: it applies carriage returns and CSI K
// (erase to the end of the line) as a terminal does, and keeps finished
// lines.
type screen struct {
	lines []string
	cur   []byte
	col   int
}

func (s *screen) write(b []byte) {
	for i := 0; i < len(b); i++ {
		switch {
		case b[i] == '\r':
			s.col = 0
		case b[i] == '\n':
			s.lines = append(s.lines, string(s.cur))
			s.cur, s.col = nil, 0
		case b[i] == 0x1b && i+2 < len(b) && b[i+1] == '[' && b[i+2] == 'K':
			s.cur = s.cur[:s.col]
			i += 2
		default:
			if s.col < len(s.cur) {
				s.cur[s.col] = b[i]
			} else {
				s.cur = append(s.cur, b[i])
			}
			s.col++
		}
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// TestTerminalRedrawsOneLine: on a terminal the task is one line redrawn
// in place, ending as the full bar and a newline.
func TestTerminalRedrawsOneLine(t *testing.T) {
	var out syncBuf
	on := true
	clock := time.Unix(1000, 0)
	r := New(&out, Options{Terminal: &on, Width: 60, Redraw: time.Millisecond, Now: func() time.Time { return clock }})
	task := r.Start("writing", 100, Items)
	for i := int64(1); i <= 40; i++ {
		task.Set(i, "")
	}
	task.Done()
	var sc screen
	sc.write(out.b.Bytes())
	want := Bar(State{Name: "writing", Done: 100, Total: 100, Unit: Items}, 60)
	if len(sc.lines) != 1 || sc.lines[0] != want || len(sc.cur) != 0 {
		t.Fatalf("screen %q (then %q), want the one line %q", sc.lines, sc.cur, want)
	}
	if !strings.HasSuffix(sc.lines[0], "] 100% 100/100 0.0s") {
		t.Fatalf("final line %q", sc.lines[0])
	}
}

// TestLinesWhenNotATerminal: to a file or pipe every line is a JSON
// object: start first, end (100%) last, done never going back.
func TestLinesWhenNotATerminal(t *testing.T) {
	var out syncBuf
	off := false
	r := New(&out, Options{Terminal: &off, Every: time.Millisecond})
	task := r.Start("demo model", 1000, Bytes)
	for i := int64(0); i <= 1000; i += 10 {
		task.Set(i, "molly-demo.gguf")
	}
	task.Done()
	failed := r.Start("quantize", 0, Bytes)
	failed.Fail(errors.New("llama_model_quantize failed"))
	var lines []Line
	for _, l := range strings.Split(strings.TrimSpace(out.b.String()), "\n") {
		var pl Line
		if err := json.Unmarshal([]byte(l), &pl); err != nil {
			t.Fatalf("not a JSON line: %q", l)
		}
		lines = append(lines, pl)
	}
	var demo []Line
	for _, l := range lines {
		if l.Task == "demo model" {
			demo = append(demo, l)
		}
	}
	first, last := demo[0], demo[len(demo)-1]
	if first.Event != "start" || first.Done != 0 || last.Event != "end" || last.Done != 1000 || last.Percent == nil || *last.Percent != 100 || last.Unit != Bytes {
		t.Fatalf("first %+v last %+v", first, last)
	}
	for i := 1; i < len(demo); i++ {
		if demo[i].Done < demo[i-1].Done {
			t.Fatalf("done went back: %+v then %+v", demo[i-1], demo[i])
		}
	}
	end := lines[len(lines)-1]
	if end.Task != "quantize" || end.Event != "failed: llama_model_quantize failed" || end.Percent != nil {
		t.Fatalf("failed task's last line %+v", end)
	}
}
