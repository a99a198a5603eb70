package redaction

import (
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
)

// refAnchors is the oracle of the prefilter: every anchor computed from
// its definition (see anchors), one property at a time, with a naive
// all-positions, all-keywords search for the keyword hits. It shares no
// code with prefilter but the keyword list and the keep filters.
func refAnchors(ix *keywordIndex, text string) anchors {
	var a anchors
	n := len(text)
	b := func(i int) byte {
		if i < 0 || i >= n {
			return 0
		}
		return text[i]
	}
	digit := func(c byte) bool { return '0' <= c && c <= '9' }
	letter := func(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
	alnum := func(c byte) bool { return digit(c) || letter(c) }
	hex := func(c byte) bool { return digit(c) || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }
	b64 := func(c byte) bool { return alnum(c) || strings.IndexByte("+/-_", c) >= 0 }
	for i := range n {
		c := text[i]
		if digit(c) && !digit(b(i-1)) {
			a.digits = append(a.digits, int32(i))
		}
		if c == '@' {
			a.ats = append(a.ats, int32(i))
		}
		if c == ':' && (hex(b(i-1)) || b(i-1) == ':' || hex(b(i+1)) || b(i+1) == ':') {
			a.colons = append(a.colons, int32(i))
		}
		if 'A' <= c && c <= 'Z' && !alnum(b(i-1)) || c >= 0xC0 && !alnum(b(i-1)) && b(i-1) < 0x80 {
			a.caps = append(a.caps, int32(i))
		}
	}
	// Maximal runs of base64 bytes, with up to two '=' after them.
	for i := 0; i < n; {
		if !b64(text[i]) {
			i++
			continue
		}
		j := i
		for j < n && b64(text[j]) {
			j++
		}
		e := j
		for e < n && e < j+2 && text[e] == '=' {
			e++
		}
		switch {
		case e-i >= minEncodedLen:
			a.runs = append(a.runs, [2]int32{int32(i), int32(e)})
		case j-i == 2 && (b(j) == ' ' || b(j) == ':') && hex(text[i]) && hex(text[i+1]) && hex(b(j+1)):
			a.hex2 = append(a.hex2, int32(i))
		}
		i = j
	}
	// Maximal alphanumeric tokens of 16 bytes.
	for i := 0; i < n; {
		if !alnum(text[i]) {
			i++
			continue
		}
		j := i
		for j < n && alnum(text[j]) {
			j++
		}
		if j-i == 16 {
			a.tok16 = append(a.tok16, int32(i))
		}
		i = j
	}
	low := []byte(text)
	for k, c := range low {
		if 'A' <= c && c <= 'Z' {
			low[k] = c + 'a' - 'A'
		}
	}
	lows := string(low)
	for p := range n {
		for id, w := range ix.words {
			if !strings.HasPrefix(lows[p:], w) {
				continue
			}
			if ix.wordOnly[id] && letter(b(p-1)) {
				continue
			}
			if id < len(ix.keep) && ix.keep[id] != nil && !ix.keep[id](text, p) {
				continue
			}
			a.kw = append(a.kw, kwHit{int32(id), int32(p)})
		}
	}
	return a
}

// prefilterTexts are the texts of TestPrefilterMatchesReference: the
// benchmark paragraphs and adversarial shapes, the corpus prompts, and
// random texts over an alphabet dense in what the prefilter looks at
// (keywords in random case, digits, hex, base64 and '=' padding, '@', ':',
// spaces, multi-byte UTF-8), of every length up to a few hundred bytes,
// so that every byte offset against the prefilter's 8-byte blocks and
// the text's end is exercised.
func prefilterTexts(t *testing.T, ix *keywordIndex) []string {
	texts := []string{"", "a", "ab", "sk", "ey", "s.", "Ab", "1", "@", ":a", "a:", "ab cd", "0f 1e:2d 3c",
		prosePara, densePara, codePara, mixedPara, gatewayMixed(4 << 10)}
	for _, c := range adversarial {
		texts = append(texts, repeatTo(c.Unit, 3000))
	}
	// The corpus prompts (not the held-out set), as written and as the
	// normalised view that scans see.
	items := append(loadJSONL(t, filepath.Join("testdata", "corpus", "tuning.jsonl")),
		loadHandwritten(t, filepath.Join("testdata", "corpus", "handwritten.txt"))...)
	for _, it := range items {
		for _, seg := range it.segments {
			texts = append(texts, seg)
			if v, ok := normalise(seg); ok {
				texts = append(texts, v.text)
			}
		}
	}
	pieces := []string{" ", " ", "  ", "\n", ":", "::", "@", "=", "==", "+", "/", "-", "_", ".", ",", "'", "(", "[",
		"è", "É", "—", "\u00a0", "ü", "日本", "\xc3", "\x80", "0", "7", "42", "a", "f", "g", "Z", "F", "x",
		"0f", "aB", "de ad", "be ef:01", "4111 1111 1111 1111", "QUJDREVGR0hJSktM", "abcdefghijklmnop",
		"ABCDEFGHIJKLMNOP", "0123456789abcdef0"}
	for _, w := range ix.words {
		pieces = append(pieces, w)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	randCase := func(s string) string {
		out := []byte(s)
		for k, c := range out {
			if rng.IntN(3) == 0 && 'a' <= c && c <= 'z' {
				out[k] = c - 'a' + 'A'
			}
		}
		return string(out)
	}
	for n := range 2000 {
		var sb strings.Builder
		for sb.Len() < n%300 {
			switch r := rng.IntN(10); {
			case r < 4:
				sb.WriteString(randCase(pieces[rng.IntN(len(pieces))]))
			case r < 6:
				for range 1 + rng.IntN(20) {
					sb.WriteByte("abcdefABCDEF0123456789+/-_="[rng.IntN(27)])
				}
			case r < 8:
				sb.WriteByte(byte(rng.IntN(256)))
			default:
				sb.WriteString(" ")
			}
		}
		texts = append(texts, sb.String()[:min(sb.Len(), n%300)])
	}
	// Texts of one to fifteen 64-byte blocks and up to two bytes more or
	// less (prefilterBlocks' blocks and its padded last one), from the
	// same pieces.
	for n := range 600 {
		size := 64*(1+n%15) + n%5 - 2
		var sb strings.Builder
		for sb.Len() < size {
			if rng.IntN(3) == 0 {
				sb.WriteString(strings.Repeat("aZ09+/_-"[rng.IntN(8):][:1], 1+rng.IntN(24)))
			} else {
				sb.WriteString(randCase(pieces[rng.IntN(len(pieces))]))
			}
		}
		texts = append(texts, sb.String()[:size])
	}
	return texts
}

// TestPrefilterMatchesReference checks that prefilter finds exactly the
// anchors of their definitions (refAnchors), in order, on the texts of
// prefilterTexts, for the full rule set and for a scanner without
// secrets (a keyword index without gitleaks' keywords).
func TestPrefilterMatchesReference(t *testing.T) {
	for _, cfg := range []Config{{}, {Types: []string{TypeEmail, TypePerson, TypePhone}}} {
		s, err := NewScanner(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var got anchors
		for _, text := range prefilterTexts(t, &s.index) {
			checkAnchors(t, &s.index, text, &got)
		}
	}
}

// checkAnchors compares prefilter's anchors of text (into got) with
// refAnchors'.
func checkAnchors(t *testing.T, ix *keywordIndex, text string, got *anchors) {
	t.Helper()
	want := refAnchors(ix, text)
	impls := []struct {
		name string
		pass func(string, *anchors)
	}{{"prefilter", ix.prefilter}, {"prefilterSWAR", ix.prefilterSWAR}}
	if useBlocks {
		impls = append(impls, struct {
			name string
			pass func(string, *anchors)
		}{"prefilterBlocks", ix.prefilterBlocks})
	}
	for _, impl := range impls {
		impl.pass(text, got)
		checkAnchorsOf(t, impl.name, text, got, &want)
	}
	// The keyword-only pass finds the same hits and no other anchor.
	ix.prefilterKeywords(text, got)
	if !slices.Equal(got.kw, want.kw) {
		t.Fatalf("prefilterKeywords' hits of %q:\n got %v\nwant %v", text, got.kw, want.kw)
	}
	if n := len(got.digits) + len(got.ats) + len(got.colons) + len(got.tok16) + len(got.caps) + len(got.hex2) + len(got.runs); n != 0 {
		t.Fatalf("prefilterKeywords of %q left %d other anchors", text, n)
	}
}

// checkAnchorsOf compares the anchors got of text, found by impl, with
// want.
func checkAnchorsOf(t *testing.T, impl, text string, got, want *anchors) {
	t.Helper()
	for _, c := range []struct {
		name      string
		got, want []int32
	}{
		{"digits", got.digits, want.digits}, {"ats", got.ats, want.ats}, {"colons", got.colons, want.colons},
		{"tok16", got.tok16, want.tok16}, {"caps", got.caps, want.caps}, {"hex2", got.hex2, want.hex2},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Fatalf("%s: %s of %q:\n got %v\nwant %v", impl, c.name, text, c.got, c.want)
		}
	}
	if !slices.Equal(got.runs, want.runs) {
		t.Fatalf("%s: runs of %q:\n got %v\nwant %v", impl, text, got.runs, want.runs)
	}
	if !slices.Equal(got.kw, want.kw) {
		t.Fatalf("%s: keyword hits of %q:\n got %v\nwant %v", impl, text, got.kw, want.kw)
	}
}

// TestSpecial8MatchesTable checks normalise's eight-byte skip against the
// byte table it stands for (an '=' only before a line break), on every pair of adjacent byte values at every
// offset of the word (a carry between bytes would show there).
func TestSpecial8MatchesTable(t *testing.T) {
	special := func(c byte) bool { return c >= 0x80 || specialASCII[c] }
	for k := range 7 {
		for b1 := range 256 {
			for b2 := range 256 {
				buf := []byte("aaaaaaaa")
				buf[k], buf[k+1] = byte(b1), byte(b2)
				var want uint64
				for i, c := range buf {
					// '=' counts only before a line break, or last.
					soft := c != '=' || i == 7 || buf[i+1] == '\n' || buf[i+1] == '\r'
					if special(c) && soft {
						want |= 0x80 << (8 * i)
					}
				}
				if got := special8(le64(string(buf))); got != want {
					t.Fatalf("special8(%q) = %#x, want %#x", buf, got, want)
				}
			}
		}
	}
}

// TestLower8MatchesToLower checks hitsAt's eight-byte lower-casing
// against strings.ToLower on ASCII (bytes from 0x80 unchanged), on every
// pair of adjacent byte values at every offset of the word (a carry
// between bytes would show there).
func TestLower8MatchesToLower(t *testing.T) {
	lower := func(c byte) byte {
		if c >= 0x80 {
			return c
		}
		return strings.ToLower(string(rune(c)))[0]
	}
	for k := range 7 {
		for b1 := range 256 {
			for b2 := range 256 {
				buf := []byte("AzZa@[`{")
				buf[k], buf[k+1] = byte(b1), byte(b2)
				want := make([]byte, 8)
				for i, c := range buf {
					want[i] = lower(c)
				}
				if got := lower8(le64(string(buf))); got != le64(string(want)) {
					t.Fatalf("lower8(%q) = %#x, want %q", buf, got, want)
				}
			}
		}
	}
}

// FuzzPrefilter checks prefilter against refAnchors on any input.
func FuzzPrefilter(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Add(densePara)
	f.Add("api_key = \"QUJDREVGR0hJSktMTU5PUA==\" de ad be ef 00 11 22 https://u:p@h.io Mr. Rossi")
	s, err := NewScanner(Config{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, text string) {
		var got anchors
		checkAnchors(t, &s.index, text, &got)
	})
}

// TestScanConcurrentMatchesSequential scans texts of every shape from
// several goroutines at once with one Scanner (its pooled per-scan memory
// is then shared out) and checks each result against a scan of the same
// text alone.
func TestScanConcurrentMatchesSequential(t *testing.T) {
	s, err := NewScanner(Config{})
	if err != nil {
		t.Fatal(err)
	}
	texts := []string{prosePara, densePara, codePara, mixedPara, gatewayMixed(8 << 10)}
	for _, c := range adversarial {
		texts = append(texts, repeatTo(c.Unit, 2000))
	}
	want := make([][]Finding, len(texts))
	for i, text := range texts {
		want[i] = s.Scan(text)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8*len(texts))
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range 3 * len(texts) {
				i := (g + r) % len(texts)
				if got := s.Scan(texts[i]); !slices.Equal(got, want[i]) {
					errs <- fmt.Sprintf("text %d: got %v, want %v", i, got, want[i])
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestThirdBytesCoverAdmits checks the third bytes read off start filters
// against the filters themselves: every byte c such that the filter
// admits kw, c and some continuation (a run of c, of letters, digits or
// '_') is in the set, and the end of the text is when the filter admits
// kw alone. On the synthetic filters the set must also be exactly those
// bytes; on the rule set's two-byte keywords it may hold more.
func TestThirdBytesCoverAdmits(t *testing.T) {
	admitted := func(f *startFilter, kw string, c byte) bool {
		tails := []string{strings.Repeat(string(c), 40), strings.Repeat("A", 40), strings.Repeat("a", 40), strings.Repeat("0", 40), strings.Repeat("_", 40)}
		// And the rest of each literal that goes on with c ("sk-proj"
		// after "sk-"), then those runs.
		for _, a := range f.alts {
			if l := len(kw) + 1; len(a.lit) > l && strings.EqualFold(a.lit[:l], kw+string(c)) {
				for _, r := range tails[1:] {
					tails = append(tails, a.lit[l:]+r)
				}
			}
		}
		for _, tail := range tails {
			if f.admits(kw+string(c)+tail, 0) {
				return true
			}
		}
		return false
	}
	check := func(name string, f *startFilter, kw string, tb *thirdBytes, tight bool) {
		t.Helper()
		for c := range 256 {
			if a := admitted(f, kw, byte(c)); a && !tb.in[c] || tight && !a && tb.in[c] {
				t.Fatalf("%s: byte %#x after %q: admitted %v, in the set %v", name, c, kw, a, tb.in[c])
			}
		}
		if e := f.admits(kw, 0); e && !tb.end || tight && !e && tb.end {
			t.Fatalf("%s: end after %q: admitted %v, in the set %v", name, kw, e, tb.end)
		}
	}
	for _, c := range []struct{ src, kw string }{
		{`(?i)eyj[a-z0-9]{10}`, "ey"}, {`eyJ[a-z0-9]{10}`, "ey"}, {`ey[A-Z0-9_]{4,}`, "ey"}, {`sk(?:-[a-z]+)?`, "sk"},
		{`(?:sk_live|sk-proj)[a-z0-9]{8}`, "sk"}, {`s\.[a-zA-Z0-9]{24}`, "s."}, {`ey\d+`, "ey"},
	} {
		f, ok := newStartFilter(c.src, []string{c.kw})
		if !ok {
			t.Fatalf("%s: no start filter", c.src)
		}
		var tb thirdBytes
		f.addThirds(c.kw, &tb)
		check(c.src, f, c.kw, &tb, true)
	}
	s, err := NewScanner(Config{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for id, w := range s.index.words {
		if len(w) != 2 || id >= len(s.index.thirds) || s.index.thirds[id] == nil {
			continue
		}
		for _, ri := range s.kwRules[id] {
			check(w, s.secrets.rules[ri].start, w, s.index.thirds[id], false)
		}
		n++
	}
	if n == 0 {
		t.Fatal("no two-byte keyword has a third-byte set")
	}
}

// TestStartFilterCountsTheClassRun checks the least run of the class a
// start filter asks for after the literal against Go's own matcher: a
// literal followed by k bytes of the class (and a byte outside it) is
// admitted whenever the anchored pattern matches it, and turned down
// whenever k is under the pattern's count (which Simplify spells as
// copies of the class) and the byte after the run is outside the class.
func TestStartFilterCountsTheClassRun(t *testing.T) {
	for _, c := range []struct {
		src, kw, lit string
		class        byte
		least        int
	}{
		{`s\.(?i:[a-z0-9]{24})`, "s.", "s.", 'Q', 24},
		{`sk-[A-Za-z0-9]{32,}`, "sk-", "sk-", '7', 32},
		{`sk-(?:proj|admin)-[A-Za-z0-9_-]{20,}`, "sk-", "sk-proj-", '_', 20},
		{`ghp_[0-9a-zA-Z]{36}`, "ghp_", "ghp_", 'x', 36},
		{`key-[a-f]{2,5}[a-f]*z`, "key-", "key-", 'b', 2},
		{`tok[0-9]+`, "tok", "tok", '5', 1},
		{`tok[0-9]{0,3}x`, "tok", "tok", '5', 0},
	} {
		f, ok := newStartFilter(c.src, []string{c.kw})
		if !ok {
			t.Fatalf("%s: no start filter", c.src)
		}
		re := regexp.MustCompile(`^(?:` + c.src + `)`)
		for k := 0; k <= 60; k++ {
			for _, tail := range []string{"", " ", "z", "x", "%"} {
				text := c.lit + strings.Repeat(string(c.class), k) + tail
				if re.MatchString(text) && !f.admits(text, 0) {
					t.Fatalf("%s: %q matches, but the filter turns it down", c.src, text)
				}
				if k < c.least && tail != "z" && tail != "x" && f.admits(text, 0) {
					t.Fatalf("%s: %q has %d bytes of the class, under %d, and is admitted", c.src, text, k, c.least)
				}
			}
		}
	}
}

// TestStartFilterComparesTheLiteral checks admits, whose literal compare
// reads eight bytes at once, against the plain definition: some
// alternative's literal starts text[p:] (ASCII case-insensitively when it
// folds, strings.ToLower on each ASCII byte) and the next min bytes are
// in its class. The filters are those of every built-in rule; the texts
// are their literals in upper, lower and mixed case, cut short, followed
// by class and other bytes, at offsets with fewer and more than eight
// bytes left.
func TestStartFilterComparesTheLiteral(t *testing.T) {
	d, err := newSecretDetector()
	if err != nil {
		t.Fatal(err)
	}
	lowerASCII := func(s string) string {
		b := []byte(s)
		for i, c := range b {
			if c < 0x80 {
				b[i] = strings.ToLower(string(rune(c)))[0]
			}
		}
		return string(b)
	}
	want := func(f *startFilter, text string, p int) bool {
		for _, a := range f.alts {
			if len(text)-p < len(a.lit)+a.min {
				continue
			}
			head := text[p : p+len(a.lit)]
			if a.fold {
				head = lowerASCII(head)
			}
			if head != a.lit {
				continue
			}
			ok := true
			for _, c := range []byte(text[p+len(a.lit) : p+len(a.lit)+a.min]) {
				ok = ok && (c >= 0x80 && a.high || c < 0x80 && a.ascii[c>>6]>>(c&63)&1 != 0)
			}
			if ok {
				return true
			}
		}
		return false
	}
	r := rand.New(rand.NewPCG(19, 23))
	admitted, n := 0, 0
	for i := range d.rules {
		f := d.rules[i].start
		if f == nil {
			continue
		}
		for range 300 {
			a := f.alts[r.IntN(len(f.alts))]
			lit := []byte(a.lit)
			for k := range lit {
				switch r.IntN(3) {
				case 0:
					lit[k] = strings.ToUpper(string(lit[k]))[0]
				case 1:
					lit[k] = strings.ToLower(string(lit[k]))[0]
				}
			}
			if r.IntN(6) == 0 {
				lit[r.IntN(len(lit))] ^= 0x20
			}
			lit = lit[:len(lit)-r.IntN(2)]
			var b strings.Builder
			b.WriteString(strings.Repeat("x", r.IntN(3)))
			p := b.Len()
			b.Write(lit)
			for range r.IntN(40) {
				const more = "AZaz09_-+/=. \x80\xff"
				b.WriteByte(more[r.IntN(len(more))])
			}
			text := b.String()
			got, w := f.admits(text, p), want(f, text, p)
			if got != w {
				t.Fatalf("%s: admits(%q, %d) = %v, want %v", d.rules[i].id, text, p, got, w)
			}
			n++
			if w {
				admitted++
			}
		}
	}
	if admitted == 0 || admitted == n {
		t.Fatalf("%d of %d texts admitted: the texts do not test both answers", admitted, n)
	}
}

// TestShannonIsTheTextbookEntropy checks shannon against the definition,
// -Σ p·log2 p over the bytes' frequencies, summed the plain way, and
// against values known in closed form.
func TestShannonIsTheTextbookEntropy(t *testing.T) {
	textbook := func(s string) float64 {
		freq := map[byte]float64{}
		for i := 0; i < len(s); i++ {
			freq[s[i]]++
		}
		h := 0.0
		for _, c := range freq {
			p := c / float64(len(s))
			h -= p * math.Log2(p)
		}
		return h
	}
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	for s, want := range map[string]float64{"": 0, "aaaa": 0, "ab": 1, "abcd": 2, "aabb": 1, string(all): 8, strings.Repeat("xy", 300): 1} {
		if got := shannon(s); math.Abs(got-want) > 1e-12 {
			t.Fatalf("shannon(%.20q) = %v, want %v", s, got, want)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		b := make([]byte, 1+rng.IntN(700))
		alpha := 1 + rng.IntN(256)
		for i := range b {
			b[i] = byte(rng.IntN(alpha))
		}
		if got, want := shannon(string(b)), textbook(string(b)); math.Abs(got-want) > 1e-9 {
			t.Fatalf("shannon of %d bytes over %d symbols = %v, the definition gives %v", len(b), alpha, got, want)
		}
	}
}
