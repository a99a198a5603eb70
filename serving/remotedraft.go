package serving

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/molly-gateway/molly/serving/llama"
)

// Drafting for a remote Molly engine (greedy speculative decoding across
// machines; Leviathan, Kalman and Matias, ICML 2023, the greedy case of
// their Algorithm 1): this engine's base model proposes up to K tokens
// greedily and the remote engine, the target, checks them in one decode
// (POST /molly/engine/verify, verify.go), answering how many it accepts and
// its own next token. Each round commits the accepted proposals and that
// token, all of them the remote's greedy choices, so the answer is the one
// the remote engine gives to the same request at temperature 0, token for
// token; only the number of remote decodes changes.
//
// The drafter has its own single-sequence context on the base model
// (ContextTokens cells, outside Config.MemoryBytes), created on first use;
// one drafted request runs at a time, and a request that finds it busy is
// declined (the caller sends it as usual). A request is drafted only when
// the remote would decode it greedily and as written (see remoteDraftable)
// and the remote engine shares this engine's tokenizer and chat template
// (VerifyInfo, compared by hash).

// RemoteVerifier is a remote engine's verification: Info describes it
// (GET /molly/engine/verify), Verify checks draft after prefix (POST; see
// Engine.Verify: accepted proposals, the next greedy token, whether it ends
// generation).
type RemoteVerifier interface {
	Info(ctx context.Context) (VerifyInfo, error)
	Verify(ctx context.Context, prefix, draft []int32) (accepted int, next int32, eog bool, err error)
}

// VerifyError is a verify endpoint's refusal: its HTTP status and OpenAI
// error fields.
type VerifyError struct {
	Status        int
	Code, Message string
}

func (e *VerifyError) Error() string {
	return fmt.Sprintf("remote verify: %d %s: %s", e.Status, e.Code, e.Message)
}

// infoRetry is how long HTTPVerifier keeps a failed Info before asking again.
const infoRetry = 30 * time.Second

// HTTPVerifier is a RemoteVerifier over HTTP: Info is GET URL, cached until
// a Verify call fails (a failed Info is kept for 30 s); Verify is POST URL
// with the cached hashes, so a remote that changed its model answers 409.
// Header is sent with every call (for example the remote's Authorization).
// Safe for concurrent use.
type HTTPVerifier struct {
	URL    string // e.g. http://10.0.0.5:8000/molly/engine/verify
	Header http.Header
	Client *http.Client // nil: http.DefaultClient

	mu      sync.Mutex
	info    *VerifyInfo
	infoErr error
	retryAt time.Time
}

func (v *HTTPVerifier) do(ctx context.Context, method string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, v.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	for k, vals := range v.Header {
		req.Header[k] = vals
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	c := v.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return &VerifyError{Status: resp.StatusCode, Code: gjson.GetBytes(b, "error.code").String(), Message: gjson.GetBytes(b, "error.message").String()}
	}
	return json.Unmarshal(b, out)
}

// Info fetches (once) and returns the remote engine's VerifyInfo. Errors:
// the transport's, a VerifyError, a body that is not VerifyInfo JSON.
func (v *HTTPVerifier) Info(ctx context.Context) (VerifyInfo, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.info != nil {
		return *v.info, nil
	}
	if v.infoErr != nil && time.Now().Before(v.retryAt) {
		return VerifyInfo{}, v.infoErr
	}
	var info VerifyInfo
	err := v.do(ctx, http.MethodGet, nil, &info)
	if err == nil && (info.VocabSHA256 == "" || info.ChatTemplateSHA256 == "") {
		err = errors.New("the verify endpoint's answer lacks vocab_sha256 or chat_template_sha256")
	}
	if err != nil {
		v.infoErr, v.retryAt = err, time.Now().Add(infoRetry)
		return VerifyInfo{}, err
	}
	v.info, v.infoErr = &info, nil
	return info, nil
}

// Verify posts prefix and draft. Errors: the transport's, a VerifyError
// (409 verify_mismatch when the remote's hashes changed), a malformed
// answer; each one drops the cached Info.
func (v *HTTPVerifier) Verify(ctx context.Context, prefix, draft []int32) (int, int32, bool, error) {
	v.mu.Lock()
	info := v.info
	v.mu.Unlock()
	body := map[string]any{"prefix": prefix, "draft": draft}
	if draft == nil {
		body["draft"] = []int32{}
	}
	if info != nil {
		body["vocab_sha256"], body["chat_template_sha256"] = info.VocabSHA256, info.ChatTemplateSHA256
	}
	b, err := json.Marshal(body)
	if err != nil {
		return 0, 0, false, err
	}
	var out struct {
		Accepted *int   `json:"accepted"`
		Next     *int32 `json:"next"`
		EOG      bool   `json:"eog"`
	}
	err = v.do(ctx, http.MethodPost, b, &out)
	if err == nil && (out.Accepted == nil || out.Next == nil || *out.Accepted < 0 || *out.Accepted > len(draft)) {
		err = fmt.Errorf("remote verify: malformed answer (accepted of %d proposals, next)", len(draft))
	}
	if err != nil {
		if ctx.Err() == nil {
			v.mu.Lock()
			v.info = nil
			v.mu.Unlock()
		}
		return 0, 0, false, err
	}
	return *out.Accepted, *out.Next, out.EOG, nil
}

// RemoteDraft is drafting against one remote engine: its Verifier, the
// Tokens proposed per round (default 4) and Logf, which is told (once per
// distinct reason, nil for silence) why requests are not drafted.
type RemoteDraft struct {
	Verifier RemoteVerifier
	Tokens   int
	Logf     func(format string, args ...any)

	mu     sync.Mutex
	logged string
}

func (d *RemoteDraft) logOnce(reason string) {
	if d.Logf == nil {
		return
	}
	d.mu.Lock()
	same := d.logged == reason
	d.logged = reason
	d.mu.Unlock()
	if !same {
		d.Logf("remote drafting off: %s", reason)
	}
}

// RemoteDraftStats counts drafting for remote engines since the engine
// started: Requests answered by drafting, Declined ones (not eligible, the
// drafter busy, the remote not matching or failing before the first token:
// sent as usual), Rounds (verify calls, each committing its accepted
// proposals plus one token), Proposed and Accepted draft tokens
// (Accepted/Proposed is the acceptance rate).
type RemoteDraftStats struct {
	Requests, Declined, Rounds, Proposed, Accepted int64
}

// RemoteDraftStats reports the remote drafting counters.
func (e *Engine) RemoteDraftStats() RemoteDraftStats {
	s := &e.drafter
	return RemoteDraftStats{Requests: s.requests.Load(), Declined: s.declined.Load(), Rounds: s.rounds.Load(), Proposed: s.proposed.Load(), Accepted: s.accepted.Load()}
}

// drafterState is the drafter's context (created on first use) and counters.
type drafterState struct {
	once  sync.Once
	mu    sync.Mutex // one drafted request at a time (TryLock)
	err   error
	ctx   *llama.Context
	batch *llama.Batch

	requests, declined, rounds, proposed, accepted atomic.Int64
}

func (s *drafterState) close() {
	s.mu.Lock() // a running drafted request stops at e.quit
	defer s.mu.Unlock()
	if s.ctx != nil {
		s.batch.Free()
		s.ctx.Close()
		s.ctx = nil
	}
}

// remoteDraftable reports why a chat body must not be drafted ("" when it
// may): drafting reproduces only a greedy decode of the request as written,
// so the body must ask for temperature 0 explicitly (an absent temperature
// is 1 on a Molly engine) and carry no reasoning or n_chains fields; the
// rest (n, stop, logprobs, tools, response_format) is checked on the
// parsed request.
func remoteDraftable(body []byte) string {
	if t := gjson.GetBytes(body, "temperature"); t.Type != gjson.Number || t.Num != 0 {
		return "temperature is not 0"
	}
	for _, f := range []string{"reasoning_effort", "max_reasoning_tokens", "min_reasoning_tokens", "n_chains"} {
		if gjson.GetBytes(body, f).Exists() {
			return f + " is set"
		}
	}
	return ""
}

// ServeRemoteDraft answers a POST /v1/chat/completions body as the remote
// engine behind d.Verifier would at temperature 0, drafting with this
// engine's base model: the OpenAI answer (stream or not, with the body's
// model name and exact usage; no prompt_tokens_details) is written to w
// and true returned. It returns false, having written nothing, when the
// request is not drafted: not greedy or not n=1, stop strings, logprobs,
// logit_bias or penalties,
// tools, response_format, reasoning or n_chains fields, a model name other
// than the remote's base, a prompt this engine cannot parse or that does
// not fit the remote's context, the remote's Info failing or differing from
// this engine's VerifyInfo (vocabulary, chat template) or not Plain, the
// drafter busy, or the first verification failing; the caller then sends
// the request to the remote as usual. A verify failure after the first
// round ends the answer with an error (502 upstream_error, or an error
// event on a stream).
func (e *Engine) ServeRemoteDraft(w http.ResponseWriter, r *http.Request, body []byte, d *RemoteDraft) bool {
	st := &e.drafter
	decline := func(reason string) bool {
		st.declined.Add(1)
		if reason != "" {
			d.logOnce(reason)
		}
		return false
	}
	if !strings.HasSuffix(strings.TrimSuffix(r.URL.Path, "/"), "/chat/completions") || remoteDraftable(body) != "" {
		return decline("")
	}
	model := gjson.GetBytes(body, "model").String()
	local, err := sjson.SetBytes(body, "model", e.cfg.ModelName)
	if err != nil {
		return decline("")
	}
	cr, req, err := e.parseRequest(local, true, false)
	if err != nil || req.N != 1 || req.Adapter != "" || req.Reasoning != nil || cr.chains > 1 ||
		(cr.plan != nil && (cr.plan.tools || cr.plan.grammar != "")) || len(req.Params.Stop) > 0 || req.Params.Logprobs || req.Params.Temperature != 0 ||
		req.Params.adjusts() {
		return decline("")
	}
	ctx := r.Context()
	info, err := d.Verifier.Info(ctx)
	mine := e.VerifyInfo()
	switch {
	case err != nil:
		return decline(fmt.Sprintf("the remote verify endpoint: %v", err))
	case info.VocabSHA256 != mine.VocabSHA256:
		return decline(fmt.Sprintf("the remote engine %q has another tokenizer (vocab_sha256 %s, this engine's %s)", info.Model, info.VocabSHA256, mine.VocabSHA256))
	case info.ChatTemplateSHA256 != mine.ChatTemplateSHA256:
		return decline(fmt.Sprintf("the remote engine %q has another chat template (chat_template_sha256 %s, this engine's %s)", info.Model, info.ChatTemplateSHA256, mine.ChatTemplateSHA256))
	case !info.Plain:
		return decline(fmt.Sprintf("the remote engine %q changes base-model requests (reasoning switcher or default n_chains)", info.Model))
	case model != info.Model:
		return decline("") // an adapter or another name: the remote answers it itself
	case len(req.Prompt) >= info.ContextTokens:
		return decline("") // the remote's own 400
	}
	if !st.mu.TryLock() {
		return decline("")
	}
	defer st.mu.Unlock()
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return decline("")
	}
	st.once.Do(func() {
		nb := e.cfg.NBatch
		st.ctx, st.err = llama.NewContext(e.model, llama.ContextParams{NCtx: e.nCtxSeq, NBatch: nb, NSeqMax: 1, Threads: e.cfg.Threads, TypeK: e.cfg.KVCacheType, TypeV: e.cfg.KVCacheType})
		if st.err == nil {
			st.batch = llama.NewBatch(nb)
		}
	})
	if st.err != nil {
		return decline(fmt.Sprintf("the drafter's context: %v", st.err))
	}
	if st.ctx == nil {
		return decline("") // closed
	}
	k := d.Tokens
	if k <= 0 {
		k = defaultDraftTokens
	}
	maxTok := info.ContextTokens - len(req.Prompt)
	if req.Params.MaxTokens > 0 {
		maxTok = min(maxTok, req.Params.MaxTokens)
	}
	s := &draftSession{e: e, st: st, v: d.Verifier, k: k, seq: append([]int32(nil), req.Prompt...), nPrompt: len(req.Prompt), maxTok: maxTok, remoteCtx: info.ContextTokens}
	st.ctx.Clear()
	first, eog, err := s.round(ctx)
	if err != nil {
		return decline(fmt.Sprintf("the first verification: %v", err))
	}
	st.requests.Add(1)
	cr.Model = model
	gen := func(ctx context.Context, _ Request, onEvent func(Event) error) (Usage, error) {
		return s.generate(ctx, first, eog, onEvent)
	}
	id, created := newID("chatcmpl-"), time.Now().Unix()
	if cr.Stream {
		e.stream(w, ctx, cr, req, true, id, "chat.completion.chunk", created, gen)
	} else {
		e.respond(w, ctx, cr, req, true, id, "chat.completion", created, gen)
	}
	return true
}

// draftSession is one drafted request: seq is the prompt and the committed
// tokens, dpos how many of them the drafter's context holds (from position
// 0).
type draftSession struct {
	e         *Engine
	st        *drafterState
	v         RemoteVerifier
	k         int
	seq       []int32
	nPrompt   int
	dpos      int
	maxTok    int // completion tokens at most
	remoteCtx int // the remote's tokens per request
	props     []int32
}

// round drafts up to k tokens after seq, has the remote verify them and
// appends what it commits (accepted proposals and its next token) to seq,
// returning those tokens and whether the last ends generation. Errors:
// llama.cpp failures, the verifier's.
func (s *draftSession) round(ctx context.Context) ([]int32, bool, error) {
	m, c, b := s.e.model, s.st.ctx, s.st.batch
	n := len(s.seq)
	// Every commit takes at least one token of the budget, and the remote's
	// verify must fit its context: n + proposals < remoteCtx. The drafter
	// decodes seq and all proposals but the last within its own context.
	k := min(s.k, s.maxTok-(n-s.nPrompt)-1, s.remoteCtx-n-1, c.NCtx()-n, b.Cap())
	s.props = s.props[:0]
	if k > 0 {
		// Decode what the drafter lacks, in batch-sized chunks, with logits
		// for the last token.
		for i := s.dpos; i < n; {
			b.Clear()
			for ; i < n && b.Len() < b.Cap(); i++ {
				b.Add(s.seq[i], i, 0, i == n-1)
			}
			if err := c.Decode(b); err != nil {
				return nil, false, fmt.Errorf("draft decode: %w", err)
			}
		}
		s.dpos = n
		for {
			d := argmax(c.LogitsView(b.Len() - 1))
			s.props = append(s.props, d)
			if len(s.props) == k || m.IsEOG(d) {
				break
			}
			b.Clear()
			b.Add(d, s.dpos, 0, true)
			if err := c.Decode(b); err != nil {
				return nil, false, fmt.Errorf("draft decode: %w", err)
			}
			s.dpos++
		}
	}
	acc, next, eog, err := s.v.Verify(ctx, s.seq, s.props)
	if err != nil {
		return nil, false, err
	}
	if acc < 0 || acc > len(s.props) {
		return nil, false, fmt.Errorf("remote verify accepted %d of %d proposals", acc, len(s.props))
	}
	st := s.st
	st.rounds.Add(1)
	st.proposed.Add(int64(len(s.props)))
	st.accepted.Add(int64(acc))
	// The drafter keeps the KV of seq and the accepted proposals.
	if kept := n + acc; s.dpos > kept {
		c.SeqRm(0, kept, -1)
		s.dpos = kept
	}
	s.seq = append(append(s.seq, s.props[:acc]...), next)
	return s.seq[n:], eog, nil
}

// generate delivers the committed tokens, from the first round's on, as
// events (UTF-8 held back until complete) until the remote's end of
// generation ("stop"), the token budget or the remote's context
// ("length"). Same contract as Generate; verify failures are 502
// upstream_error.
func (s *draftSession) generate(ctx context.Context, commit []int32, eog bool, onEvent func(Event) error) (Usage, error) {
	e := s.e
	u := Usage{PromptTokens: s.nPrompt}
	var text []byte
	sent := 0
	flush := func(finish string) error {
		end := len(text)
		if finish == "" {
			end -= holdBack(text[sent:], nil)
		}
		if end == sent && finish == "" {
			return nil
		}
		ev := Event{Text: string(text[sent:end]), Finish: finish}
		sent = end
		return onEvent(ev)
	}
	finish := ""
	for finish == "" {
		for i, tok := range commit {
			if (i == len(commit)-1 && eog) || e.model.IsEOG(tok) {
				finish = "stop"
				break
			}
			u.CompletionTokens++
			text = append(text, e.model.TokenPiece(tok)...)
			if u.CompletionTokens >= s.maxTok {
				finish = "length"
				break
			}
		}
		if finish != "" {
			break
		}
		if err := flush(""); err != nil {
			return Usage{}, err
		}
		select {
		case <-e.quit:
			return Usage{}, ErrClosed
		default:
		}
		if err := ctx.Err(); err != nil {
			return Usage{}, err
		}
		var err error
		if commit, eog, err = s.round(ctx); err != nil {
			if ctx.Err() != nil {
				return Usage{}, ctx.Err()
			}
			return Usage{}, &apiError{http.StatusBadGateway, "server_error", "", "upstream_error", err.Error()}
		}
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u, flush(finish)
}

// RemoteDrafter returns ServeRemoteDraft for the remote engine whose verify
// endpoint is verifyURL (an HTTPVerifier sending header, over client),
// proposing tokens per round (0: 4), telling logf why requests are not
// drafted: the gateway's hook for a target with draft_with_engine
// (router/egress.Drafter).
func (e *Engine) RemoteDrafter(verifyURL string, header http.Header, client *http.Client, tokens int, logf func(format string, args ...any)) func(http.ResponseWriter, *http.Request, []byte) bool {
	d := &RemoteDraft{Verifier: &HTTPVerifier{URL: verifyURL, Header: header, Client: client}, Tokens: tokens, Logf: logf}
	return func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		return e.ServeRemoteDraft(w, r, body, d)
	}
}
