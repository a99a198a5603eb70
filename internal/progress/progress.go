// Package progress reports long work — model generation, quantization,
// adapter training, first-run preparation — as a bar redrawn in place on a
// terminal, or as periodic structured lines (one JSON object per line)
// when the output is a file or a pipe, so logs and CI keep a record.
//
// A Task is safe for concurrent use: work calls Add or Set from any
// goroutine; a ticker draws. Rendering is a pure function (Bar) of the
// task's state and the terminal width, tested against fixed widths.
package progress

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"
)

// Unit says how Done and Total are printed.
type Unit string

// Units.
const (
	Bytes Unit = "bytes" // 1.5 MiB
	Items Unit = "items" // 3/5
)

// Options configure a Reporter; the zero value detects everything.
type Options struct {
	// Terminal forces the bar (true) or the lines (false); nil detects
	// whether the writer is a terminal.
	Terminal *bool
	// Width is the terminal width in columns; 0 asks the terminal (80 when
	// it cannot say).
	Width int
	// Redraw is how often the bar is redrawn (default 100ms); Every how
	// often a line is written when not on a terminal (default 2s).
	Redraw, Every time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Reporter writes the progress of tasks to one writer.
type Reporter struct {
	w        io.Writer
	terminal bool
	width    int
	redraw   time.Duration
	every    time.Duration
	now      func() time.Time
	mu       sync.Mutex // serialises writes
}

// New returns a reporter writing to w (usually os.Stderr).
func New(w io.Writer, o Options) *Reporter {
	r := &Reporter{w: w, width: o.Width, redraw: o.Redraw, every: o.Every, now: o.Now}
	f, isFile := w.(*os.File)
	switch {
	case o.Terminal != nil:
		r.terminal = *o.Terminal
	case isFile:
		r.terminal = term.IsTerminal(int(f.Fd()))
	}
	if r.width <= 0 && r.terminal && isFile {
		if cols, _, err := term.GetSize(int(f.Fd())); err == nil {
			r.width = cols
		}
	}
	if r.width <= 0 {
		r.width = 80
	}
	if r.redraw <= 0 {
		r.redraw = 100 * time.Millisecond
	}
	if r.every <= 0 {
		r.every = 2 * time.Second
	}
	if r.now == nil {
		r.now = time.Now
	}
	return r
}

// Terminal reports whether the reporter draws a bar.
func (r *Reporter) Terminal() bool { return r.terminal }

// State is a task's progress at one moment.
type State struct {
	Name    string
	Done    int64
	Total   int64 // 0: unknown (no percentage, no bar)
	Unit    Unit
	Elapsed time.Duration
	Note    string // what the task is at, e.g. the file being written
}

// Task is one piece of long work.
type Task struct {
	r     *Reporter
	start time.Time
	stop  chan struct{}
	ended chan struct{}

	mu    sync.Mutex
	state State
	err   error
}

// Start begins a task of total units (0 when unknown) and draws it until
// Done or Fail.
func (r *Reporter) Start(name string, total int64, unit Unit) *Task {
	t := &Task{r: r, start: r.now(), stop: make(chan struct{}), ended: make(chan struct{}),
		state: State{Name: name, Total: total, Unit: unit}}
	if !r.terminal {
		r.line(t.snapshot(), "start")
	}
	go t.loop()
	return t
}

// Add adds n units done.
func (t *Task) Add(n int64) {
	t.mu.Lock()
	t.state.Done += n
	t.mu.Unlock()
}

// Set sets the units done (and the note, when not empty).
func (t *Task) Set(done int64, note string) {
	t.mu.Lock()
	t.state.Done = done
	if note != "" {
		t.state.Note = note
	}
	t.mu.Unlock()
}

// Done ends the task as complete: the bar is drawn full, or an "end" line
// is written.
func (t *Task) Done() { t.end(nil) }

// Fail ends the task with err.
func (t *Task) Fail(err error) { t.end(err) }

func (t *Task) end(err error) {
	t.mu.Lock()
	if err == nil && t.state.Total > 0 {
		t.state.Done = t.state.Total
	}
	t.err = err
	t.mu.Unlock()
	select {
	case <-t.stop:
		return // already ended
	default:
		close(t.stop)
	}
	<-t.ended
}

func (t *Task) snapshot() State {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.state
	s.Elapsed = t.r.now().Sub(t.start)
	return s
}

func (t *Task) loop() {
	defer close(t.ended)
	period := t.r.every
	if t.r.terminal {
		period = t.r.redraw
	}
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			s := t.snapshot()
			t.mu.Lock()
			err := t.err
			t.mu.Unlock()
			if t.r.terminal {
				line := Bar(s, t.r.width)
				if err != nil {
					line = fit(s.Name+": failed: "+err.Error(), t.r.width)
				}
				t.r.draw(line, "\n")
			} else if err != nil {
				t.r.line(s, "failed: "+err.Error())
			} else {
				t.r.line(s, "end")
			}
			return
		case <-tick.C:
			s := t.snapshot()
			if t.r.terminal {
				t.r.draw(Bar(s, t.r.width), "")
			} else {
				t.r.line(s, "progress")
			}
		}
	}
}

// draw rewrites the current terminal line: carriage return, the text,
// erase to the end of the line (ECMA-48 EL, CSI K), then end ("\n" for
// the last drawing).
func (r *Reporter) draw(text, end string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprint(r.w, "\r"+text+"\x1b[K"+end)
}

// Line is one structured progress line (JSON).
type Line struct {
	Task     string   `json:"task"`
	Event    string   `json:"event"` // start, progress, end, failed: <error>
	Done     int64    `json:"done"`
	Total    int64    `json:"total,omitempty"`
	Unit     Unit     `json:"unit"`
	Percent  *float64 `json:"percent,omitempty"`
	ElapsedS float64  `json:"elapsed_s"`
	Note     string   `json:"note,omitempty"`
}

func (r *Reporter) line(s State, event string) {
	l := Line{Task: s.Name, Event: event, Done: s.Done, Total: s.Total, Unit: s.Unit, ElapsedS: round(s.Elapsed.Seconds(), 3), Note: s.Note}
	if s.Total > 0 {
		p := round(100*float64(min(s.Done, s.Total))/float64(s.Total), 1)
		l.Percent = &p
	}
	b, _ := json.Marshal(l)
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = r.w.Write(append(b, '\n'))
}

func round(x float64, digits int) float64 {
	p := 1.0
	for range digits {
		p *= 10
	}
	return float64(int64(x*p+0.5)) / p
}

// Bar renders s for a terminal width columns wide:
//
//	<name> [#########.........]  45% 5.6/12.4 MiB 1.2s <note>
//
// The bar takes what the text leaves, at most 30 columns and at least 10;
// with no total there is no bar nor percentage, only what is done and the
// elapsed time. The result is never wider than width (the note, then the
// name are cut).
func Bar(s State, width int) string {
	amount := amountOf(s)
	elapsed := fmt.Sprintf("%.1fs", s.Elapsed.Seconds())
	if s.Total <= 0 {
		return fit(strings.Join(nonEmpty(s.Name, amount, elapsed, s.Note), " "), width)
	}
	frac := min(float64(s.Done)/float64(s.Total), 1)
	pct := fmt.Sprintf("%3d%%", int(frac*100))
	tail := strings.Join(nonEmpty(pct, amount, elapsed), " ")
	name := s.Name
	barW := width - len(name) - len(tail) - 4 // " [" + "] "
	if barW < 10 {
		name = fit(name, max(width-len(tail)-4-10, 0))
		barW = width - len(name) - len(tail) - 4
	}
	barW = min(barW, 30)
	if barW < 1 {
		return fit(name+" "+tail, width)
	}
	filled := int(frac * float64(barW))
	out := name + " [" + strings.Repeat("#", filled) + strings.Repeat(".", barW-filled) + "] " + tail
	if s.Note != "" && len(out)+1+len(s.Note) <= width {
		out += " " + s.Note
	}
	return fit(out, width)
}

func amountOf(s State) string {
	switch s.Unit {
	case Bytes:
		if s.Total > 0 {
			return size(s.Done, s.Total) + "/" + size(s.Total, s.Total) + " " + unitOf(s.Total)
		}
		return size(s.Done, s.Done) + " " + unitOf(s.Done)
	default:
		if s.Total > 0 {
			return fmt.Sprintf("%d/%d", s.Done, s.Total)
		}
		return fmt.Sprint(s.Done)
	}
}

// size prints n bytes in the binary unit of scale (IEC 80000-13 prefixes).
func size(n, scale int64) string {
	u := float64(unitBytes(scale))
	if u == 1 {
		return fmt.Sprint(n)
	}
	return fmt.Sprintf("%.1f", float64(n)/u)
}

func unitBytes(n int64) int64 {
	switch {
	case n >= 1<<30:
		return 1 << 30
	case n >= 1<<20:
		return 1 << 20
	case n >= 1<<10:
		return 1 << 10
	}
	return 1
}

func unitOf(n int64) string {
	return map[int64]string{1: "B", 1 << 10: "KiB", 1 << 20: "MiB", 1 << 30: "GiB"}[unitBytes(n)]
}

func nonEmpty(parts ...string) []string {
	out := parts[:0:0]
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

// fit cuts s to width columns (s is ASCII but for what callers pass in
// names and notes; a cut never splits a UTF-8 sequence).
func fit(s string, width int) string {
	if len(s) <= width {
		return s
	}
	cut := max(width, 0)
	for cut > 0 && cut < len(s) && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut]
}
