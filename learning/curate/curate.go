// Package curate turns traces into training sets: pairs grouped by domain
// (the capability estimator's task category, which is also the name of
// the T0 adapter serving it), filtered by their quality signals, with the
// answers of higher tiers as teacher targets (knowledge distillation:
// Hinton, Vinyals & Dean, "Distilling the Knowledge in a Neural Network",
// 2015 — here on the teacher's sampled text, sequence-level, as Kim &
// Rush, "Sequence-Level Knowledge Distillation", EMNLP 2016), exact and
// near-duplicates removed (MinHash over word shingles: Broder, "On the
// resemblance and containment of documents", 1997), and a held-out split
// chosen by a hash of the prompt, so a prompt is held out in every cycle or
// in none and never enters training once it was used to evaluate. It
// reads and writes OpenAI's chat fine-tuning JSONL.
package curate

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"slices"
	"strings"
	"unicode"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/learning/eval"
	"github.com/molly-gateway/molly/registry"
)

// Options configure Curate; zero values take the defaults.
type Options struct {
	// HeldOut is the share of prompts held out for evaluation (default 0.2).
	HeldOut float64
	// NearDuplicate is the estimated Jaccard similarity of word 3-shingles
	// at or above which a pair counts as a near-duplicate of an earlier
	// one (default 0.8).
	NearDuplicate float64
	// MinLogprob drops answers whose mean token log-probability (when the
	// tier reported one) is below it; 0: no such filter.
	MinLogprob float64
	// MaxAnswerBytes drops longer answers (default 8192).
	MaxAnswerBytes int
}

func (o *Options) defaults() {
	if o.HeldOut <= 0 || o.HeldOut >= 1 {
		o.HeldOut = 0.2
	}
	if o.NearDuplicate <= 0 || o.NearDuplicate > 1 {
		o.NearDuplicate = 0.8
	}
	if o.MaxAnswerBytes <= 0 {
		o.MaxAnswerBytes = 8192
	}
}

// Report counts what curation kept and why it dropped the rest.
type Report struct {
	Seen        int                  `json:"seen"`
	Kept        int                  `json:"kept"`
	Train       int                  `json:"train"`
	HeldOut     int                  `json:"held_out"`
	Teacher     int                  `json:"teacher"` // kept pairs whose answer came from a tier above T0
	Edited      int                  `json:"edited"`  // kept pairs whose answer is the client's correction
	Dropped     map[string]int       `json:"dropped"` // by reason
	Duplicates  int                  `json:"duplicates"`
	NearDupes   int                  `json:"near_duplicates"`
	TraceIDs    []int64              `json:"-"`
	TrainTraces []registry.TrainedOn `json:"-"`
}

// Drop reasons.
const (
	DropNoAnswer    = "no_answer"     // the request did not end in a delivered answer
	DropNegative    = "negative"      // explicit feedback below 0.5 and no correction
	DropSelf        = "self"          // a T0 answer without positive feedback: nothing to distil
	DropUnparseable = "unparseable"   // not a chat body of text messages (tools, images, ...)
	DropLowScore    = "low_logprob"   // under MinLogprob
	DropTooLong     = "answer_length" // over MaxAnswerBytes
)

// Curate builds the set name of domain from traces (any order; those of
// other categories are ignored).
func Curate(name, domain string, traces []registry.Trace, o Options) (registry.CuratedSet, Report) {
	o.defaults()
	rep := Report{Dropped: map[string]int{}}
	set := registry.CuratedSet{Name: name, Domain: domain, Source: "traces"}
	var cands []candidate
	for _, t := range traces {
		if t.Category != domain {
			continue
		}
		rep.Seen++
		c, why := pairOf(t, o)
		if why != "" {
			rep.Dropped[why]++
			continue
		}
		cands = append(cands, c)
	}
	kept := dedupe(cands, o.NearDuplicate, &rep)
	for _, c := range kept {
		it := c.item
		it.Split = Split(c.prompt, o.HeldOut)
		set.Items = append(set.Items, it)
		rep.Kept++
		if it.Split == registry.SplitTrain {
			rep.Train++
			rep.TrainTraces = append(rep.TrainTraces, registry.TrainedOn{TraceID: it.TraceID, Member: it.Member})
		} else {
			rep.HeldOut++
		}
		if it.Teacher != "" && it.Teacher != "T0" && !c.edited {
			rep.Teacher++
		}
		if c.edited {
			rep.Edited++
		}
		rep.TraceIDs = append(rep.TraceIDs, it.TraceID)
	}
	return set, rep
}

type candidate struct {
	item   registry.CuratedItem
	prompt string // normalised prompt text, for the split
	text   string // normalised prompt and answer, for duplicates
	edited bool
}

// pairOf is t as a training pair, or why it is not one.
func pairOf(t registry.Trace, o Options) (candidate, string) {
	switch t.Label {
	case "routed", "fallback", "escalated", "mixture":
	default:
		return candidate{}, DropNoAnswer
	}
	answer, edited := t.Answer, false
	switch {
	case t.Edit != "":
		answer, edited = t.Edit, true // the client's correction is the best target there is
	case t.Feedback >= 0 && t.Feedback < 0.5:
		return candidate{}, DropNegative
	case t.Tier == "T0" && t.Feedback < 0.5:
		return candidate{}, DropSelf
	}
	if strings.TrimSpace(answer) == "" {
		return candidate{}, DropNoAnswer
	}
	if len(answer) > o.MaxAnswerBytes {
		return candidate{}, DropTooLong
	}
	if o.MinLogprob < 0 && t.ScoreKind == "logprob" && !edited && t.Score < o.MinLogprob {
		return candidate{}, DropLowScore
	}
	msgs, ok := Messages([]byte(t.Request))
	if !ok {
		return candidate{}, DropUnparseable
	}
	mj, _ := json.Marshal(msgs)
	teacher := t.Tier
	if edited {
		teacher = "edit"
	}
	p := normalise(promptText(msgs))
	return candidate{
		item:   registry.CuratedItem{TraceID: t.ID, Member: t.Member, Teacher: teacher, Messages: string(mj), Answer: answer},
		prompt: p, text: p + "\n" + normalise(answer), edited: edited,
	}, ""
}

// Messages reads the chat messages of an OpenAI chat request body: every
// message must have a role among system, developer, user and assistant and
// string content (or text parts); a tool turn, tool calls or non-text
// parts make it unusable (ok false).
func Messages(body []byte) ([]eval.Message, bool) {
	ms := gjson.GetBytes(body, "messages")
	if !ms.IsArray() {
		return nil, false
	}
	var out []eval.Message
	ok := true
	ms.ForEach(func(_, m gjson.Result) bool {
		role := m.Get("role").String()
		switch role {
		case "system", "developer", "user", "assistant":
		default:
			ok = false
			return false
		}
		if m.Get("tool_calls").Exists() {
			ok = false
			return false
		}
		c := m.Get("content")
		var text string
		switch {
		case c.Type == gjson.String:
			text = c.Str
		case c.IsArray():
			c.ForEach(func(_, part gjson.Result) bool {
				if part.Get("type").String() != "text" {
					ok = false
					return false
				}
				text += part.Get("text").String()
				return true
			})
		default:
			ok = false
		}
		if role == "developer" {
			role = "system"
		}
		out = append(out, eval.Message{Role: role, Content: text})
		return ok
	})
	if !ok || len(out) == 0 || out[len(out)-1].Role == "assistant" {
		return nil, false
	}
	return out, true
}

func promptText(msgs []eval.Message) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString(m.Role)
		b.WriteString(": ")
		b.WriteString(m.Content)
		b.WriteByte('\n')
	}
	return b.String()
}

// normalise lower-cases s and collapses runs of non-letters-or-digits to
// one space, so duplicates differing in case, spacing or punctuation meet.
func normalise(s string) string {
	var b strings.Builder
	space := true
	for _, r := range s {
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			b.WriteRune(unicode.ToLower(r))
			space = false
			continue
		}
		if !space {
			b.WriteByte(' ')
			space = true
		}
	}
	return strings.TrimSpace(b.String())
}

// Split is the split of a prompt: SplitHeldOut when the first 8 bytes of
// SHA-256(prompt) read as a fraction fall below heldOut.
func Split(prompt string, heldOut float64) string {
	h := sha256.Sum256([]byte(prompt))
	if float64(binary.BigEndian.Uint64(h[:8]))/math.MaxUint64 < heldOut {
		return registry.SplitHeldOut
	}
	return registry.SplitTrain
}

// MinHash parameters: 64 permutations in 16 bands of 4 rows, so pairs of
// Jaccard similarity s share a band with probability 1−(1−s⁴)¹⁶ (0.9996
// at s = 0.8, 0.15 at s = 0.3); candidates are then checked against the
// threshold on the full signature (Leskovec, Rajaraman & Ullman, "Mining
// of Massive Datasets", ch. 3).
const (
	numHashes = 64
	bands     = 16
	rows      = numHashes / bands
	shingle   = 3 // words
)

// dedupe keeps the first of each group of exact duplicates (same
// normalised prompt and answer) and of near-duplicates (estimated
// Jaccard ≥ threshold), in input order.
func dedupe(cs []candidate, threshold float64, rep *Report) []candidate {
	seen := map[string]bool{}
	buckets := map[[2]uint64][]int{}
	var sigs [][numHashes]uint64
	var kept []candidate
	for _, c := range cs {
		if seen[c.text] {
			rep.Duplicates++
			continue
		}
		seen[c.text] = true
		sig := signature(c.text)
		near := false
		cand := map[int]bool{}
		for b := range bands {
			for _, j := range buckets[bandKey(sig, b)] {
				cand[j] = true
			}
		}
		for j := range cand {
			if similarity(sig, sigs[j]) >= threshold {
				near = true
				break
			}
		}
		if near {
			rep.NearDupes++
			continue
		}
		idx := len(sigs)
		sigs = append(sigs, sig)
		for b := range bands {
			k := bandKey(sig, b)
			buckets[k] = append(buckets[k], idx)
		}
		kept = append(kept, c)
	}
	return kept
}

func bandKey(sig [numHashes]uint64, b int) [2]uint64 {
	h := fnv.New64a()
	var buf [8]byte
	for _, v := range sig[b*rows : (b+1)*rows] {
		binary.LittleEndian.PutUint64(buf[:], v)
		h.Write(buf[:])
	}
	return [2]uint64{uint64(b), h.Sum64()}
}

// signature is the MinHash signature of text's word 3-shingles: for each
// of numHashes hash functions h_i(x) = mix(x ⊕ seed_i), the minimum over
// the shingles.
func signature(text string) [numHashes]uint64 {
	words := strings.Fields(text)
	var sig [numHashes]uint64
	for i := range sig {
		sig[i] = math.MaxUint64
	}
	n := max(1, len(words)-shingle+1)
	for s := range n {
		h := fnv.New64a()
		h.Write([]byte(strings.Join(words[s:min(s+shingle, len(words))], " ")))
		x := h.Sum64()
		for i := range sig {
			v := mix(x ^ (uint64(i+1) * 0x9e3779b97f4a7c15))
			if v < sig[i] {
				sig[i] = v
			}
		}
	}
	return sig
}

// mix is splitmix64's finaliser, a bijective mixing of 64 bits.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// similarity is the share of equal signature entries, an unbiased
// estimate of the Jaccard similarity of the shingle sets.
func similarity(a, b [numHashes]uint64) float64 {
	eq := 0
	for i := range a {
		if a[i] == b[i] {
			eq++
		}
	}
	return float64(eq) / numHashes
}

// Pairs converts the items of s with split ("" for every split) to
// evaluation pairs. Errors: an item whose messages are not JSON.
func Pairs(s registry.CuratedSet, split string) ([]eval.Pair, error) {
	var out []eval.Pair
	for i, it := range s.Items {
		if split != "" && it.Split != split {
			continue
		}
		var msgs []eval.Message
		if err := json.Unmarshal([]byte(it.Messages), &msgs); err != nil {
			return nil, fmt.Errorf("set %s item %d: %w", s.Name, i, err)
		}
		out = append(out, eval.Pair{Messages: msgs, Answer: it.Answer})
	}
	return out, nil
}

// WriteJSONL writes the items of s with split ("" for all) as OpenAI chat
// fine-tuning JSONL: {"messages": [..., {"role": "assistant", "content":
// answer}]} per line.
func WriteJSONL(w io.Writer, s registry.CuratedSet, split string) (int, error) {
	ps, err := Pairs(s, split)
	if err != nil {
		return 0, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	for _, p := range ps {
		msgs := append(slices.Clone(p.Messages), eval.Message{Role: "assistant", Content: p.Answer})
		if err := enc.Encode(map[string]any{"messages": msgs}); err != nil {
			return 0, err
		}
	}
	_, err = w.Write(buf.Bytes())
	return len(ps), err
}

// Import reads OpenAI chat fine-tuning JSONL from r as the curated set
// name of domain, deduplicated and split like traces. Errors: a malformed
// line (eval.ReadJSONL names it), an empty file.
func Import(name, domain string, r io.Reader, o Options) (registry.CuratedSet, Report, error) {
	o.defaults()
	ps, err := eval.ReadJSONL(r)
	if err != nil {
		return registry.CuratedSet{}, Report{}, err
	}
	if len(ps) == 0 {
		return registry.CuratedSet{}, Report{}, fmt.Errorf("no pairs to import")
	}
	rep := Report{Dropped: map[string]int{}, Seen: len(ps)}
	var cands []candidate
	for _, p := range ps {
		mj, _ := json.Marshal(p.Messages)
		pr := normalise(promptText(p.Messages))
		cands = append(cands, candidate{item: registry.CuratedItem{Messages: string(mj), Answer: p.Answer},
			prompt: pr, text: pr + "\n" + normalise(p.Answer)})
	}
	set := registry.CuratedSet{Name: name, Domain: domain, Source: "import"}
	for _, c := range dedupe(cands, o.NearDuplicate, &rep) {
		c.item.Split = Split(c.prompt, o.HeldOut)
		set.Items = append(set.Items, c.item)
		rep.Kept++
		if c.item.Split == registry.SplitTrain {
			rep.Train++
		} else {
			rep.HeldOut++
		}
	}
	return set, rep, nil
}
