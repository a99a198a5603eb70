package redaction

import (
	"math/rand/v2"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// naiveSecrets evaluates the same rules the plain way gitleaks does: every
// rule's original pattern (with the prose tail) over the whole text when a
// keyword occurs, no prefix stripping, no windows, no anchoring.
func naiveSecrets(t *testing.T, d *secretDetector, text string) []Finding {
	t.Helper()
	lower := strings.ToLower(text)
	var out []Finding
	for _, r := range d.rules {
		if len(r.keywords) > 0 && !slices.ContainsFunc(r.keywords, func(k string) bool { return strings.Contains(lower, k) }) {
			continue
		}
		plain := r
		plain.stripped, plain.leadB, plain.anchored = false, false, nil
		plain.re = regexp.MustCompile(r.orig)
		// Leftmost-first matches; a match finding rejects hides no later
		// one for hand-written rules and rules tried at their keyword
		// hits (see detectIn and detectAt): the search goes on from the
		// byte after its start.
		retry := r.hand || r.anchored != nil
		for pos := 0; pos <= len(text); {
			m := plain.re.FindStringSubmatchIndex(text[pos:])
			if m == nil {
				break
			}
			for k := range m {
				if m[k] >= 0 {
					m[k] += pos
				}
			}
			if f, ok := d.finding(&plain, text, m, nil); ok {
				out = append(out, f)
			} else if retry {
				pos = m[0] + 1
				continue
			}
			pos = max(m[1], m[0]+1)
		}
	}
	return out
}

// fastSecrets runs the secret rules the way Scan does: behind the
// prefilter's keyword hits, with windows, anchored tries and the
// assignment shortcut.
func fastSecrets(s *Scanner, text string) []Finding {
	st := &scanState{}
	s.index.prefilter(text, &st.a)
	st.hits = make([][]int32, len(s.secrets.rules))
	for _, h := range st.a.kw {
		for _, r := range s.kwRules[h.id] {
			st.hits[r] = append(st.hits[r], h.pos)
		}
	}
	return s.secrets.detect(text, st.hits, nil, nil)
}

func sortFindings(fs []Finding) []Finding {
	slices.SortFunc(fs, func(a, b Finding) int {
		if a.Start != b.Start {
			return a.Start - b.Start
		}
		if a.End != b.End {
			return a.End - b.End
		}
		return strings.Compare(a.Subtype, b.Subtype)
	})
	return slices.Compact(fs)
}

// TestSecretShortcutsMatchThePlainEvaluation checks that Molly's speed-ups
// of the gitleaks rules (identifier prefix stripped, leading \b checked by
// hand, keyword windows, anchored tries) find exactly what the plain
// evaluation finds, on secrets in many contexts.
func TestSecretShortcutsMatchThePlainEvaluation(t *testing.T) {
	d, err := newSecretDetector()
	if err != nil {
		t.Fatal(err)
	}
	s := mustScanner(t)
	r := rand.New(rand.NewPCG(99, 1))
	from := func(n int, alphabet string) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		return string(b)
	}
	known := []string{keyOpenAI, keyOpenAIOld, keyAnthropic, keyAWS, keyGitHub, keyGitHubOA, keyGitHubPAT, keySlack, keyStripe, keyStripeRK, keyGoogle, keyJWT, keyPEM, keyPEMCut}
	contexts := []string{
		"%s", "key: %s", "api_key = \"%s\"", "MY_API_KEY=%s\n", "export GITHUB_TOKEN='%s';", "password: %s.",
		"auth %s, ok", "Authorization: Bearer %s", "the secret is %s!", "token=%s&x=1", "{\"access_token\":\"%s\"}",
		"twilio key SK%s", "heroku_api_key = %s", "xkey=%s", "ckey=%s and key=%s", "secret: password: %s",
	}
	var texts []string
	for i := 0; i < 400; i++ {
		var v string
		switch i % 4 {
		case 0:
			v = known[r.IntN(len(known))]
		case 1:
			v = from(8+r.IntN(40), alnum+"-_.=")
		case 2:
			v = strings.ToLower(from(32, "0123456789abcdef"))
		default:
			v = from(40, alnum+"/+")
		}
		c := contexts[i%len(contexts)]
		texts = append(texts, strings.ReplaceAll(c, "%s", v))
	}
	for _, it := range loadJSONL(t, filepath.Join("testdata", "corpus", "tuning.jsonl"))[:300] {
		texts = append(texts, it.segments...)
	}
	texts = append(texts, repeatTo(densePara, 4<<10), repeatTo(prosePara, 4<<10), strings.Repeat("key=", 300), strings.Repeat("api_key = \"", 200),
		strings.Repeat("-----BEGIN RSA PRIVATE KEY-----\n", 100), strings.Repeat("-----BEGIN RSA PRIVATE KEY\n", 100),
		"-----BEGIN RSA PRIVATE KEY-----\n"+strings.Repeat(keyPEMBody+"\n", 40)+"-----END CERTIFICATE-----\n-----BEGIN EC PRIVATE KEY-----\n"+keyPEMBody+"\n-----END EC PRIVATE KEY-----",
		"x -----BEGIN OPENSSH PRIVATE KEY BLOCK-----\n"+strings.Repeat(keyPEMBody+"\n", 30)+"-----END OPENSSH PRIVATE KEY BLOCK----- y",
		"-----begin private key-----"+strings.Repeat("a", 300)+"KEY BLOCK----- and -----BEGIN PRIVATE KEY----- "+keyPEMBody+" key-----",
		// Header choices: two possible ends on one line, the BLOCK form, a
		// short first body run, a header of 100 bytes and of 101, lower
		// case and non-ASCII header bytes (gitleaks' rule is (?i)), bodies
		// that end at the next header.
		"-----BEGIN A PRIVATE KEY-----B PRIVATE KEY----- "+keyPEMBody+"\n",
		"-----BEGIN A PRIVATE KEY-----x PRIVATE KEY----- "+keyPEMBody,
		"-----BEGIN RSA PRIVATE KEY BLOCK-----\n"+keyPEMBody+"\n"+keyPEMBody,
		"-----BEGIN RSA PRIVATE KEY-----\nabc "+keyPEMBody,
		"-----BEGIN "+strings.Repeat("X", 89)+"PRIVATE KEY-----\n"+keyPEMBody,
		"-----BEGIN "+strings.Repeat("X", 90)+"PRIVATE KEY-----\n"+keyPEMBody,
		"-----begin rsa private key-----\n"+strings.Repeat("a", 70)+"key-----",
		"-----BEGIN \u017fSA PRIVATE KEY-----"+strings.Repeat("b", 64)+"KEY-----",
		strings.Repeat("-----BEGIN RSA PRIVATE KEY-----\n"+keyPEMBody[:40]+"\n", 20),
		strings.Repeat("-----BEGIN RSA PRIVATE KEY----- x\n", 20),
		"-----BEGIN RSA PRIVATE \u212aEY-----"+strings.Repeat("c", 64)+"\u212aEY-----",
		// A header that holds an END line: the block ends at the END
		// line after the body, not within the header's reach.
		"-----BEGIN-----END RSA PRIVATE KEY-----\n"+strings.Repeat(keyPEMBody+"\n", 40)+"-----END RSA PRIVATE KEY-----",
		"-----BEGIN X-----END RSA PRIVATE KEY-----\n"+keyPEMBody+"\n-----END RSA PRIVATE KEY-----END RSA PRIVATE KEY-----")
	total := 0
	for _, text := range texts {
		got := sortFindings(fastSecrets(s, text))
		total += len(got)
		want := sortFindings(naiveSecrets(t, d, text))
		if !slices.Equal(got, want) {
			t.Errorf("on %q\n fast  %v\n plain %v", text, got, want)
		}
	}
	if total < 300 {
		t.Errorf("only %d findings in all texts: the comparison proves little", total)
	}
	t.Logf("%d texts, %d findings, fast and plain agree", len(texts), total)
}

// TestReachScanMatchesItsDefinition checks the generic rule's reach
// filter, as detectAt starts it, against its definition read off the
// text for each hit on its own: a tail byte (a quote, white space,
// ; , . ! ? ) ] } > or a backslash) or the end of the text at most
// assign+160 bytes after the hit, or else no byte outside [A-Za-z0-9+/]
// among the 160 before that reach. Hits come in increasing order, from
// offset 0 (where a reach filter that took offset 0 for a tail would
// admit every text).
func TestReachScanMatchesItsDefinition(t *testing.T) {
	const tails = "`'\" \t\n\r\f\v;,.!?)]}>\\"
	body := func(c byte) bool {
		return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '+' || c == '/'
	}
	want := func(text string, p, assign int) bool {
		w := p + assign + 160
		if k := strings.IndexAny(text[p:], tails); k < 0 && len(text) <= w || k >= 0 && p+k <= w {
			return true
		}
		for k := w - 160; k < w; k++ {
			if !body(text[k]) {
				return false
			}
		}
		return true
	}
	r := rand.New(rand.NewPCG(7, 11))
	for range 3000 {
		n := 1 + r.IntN(900)
		b := make([]byte, n)
		alphabet := []string{"aB9+/", "aB9+/=", "aB9+/= ", "key=", "aB9+/=-_"}[r.IntN(5)]
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
			if r.IntN(400) == 0 {
				b[i] = tails[r.IntN(len(tails))]
			}
		}
		text := string(b)
		assign := 1 + r.IntN(40)
		rs := newReachScan()
		for p := r.IntN(3); p < n; p += 1 + r.IntN(12) {
			if got, want := rs.admits(text, p, assign), want(text, p, assign); got != want {
				t.Fatalf("admits(%q, %d, %d) = %v, want %v", text, p, assign, got, want)
			}
		}
	}
}

// TestRunScanIsSecretRunAfter checks the remembering form of the secret-run
// test against the plain one, on random texts of run and break bytes, with
// queries in increasing order (as hits come) and in any order, of one need
// or of any.
func TestRunScanIsSecretRunAfter(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	for range 20000 {
		n := 1 + r.IntN(80)
		b := make([]byte, n)
		for i := range b {
			b[i] = "aaaab=:' \"\n`"[r.IntN(12)]
		}
		text := string(b)
		var rs runScan
		sorted := r.IntN(2) == 0
		fixed := 1 + r.IntN(14) // one need per text (one rule's), or any
		if r.IntN(2) == 0 {
			fixed = 0
		}
		o := 0
		for range 30 {
			if sorted {
				o += r.IntN(4)
			} else {
				o = r.IntN(n + 2)
			}
			if o >= n {
				break
			}
			need := 1 + r.IntN(14)
			if fixed > 0 {
				need = fixed
			}
			if got, want := rs.runAfter(text, o, need), secretRunAfter(text, o, need); got != want {
				t.Fatalf("runAfter(%q, %d, %d) = %v, want %v", text, o, need, got, want)
			}
		}
	}
}
