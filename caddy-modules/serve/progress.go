package serve

import (
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/molly-gateway/molly/internal/progress"
	"github.com/molly-gateway/molly/serving"
	"github.com/molly-gateway/molly/serving/gguf"
)

// demoBytes estimates the bytes serving.WriteDemo writes for size: the
// tensors of the base model (F16 matrices when the size is F16, F32
// otherwise) and of each rank-8 adapter (F32) over gguf.DefaultTargets.
// Headers and the vocabulary are left out, so the bar waits at 99% for
// them and is completed when WriteDemo returns. 0 for an unknown size.
func demoBytes(size string) int64 {
	c, err := gguf.SizeConfig(size, 0)
	if err != nil {
		return 0
	}
	const rank = 8
	var base, adapter int64
	shapes := c.TensorShapes()
	for name, shape := range shapes {
		n, elem := int64(1), int64(4)
		for _, d := range shape {
			n *= int64(d)
		}
		if c.F16 && len(shape) > 1 {
			elem = 2
		}
		base += n * elem
		for _, t := range gguf.DefaultTargets {
			if len(shape) == 2 && strings.HasSuffix(name, "."+t+".weight") {
				adapter += (int64(shape[0])*rank + rank*int64(shape[1])) * 4
			}
		}
	}
	return base + adapter*int64(len(serving.DemoAdapters))
}

// writtenDemo is the size of the demo files in out so far and the one
// being written (the newest), for the progress note.
func writtenDemo(out string) (int64, string) {
	files := []string{filepath.Join(out, serving.DemoModelFile)}
	for _, a := range serving.DemoAdapters {
		files = append(files, filepath.Join(out, serving.DemoAdapterDir, a+".gguf"))
	}
	var total int64
	current := ""
	var newest time.Time
	for _, f := range files {
		if st, err := os.Stat(f); err == nil {
			total += st.Size()
			if st.ModTime().After(newest) || current == "" {
				newest, current = st.ModTime(), filepath.Base(f)
			}
		}
	}
	return total, current
}

// writeDemoWithProgress runs serving.WriteDemo, reporting the bytes written
// (polled from the files, every poll) to stderr.
func writeDemoWithProgress(out string, seed int64, size string, poll time.Duration) error {
	// Files of an earlier run would count as written: start from none.
	for _, a := range serving.DemoAdapters {
		_ = os.Remove(filepath.Join(out, serving.DemoAdapterDir, a+".gguf"))
	}
	_ = os.Remove(filepath.Join(out, serving.DemoModelFile))
	task := progress.New(os.Stderr, progress.Options{}).Start("demo model ("+size+")", demoBytes(size), progress.Bytes)
	done := make(chan error, 1)
	go func() { done <- serving.WriteDemo(out, seed, size) }()
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				task.Fail(err)
				return err
			}
			task.Done()
			return nil
		case <-t.C:
			n, file := writtenDemo(out)
			task.Set(min(n, max(demoBytes(size)-1, 0)), file)
		}
	}
}

// quantizeWithProgress runs serving.QuantizeModel, reporting the elapsed
// time (llama_model_quantize reports no progress of its own).
func quantizeWithProgress(path, ftype string) error {
	task := progress.New(os.Stderr, progress.Options{}).Start("quantize "+filepath.Base(path)+" to "+ftype, 0, progress.Bytes)
	if err := serving.QuantizeModel(path, ftype); err != nil {
		task.Fail(err)
		return err
	}
	if st, err := os.Stat(path); err == nil {
		task.Set(st.Size(), "")
	}
	task.Done()
	return nil
}
