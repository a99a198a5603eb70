package federation

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"

	"github.com/x448/float16"

	"github.com/molly-gateway/molly/learning/lora"
)

// Magic starts every encoded Delta.
const Magic = "MOLLY-FED-DELTA-1\n"

// Limits of a Delta on the wire.
const (
	// DefaultMaxDeltaBytes bounds an encoded delta unless the aggregator
	// configures another bound: 256 MiB.
	DefaultMaxDeltaBytes = 256 << 20
	// MaxHeaderBytes bounds the JSON header: 1 MiB.
	MaxHeaderBytes = 1 << 20
	// MaxTensors bounds the matrices of one delta.
	MaxTensors = 4096
)

// Element types of a Delta's payload.
const (
	F16 = "f16"
	F32 = "f32"
)

// Errors of decoding and checking deltas.
var (
	// ErrMalformed: the bytes are not a well-formed delta.
	ErrMalformed = errors.New("malformed delta")
	// ErrTooLarge: the delta is larger than the limit.
	ErrTooLarge = errors.New("delta too large")
)

// Base identifies the base model a delta was trained against.
type Base struct {
	Arch     string `json:"arch"`     // general.architecture, e.g. "llama"
	Checksum string `json:"checksum"` // general.base_checksum
	Quant    string `json:"quant"`    // F32, F16, Q8_0, ...
}

// TensorInfo names one matrix of a delta and its shape.
type TensorInfo struct {
	Name string `json:"name"` // the base tensor, e.g. "blk.0.attn_q.weight"
	Out  int    `json:"out"`
	In   int    `json:"in"`
}

// Header is a delta's JSON header.
type Header struct {
	Round   uint64 `json:"round"`
	Domain  string `json:"domain"`
	Base    Base   `json:"base"`
	Samples int64  `json:"samples"` // training examples behind the update (FedAvg's weight)
	Rank    int    `json:"rank"`    // rank of the adapter the update came from (0: unknown)
	DType   string `json:"dtype"`   // F16 or F32
	// Clip is the L2 bound the update was clipped to and Sigma the noise
	// multiplier (noise standard deviation Sigma·Clip) when DP was on.
	Clip    float64      `json:"clip,omitempty"`
	Sigma   float64      `json:"sigma,omitempty"`
	Tensors []TensorInfo `json:"tensors"`
}

// Delta is one participant's update of one domain: ΔW [Out][In] row-major
// per adapted base matrix, in the order of Header.Tensors.
type Delta struct {
	Header
	W [][]float32
}

// domainRe is what a domain name may be: identifiers only, never text.
var domainRe = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,63}$`)

// tensorRe is what a tensor name may be.
var tensorRe = regexp.MustCompile(`^blk\.[0-9]{1,4}\.[a-z_]{1,32}\.weight$`)

// FromAdapter makes the delta of adapter a: for every pair,
// ΔW = (Alpha/Rank)·B·A, float64 accumulation. Errors: a bad domain name
// or sample count.
func FromAdapter(a *lora.Adapter, round uint64, domain string, base Base, samples int64) (*Delta, error) {
	if !domainRe.MatchString(domain) {
		return nil, fmt.Errorf("domain %q: want lower-case letters, digits, '_', '.', '-'", domain)
	}
	if samples <= 0 {
		return nil, fmt.Errorf("sample count %d: must be positive", samples)
	}
	d := &Delta{Header: Header{Round: round, Domain: domain, Base: base, Samples: samples, Rank: a.Rank, DType: F16}}
	s := float64(a.Scale())
	r := a.Rank
	for _, p := range a.Pairs {
		w := make([]float32, p.Out*p.In)
		row := make([]float64, p.In)
		for o := range p.Out {
			clear(row)
			for k := range r {
				b := float64(p.B[o*r+k]) * s
				if b == 0 {
					continue
				}
				ak := p.A[k*p.In : (k+1)*p.In]
				for i, v := range ak {
					row[i] += b * float64(v)
				}
			}
			for i, v := range row {
				w[o*p.In+i] = float32(v)
			}
		}
		d.Tensors = append(d.Tensors, TensorInfo{Name: p.Name, Out: p.Out, In: p.In})
		d.W = append(d.W, w)
	}
	return d, nil
}

// Norm is the L2 norm of the whole update (all matrices concatenated).
func (d *Delta) Norm() float64 {
	var s float64
	for _, w := range d.W {
		for _, v := range w {
			s += float64(v) * float64(v)
		}
	}
	return math.Sqrt(s)
}

// maxF16 is the largest finite binary16 value.
const maxF16 = 65504

// Encode writes d in the wire format (package doc). Errors: a header that
// does not describe the payload, a value that is not finite or (for f16)
// beyond ±65504.
func (d *Delta) Encode() ([]byte, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	for t, w := range d.W {
		for _, v := range w {
			if f := float64(v); math.IsNaN(f) || math.IsInf(f, 0) || (d.DType == F16 && math.Abs(f) > maxF16) {
				return nil, fmt.Errorf("tensor %s holds %g, which %s cannot carry", d.Tensors[t].Name, v, d.DType)
			}
		}
	}
	hj, err := json.Marshal(d.Header)
	if err != nil {
		return nil, err
	}
	size := len(Magic) + 4 + len(hj)
	width := 2
	if d.DType == F32 {
		width = 4
	}
	for _, t := range d.Tensors {
		size += width * t.Out * t.In
	}
	out := make([]byte, 0, size)
	out = append(out, Magic...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(hj)))
	out = append(out, hj...)
	for _, w := range d.W {
		for _, v := range w {
			if width == 2 {
				out = binary.LittleEndian.AppendUint16(out, float16.Fromfloat32(v).Bits())
			} else {
				out = binary.LittleEndian.AppendUint32(out, math.Float32bits(v))
			}
		}
	}
	return out, nil
}

// check verifies the header describes W and holds only identifiers.
func (d *Delta) check() error {
	h := d.Header
	switch {
	case !domainRe.MatchString(h.Domain):
		return fmt.Errorf("%w: domain %q is not an identifier", ErrMalformed, h.Domain)
	case h.Samples <= 0:
		return fmt.Errorf("%w: sample count %d", ErrMalformed, h.Samples)
	case h.DType != F16 && h.DType != F32:
		return fmt.Errorf("%w: dtype %q (want f16 or f32)", ErrMalformed, h.DType)
	case len(h.Tensors) == 0 || len(h.Tensors) > MaxTensors:
		return fmt.Errorf("%w: %d tensors (want 1..%d)", ErrMalformed, len(h.Tensors), MaxTensors)
	case len(d.W) != len(h.Tensors):
		return fmt.Errorf("%w: %d matrices for %d tensors", ErrMalformed, len(d.W), len(h.Tensors))
	case h.Rank < 0 || h.Clip < 0 || h.Sigma < 0:
		return fmt.Errorf("%w: negative rank, clip or sigma", ErrMalformed)
	}
	seen := map[string]bool{}
	for i, t := range h.Tensors {
		if !tensorRe.MatchString(t.Name) || seen[t.Name] {
			return fmt.Errorf("%w: tensor name %q (repeated or not blk.N.target.weight)", ErrMalformed, t.Name)
		}
		seen[t.Name] = true
		if t.Out <= 0 || t.In <= 0 || t.Out > 1<<20 || t.In > 1<<20 || len(d.W[i]) != t.Out*t.In {
			return fmt.Errorf("%w: tensor %s shape %d×%d does not fit its %d values", ErrMalformed, t.Name, t.Out, t.In, len(d.W[i]))
		}
	}
	return nil
}

// DecodeDelta reads an encoded delta of at most max bytes (0:
// DefaultMaxDeltaBytes). Errors: ErrTooLarge; ErrMalformed with the
// reason (bad magic, header, shapes, payload length, a value that is not
// finite).
func DecodeDelta(b []byte, max int) (*Delta, error) {
	if max <= 0 {
		max = DefaultMaxDeltaBytes
	}
	if len(b) > max {
		return nil, fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooLarge, len(b), max)
	}
	if !bytes.HasPrefix(b, []byte(Magic)) || len(b) < len(Magic)+4 {
		return nil, fmt.Errorf("%w: not a Molly federation delta (bad magic)", ErrMalformed)
	}
	b = b[len(Magic):]
	hl := int(binary.LittleEndian.Uint32(b))
	b = b[4:]
	if hl > MaxHeaderBytes || hl > len(b) {
		return nil, fmt.Errorf("%w: header of %d bytes in %d", ErrMalformed, hl, len(b))
	}
	var d Delta
	dec := json.NewDecoder(bytes.NewReader(b[:hl]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d.Header); err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrMalformed, err)
	}
	body := b[hl:]
	width := 2
	if d.DType == F32 {
		width = 4
	}
	need := 0
	for _, t := range d.Tensors {
		if t.Out <= 0 || t.In <= 0 || t.Out > 1<<20 || t.In > 1<<20 {
			return nil, fmt.Errorf("%w: tensor %q shape %d×%d", ErrMalformed, t.Name, t.Out, t.In)
		}
		need += width * t.Out * t.In
		if need > len(body) {
			break
		}
	}
	if need != len(body) {
		return nil, fmt.Errorf("%w: payload of %d bytes, the header describes %d", ErrMalformed, len(body), need)
	}
	for _, t := range d.Tensors {
		w := make([]float32, t.Out*t.In)
		for i := range w {
			var v float32
			if width == 2 {
				v = float16.Frombits(binary.LittleEndian.Uint16(body)).Float32()
			} else {
				v = math.Float32frombits(binary.LittleEndian.Uint32(body))
			}
			body = body[width:]
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return nil, fmt.Errorf("%w: tensor %s holds a value that is not finite", ErrMalformed, t.Name)
			}
			w[i] = v
		}
		d.W = append(d.W, w)
	}
	if len(d.Tensors) > 0 && len(d.W) == 0 {
		return nil, fmt.Errorf("%w: no matrices", ErrMalformed)
	}
	if err := d.check(); err != nil {
		return nil, err
	}
	return &d, nil
}
