package pipeline

import "github.com/molly-gateway/molly/router/route"

// single is the plain strategy: the first candidate that answers, trying
// the next on any failure before anything reached the client (fallback).
func (p *Pipeline) single(rq *request, cands []route.Candidate) error {
	for _, c := range cands {
		o := p.send(rq, c, 0)
		if o.kind == failClientGone {
			return p.clientGone(rq, &o)
		}
		if !o.ok() {
			rq.note(o)
			continue
		}
		return p.respond(rq, &o, "")
	}
	return noTarget("All allowed targets for model `"+rq.a.Model()+"` failed", rq.plan.Excluded, rq.tried)
}
