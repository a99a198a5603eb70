package pipeline

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// pluginDir holds the tool plugin binaries the tool tests build, once per
// test binary (toolPlugins).
var (
	pluginOnce sync.Once
	pluginDir  string
	pluginErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if pluginDir != "" {
		os.RemoveAll(pluginDir)
	}
	os.Exit(code)
}

// toolPlugins builds the real payments and support plugins and returns
// their paths and SHA-256 sums by name.
func toolPlugins(t *testing.T) map[string][2]string {
	t.Helper()
	pluginOnce.Do(func() {
		if pluginDir, pluginErr = os.MkdirTemp("", "molly-pipeline-plugins"); pluginErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", pluginDir+string(filepath.Separator), "../../plugins/payments", "../../plugins/support").CombinedOutput()
		if err != nil {
			pluginErr = &buildError{err, string(out)}
		}
	})
	if pluginErr != nil {
		t.Fatalf("building the tool plugins: %v", pluginErr)
	}
	out := map[string][2]string{}
	for _, name := range []string{"payments", "support"} {
		path := filepath.Join(pluginDir, name)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		out[name] = [2]string{path, hex.EncodeToString(sum[:])}
	}
	return out
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + e.out }
