package federation

import (
	"testing"
)

// benchDeltas are three deltas of the "small" demo base's default
// targets for one layer (attn_q 256×256, attn_v 128×256, ffn_up
// 768×256, ffn_down 256×768).
func benchDeltas() []*Delta {
	var ds []*Delta
	for k := range 3 {
		d := &Delta{Header: Header{Round: 1, Domain: "orders", Base: testBase, Samples: int64(10 + k), Rank: 8, DType: F16}}
		for _, s := range []TensorInfo{{"blk.0.attn_q.weight", 256, 256}, {"blk.0.attn_v.weight", 128, 256},
			{"blk.0.ffn_up.weight", 768, 256}, {"blk.0.ffn_down.weight", 256, 768}} {
			w := make([]float32, s.Out*s.In)
			for i := range w {
				w[i] = float32((i*(k+3))%97-48) / 1000
			}
			d.Tensors, d.W = append(d.Tensors, s), append(d.W, w)
		}
		ds = append(ds, d)
	}
	return ds
}

// BenchmarkEncodeF32 is the baseline of BenchmarkEncodeF16.
func BenchmarkEncodeF32(b *testing.B) {
	d := benchDeltas()[0]
	d.DType = F32
	for b.Loop() {
		if _, err := d.Encode(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeF16(b *testing.B) {
	d := benchDeltas()[0]
	for b.Loop() {
		if _, err := d.Encode(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeF16(b *testing.B) {
	enc, _ := benchDeltas()[0].Encode()
	b.SetBytes(int64(len(enc)))
	for b.Loop() {
		if _, err := DecodeDelta(enc, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFedAvg is the baseline of BenchmarkFactorize: averaging is
// linear in the deltas' size, the SVD is what a round's close costs.
func BenchmarkFedAvg(b *testing.B) {
	ds := benchDeltas()
	for b.Loop() {
		FedAvg(ds)
	}
}

func BenchmarkFactorize(b *testing.B) {
	avg, _ := FedAvg(benchDeltas())
	for b.Loop() {
		if _, _, err := Factorize(avg, 8); err != nil {
			b.Fatal(err)
		}
	}
}
