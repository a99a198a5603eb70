package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/open-policy-agent/opa/v1/tester"

	"github.com/molly-gateway/molly/serving"
)

var update = flag.Bool("update", false, "rewrite the golden Caddyfile.json files")

// repoRoot is where the Caddyfiles' relative paths (models/, policies/) resolve.
const repoRoot = "../.."

// caddyfiles lists the root Caddyfile and every example's.
func caddyfiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot, "examples", "*", "Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{filepath.Join(repoRoot, "Caddyfile")}, files...)
	if len(files) < 4 {
		t.Fatalf("found %d Caddyfiles, want the root one and at least 3 examples", len(files))
	}
	return files
}

// TestExamplesAdapt compares `molly adapt` of every Caddyfile with its
// checked-in JSON (golden files; -update rewrites them).
func TestExamplesAdapt(t *testing.T) {
	for _, f := range caddyfiles(t) {
		t.Run(f, func(t *testing.T) {
			abs, _ := filepath.Abs(f)
			cmd := exec.Command(mollyBin, "adapt", "--config", abs, "--adapter", "caddyfile", "--pretty")
			cmd.Dir = repoRoot
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("adapt: %v\n%s", err, stderr.String())
			}
			golden := f + ".json"
			if *update {
				if err := os.WriteFile(golden, out, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./cmd/molly -run TestExamplesAdapt -update)", err)
			}
			if !bytes.Equal(out, want) {
				t.Fatalf("adapt output differs from %s:\n%s", golden, out)
			}
		})
	}
}

// TestExamplesValidate runs `molly validate` (which provisions every module,
// loading the engine and compiling the policies) on every Caddyfile, in a
// directory laid out like the repository with a generated demo model.
func TestExamplesValidate(t *testing.T) {
	dir := t.TempDir()
	if err := serving.WriteDemo(filepath.Join(dir, "models", "demo"), 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"policies", "examples"} {
		abs, _ := filepath.Abs(filepath.Join(repoRoot, sub))
		if err := os.Symlink(abs, filepath.Join(dir, sub)); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range caddyfiles(t) {
		t.Run(f, func(t *testing.T) {
			abs, _ := filepath.Abs(f)
			cmd := exec.Command(mollyBin, "validate", "--config", abs, "--adapter", "caddyfile")
			cmd.Dir = dir
			// Its own data dir: the registry (and the admin socket's folder)
			// must not be the user's, which another Molly may have written.
			cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+t.TempDir())
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("validate: %v\n%s", err, out)
			}
		})
	}
}

// TestExamplePolicies runs the Rego tests of every example's policies.
func TestExamplePolicies(t *testing.T) {
	dirs, _ := filepath.Glob(filepath.Join(repoRoot, "examples", "*", "policies"))
	if len(dirs) == 0 {
		t.Fatal("no example policies found")
	}
	for _, d := range dirs {
		t.Run(d, func(t *testing.T) {
			results, err := tester.Run(context.Background(), d)
			if err != nil {
				t.Fatal(err)
			}
			if len(results) == 0 {
				t.Fatal("no Rego tests ran")
			}
			for _, r := range results {
				if !r.Pass() {
					t.Errorf("%s.%s: %s", r.Package, r.Name, r.String())
				}
			}
		})
	}
}
