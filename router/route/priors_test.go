package route

import (
	"errors"
	"math"
	"testing"
	"time"
)

func TestFeedback(t *testing.T) {
	key := PriorKey{"lan", "m", "chat"}
	t.Run("an unknown decision id is ErrUnknownDecision", func(t *testing.T) {
		if _, err := NewPriors().Feedback("nope", 1); !errors.Is(err, ErrUnknownDecision) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("a score moves the remembered candidate's prior from the quality it was chosen with", func(t *testing.T) {
		p := NewPriors()
		p.Remember("d1", key, 0.7)
		res, err := p.Feedback("d1", 0.2)
		if err != nil || res.Key != key || math.Abs(res.Quality-(0.9*0.7+0.1*0.2)) > 1e-12 || res.N != 1 {
			t.Fatalf("Feedback = %+v, %v; want quality 0.65 after 1", res, err)
		}
		if _, err := p.Feedback("d1", 1); !errors.Is(err, ErrFeedbackGiven) {
			t.Fatalf("second feedback err = %v, want ErrFeedbackGiven", err)
		}
	})
	t.Run("a score outside [0,1] is refused", func(t *testing.T) {
		p := NewPriors()
		p.Remember("d1", key, 0.7)
		for _, s := range []float64{-0.1, 1.5, math.NaN()} {
			if _, err := p.Feedback("d1", s); err == nil {
				t.Fatalf("score %v accepted", s)
			}
		}
	})
	t.Run("decisions older than the TTL are forgotten", func(t *testing.T) {
		now := time.Unix(1000, 0)
		p := &Priors{Now: func() time.Time { return now }}
		p.Remember("d1", key, 0.7)
		now = now.Add(DefaultDecisionTTL + time.Second)
		if _, err := p.Feedback("d1", 1); !errors.Is(err, ErrUnknownDecision) {
			t.Fatalf("err = %v, want ErrUnknownDecision", err)
		}
	})
	t.Run("a full memory forgets the oldest decision first", func(t *testing.T) {
		p := &Priors{DecisionCapacity: 2}
		p.Remember("d1", key, 0.7)
		p.Remember("d2", key, 0.7)
		p.Remember("d3", key, 0.7)
		if _, err := p.Feedback("d1", 1); !errors.Is(err, ErrUnknownDecision) {
			t.Fatalf("d1: err = %v, want ErrUnknownDecision", err)
		}
		for _, id := range []string{"d2", "d3"} {
			if _, err := p.Feedback(id, 1); err != nil {
				t.Fatalf("%s: %v", id, err)
			}
		}
	})
	t.Run("nil priors learn nothing and keep the seeds", func(t *testing.T) {
		var p *Priors
		if q, n := p.Quality(key, 0.4); q != 0.4 || n != 0 {
			t.Fatalf("Quality = %v, %d", q, n)
		}
		if q, err := p.ObserveQuality(key, 0.4, 1); q != 0.4 || err != nil {
			t.Fatalf("ObserveQuality = %v, %v", q, err)
		}
		p.ObserveLatency("lan", time.Second, time.Second)
		if _, ok := p.Latency("lan", false); ok {
			t.Fatal("nil priors learned a latency")
		}
	})
}

func TestPriorsSurviveARestartThroughTheirStore(t *testing.T) {
	store := &MemoryPriorStore{}
	p := NewPriors()
	if err := p.Attach(store); err != nil {
		t.Fatal(err)
	}
	p.Remember("d1", PriorKey{"lan", "m", "chat"}, 0.7)
	if _, err := p.Feedback("d1", 0); err != nil {
		t.Fatal(err)
	}
	p.ObserveLatency("lan", 100*time.Millisecond, 300*time.Millisecond)
	// Feedback is saved at once; the latency waits for a flush.
	if recs, _ := store.Load(); len(recs) != 1 || recs[0].Kind != PriorQuality || math.Abs(recs[0].Value-0.63) > 1e-12 {
		t.Fatalf("before Close the store holds %+v, want the quality 0.63 only", recs)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	again := NewPriors()
	if err := again.Attach(store); err != nil {
		t.Fatal(err)
	}
	if q, n := again.Quality(PriorKey{"lan", "m", "chat"}, 0.7); math.Abs(q-0.63) > 1e-12 || n != 1 {
		t.Fatalf("quality after restart = %v (%d), want 0.63 (1)", q, n)
	}
	if l, ok := again.Latency("lan", true); !ok || l != 0.1 {
		t.Fatalf("ttfb after restart = %v, %v; want 0.1", l, ok)
	}
}

func TestThroughputIsLearnedPerTargetAndModelAndSurvivesARestart(t *testing.T) {
	store := &MemoryPriorStore{}
	p := NewPriors()
	if err := p.Attach(store); err != nil {
		t.Fatal(err)
	}
	if _, ok := p.Throughput("lan", "m"); ok {
		t.Fatal("a throughput before any observation")
	}
	p.ObserveThroughput("lan", "m", 50, 2*time.Second) // 25 tokens/s replaces the empty prior
	p.ObserveThroughput("lan", "m", 0, time.Second)    // nothing generated: ignored
	if v, ok := p.Throughput("lan", "m"); !ok || v != 25 {
		t.Fatalf("throughput %v, %v; want 25", v, ok)
	}
	p.ObserveThroughput("lan", "m", 45, time.Second) // 45 tokens/s: EWMA 0.3·45 + 0.7·25 = 31
	if v, _ := p.Throughput("lan", "m"); math.Abs(v-31) > 1e-9 {
		t.Fatalf("throughput %v after a second observation, want 31", v)
	}
	if _, ok := p.Throughput("lan", "other"); ok {
		t.Fatal("throughput leaked to another model")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	again := NewPriors()
	if err := again.Attach(store); err != nil {
		t.Fatal(err)
	}
	if v, ok := again.Throughput("lan", "m"); !ok || math.Abs(v-31) > 1e-9 {
		t.Fatalf("throughput after restart %v, %v; want 31", v, ok)
	}
}
