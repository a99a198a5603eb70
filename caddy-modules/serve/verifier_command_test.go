package serve

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/molly-gateway/molly/serving"
	"github.com/molly-gateway/molly/serving/gguf"
)

func TestTrainVerifierReadsLabelledChains(t *testing.T) {
	dir := t.TempDir()
	if err := serving.WriteDemo(dir, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	lines := []string{
		`{"messages":[{"role":"user","content":"2+2?"}],"reasoning":"two and two","content":"answer: 4","correct":true}`,
		`{"messages":[{"role":"user","content":"2+2?"}],"reasoning":"two and two","content":"answer: 5","correct":false}`,
		``,
		`{"messages":[{"role":"user","content":"3+3?"}],"content":"answer: 6","correct":true}`,
		`{"messages":[{"role":"user","content":"3+3?"}],"content":"answer: 7 because","correct":false}`,
	}
	data := filepath.Join(dir, "chains.jsonl")
	if err := os.WriteFile(data, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := serving.Config{ModelPath: filepath.Join(dir, serving.DemoModelFile), NSeqMax: 1, NCtx: 1024}
	cfg.Reasoning.AnswerRegex = `answer: (\d)`
	v, err := TrainVerifier(cfg, data, 1e-4)
	if err != nil {
		t.Fatal(err)
	}
	base, _ := gguf.SizeConfig("tiny", 1)
	if v.Examples != 4 || len(v.Weights) != base.Embd || v.BaseChecksum != base.Checksum() || v.TrainAccuracy != 1 {
		t.Errorf("verifier: %d examples, %d weights, base %q, accuracy %v; want 4, %d, %q, 1",
			v.Examples, len(v.Weights), v.BaseChecksum, v.TrainAccuracy, base.Embd, base.Checksum())
	}
	if err := os.WriteFile(data, []byte(lines[0]+"\n{not json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := TrainVerifier(cfg, data, 1e-4); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("a bad line: %v, want an error naming line 2", err)
	}
}

func TestTrainProbeReadsLabelledPrompts(t *testing.T) {
	dir := t.TempDir()
	if err := serving.WriteDemo(dir, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "prompts.jsonl")
	lines := `{"messages":[{"role":"user","content":"prove it"}],"hard":true}
{"messages":[{"role":"user","content":"hi"}],"hard":false}
`
	if err := os.WriteFile(data, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	v, err := TrainProbe(serving.Config{ModelPath: filepath.Join(dir, serving.DemoModelFile), NSeqMax: 1}, data, 1e-4)
	if err != nil {
		t.Fatal(err)
	}
	base, _ := gguf.SizeConfig("tiny", 1)
	if v.Features != "mean_hidden_difficulty" || len(v.Weights) != base.Embd+1 || v.Examples != 2 || v.TrainAccuracy != 1 {
		t.Errorf("probe %s, %d weights, %d examples, accuracy %v", v.Features, len(v.Weights), v.Examples, v.TrainAccuracy)
	}
}
