package redaction

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/nyaruka/phonenumbers"
)

// TestDigitDFAMatchesRegexp checks digitDFA against the regexp package on
// every national number pattern of libphonenumber's metadata (every
// region, every number type): on the pattern's example number, every
// one-digit change, prefix and extension of it, strings the automaton
// spells on random walks, random digit strings, and strings with a
// non-digit (which the automaton must decline). Nearly every pattern must
// get an automaton, or the test would only exercise the fallback.
func TestDigitDFAMatchesRegexp(t *testing.T) {
	coll, err := phonenumbers.MetadataCollection()
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	randDigits := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte('0' + rng.IntN(10))
		}
		return string(b)
	}
	patterns, built, checked := 0, 0, 0
	for _, m := range coll.GetMetadata() {
		for _, d := range []*phonenumbers.PhoneNumberDesc{m.GetGeneralDesc(), m.GetPremiumRate(), m.GetTollFree(), m.GetSharedCost(),
			m.GetVoip(), m.GetPersonalNumber(), m.GetPager(), m.GetUan(), m.GetVoicemail(), m.GetFixedLine(), m.GetMobile()} {
			if d == nil || d.GetNationalNumberPattern() == "" {
				continue
			}
			pat := d.GetNationalNumberPattern()
			re, err := regexp.Compile("^(?:" + pat + ")$")
			if err != nil {
				continue
			}
			patterns++
			dfa := newDigitDFA("(?:" + pat + ")")
			if dfa == nil {
				continue
			}
			built++
			ex := d.GetExampleNumber()
			inputs := []string{"", ex, ex + "0", ex + "9"}
			for i := range len(ex) {
				inputs = append(inputs, ex[:i])
				for c := byte('0'); c <= '9'; c++ {
					inputs = append(inputs, ex[:i]+string(c)+ex[i+1:])
				}
			}
			for range 50 {
				// A random walk through the automaton, ending anywhere.
				var b []byte
				st := int16(0)
				for n := rng.IntN(18); len(b) < n; {
					c := rng.IntN(10)
					if dfa.next[st][c] < 0 {
						c = rng.IntN(10)
					}
					b = append(b, byte('0'+c))
					if st = dfa.next[st][c]; st < 0 {
						break
					}
				}
				inputs = append(inputs, string(b), randDigits(1+rng.IntN(17)))
			}
			for _, s := range inputs {
				got, ok := dfa.match(s)
				if !ok {
					t.Fatalf("%s %q: automaton declined the digit string %q", m.GetId(), pat, s)
				}
				if want := re.MatchString(s); got != want {
					t.Fatalf("%s %q: automaton says %v for %q, regexp %v", m.GetId(), pat, got, s, want)
				}
				checked++
			}
			for _, s := range []string{ex + "a", "x" + ex, strings.Replace(ex, ex[:min(1, len(ex))], "-", 1)} {
				if _, ok := dfa.match(s); ok && strings.ContainsFunc(s, func(r rune) bool { return r < '0' || r > '9' }) {
					t.Fatalf("%s: automaton answered for the non-digit string %q", m.GetId(), s)
				}
			}
		}
	}
	t.Logf("%d patterns, %d with an automaton, %d strings checked", patterns, built, checked)
	if patterns < 1000 || built < patterns*95/100 {
		t.Fatalf("%d of %d patterns got an automaton", built, patterns)
	}
}
