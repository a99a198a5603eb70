package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// policyStatus is GET /molly/policy's body.
type policyStatus struct {
	Revision  string   `json:"revision"`
	LoadedAt  string   `json:"loaded_at"`
	Source    string   `json:"source"`
	Files     []string `json:"files"`
	LastError string   `json:"last_error"`
	Healthy   bool     `json:"healthy"`
}

// TestPolicyStatusOnTheAdminSocket: GET /molly/policy on the admin socket
// reports the revision serving — the SHA-256 policies/README.md defines,
// computed here from the files —, its source, files and health; a file
// that no longer compiles leaves that revision serving and is reported as
// last_error with healthy false. Another method is 405.
func TestPolicyStatusOnTheAdminSocket(t *testing.T) {
	dir := t.TempDir()
	files, err := filepath.Glob(filepath.Join("..", "..", "policies", "*.rego"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.rego") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644); err != nil {
			t.Fatal(err)
		}
		names = append(names, filepath.Base(f))
	}
	slices.Sort(names)
	// The revision as the README defines it: per file in lexical order,
	// path NUL length (8 bytes, big-endian) content.
	h := sha256.New()
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		var size [8]byte
		binary.BigEndian.PutUint64(size[:], uint64(len(b)))
		h.Write([]byte(n + "\x00"))
		h.Write(size[:])
		h.Write(b)
	}
	want := hex.EncodeToString(h.Sum(nil))

	admin := adminSocket(t)
	startMolly(t, `{
	admin `+admin+`|0600
	auto_https off
	persist_config off
	molly {
		registry `+filepath.Join(t.TempDir(), "molly.db")+`
		policy_dir `+dir+`
		target lan {
			tier T1
			endpoint http://127.0.0.1:9/v1
			models m
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_classify
	molly_policy
	molly_route
}
`)
	get := func() policyStatus {
		t.Helper()
		code, body := adminCall(t, admin, http.MethodGet, "/molly/policy", nil)
		if code != http.StatusOK {
			t.Fatalf("GET /molly/policy: %d %s", code, body)
		}
		var st policyStatus
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatalf("GET /molly/policy: %v: %s", err, body)
		}
		return st
	}
	st := get()
	if st.Revision != want || st.Source != dir || !slices.Equal(st.Files, names) || !st.Healthy || st.LastError != "" || st.LoadedAt == "" {
		t.Fatalf("policy status %+v, want revision %s of %v from %s, healthy", st, want, names, dir)
	}
	if code, body := adminCall(t, admin, http.MethodPost, "/molly/policy", nil); code != http.StatusMethodNotAllowed {
		t.Fatalf("POST /molly/policy: %d %s", code, body)
	}

	if err := os.WriteFile(filepath.Join(dir, "broken.rego"), []byte("package molly.policy\n\nthis is not rego {\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The watcher reloads after 100 ms without events; wait for its verdict.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st = get()
		if st.LastError != "" || time.Now().After(deadline) {
			break
		}
	}
	if st.LastError == "" || st.Healthy || st.Revision != want || !slices.Equal(st.Files, names) {
		t.Fatalf("after a broken file: %+v, want the revision %s still serving, last_error set, not healthy", st, want)
	}
}
