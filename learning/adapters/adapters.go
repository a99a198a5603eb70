// Package adapters is the registry of adapter versions the specialisation
// loop makes: each GGUF stored by content hash (SHA-256) and pinned to the
// base it was made for (its checksum and weight type), aliases from an
// adapter name to the version it serves now, promotion and rollback with
// their history, and the hot swap into the running T0 engine.
//
// The engine is reached through the Engine interface below, which
// *serving.Engine satisfies today: AddAdapter(name, path) replaces the
// adapter name atomically, requests already admitted finish on the version
// they started with, and the engine's prefix cache is keyed by the adapter
// entry, so no KV computed under one version serves another. When the
// engine identifies adapters by content hash itself, only the adapter to
// this interface changes.
//
// A promotion registers two engine adapters: the alias (the domain name,
// e.g. "support": clients and the router keep their model name
// "<base>:support") and the pinned version "support@<12 hex digits>", so a
// client can ask for one version explicitly.
package adapters

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/molly-gateway/molly/learning/eval"
	"github.com/molly-gateway/molly/learning/lora"
	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/router/route"
)

// Engine is the running T0 engine as promotion uses it.
type Engine interface {
	// AddAdapter registers (or replaces) adapter name from the GGUF at path.
	AddAdapter(name, path string) error
	// Name is the served base model name.
	Name() string
}

// Priors is where a promotion sets the router's quality prior
// (*route.Priors).
type Priors interface {
	SetQuality(key route.PriorKey, q float64, n int64) error
	// Quality is the prior in effect for key (seed when nothing was
	// learned) and its observation count.
	Quality(key route.PriorKey, seed float64) (float64, int64)
}

// Base identifies a base model: its recorded checksum and weight type.
type Base struct {
	Checksum string `json:"checksum"`
	Quant    string `json:"quant"` // F32, F16, Q8_0, Q4_0, ...
}

// Errors.
var (
	// ErrOtherBase: the adapter was made for another base (checksum or
	// weight type) than the one served.
	ErrOtherBase = errors.New("adapter made for another base")
	// ErrNoPrevious: a rollback found no earlier promoted version.
	ErrNoPrevious = errors.New("no earlier promoted version to roll back to")
)

// BaseOf reads the identity of the GGUF base model at path from its header.
func BaseOf(path string) (Base, error) {
	f, err := os.Open(path)
	if err != nil {
		return Base{}, err
	}
	defer f.Close()
	g, err := ggml.Decode(f, 0)
	if err != nil {
		return Base{}, fmt.Errorf("reading %s: %w", path, err)
	}
	kv := g.KV()
	b := Base{Checksum: kv.String(lora.KeyBaseChecksum)}
	b.Quant = strings.ToUpper(fileType(kv))
	return b, nil
}

func fileType(kv ggml.KV) string {
	for _, t := range g2types {
		if v, ok := kv["general.file_type"].(uint32); ok && v == t.id {
			return t.name
		}
	}
	return "unknown"
}

// g2types are llama.cpp's LLAMA_FTYPE values of the types Molly makes.
var g2types = []struct {
	id   uint32
	name string
}{{0, "F32"}, {1, "F16"}, {2, "Q4_0"}, {7, "Q8_0"}}

// Store keeps adapter files by hash in a folder and their records in the
// registry.
type Store struct {
	Registry *registry.Registry
	Dir      string // where version files live: <Dir>/<sha256>.gguf
	Base     Base   // the base served now
}

// Add copies the adapter GGUF at path into the store under its content
// hash and records it as a version of name made for the store's base
// (source: trained, external or import; set: the curated set; trainedOn:
// the traces it learnt from). Errors: not an adapter, ErrOtherBase, I/O.
func (s *Store) Add(ctx context.Context, name, path, source, set string, trainedOn []registry.TrainedOn) (registry.AdapterVersion, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return registry.AdapterVersion{}, err
	}
	if err := s.check(data); err != nil {
		return registry.AdapterVersion{}, err
	}
	sum := sha256.Sum256(data)
	version := hex.EncodeToString(sum[:])
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return registry.AdapterVersion{}, err
	}
	dst := filepath.Join(s.Dir, version+".gguf")
	if _, err := os.Stat(dst); err != nil {
		if err := writeFile(dst, data); err != nil {
			return registry.AdapterVersion{}, err
		}
	}
	v := registry.AdapterVersion{Version: version, Name: name, BaseChecksum: s.Base.Checksum, BaseQuant: s.Base.Quant,
		Path: dst, Set: set, Source: source}
	if err := s.Registry.PutAdapterVersion(ctx, v, trainedOn); err != nil {
		return registry.AdapterVersion{}, err
	}
	return v, nil
}

// check refuses an adapter file that is not a LoRA adapter or records
// another base checksum than the store's.
func (s *Store) check(data []byte) error {
	g, err := ggml.Decode(strings.NewReader(string(data)), 0)
	if err != nil {
		return fmt.Errorf("not a GGUF adapter: %w", err)
	}
	kv := g.KV()
	if kv.String("general.type") != "adapter" {
		return fmt.Errorf("not an adapter: general.type is %q", kv.String("general.type"))
	}
	if sum, _ := kv[lora.KeyAdapterBaseChecksum].(string); sum != "" && s.Base.Checksum != "" && sum != s.Base.Checksum {
		return fmt.Errorf("%w: made for base %.12s…, the base served is %.12s…", ErrOtherBase, sum, s.Base.Checksum)
	}
	return nil
}

func writeFile(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".version-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Short is a version's display form: its first 12 hex digits.
func Short(version string) string { return version[:min(12, len(version))] }

// Pinned is the engine adapter name of one version of name: "name@short".
func Pinned(name, version string) string { return name + "@" + Short(version) }

// Evaluation is what the loop recorded about a version (AdapterVersion.Scores).
type Evaluation struct {
	Scores   eval.Scores  `json:"scores"`
	Verdict  eval.Verdict `json:"verdict"`
	Quality  float64      `json:"quality"` // e^(−held-out domain NLL): the geometric-mean token probability (reported; the prior is PromotedQuality)
	HeldOut  int          `json:"held_out"`
	Category string       `json:"category"`
}

// Promotion is where a promotion applies: the engine, the router's priors
// and the T0 target whose prior moves.
type Promotion struct {
	Engine Engine
	Priors Priors
	Target string // the T0 target's name in the catalogue
	// Seed is the target's configured quality prior for (model, category)
	// (route.Target.Seed); nil means 0.5.
	Seed func(model, category string) float64
}

// PromotedQuality is the quality prior a promoted version gets, on the
// router's own scale: the prior in effect q (learned, or the configured
// seed) with the share of the remaining gap the version closed, measured
// as its relative held-out loss reduction over the incumbent:
//
//	q' = 1 − (1 − q) · min(1, NLL_candidate / NLL_incumbent)
//
// So a version that passed the gate (lower NLL than what it replaces)
// never lowers the prior, an equal one keeps it, and a perfect one (NLL 0)
// reaches 1. Scores without an incumbent NLL leave q as it is.
func PromotedQuality(q float64, s eval.Scores) float64 {
	if !(s.IncumbentDomain.NLL > 0) || s.CandidateDomain.NLL < 0 {
		return q
	}
	ratio := math.Min(1, s.CandidateDomain.NLL/s.IncumbentDomain.NLL)
	return math.Max(0, math.Min(1, 1-(1-q)*ratio))
}

// Promote makes version the one name serves: it checks the version is
// for the base served (ErrOtherBase otherwise), registers the alias and
// the pinned name in the engine (requests in flight finish on what they
// started with), sets the quality prior of (target, "<base>:<name>",
// category) to PromotedQuality of its evaluation, then moves the alias in the
// registry with the event. The engine is changed before the registry, so a
// failure to register leaves the alias where it was; an engine that
// refuses the file leaves everything as it was.
func (s *Store) Promote(ctx context.Context, p Promotion, name, version, action, reason string) (registry.AdapterVersion, error) {
	v, err := s.Registry.AdapterVersion(ctx, version)
	if err != nil {
		return registry.AdapterVersion{}, err
	}
	if v.Name != name {
		return registry.AdapterVersion{}, fmt.Errorf("version %s is of adapter %q, not %q", Short(v.Version), v.Name, name)
	}
	if (s.Base.Checksum != "" && v.BaseChecksum != s.Base.Checksum) || v.BaseQuant != s.Base.Quant {
		return registry.AdapterVersion{}, fmt.Errorf("%w: version %s is for base %.12s… %s, the base served is %.12s… %s",
			ErrOtherBase, Short(v.Version), v.BaseChecksum, v.BaseQuant, s.Base.Checksum, s.Base.Quant)
	}
	if p.Engine != nil {
		if err := p.Engine.AddAdapter(Pinned(name, v.Version), v.Path); err != nil {
			return registry.AdapterVersion{}, err
		}
		if err := p.Engine.AddAdapter(name, v.Path); err != nil {
			return registry.AdapterVersion{}, err
		}
	}
	if p.Priors != nil && p.Engine != nil && v.Scores != "" {
		var ev Evaluation
		if err := json.Unmarshal([]byte(v.Scores), &ev); err == nil && ev.Category != "" {
			key := route.PriorKey{Target: p.Target, Model: p.Engine.Name() + ":" + name, Category: ev.Category}
			seed := 0.5
			if p.Seed != nil {
				seed = p.Seed(key.Model, key.Category)
			}
			// A promotion builds on the prior in effect; a rollback
			// restores the version's own gain over the configured seed
			// (the prior it had is not kept).
			from := seed
			if action != "rollback" {
				from, _ = p.Priors.Quality(key, seed)
			}
			if err := p.Priors.SetQuality(key, PromotedQuality(from, ev.Scores), int64(max(ev.HeldOut, 1))); err != nil {
				return registry.AdapterVersion{}, err
			}
		}
	}
	if err := s.Registry.SetAlias(ctx, name, v.Version, action, reason); err != nil {
		return registry.AdapterVersion{}, err
	}
	return v, nil
}

// Rollback points name back at the version it served before the current
// one (the previous promote or rollback target in its history) and
// restores that version's prior. Errors: ErrNoPrevious, Promote's.
func (s *Store) Rollback(ctx context.Context, p Promotion, name, reason string) (registry.AdapterVersion, error) {
	aliases, err := s.Registry.Aliases(ctx)
	if err != nil {
		return registry.AdapterVersion{}, err
	}
	cur, ok := aliases[name]
	if !ok {
		return registry.AdapterVersion{}, fmt.Errorf("%w: %s serves no version", ErrNoPrevious, name)
	}
	evs, err := s.Registry.AdapterEvents(ctx, name)
	if err != nil {
		return registry.AdapterVersion{}, err
	}
	// The served sequence: each promote or rollback event sets the alias.
	var served []string
	for _, e := range evs {
		if e.Action == "promote" || e.Action == "rollback" {
			served = append(served, e.Version)
		}
	}
	prev := ""
	for i := len(served) - 1; i >= 0; i-- {
		if served[i] != cur {
			prev = served[i]
			break
		}
	}
	if prev == "" {
		return registry.AdapterVersion{}, fmt.Errorf("%w: %s has served only %s", ErrNoPrevious, name, Short(cur))
	}
	return s.Promote(ctx, p, name, prev, "rollback", reason)
}

// Apply registers every alias's version (and its pinned name) in engine:
// what a fresh engine needs after a restart or config reload. Versions for
// another base are skipped and reported.
func (s *Store) Apply(ctx context.Context, engine Engine) error {
	aliases, err := s.Registry.Aliases(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for name, version := range aliases {
		v, err := s.Registry.AdapterVersion(ctx, version)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if (s.Base.Checksum != "" && v.BaseChecksum != s.Base.Checksum) || v.BaseQuant != s.Base.Quant {
			errs = append(errs, fmt.Errorf("%w: %s@%s", ErrOtherBase, name, Short(version)))
			continue
		}
		if err := engine.AddAdapter(Pinned(name, v.Version), v.Path); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := engine.AddAdapter(name, v.Path); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Entry is one adapter name with its versions and history, for listing.
type Entry struct {
	Name     string                    `json:"name"`
	Serving  string                    `json:"serving,omitempty"` // the alias's version
	Versions []registry.AdapterVersion `json:"versions"`
	History  []registry.AdapterEvent   `json:"history"`
}

// List returns every adapter name the registry knows, with versions
// (newest first) and history (oldest first).
func (s *Store) List(ctx context.Context) ([]Entry, error) {
	vs, err := s.Registry.AdapterVersions(ctx, "")
	if err != nil {
		return nil, err
	}
	aliases, err := s.Registry.Aliases(ctx)
	if err != nil {
		return nil, err
	}
	byName := map[string]*Entry{}
	var names []string
	for _, v := range vs {
		e := byName[v.Name]
		if e == nil {
			e = &Entry{Name: v.Name, Serving: aliases[v.Name]}
			byName[v.Name] = e
			names = append(names, v.Name)
		}
		e.Versions = append(e.Versions, v)
	}
	var out []Entry
	for _, n := range names {
		h, err := s.Registry.AdapterEvents(ctx, n)
		if err != nil {
			return nil, err
		}
		byName[n].History = h
		out = append(out, *byName[n])
	}
	return out, nil
}
