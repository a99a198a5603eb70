package lora

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/ollama/ollama/fs/ggml"
)

// checkpointMagic starts a checkpoint file: the magic, a little-endian
// uint32 header length, the JSON header, then every parameter and both
// Adam moments as little-endian float32, pair by pair (A then B).
const checkpointMagic = "MOLLY-LORA-CKPT-1\n"

var errNoCheckpoint = errors.New("no checkpoint")

// ErrOtherRun is returned when a checkpoint belongs to another run
// (another base, data set or options): delete it or name another file.
var ErrOtherRun = errors.New("checkpoint belongs to another training run")

type ckptHeader struct {
	Run   string `json:"run"`
	Step  int    `json:"step"`
	Pairs []struct {
		Name    string `json:"name"`
		In, Out int
	} `json:"pairs"`
}

// save writes the state to path atomically: a temporary file in the same
// folder, fsync'd, renamed over path, and the folder fsync'd, so a crash
// leaves the old checkpoint or the new one, never a torn file.
func (st *state) save(path string) error {
	h := ckptHeader{Run: st.run, Step: st.step}
	for _, p := range st.a.Pairs {
		h.Pairs = append(h.Pairs, struct {
			Name    string `json:"name"`
			In, Out int
		}{p.Name, p.In, p.Out})
	}
	hj, _ := json.Marshal(h)
	tmp, err := os.CreateTemp(filepath.Dir(path), ".ckpt-*")
	if err != nil {
		return fmt.Errorf("saving checkpoint: %w", err)
	}
	defer os.Remove(tmp.Name())
	w := bufio.NewWriterSize(tmp, 1<<20)
	w.WriteString(checkpointMagic)
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(hj)))
	w.Write(n[:])
	w.Write(hj)
	params := st.params()
	for _, set := range [][][]float32{params, st.m1, st.m2} {
		for _, v := range set {
			writeFloats(w, v)
		}
	}
	if err := w.Flush(); err != nil {
		tmp.Close()
		return fmt.Errorf("saving checkpoint: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("saving checkpoint: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("saving checkpoint: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("saving checkpoint: %w", err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// load reads the state saved at path into st. Errors: errNoCheckpoint
// when there is no file, ErrOtherRun, a malformed file.
func (st *state) load(path string) error {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return errNoCheckpoint
	}
	if err != nil {
		return fmt.Errorf("reading checkpoint: %w", err)
	}
	if !bytes.HasPrefix(data, []byte(checkpointMagic)) || len(data) < len(checkpointMagic)+4 {
		return fmt.Errorf("checkpoint %s: not a Molly LoRA checkpoint", path)
	}
	data = data[len(checkpointMagic):]
	hl := int(binary.LittleEndian.Uint32(data))
	if 4+hl > len(data) {
		return fmt.Errorf("checkpoint %s: truncated header", path)
	}
	var h ckptHeader
	if err := json.Unmarshal(data[4:4+hl], &h); err != nil {
		return fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if h.Run != st.run {
		return fmt.Errorf("%w: %s", ErrOtherRun, path)
	}
	body := data[4+hl:]
	params := st.params()
	need := 0
	for _, v := range params {
		need += 3 * 4 * len(v)
	}
	if len(body) != need {
		return fmt.Errorf("checkpoint %s: %d bytes of state, want %d", path, len(body), need)
	}
	for _, set := range [][][]float32{params, st.m1, st.m2} {
		for _, v := range set {
			for i := range v {
				v[i] = math.Float32frombits(binary.LittleEndian.Uint32(body))
				body = body[4:]
			}
		}
	}
	st.step = h.Step
	return nil
}

func writeFloats(w io.Writer, v []float32) {
	buf := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(x))
	}
	w.Write(buf)
}

// f32 is a tensor payload written as F32.
type f32 []float32

func (v f32) WriteTo(w io.Writer) (int64, error) {
	buf := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(x))
	}
	n, err := w.Write(buf)
	return int64(n), err
}

// WriteGGUF writes a as a llama.cpp LoRA adapter GGUF for base m to path:
// general.type=adapter, adapter.type=lora, adapter.lora.alpha, the base's
// checksum under adapter.base_checksum, and per pair <name>.lora_a
// [In, Rank] and <name>.lora_b [Rank, Out] (ggml order), F32. The file is
// written to a temporary name, fsync'd and renamed. Errors: write failures.
func (a *Adapter) WriteGGUF(path string, m *Model, name string) error {
	kv := ggml.KV{
		"general.architecture": m.Arch,
		"general.type":         "adapter",
		"general.name":         name,
		"adapter.type":         "lora",
		"adapter.lora.alpha":   a.Alpha,
	}
	if m.Checksum != "" {
		kv[KeyAdapterBaseChecksum] = m.Checksum
	}
	var ts []*ggml.Tensor
	for _, p := range a.Pairs {
		ts = append(ts,
			&ggml.Tensor{Name: p.Name + ".lora_a", Kind: uint32(ggml.TensorTypeF32), Shape: []uint64{uint64(p.In), uint64(a.Rank)}, WriterTo: f32(p.A)},
			&ggml.Tensor{Name: p.Name + ".lora_b", Kind: uint32(ggml.TensorTypeF32), Shape: []uint64{uint64(a.Rank), uint64(p.Out)}, WriterTo: f32(p.B)})
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".adapter-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := ggml.WriteGGUF(tmp, kv, ts); err != nil {
		tmp.Close()
		return fmt.Errorf("writing adapter %s: %w", path, err)
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

// ReadAdapter reads a LoRA adapter GGUF made for m (by WriteGGUF or
// another tool with F32 or F16 tensors). Errors: not an adapter, a tensor
// that does not fit m, an unsupported type.
func ReadAdapter(path string, m *Model) (*Adapter, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	g, err := ggml.Decode(f, -1)
	if err != nil {
		return nil, fmt.Errorf("reading adapter %s: %w", path, err)
	}
	kv := g.KV()
	if kv.String("general.type") != "adapter" {
		return nil, fmt.Errorf("%s is not an adapter (general.type %q)", path, kv.String("general.type"))
	}
	a := &Adapter{Alpha: kv.Float("adapter.lora.alpha")}
	base := int64(g.Tensors().Offset)
	pairs := map[string]*Pair{}
	for _, t := range g.Tensors().Items() {
		name, part, ok := strings.Cut(t.Name, ".weight.lora_")
		if !ok || len(t.Shape) != 2 {
			continue
		}
		var l int
		var target string
		if _, err := fmt.Sscanf(name, "blk.%d.%s", &l, &target); err != nil || l >= m.Cfg.Layers {
			return nil, fmt.Errorf("adapter tensor %s does not name a block of the base", t.Name)
		}
		_, out, in := m.matrix(l, target)
		if out == 0 {
			return nil, fmt.Errorf("adapter tensor %s: unsupported target", t.Name)
		}
		p := pairs[name]
		if p == nil {
			p = &Pair{Name: name + ".weight", Layer: l, Target: target, In: in, Out: out}
			pairs[name] = p
		}
		n := int(t.Shape[0] * t.Shape[1])
		v, _, err := readTensor(f, base+int64(t.Offset), t.Kind, n)
		if err != nil {
			return nil, fmt.Errorf("adapter tensor %s: %w", t.Name, err)
		}
		switch part {
		case "a":
			if int(t.Shape[0]) != in {
				return nil, fmt.Errorf("adapter tensor %s: shape %v does not fit [%d, r]", t.Name, t.Shape, in)
			}
			p.A, a.Rank = v, int(t.Shape[1])
		case "b":
			if int(t.Shape[1]) != out {
				return nil, fmt.Errorf("adapter tensor %s: shape %v does not fit [r, %d]", t.Name, t.Shape, out)
			}
			p.B = v
		}
	}
	if len(pairs) == 0 || a.Rank == 0 {
		return nil, fmt.Errorf("adapter %s has no LoRA tensors", path)
	}
	if a.Alpha == 0 {
		a.Alpha = float32(a.Rank)
	}
	seen := map[string]bool{}
	for _, p := range pairs {
		if len(p.A) != a.Rank*p.In || len(p.B) != a.Rank*p.Out {
			return nil, fmt.Errorf("adapter pair %s lacks lora_a or lora_b or mixes ranks", p.Name)
		}
		a.Pairs = append(a.Pairs, p)
		if !seen[p.Target] {
			seen[p.Target] = true
			a.Targets = append(a.Targets, p.Target)
		}
	}
	sortPairs(a.Pairs)
	a.index(m.Cfg.Layers)
	return a, nil
}

func sortPairs(ps []*Pair) {
	order := func(p *Pair) int {
		for i, t := range Targets {
			if t == p.Target {
				return p.Layer*len(Targets) + i
			}
		}
		return math.MaxInt
	}
	for i := 1; i < len(ps); i++ {
		for j := i; j > 0 && order(ps[j]) < order(ps[j-1]); j-- {
			ps[j], ps[j-1] = ps[j-1], ps[j]
		}
	}
}
