package policies

import (
	"context"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// hotInput is a route decision's input as the pipeline passes it on the
// request path: the Subject's members, the identity and the catalogue's
// targets all converted once (PolicyMembers, identity.PolicyValue,
// Catalogue.PolicyTargets), the same input every request (a memo hit).
func hotInput(b *testing.B) Input {
	b.Helper()
	m, id, targets := typical()
	v, err := ValueOf(m)
	if err != nil {
		b.Fatal(err)
	}
	o := v.(ast.Object)
	s := memberSubject{valueSubject: valueSubject{subject: newSubject(m), v: v},
		req: o.Get(keyRequest), capability: o.Get(keyCapability), sov: o.Get(keySovereignty)}
	idv, err := ValueOf(id)
	if err != nil {
		b.Fatal(err)
	}
	conv := make([]any, len(targets))
	for i, t := range targets {
		if conv[i], err = ValueOf(t); err != nil {
			b.Fatal(err)
		}
	}
	return Input{Subject: s, Identity: idv, Targets: conv}
}

// capturingCore is a zapcore.Core that keeps the fields of the last entry
// without encoding them, so a benchmark can encode the line by itself.
type capturingCore struct {
	zapcore.LevelEnabler
	fields []zap.Field
}

func (c *capturingCore) With([]zap.Field) zapcore.Core { return c }
func (c *capturingCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	return ce.AddCore(e, c)
}
func (c *capturingCore) Write(_ zapcore.Entry, fs []zap.Field) error {
	c.fields = append(c.fields[:0], fs...)
	return nil
}
func (c *capturingCore) Sync() error { return nil }

// BenchmarkDecideHot measures Decide on the request path's input (memo
// hit), with no logger (the decision alone) and with a logger that keeps
// the fields without encoding them (what the request goroutine pays for
// the log line). BenchmarkDecisionLogLine measures encoding that line with
// zap's JSON encoder, as the server's logger does.
func BenchmarkDecideHot(b *testing.B) {
	ctx := context.Background()
	in := hotInput(b)
	for _, c := range []struct {
		name string
		log  *zap.Logger
	}{{"nop-log", zap.NewNop()}, {"fields", zap.New(&capturingCore{LevelEnabler: zap.InfoLevel})}} {
		b.Run(c.name, func(b *testing.B) {
			e, err := New(ctx, Options{Logger: c.log})
			if err != nil {
				b.Fatal(err)
			}
			if d := e.Decide(ctx, in).Decision(); !d.Allowed() {
				b.Fatalf("denied: %v", d.Reasons())
			}
			loop(b, func() { e.Decide(ctx, in) })
		})
	}
}

func BenchmarkDecisionLogLine(b *testing.B) {
	ctx := context.Background()
	in := hotInput(b)
	for _, memo := range []struct {
		name string
		size int
	}{{"memo-hit", 0}, {"evaluated", -1}} {
		b.Run(memo.name, func(b *testing.B) {
			core := &capturingCore{LevelEnabler: zap.InfoLevel}
			e, err := New(ctx, Options{Logger: zap.New(core), MemoSize: memo.size})
			if err != nil {
				b.Fatal(err)
			}
			e.Decide(ctx, in)
			e.Decide(ctx, in)
			fields := core.fields
			enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
			ent := zapcore.Entry{Message: "policy decision"}
			loop(b, func() {
				buf, err := enc.EncodeEntry(ent, fields)
				if err != nil {
					b.Fatal(err)
				}
				buf.Free()
			})
		})
	}
}
