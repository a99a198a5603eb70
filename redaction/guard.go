package redaction

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// Output guarding: answers (whole or streamed) are scanned with the same
// detectors as requests, and each value the model wrote is passed, masked
// or makes the answer blocked, per entity type, as a GuardPolicy says
// (the gateway fills it from redaction.rego per tier). Values the gateway
// itself put back (restored placeholders) are not flagged: the caller
// lists them when it builds the Guard (Vault.Values).

// GuardAction is what a Guard does with a value of one type in an answer.
type GuardAction int

const (
	// GuardPass leaves the value as the model wrote it.
	GuardPass GuardAction = iota
	// GuardMask replaces it by its bare type, "[EMAIL]".
	GuardMask
	// GuardBlock stops the answer: Check and the stream guard return a
	// *BlockedError (errors.Is(err, ErrAnswerBlocked)).
	GuardBlock
)

// String returns "pass", "mask" or "block".
func (a GuardAction) String() string {
	switch a {
	case GuardPass:
		return "pass"
	case GuardMask:
		return "mask"
	case GuardBlock:
		return "block"
	}
	return fmt.Sprintf("GuardAction(%d)", int(a))
}

// ParseGuardAction parses "pass", "mask" or "block" (Rego data); anything
// else is an error naming it.
func ParseGuardAction(s string) (GuardAction, error) {
	switch s {
	case "pass", "":
		return GuardPass, nil
	case "mask":
		return GuardMask, nil
	case "block":
		return GuardBlock, nil
	}
	return 0, fmt.Errorf("redaction: unknown guard action %q (want pass, mask or block)", s)
}

// GuardPolicy says what to do with each entity type found in an answer.
type GuardPolicy struct {
	Actions map[string]GuardAction // by entity type
	Default GuardAction            // for types not in Actions
}

func (p GuardPolicy) action(typ string) GuardAction {
	if a, ok := p.Actions[typ]; ok {
		return a
	}
	return p.Default
}

// ErrAnswerBlocked is what a *BlockedError wraps.
var ErrAnswerBlocked = errors.New("redaction: the answer holds a value the policy blocks")

// BlockedError reports the type of the value that blocked an answer (never
// the value itself).
type BlockedError struct{ Type string }

func (e *BlockedError) Error() string {
	return "redaction: the answer holds a " + e.Type + " value the policy blocks"
}
func (e *BlockedError) Unwrap() error { return ErrAnswerBlocked }

// Guard applies a GuardPolicy to the answers of one request. It is safe
// for concurrent use; its stream guards are not.
type Guard struct {
	s       *Scanner
	policy  GuardPolicy
	allowed map[string]bool
	values  []string
	lens    []int // the distinct lengths of values, ascending
}

// NewGuard returns a guard for policy that does not flag the restored
// values (typically Vault.Values of the request's vault): a finding whose
// text is one of them, or part of one, is left alone.
func (s *Scanner) NewGuard(policy GuardPolicy, restored ...string) *Guard {
	g := &Guard{s: s, policy: policy, allowed: make(map[string]bool, len(restored))}
	for _, v := range restored {
		if v != "" && !g.allowed[v] {
			g.allowed[v] = true
			g.values = append(g.values, v)
			if !slices.Contains(g.lens, len(v)) {
				g.lens = append(g.lens, len(v))
			}
		}
	}
	slices.Sort(g.lens)
	return g
}

// restored reports whether v is, or is part of, a restored value, or is
// restored values written one after another (joined directly or by one
// space, '-' or '.'): the parts of a value the client split across two
// messages come back as two placeholders, "[EMAIL_1][EMAIL_2]", restored
// into the whole value, which no single restored value holds.
func (g *Guard) restored(v string) bool {
	if g.allowed[v] {
		return true
	}
	for _, a := range g.values {
		if len(a) > len(v) && strings.Contains(a, v) {
			return true
		}
	}
	return g.joined(v)
}

// joined reports whether v is two or more restored values, each directly
// after the one before or after one separator byte (' ', '-', '.'). It
// tries, at each reachable offset, one map look-up per distinct value
// length: O(len(v) × distinct lengths).
func (g *Guard) joined(v string) bool {
	if len(g.values) == 0 || len(v) < 2*g.lens[0] {
		return false
	}
	// reach[i]: v[:i] is restored values (and separators), ending in a value.
	reach := make([]bool, len(v)+1)
	reach[0] = true
	for i := 0; i < len(v); i++ {
		if !reach[i] {
			continue
		}
		from := []int{i}
		if i > 0 && i+1 < len(v) && (v[i] == ' ' || v[i] == '-' || v[i] == '.') {
			from = append(from, i+1)
		}
		for _, k := range from {
			for _, n := range g.lens {
				if k+n > len(v) {
					break
				}
				if (k > 0 || n < len(v)) && g.allowed[v[k:k+n]] {
					reach[k+n] = true
				}
			}
		}
	}
	return reach[len(v)]
}

// ScanAnswer returns the findings of answer the policy acts on (mask or
// block), under the scan budget (ErrScanBudget: treat the answer as
// unchecked). Restored values and GuardPass types are left out.
func (g *Guard) ScanAnswer(answer string) ([]Finding, error) {
	fs, err := g.s.ScanBounded(answer)
	return g.acted(answer, fs, fs[:0]), err
}

// acted appends to dst the findings fs of text the policy acts on: not
// of a GuardPass type, not restored values.
func (g *Guard) acted(text string, fs, dst []Finding) []Finding {
	for _, f := range fs {
		if g.policy.action(f.Type) != GuardPass && !g.restored(text[f.Start:f.End]) {
			dst = append(dst, f)
		}
	}
	return dst
}

// Check scans a whole answer and returns it with GuardMask values replaced
// by "[TYPE]", and the findings acted on. When a GuardBlock value is
// found it returns a *BlockedError and no text; when the scan budget runs
// out, an error wrapping ErrScanBudget and no text.
func (g *Guard) Check(answer string) (string, []Finding, error) {
	fs, err := g.ScanAnswer(answer)
	if err != nil {
		return "", fs, err
	}
	out, err := g.apply(answer, fs)
	return out, fs, err
}

// apply masks (or blocks on) findings fs of text.
func (g *Guard) apply(text string, fs []Finding) (string, error) {
	if len(fs) == 0 {
		return text, nil
	}
	var b strings.Builder
	last := 0
	for _, f := range fs {
		switch g.policy.action(f.Type) {
		case GuardBlock:
			return "", &BlockedError{Type: f.Type}
		case GuardMask:
			b.WriteString(text[last:f.Start])
			b.WriteString("[" + typeName(f.Type) + "]")
			last = f.End
		}
	}
	b.WriteString(text[last:])
	return b.String(), nil
}

// GuardHoldBytes is how many bytes of the normalised view (see normalise)
// a StreamGuard holds back from the end of what it has seen: the longest
// value any bounded pattern can span and the context it needs. The longest
// is an e-mail address, 64 + 1 + 253 = 318 bytes (RFC 5321 §4.5.3.1; a
// written-out one is bounded at maxWrittenEmail), or a gitleaks
// semi-generic assignment, under 400 bytes (see secretDetector.detectAt);
// the 40 bytes of context before a bare number and the cue before a name
// fit in the rest. Values with no such bound are held whole while still
// open at the cut, up to GuardMaxHoldBytes: a run without white space, a
// PEM block, a key wrapped over lines and a spaced-hex run (see
// joinedAcross). The guarantee: no byte of a value the detectors find in
// the whole answer is emitted unmasked, for any value whose text spans at
// most GuardMaxHoldBytes bytes; a longer one may be emitted in part.
const (
	GuardHoldBytes    = 512
	GuardMaxHoldBytes = 64 << 10
	guardContextBytes = 64 // already emitted input scanned again for context (as written, not masked)
	// guardMaxContextBytes bounds the context when it is moved back to a
	// value's start (see ctxStart).
	guardMaxContextBytes = 1024
)

// StreamGuard guards one streamed answer (e.g. the delta.content of SSE
// chunks, after placeholders are restored): Write returns what is safe to
// emit, holding back at most GuardHoldBytes (more only while a token or a
// PEM block is still open, up to GuardMaxHoldBytes), never half a UTF-8
// character; masked values come out as "[TYPE]". After a block every call
// returns the same *BlockedError. Not safe for concurrent use.
type StreamGuard struct {
	g       *Guard
	pending string
	// ctx is the last input bytes emitted, as they came (before any
	// mask), scanned again for context: a mask would change what the
	// rules read before a value ("token for [IP_ADDRESS]: …" no longer
	// has gitleaks' generic shape, "token for 10.0.0.12: …" has). It
	// starts guardContextBytes before the end of what was emitted, or
	// before a value found near that end (see ctxStart).
	ctx     string
	err     error
	found   []Finding
	emitted int // bytes of input emitted so far (finding offsets are in input bytes)
}

// NewStream returns a stream guard for one answer.
func (g *Guard) NewStream() *StreamGuard { return &StreamGuard{g: g} }

// Findings returns the findings acted on so far, with offsets into the
// whole input stream.
func (sg *StreamGuard) Findings() []Finding { return sg.found }

// Pending returns the number of bytes held back.
func (sg *StreamGuard) Pending() int { return len(sg.pending) }

// Write consumes the next chunk and returns the text that is safe to emit
// now (possibly empty), or the error that stopped the answer.
func (sg *StreamGuard) Write(chunk string) (string, error) {
	if sg.err != nil {
		return "", sg.err
	}
	buf := sg.pending + chunk
	if len(buf) <= GuardHoldBytes {
		sg.pending = buf
		return "", nil
	}
	return sg.step(buf, false)
}

// Flush checks and returns the held-back tail at the end of the stream.
func (sg *StreamGuard) Flush() (string, error) {
	if sg.err != nil {
		return "", sg.err
	}
	buf := sg.pending
	sg.pending = ""
	if buf == "" {
		return "", nil
	}
	return sg.step(buf, true)
}

// holdFrom returns where the held-back tail of buf starts: GuardHoldBytes
// of its normalised view (escapes and invisible characters take no room),
// moved back to white space, then back over every gap of white space that
// a detector reads through when the bytes on both sides may be one value
// (see joinedAcross: a key wrapped over lines, spaced hex), and to the
// start of an open PEM block; never further back than GuardMaxHoldBytes.
func holdFrom(buf string) int {
	cut := len(buf) - GuardHoldBytes
	if v, ok := normalise(buf); ok {
		if len(v.text) <= GuardHoldBytes {
			cut = 0
		} else {
			o, _ := v.orig(len(v.text) - GuardHoldBytes)
			cut = min(cut, o)
		}
	}
	floor := max(0, len(buf)-GuardMaxHoldBytes)
	cut = max(cut, floor)
	// Do not cut a token (a key, a base64 run, a long address) in two.
	for cut > floor && !isSpaceByte(buf[cut-1]) {
		cut--
	}
	// Nor a value that goes on over the white space before the cut.
	for cut > floor {
		ts := joinedAcross(buf, cut)
		if ts < 0 {
			break
		}
		cut = max(ts, floor)
		for cut > floor && !isSpaceByte(buf[cut-1]) {
			cut--
		}
	}
	// A PEM block still open before the cut is held from its start.
	if b := strings.LastIndex(buf[:cut], "-----BEGIN"); b >= floor && b > strings.LastIndex(buf[:cut], "-----END") {
		cut = b
	}
	for cut > 0 && !utf8.RuneStart(buf[cut]) {
		cut--
	}
	return max(cut, 0)
}

// joinedAcross returns the start of the token before the white space
// ending at cut when a detector may read it and what follows the white
// space as one value, else -1: two hex pairs apart by one space (spaced
// hex, see encodedSegments), or a key-like run ending its line and a
// token continuing it on the next (see wrapGap), also when the buffer
// ends before the next line has come.
func joinedAcross(buf string, cut int) int {
	te := cut
	for k := 0; te > 0 && k < 48 && (isSpaceByte(buf[te-1]) || strings.IndexByte("\"'+\\.", buf[te-1]) >= 0); k++ {
		te--
	}
	ts := te
	for ts > 0 && te-ts <= maxWrapBytes && isB64Byte(buf[ts-1]) {
		ts--
	}
	if ts == te {
		return -1
	}
	// Spaced hex: "61 62" with the cut after the space.
	if te-ts == 2 && isHex(buf[ts]) && isHex(buf[ts+1]) && cut == te+1 && (buf[te] == ' ' || buf[te] == ':') {
		if cut == len(buf) || cut+1 == len(buf) && isHex(buf[cut]) || cut+2 <= len(buf) && isHex(buf[cut]) && isHex(buf[cut+1]) {
			return ts
		}
	}
	if strings.IndexByte(buf[te:cut], '\n') < 0 {
		return -1 // not at a line break
	}
	// The next line's token, when it has come: a key-like run on either
	// side may be a wrapped key (see detectWrapped and tokenBefore), and
	// one that reaches the end of buf may still become one.
	ns := wrapGap(buf, te)
	if ns < 0 {
		if keyLike(buf, ts, te) && strings.TrimLeft(buf[cut:], " \t\"'+.") == "" {
			return ts
		}
		return -1
	}
	ne := ns
	for ne < len(buf) && isB64Byte(buf[ne]) {
		ne++
	}
	if keyLike(buf, ts, te) || ne == len(buf) || keyLike(buf, ns, ne) {
		return ts
	}
	return -1
}

func (sg *StreamGuard) step(buf string, final bool) (string, error) {
	cut := len(buf)
	if !final {
		cut = holdFrom(buf)
	}
	text := sg.ctx + buf
	raw, err := sg.g.s.ScanBounded(text)
	if err != nil {
		sg.err = err
		return "", err
	}
	fs := sg.g.acted(text, raw, nil)
	off := len(sg.ctx)
	var act []Finding
	for _, f := range fs {
		f.Start -= off
		f.End -= off
		if f.End <= 0 {
			continue // already emitted
		}
		f.Start = max(f.Start, 0)
		if f.Start < cut && f.End > cut {
			cut = f.Start // hold the whole value
		}
		if f.Start < cut {
			act = append(act, f)
		}
	}
	var emit []Finding
	for _, f := range act {
		if f.End <= cut {
			emit = append(emit, f)
		}
	}
	out, err := sg.g.apply(buf[:cut], emit)
	if err != nil {
		sg.err = err
		return "", err
	}
	for _, f := range emit {
		f.Start += sg.emitted
		f.End += sg.emitted
		sg.found = append(sg.found, f)
	}
	sg.emitted += cut
	sg.pending = buf[cut:]
	c := sg.ctx + buf[:cut]
	if k := ctxStart(c, raw); k > 0 {
		c = c[k:]
	}
	sg.ctx = c
	return out, nil
}

// ctxStart returns where the context kept from c (the text scanned, up to
// the cut) starts: guardContextBytes before its end, moved back to
// guardContextBytes before the start of each finding of fs (the scan's,
// of every type, passed or not) that ends after it, at most
// guardMaxContextBytes before the end. The next scan then reads such a
// value, and the keyword before it, as the whole text does: a scan begun
// inside a value or its keyword reads the bytes after otherwise (a
// password rule that took "Xk9#mQ2vLp7z+39" whole leaves "347 123 4567"
// to no one; begun after "pass", the scan reads "+39 347 123 4567" as a
// phone number).
func ctxStart(c string, fs []Finding) int {
	k := len(c) - guardContextBytes
	floor := len(c) - guardMaxContextBytes
	for moved := true; moved && k > max(floor, 0); {
		moved = false
		for _, f := range fs {
			if f.End > k && f.Start-guardContextBytes < k {
				k = max(f.Start-guardContextBytes, floor)
				moved = true
			}
		}
	}
	k = max(k, 0)
	for k < len(c) && !utf8.RuneStart(c[k]) {
		k++
	}
	return k
}

// Values returns the values this Vault holds placeholders for (what
// Restore may put back into an answer), for NewGuard. Never log them.
func (v *Vault) Values() []string {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make([]string, 0, len(v.byPH))
	for _, val := range v.byPH {
		out = append(out, val)
	}
	return out
}
