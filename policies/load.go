package policies

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
	"testing/fstest"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/loader"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
)

// maxDepth bounds how deep the policy directory is read, so a symlink loop
// is an error instead of a hang.
const maxDepth = 16

// revision is one immutable, compiled state of the policy: the files read,
// the one ast.Compiler built from them and every query prepared on it. The
// engine swaps whole revisions atomically, so an evaluation sees one
// revision from start to end.
type revision struct {
	id       string // hex SHA-256 of the files (see snapshot.hash)
	source   string // the directory, or "embedded"
	files    []string
	loadedAt time.Time

	decision, tool, offer, escalate, orchestration rego.PreparedEvalQuery
	memo                                           *memo // route decisions by the input parts the policy reads; nil: none
}

// snapshot is the content of a policy directory read at one moment: the
// files OPA's loader would load (Rego modules, JSON/YAML data documents,
// .tar.gz bundles), held in memory so that what is hashed is exactly what
// is compiled.
type snapshot struct {
	files fstest.MapFS
	names []string // sorted
	hash  string
	dirs  []string // directories read, as paths below the root ("." first)
}

// loadable reports whether OPA's loader loads name when it meets it inside a
// directory (the loader's known types), minus Rego tests, which are not
// served.
func loadable(name string) bool {
	switch {
	case strings.HasSuffix(name, "_test.rego"):
		return false
	case strings.HasSuffix(name, ".rego"), strings.HasSuffix(name, ".json"),
		strings.HasSuffix(name, ".yaml"), strings.HasSuffix(name, ".yml"),
		strings.HasSuffix(name, ".tar.gz"):
		return true
	}
	return false
}

// readSnapshot reads every loadable file below the root of fsys, following
// symlinks, skipping names that start with "." (as `opa run --ignore '.*'`
// does: Kubernetes ConfigMap volumes hold each file twice more below
// "..data" and "..<timestamp>" directories, reached here through the
// top-level symlinks) and Rego tests.
func readSnapshot(fsys fs.FS) (*snapshot, error) {
	s := &snapshot{files: fstest.MapFS{}}
	if err := s.read(fsys, ".", 0); err != nil {
		return nil, err
	}
	if len(s.names) == 0 {
		return nil, errors.New("no policy file (.rego, data .json/.yaml or .tar.gz bundle) found")
	}
	if !s.hasRego() {
		return nil, errors.New("no .rego file found")
	}
	sort.Strings(s.names)
	h := sha256.New()
	var n [8]byte
	for _, name := range s.names {
		b := s.files[name].Data
		h.Write([]byte(name))
		h.Write([]byte{0})
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	s.hash = hex.EncodeToString(h.Sum(nil))
	return s, nil
}

func (s *snapshot) hasRego() bool {
	for _, n := range s.names {
		if strings.HasSuffix(n, ".rego") {
			return true
		}
	}
	return false
}

func (s *snapshot) read(fsys fs.FS, dir string, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("%s: directories nested deeper than %d (a symlink loop?)", dir, maxDepth)
	}
	s.dirs = append(s.dirs, dir)
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return err
	}
	for _, ent := range entries {
		name := ent.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		p := path.Join(dir, name)
		info, err := fs.Stat(fsys, p) // follows symlinks
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && ent.Type()&fs.ModeSymlink != 0 {
				return fmt.Errorf("%s: dangling symlink", p)
			}
			return err
		}
		switch {
		case info.IsDir():
			if err := s.read(fsys, p, depth+1); err != nil {
				return err
			}
		case info.Mode().IsRegular() && loadable(name):
			b, err := fs.ReadFile(fsys, p)
			if err != nil {
				return err
			}
			s.files[p] = &fstest.MapFile{Data: b, Mode: 0o444}
			s.names = append(s.names, p)
		}
	}
	return nil
}

// sameContent reports whether fsys still holds exactly the snapshot's
// files. A directory changed while it was read (a ConfigMap swapped between
// two files, an editor halfway through a save) gives a mixed snapshot that
// no one wrote; reading twice and comparing catches it.
func (s *snapshot) sameContent(fsys fs.FS) bool {
	again, err := readSnapshot(fsys)
	if err != nil || len(again.names) != len(s.names) {
		return false
	}
	for _, n := range s.names {
		f, ok := again.files[n]
		if !ok || !bytes.Equal(f.Data, s.files[n].Data) {
			return false
		}
	}
	return true
}

// compile builds a revision from a snapshot the way `opa eval -d <dir>`
// does: OPA's file loader reads modules, data documents (each at its
// directory's path below data) and bundles; one ast.Compiler compiles the
// modules once (with the data paths as conflicts, as OPA checks them); every
// query is prepared on that compiler and one in-memory store.
func compile(ctx context.Context, s *snapshot, source, decisionQuery string, memoSize int) (*revision, error) {
	res, err := loader.NewFileLoader().WithFS(s.files).Filtered([]string{"."}, nil)
	if err != nil {
		return nil, err
	}
	store := inmem.NewFromObjectWithOpts(res.Documents, inmem.OptReturnASTValuesOnRead(true))
	txn, err := store.NewTransaction(ctx)
	if err != nil {
		return nil, err
	}
	defer store.Abort(ctx, txn)
	c := ast.NewCompiler().WithPathConflictsCheck(storage.NonEmpty(ctx, store, txn))
	if c.Compile(res.ParsedModules()); c.Failed() {
		return nil, c.Errors
	}
	r := &revision{id: s.hash, source: source, files: s.names, loadedAt: time.Now()}
	for _, q := range []struct {
		query string
		into  *rego.PreparedEvalQuery
	}{
		{decisionQuery, &r.decision},
		{ToolQuery, &r.tool},
		{ToolOfferQuery, &r.offer},
		{EscalationQuery, &r.escalate},
		{OrchestrationQuery, &r.orchestration},
	} {
		pq, err := rego.New(
			rego.Query(q.query),
			rego.Compiler(c),
			rego.Store(store),
			rego.StrictBuiltinErrors(true),
		).PrepareForEval(ctx)
		if err != nil {
			return nil, fmt.Errorf("preparing %s: %w", q.query, err)
		}
		*q.into = pq
	}
	r.memo = newMemo(c, decisionQuery, memoSize)
	return r, nil
}
