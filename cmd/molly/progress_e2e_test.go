package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/molly-gateway/molly/serving"
)

// mollyEnv is the environment the molly binary runs with in these tests:
// home and XDG folders under the test's temp dir, never the user's.
func mollyEnv(t *testing.T) []string {
	return append(os.Environ(), "HOME="+t.TempDir(), "XDG_DATA_HOME="+t.TempDir(), "XDG_CONFIG_HOME="+t.TempDir())
}

// TestModelDemoReportsProgress: `molly model demo` writes structured
// progress lines when its output is a pipe, and a bar redrawn in place on a
// terminal (a pseudo-terminal from script(1)); the files are byte for byte
// what serving.WriteDemo writes.
func TestModelDemoReportsProgress(t *testing.T) {
	out := t.TempDir()
	cmd := exec.Command(mollyBin, "model", "demo", "--out", out, "--seed", "3", "--size", "tiny")
	cmd.Env = mollyEnv(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("molly model demo: %v\n%s", err, stderr.String())
	}
	var events []string
	var last struct {
		Task    string   `json:"task"`
		Event   string   `json:"event"`
		Done    int64    `json:"done"`
		Total   int64    `json:"total"`
		Percent *float64 `json:"percent"`
	}
	for _, l := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		if err := json.Unmarshal([]byte(l), &last); err != nil {
			t.Fatalf("stderr line is not a progress object: %q", l)
		}
		events = append(events, last.Event)
	}
	if events[0] != "start" || last.Event != "end" || last.Task != "demo model (tiny)" || last.Percent == nil || *last.Percent != 100 || last.Total <= 0 {
		t.Fatalf("progress lines %v, last %+v", events, last)
	}
	want := t.TempDir()
	if err := serving.WriteDemo(want, 3, "tiny"); err != nil {
		t.Fatal(err)
	}
	files := []string{serving.DemoModelFile}
	for _, a := range serving.DemoAdapters {
		files = append(files, filepath.Join(serving.DemoAdapterDir, a+".gguf"))
	}
	var written int64
	for _, f := range files {
		a, errA := os.ReadFile(filepath.Join(out, f))
		b, errB := os.ReadFile(filepath.Join(want, f))
		if errA != nil || errB != nil || !bytes.Equal(a, b) {
			t.Fatalf("%s differs from serving.WriteDemo's (%v, %v)", f, errA, errB)
		}
		written += int64(len(a))
	}
	// The estimate leaves out headers and the vocabulary: within 25% of what was written.
	if float64(last.Total) < 0.75*float64(written) || last.Total > written {
		t.Errorf("estimated %d bytes, wrote %d", last.Total, written)
	}

	script, err := exec.LookPath("script")
	if err != nil {
		t.Skip("no script(1) (util-linux) for a pseudo-terminal: the bar is tested by internal/progress only")
	}
	tty := exec.Command(script, "-q", "-e", "-c", mollyBin+" model demo --out "+t.TempDir()+" --size tiny", "/dev/null")
	tty.Env = mollyEnv(t)
	b, err := tty.CombinedOutput()
	if err != nil {
		t.Fatalf("molly model demo on a terminal: %v\n%q", err, b)
	}
	text := string(b)
	final := ""
	for _, l := range strings.Split(text, "\n") {
		if l = strings.TrimSuffix(l, "\r"); strings.Contains(l, "demo model") {
			final = l[strings.LastIndex(l, "\r")+1:] // what the terminal shows: the last drawing
		}
	}
	if !strings.Contains(text, "\x1b[K") || !strings.HasPrefix(final, "demo model (tiny) [") || !strings.Contains(final, "] 100% ") ||
		strings.Contains(text, `"event"`) {
		t.Fatalf("terminal output %q", text)
	}
}

// TestModelQuantizeReportsProgress: `molly model quantize` rewrites the
// model smaller (8-bit weights from 32-bit) and reports start and end as
// progress lines when not on a terminal; a bad type, a model already of
// the type or already quantized, and a missing file fail with the reason
// reported and the model left as it was.
func TestModelQuantizeReportsProgress(t *testing.T) {
	dir := t.TempDir()
	if err := serving.WriteDemo(dir, 1, "small"); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, serving.DemoModelFile)
	before, _ := os.Stat(path)
	run := func(ftype string) (string, error) {
		cmd := exec.Command(mollyBin, "model", "quantize", "--model", path, "--type", ftype)
		cmd.Env = mollyEnv(t)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		return stderr.String(), err
	}
	if out, err := run("q9_9"); err == nil || !strings.Contains(out, `"event":"failed: `) {
		t.Fatalf("a bad type: %v\n%s", err, out)
	}
	if st, _ := os.Stat(path); st.Size() != before.Size() {
		t.Fatalf("a failed quantization changed the model: %d → %d bytes", before.Size(), st.Size())
	}
	out, err := run("q8_0")
	if err != nil {
		t.Fatalf("quantize: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var last struct {
		Task  string `json:"task"`
		Event string `json:"event"`
		Done  int64  `json:"done"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || !strings.Contains(lines[0], `"event":"start"`) || last.Event != "end" {
		t.Fatalf("progress lines:\n%s", out)
	}
	after, _ := os.Stat(path)
	// Q8_0 stores 34 bytes per 32 weights instead of 128: the file shrinks to well under half.
	if after.Size() >= before.Size()/2 || last.Done != after.Size() {
		t.Fatalf("%d → %d bytes (reported %d)", before.Size(), after.Size(), last.Done)
	}
	// What llama.cpp would fail on with a bare status is refused with the
	// reason, the model left as it is.
	for _, tc := range []struct{ ftype, want string }{{"q8_0", "is already Q8_0"}, {"q4_0", "cannot be converted to Q4_0 from Q8_0"}} {
		if out, err := run(tc.ftype); err == nil || !strings.Contains(out, tc.want) || strings.Contains(out, "llama.cpp error") {
			t.Fatalf("quantizing the Q8_0 model to %s: %v\n%s", tc.ftype, err, out)
		}
		if st, _ := os.Stat(path); st.Size() != after.Size() {
			t.Fatalf("a refused quantization changed the model: %d → %d bytes", after.Size(), st.Size())
		}
	}
	path = filepath.Join(dir, "missing.gguf")
	if out, err := run("q8_0"); err == nil || !strings.Contains(out, "the model file "+path+" does not exist") {
		t.Fatalf("a missing model: %v\n%s", err, out)
	}
}
