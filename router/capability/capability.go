// Package capability is capability estimation: task category, difficulty
// and their uncertainty from the prompt, in one linear pass and without a
// model call.
package capability

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode"
)

// Task categories the estimator knows without any adapter. The domains of
// the T0 engine's adapters ("support", "billing", ...) join them when
// registered (see Estimator).
const (
	TaskChat           = "chat"
	TaskCoding         = "coding"
	TaskMath           = "math" // maths and step-by-step reasoning
	TaskExtraction     = "extraction"
	TaskSummarisation  = "summarisation"
	TaskTranslation    = "translation"
	TaskCreative       = "creative"
	TaskClassification = "classification"
	TaskEmbedding      = "embedding" // set for /v1/embeddings, never estimated
)

// Tasks lists the built-in categories in tie-break order.
var Tasks = []string{TaskChat, TaskCoding, TaskMath, TaskExtraction, TaskSummarisation, TaskTranslation, TaskCreative, TaskClassification}

// Estimate is the capability estimate of one prompt.
type Estimate struct {
	// Task is the winning category: a built-in one or a registered adapter domain.
	Task string
	// Difficulty is in [0,1]: the logistic of the difficulty features.
	Difficulty float64
	// Language is "en", "it", "fr", "de", "es" or "" (undecided), from
	// stop-word counts.
	Language string
	// Scores holds the raw score of every category that scored, winner
	// first; ties keep the order of Tasks, then domains alphabetically.
	Scores []CategoryScore
}

// CategoryScore is one category's linear score (sum of matched cue weights plus bias).
type CategoryScore struct {
	Task  string
	Score float64
}

// ChatBias is the score chat starts with; a category must beat it to win.
const ChatBias = 1.0

// MaxScanBytes bounds the text the cues are matched in: the first
// 12 KiB and the last 4 KiB of a longer text (cut at rune boundaries),
// so a multi-megabyte prompt costs what a 16 KiB one does, plus one
// counting pass over its bytes for the length. Instructions sit at the
// head of a prompt and questions at its tail; the middle of a long prompt
// is pasted material whose words should not pick the task.
const MaxScanBytes = 16 << 10

const headBytes = MaxScanBytes * 3 / 4

// Estimator is the capability estimator that runs in the request path. It
// is a linear classifier over hand-weighted cues — keyword and phrase cues
// in English and Italian (with French, German and Spanish translations),
// code fences and code-like syntax, arithmetic and maths symbols — one
// weight per cue, argmax wins (the bag-of-features linear model of
// fastText, Joulin et al. 2017, with weights set by hand, not learned).
// Chat has a bias of ChatBias: another category must collect more than
// that to win. Difficulty is a logistic over length, question count,
// reasoning and constraint cues, tool use, language and category, after
// the query-difficulty signals that RouteLLM (Ong et al. 2024) and Hybrid
// LLM (Ding et al., ICLR 2024) learn from text; ours are hand-set.
//
// Every phrase of every cue is in one Aho-Corasick automaton, compiled
// once per set of adapter domains; a prompt is normalised (lower case,
// accents folded, one token per symbol) and fed through it in a single
// pass over at most MaxScanBytes, without allocating except the returned
// Scores.
//
// Adapter domains: every name the domains function returns (the T0
// engine's adapter names, e.g. "billing" for "molly-demo:billing") becomes
// a category. Names with a built-in lexicon (support, billing, payments,
// legal, medical, hr) use it; any other name of at least three ASCII
// letters is matched as a word prefix (its stem without an English
// inflection, so "shipping" also matches "shipped"); other names never win.
//
// The labelled sets in testdata/ (in-sample, held-out, independent) and
// the accuracy each must keep are in capability_test.go.
//
// The zero value and the nil *Estimator have no adapter domains. Safe for
// concurrent use.
type Estimator struct {
	domains atomic.Pointer[func() []string]
	model   atomic.Pointer[model]
}

// NewEstimator returns an estimator whose adapter domains come from
// domains, called on every Estimate (nil: none).
func NewEstimator(domains func() []string) *Estimator {
	e := &Estimator{}
	e.SetDomains(domains)
	return e
}

// SetDomains replaces the function the adapter domains come from (nil:
// none). A new set of domains compiles a new automaton once, on the first
// Estimate that sees it.
func (e *Estimator) SetDomains(domains func() []string) {
	e.domains.Store(&domains)
}

// Estimate scores text (the last user message, or the prompt) and returns
// the task, difficulty, language and category scores. tools says whether
// the request declares tools or carries tool messages.
func (e *Estimator) Estimate(text string, tools bool) Estimate {
	m := e.current()
	st := m.pool.Get().(*state)
	z := m.scan(text, st)

	sc, has := st.scores, st.has
	clear(sc)
	clear(has)
	sc[0], has[0] = ChatBias, true
	for i, c := range m.cueCat {
		if c >= 0 && st.counts[i] > 0 {
			sc[c] += m.cueW[i]
			has[c] = true
		}
	}
	n := 0
	for _, h := range has {
		if h {
			n++
		}
	}
	out := Estimate{Scores: make([]CategoryScore, 0, n)}
	for i, h := range has {
		if h {
			out.Scores = append(out.Scores, CategoryScore{m.cats[i], sc[i]})
		}
	}
	slices.SortStableFunc(out.Scores, func(a, b CategoryScore) int {
		switch {
		case a.Score > b.Score:
			return -1
		case a.Score < b.Score:
			return 1
		}
		return 0
	})
	out.Task = out.Scores[0].Task
	out.Language = m.language(st)

	// The difficulty logit:
	//
	//	−1.6 + 0.5·ln(1+tokens/40) + 0.25·min(questions−1, 3) + 0.8·min(reasoning cues, 2)
	//	     + 0.3·min(constraints, 3) + 0.4·tools + 0.3·[code fence and > 20 lines] + 0.2·[not English]
	//	     + offset(task)
	//
	// so "hello" scores ≈ 0.12 and a long multi-part proof ≈ 0.9. Tokens
	// count the whole text (ceil(runes/4)); the rest the scanned window.
	lz := -1.6 + 0.5*math.Log1p(float64((runeCount(text)+3)/4)/40)
	if z.questions > 1 {
		lz += 0.25 * float64(min(z.questions-1, 3))
	}
	lz += 0.8 * float64(min(st.counts[m.reasoning], 2))
	lz += 0.3 * float64(min(st.counts[m.constraint], 3))
	if tools {
		lz += 0.4
	}
	if st.counts[m.fence] > 0 && z.lines > 20 {
		lz += 0.3
	}
	if out.Language != "en" {
		lz += 0.2
	}
	lz += difficultyOffset[out.Task]
	out.Difficulty = 1 / (1 + math.Exp(-lz))
	m.pool.Put(st)
	return out
}

// Entropy is the Shannon entropy (nats) of the softmax over the category
// scores: near 0 when one category dominates, ln(k) when k tie.
func (e Estimate) Entropy() float64 {
	if len(e.Scores) == 0 {
		return 0
	}
	top := e.Scores[0].Score
	var z float64
	for _, s := range e.Scores {
		z += math.Exp(s.Score - top)
	}
	var h float64
	for _, s := range e.Scores {
		p := math.Exp(s.Score-top) / z
		if p > 0 {
			h -= p * math.Log(p)
		}
	}
	return h
}

// difficultyOffset shifts the difficulty logit by category.
var difficultyOffset = map[string]float64{
	TaskMath: 0.6, TaskCoding: 0.5, TaskExtraction: 0.1, TaskClassification: -0.4, TaskChat: -0.4,
	TaskTranslation: -0.1, TaskSummarisation: 0, TaskCreative: 0, "legal": 0.3,
}

// model is the compiled estimator for one set of adapter domains.
type model struct {
	domains []string // sorted, unique
	cats    []string // Tasks, then the domains that are not one
	cueCat  []int32  // by cue: index in cats, -1 for counters
	cueW    []float64
	ac      *automaton

	fence, reasoning, constraint int32
	lang                         [len(stopWords)]int32

	pool sync.Pool // *state
}

// state is one Estimate's scratch memory, pooled per model.
type state struct {
	scanState
	scores []float64
	has    []bool
}

// scan feeds the window of text through the automaton.
func (m *model) scan(text string, st *state) normaliser {
	m.ac.start(&st.scanState)
	z := newNormaliser()
	head, tail := window(text)
	var out [3]byte
	for _, part := range [2]string{head, tail} {
		m.ac.scan(part, &z, &st.scanState)
		// The end of the head and of the text are newline tokens: no
		// phrase joins across the cut.
		m.ac.feed(out[:z.end(&out)], &st.scanState)
	}
	return z
}

// window returns the text the cues are matched in: all of text when it
// is at most MaxScanBytes, else its first headBytes and its last
// MaxScanBytes−headBytes, each cut back to a rune boundary.
func window(text string) (head, tail string) {
	if len(text) <= MaxScanBytes {
		return text, ""
	}
	h := headBytes
	for h > 0 && text[h]&0xC0 == 0x80 {
		h--
	}
	t := len(text) - (MaxScanBytes - headBytes)
	for t < len(text) && text[t]&0xC0 == 0x80 {
		t++
	}
	return text[:h], text[t:]
}

// language is the language with the most stop words, "" on a tie or none.
func (m *model) language(st *state) string {
	best, n, tie := -1, int32(0), false
	for i, c := range m.lang {
		switch n1 := st.counts[c]; {
		case n1 > n:
			best, n, tie = i, n1, false
		case n1 == n && n1 > 0:
			tie = true
		}
	}
	if best < 0 || tie {
		return ""
	}
	return stopWords[best].lang
}

// sameDomains reports whether ds holds exactly m's domains, in any order
// and with repeats, without allocating.
func (m *model) sameDomains(ds []string) bool {
	if slices.Equal(ds, m.domains) {
		return true
	}
	for _, d := range ds {
		if _, ok := slices.BinarySearch(m.domains, d); !ok {
			return false
		}
	}
	for _, d := range m.domains {
		if !slices.Contains(ds, d) {
			return false
		}
	}
	return true
}

// current returns the model for the domains registered now.
func (e *Estimator) current() *model {
	var ds []string
	if e == nil {
		return baseModel()
	}
	if f := e.domains.Load(); f != nil && *f != nil {
		ds = (*f)()
	}
	if m := e.model.Load(); m != nil && m.sameDomains(ds) {
		return m
	}
	m := modelFor(ds)
	e.model.Store(m)
	return m
}

// models caches compiled models by domain set, shared by all estimators;
// it is cleared when it holds maxModels (domain sets change when adapters
// are loaded, not per request).
var models struct {
	sync.Mutex
	m map[string]*model
}

const maxModels = 32

// baseModel is the model without adapter domains, for the nil Estimator.
var baseModel = sync.OnceValue(func() *model { return modelFor(nil) })

func modelFor(ds []string) *model {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	ds = slices.Compact(ds)
	key := strings.Join(ds, "\x00")
	models.Lock()
	defer models.Unlock()
	if m, ok := models.m[key]; ok {
		return m
	}
	m, err := compile(ds)
	if err != nil {
		// The lexicons are constants and adapter names are sanitised:
		// only a broken lexicon gets here, and TestLexiconsCompile fails.
		panic(fmt.Sprintf("capability: compiling the lexicons: %v", err))
	}
	if models.m == nil || len(models.m) >= maxModels {
		models.m = map[string]*model{}
	}
	models.m[key] = m
	return m
}

// compile builds the model for the sorted, unique domains ds.
func compile(ds []string) (*model, error) {
	m := &model{domains: ds, cats: slices.Clone(Tasks)}
	catIndex := map[string]int32{}
	for i, t := range Tasks {
		catIndex[t] = int32(i)
	}
	for _, d := range ds {
		if _, ok := catIndex[d]; !ok {
			catIndex[d] = int32(len(m.cats))
			m.cats = append(m.cats, d)
		}
	}
	var ps phraseSet
	var pairs []pair
	addCue := func(cat int32, w float64, c cueDef) error {
		id := int32(len(m.cueCat))
		m.cueCat = append(m.cueCat, cat)
		m.cueW = append(m.cueW, w)
		if c.any != "" {
			if err := ps.add(c.any, action{kind: actCount, cue: id}); err != nil {
				return err
			}
		}
		for _, n := range c.near {
			p := int32(len(pairs))
			pairs = append(pairs, pair{lo: int32(n.gap[0]), hi: int32(n.gap[1]), line: n.line})
			if err := ps.add(n.first, action{kind: actMark, pair: p}); err != nil {
				return err
			}
			if err := ps.add(n.then, action{kind: actThen, cue: id, pair: p}); err != nil {
				return err
			}
		}
		return nil
	}
	counter := func(phrases string) (int32, error) {
		id := int32(len(m.cueCat))
		return id, addCue(-1, 0, cueDef{any: phrases})
	}
	for _, c := range taskCues {
		if err := addCue(catIndex[c.cat], c.w, c); err != nil {
			return nil, fmt.Errorf("%s cue: %w", c.cat, err)
		}
	}
	for _, d := range ds {
		cues, ok := domainLexicons[d]
		if !ok {
			cues = unknownDomain(d)
		}
		for _, c := range cues {
			if err := addCue(catIndex[d], c.w, c); err != nil {
				return nil, fmt.Errorf("domain %s: %w", d, err)
			}
		}
	}
	var err error
	if m.fence, err = counter("```"); err != nil {
		return nil, err
	}
	if m.reasoning, err = counter(reasoningCues); err != nil {
		return nil, fmt.Errorf("reasoning cues: %w", err)
	}
	if m.constraint, err = counter(constraintCues); err != nil {
		return nil, fmt.Errorf("constraint cues: %w", err)
	}
	for i, sw := range stopWords {
		if m.lang[i], err = counter(sw.words); err != nil {
			return nil, fmt.Errorf("%s stop words: %w", sw.lang, err)
		}
	}
	m.ac = ps.build()
	m.ac.pairs = pairs
	ncues, ncats := len(m.cueCat), len(m.cats)
	m.pool.New = func() any {
		return &state{
			scanState: scanState{counts: make([]int32, ncues), marks: make([]int32, len(pairs))},
			scores:    make([]float64, ncats),
			has:       make([]bool, ncats),
		}
	}
	return m, nil
}

// unknownDomain is the cue of an adapter name without a lexicon: the word
// or its stem without an English inflection, as a prefix, weight 2. Names
// that are not plain ASCII words of three letters or more get no cue.
func unknownDomain(d string) []cueDef {
	name := strings.ToLower(d)
	if len(name) < 3 {
		return nil
	}
	for _, r := range name {
		if r > unicode.MaxASCII || !unicode.IsLetter(r) {
			return nil
		}
	}
	stem := name
	for _, suf := range []string{"ing", "ed", "es", "s"} {
		if len(stem)-len(suf) >= 4 && strings.HasSuffix(stem, suf) {
			stem = strings.TrimSuffix(stem, suf)
			break
		}
	}
	return []cueDef{{cat: d, w: 2, any: stem + "*"}}
}

// runeCount is utf8.RuneCountInString for valid UTF-8: the bytes that are
// not continuation bytes (0b10xxxxxx), counted sixteen at a time in the
// byte lanes of two words (a stray continuation byte in invalid UTF-8 is
// not counted).
func runeCount(s string) int {
	const high = 0x8080808080808080
	n := len(s)
	for len(s) >= 16 {
		// At most 127 rounds of two, so no byte lane passes 255.
		var lanes uint64
		for k := 0; k < 127 && len(s) >= 16; k++ {
			_ = s[15]
			w := uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
				uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
			v := uint64(s[8]) | uint64(s[9])<<8 | uint64(s[10])<<16 | uint64(s[11])<<24 |
				uint64(s[12])<<32 | uint64(s[13])<<40 | uint64(s[14])<<48 | uint64(s[15])<<56
			// 1 in a lane for each continuation byte: bit 7 set, bit 6 clear
			lanes += (w&^(w<<1)&high)>>7 + (v&^(v<<1)&high)>>7
			s = s[16:]
		}
		// Sum the eight byte lanes in 16-bit lanes.
		const even = 0x00FF00FF00FF00FF
		x := lanes&even + lanes>>8&even
		n -= int(x * 0x0001000100010001 >> 48)
	}
	for i := 0; i < len(s); i++ {
		if s[i]&0xC0 == 0x80 {
			n--
		}
	}
	return n
}

// EstimateTokens approximates the token count of text as ceil(runes/4),
// OpenAI's rule of thumb for English ("a token is about 4 characters",
// help.openai.com "What are tokens and how to count them").
func EstimateTokens(text string) int {
	return (runeCount(text) + 3) / 4
}

// BoundTokens is an upper bound on the tokens any tokenizer of the byte
// family gives text: its UTF-8 length in bytes. A byte-level BPE (GPT's
// tiktoken encodings, Llama 3, Qwen, …) and a SentencePiece model with
// byte fallback (Llama 2, Mistral, Gemma) make every token of at least one
// byte, so no text has more tokens than bytes — whatever its script, digits
// or punctuation, where EstimateTokens can be several times short (one CJK
// character is 3 bytes and about one token, an emoji up to 4 bytes and
// 2–3 tokens). Special tokens a chat template adds are not in text; the
// caller adds them. Admission reserves with it (Annotation.PromptBound),
// so that no prompt spends more than its reservation.
func BoundTokens(text string) int { return len(text) }
