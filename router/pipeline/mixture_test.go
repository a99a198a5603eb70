package pipeline

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/route"
)

func TestMixtureFusesTheBestOfK(t *testing.T) {
	const flat = "Summarise and translate this text" // summarisation and translation tie
	const sure = "hello"                             // chat alone
	if a := mustClassify(t, openai.EndpointChat, chatBody(flat)); a.TaskEntropy() <= route.DefaultMixtureEntropy {
		t.Fatalf("TaskEntropy of %q = %.4f, want above %v", flat, a.TaskEntropy(), route.DefaultMixtureEntropy)
	}
	if a := mustClassify(t, openai.EndpointChat, chatBody(sure)); a.TaskEntropy() > route.DefaultMixtureEntropy {
		t.Fatalf("TaskEntropy of %q = %.4f, want at most %v", sure, a.TaskEntropy(), route.DefaultMixtureEntropy)
	}
	ups, targets := cascadeTiers(t, [3]float64{-0.1, -0.1, -3})
	ledger := &memLedger{}
	url := chatURLFor(t, setup{targets: targets, edit: func(p *Pipeline) {
		p.Strategies.Mixture = &route.Mixture{Entropy: route.DefaultMixtureEntropy, K: 2}
	}}, ledger)

	t.Run("a flat category distribution asks the top k and returns the best by weight × prior × confidence", func(t *testing.T) {
		r := post(t, url, chatBody(flat))
		if r.status != 200 || r.header.Get(HeaderTarget) != "remote" || r.header.Get(HeaderPlan) != "mixture" {
			t.Fatalf("status %d target %q: %s", r.status, r.header.Get(HeaderTarget), r.body)
		}
		// 33 runes: 9 tokens + 6 = 15 prompt tokens, 256 assumed completion
		// tokens: cloud scores 0.9 − 10·271/1e6 = 0.89729, remote 0.6 −
		// 10·27.1/1e6 = 0.599729 (lan 0.5 is not asked). Fused: cloud
		// 1 · 0.9 · e^−3, remote e^(0.599729−0.89729) · 0.6 · e^−0.1.
		cloud := 0.9 * math.Exp(-3)
		remote := math.Exp(0.599729-0.89729) * 0.6 * math.Exp(-0.1)
		// Each member's answer: 5 + 5 tokens, cloud at 1 USD/1M, remote at 0.1.
		want := fmt.Sprintf("best=remote/m; cloud/m fused=%.4f, remote/m fused=%.4f; cost_usd=0.000011", cloud, remote)
		if got := r.header.Get(HeaderMixture); got != want {
			t.Errorf("%s = %q, want %q", HeaderMixture, got, want)
		}
		if got := gjson.Get(r.body, "choices.0.message.content").String(); got != "remote says: "+flat {
			t.Errorf("answer %q", got)
		}
		if lp := gjson.Get(r.body, "choices.0.logprobs"); lp.Type != gjson.Null {
			t.Errorf("logprobs the client did not ask for were returned: %s", lp.Raw)
		}
		if ups[0].Count() != 0 || ups[1].Count() != 1 || ups[2].Count() != 1 {
			t.Errorf("requests lan %d remote %d cloud %d, want 0 1 1", ups[0].Count(), ups[1].Count(), ups[2].Count())
		}
		got := ledger.take()
		var names []string
		var total float64
		for _, u := range got {
			names = append(names, u.Target)
			total += u.CostUSD
		}
		slices.Sort(names)
		if !slices.Equal(names, []string{"cloud", "remote"}) || math.Abs(total-0.000011) > 1e-12 {
			t.Errorf("usage recorded for %v costing %v USD, want cloud and remote costing 0.000011", names, total)
		}
	})

	t.Run("a sure category is routed to one target", func(t *testing.T) {
		before := ups[2].Count()
		r := post(t, url, chatBody(sure))
		if r.status != 200 || r.header.Get(HeaderTarget) != "cloud" || r.header.Get(HeaderMixture) != "" || r.header.Get(HeaderPlan) != "single" {
			t.Fatalf("status %d target %q mixture %q", r.status, r.header.Get(HeaderTarget), r.header.Get(HeaderMixture))
		}
		if ups[1].Count() != 1 || ups[2].Count() != before+1 {
			t.Errorf("remote %d cloud %d requests, want only cloud asked", ups[1].Count(), ups[2].Count()-before)
		}
		if got := ledger.take(); len(got) != 1 {
			t.Errorf("%d usage records, want 1", len(got))
		}
	})

	t.Run("when every member fails the rest are tried in order", func(t *testing.T) {
		ups, targets := cascadeTiers(t, [3]float64{-0.1, -0.1, -3})
		ups[1].Close()
		ups[2].Close()
		gw, _ := startGateway(t, setup{targets: targets, edit: func(p *Pipeline) {
			p.Strategies.Mixture = &route.Mixture{Entropy: route.DefaultMixtureEntropy}
		}})
		r := post(t, gw.URL+"/v1/chat/completions", chatBody(flat))
		if r.status != 200 || r.header.Get(HeaderTarget) != "lan" || r.header.Get(HeaderMixture) != "" {
			t.Fatalf("status %d target %q mixture %q: %s", r.status, r.header.Get(HeaderTarget), r.header.Get(HeaderMixture), r.body)
		}
	})
}
