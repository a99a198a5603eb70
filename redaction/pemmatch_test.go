package redaction

import (
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestPrivateKeyMatcherIsTheExpression checks the hand matcher of gitleaks'
// private-key rule against the rule's own expression (Go's regexp,
// anchored at each "-----BEGIN"), and the search for its last landmark
// against an anchored expression tried at every byte, on random texts made
// of the pieces that matter: headers in either case, the Kelvin sign and
// the long s (which (?i) folds with k and s), " BLOCK", runs of dashes,
// bodies of multi-byte and invalid UTF-8, line breaks.
func TestPrivateKeyMatcherIsTheExpression(t *testing.T) {
	d, err := newSecretDetector()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range d.rules {
		if r.id == "private-key" {
			found = true
			if !r.privateKey || r.orig != privateKeyGitleaks {
				t.Fatalf("gitleaks' private-key rule is %q, not the one matched by hand (%q)", r.orig, privateKeyGitleaks)
			}
		}
	}
	if !found {
		t.Fatal("gitleaks' rule set has no private-key rule")
	}
	re := regexp.MustCompile(`^(?:` + privateKeyGitleaks + `)`)
	landmark := regexp.MustCompile(`^(?i:KEY(?: BLOCK)?-----)`)
	pieces := []string{
		"-----BEGIN", "-----begin", "-----Begin", " ", "RSA", "ſ", "\u212a", "PRIVATE KEY", "private key", "PRIVATE \u212aEY",
		" BLOCK", " BLOC\u212a", " block", "-----", "-", "KEY", "key", "\u212aey", "\n", "é", "\xff", "_", "9", "AbCdEf0123+/=",
		strings.Repeat("x", 30), strings.Repeat("Q", 64), strings.Repeat("é", 40),
	}
	r := rand.New(rand.NewPCG(7, 11))
	matches, tries := 0, 0
	for range 8000 {
		var b strings.Builder
		for range 1 + r.IntN(60) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		text := b.String()
		want := -1
		for q := range len(text) {
			if landmark.MatchString(text[q:]) {
				want = q
			}
		}
		last := lastPrivateKeyLandmark(text)
		if last != want {
			t.Fatalf("last landmark of %q at %d, want %d", text, last, want)
		}
		for p := range len(text) {
			if !hasPrefixFold(text, p, "-----begin") {
				continue
			}
			tries++
			want := -1
			if m := re.FindStringIndex(text[p:]); m != nil {
				want = p + m[1]
				matches++
			}
			if got := matchPrivateKeyGitleaks(text, p, last); got != want {
				t.Fatalf("match at %d of %q ends at %d, want %d", p, text, got, want)
			}
		}
	}
	if matches < 200 || tries < 2*matches {
		t.Fatalf("%d matches in %d tries: the texts test too little", matches, tries)
	}
	t.Logf("%d tries, %d matches: the matcher agrees with the expression", tries, matches)
}

// TestPEMWindowsKeepTheMatch checks Molly's two PEM rules' windows against
// the rules' own expressions on the rest of the text: where a window ends
// at its hit (no match can end anywhere, so detectAt tries nothing), the
// expression finds no match from there; elsewhere it finds the same one
// in the window as on the rest (for the complete block too when a header
// holds an END line: "-----BEGIN-----END RSA PRIVATE KEY-----…"). The texts are random strings of the
// pieces that matter: headers with and without " BLOCK", bodies of 16
// base64 bytes and shorter, white space the expression's \s does not
// hold (\v), END lines.
func TestPEMWindowsKeepTheMatch(t *testing.T) {
	d, err := newSecretDetector()
	if err != nil {
		t.Fatal(err)
	}
	var rules []*secretRule
	for i := range d.rules {
		if d.rules[i].window != nil {
			rules = append(rules, &d.rules[i])
		}
	}
	if len(rules) != 2 {
		t.Fatalf("%d rules with a PEM window, want Molly's two", len(rules))
	}
	pieces := []string{
		"-----BEGIN", "-----BEGIN RSA PRIVATE KEY-----", "-----END RSA PRIVATE KEY-----", " ", "RSA", "PRIVATE KEY", " BLOCK",
		"-----", "-", "\n", "\v", "\t", "MIIEvQIBADANBgkq", "hkiG9w0BAQE=", "AbC", "-----END", "x", "é",
	}
	r := rand.New(rand.NewPCG(13, 17))
	empty := 0
	for range 20000 {
		var b strings.Builder
		for range 1 + r.IntN(14) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		text := b.String()
		for p := strings.Index(text, "-----BEGIN"); p >= 0; {
			for _, rule := range rules {
				want := rule.anchored.FindStringSubmatchIndex(text[p:])
				we := min(len(text), rule.window(text, p))
				if we <= p {
					empty++
					if want != nil && want[1] > want[0] {
						t.Fatalf("%q at %d: the window is empty, the expression matches %q", text, p, text[p:p+want[1]])
					}
					continue
				}
				if got := rule.anchored.FindStringSubmatchIndex(text[p:we]); !slices.Equal(got, want) {
					t.Fatalf("%q at %d: in the window %v, on the rest %v (%s)", text, p, got, want, rule.orig)
				}
			}
			k := strings.Index(text[p+1:], "-----BEGIN")
			if k < 0 {
				break
			}
			p += 1 + k
		}
	}
	if empty == 0 {
		t.Fatal("no window was empty: the texts do not test the condition")
	}
}
