package redaction

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// TestSecretRejectedMatchHidesNoLaterOne: a match the password rule
// rejects ("secret: password", whose value is a word) does not hide the
// assignment that starts inside it. The oracle is the span by hand.
func TestSecretRejectedMatchHidesNoLaterOne(t *testing.T) {
	runScanCases(t, []scanCase{
		{"a password assignment after the keyword secret", "", "secret: password: Xk9#mQ2vLp7z ok", []string{"SECRET:Xk9#mQ2vLp7z"}},
		{"the same after a zero-width space", "", "token \u200bsecret: password: Xk9#mQ2vLp7z\u200b\u200d token", []string{"SECRET:Xk9#mQ2vLp7z"}},
	})
}

// mashedGuardTexts are texts of glued values (passwords after zero-width
// spaces, keys, numbers) on which the stream guard once emitted something
// else than Check: a password the whole scan found behind a rejected
// "secret: password" match (the first), and values after a long password
// the rule took whole, read otherwise by a scan begun inside the password
// or its keyword (the other two).
var mashedGuardTexts = []string{
	" secret: my password is Tr0ub4dor&3x.a\u200dmario.rossi@example.it&amp;secret: password: Xk9#mQ2vLp7z\u200b\u200d token  &amp;.\"apassword: Xk9#mQ2vLp7zpassword: Xk9#mQ2vLp7z&amp;&amp;. lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum ,\u200dmario.rossi@example.it&amp;\tpassword: Xk9#mQ2vLp7zsecret: &amp;\u200d.mario.rossi@example.ittoken  lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum ,token pwd=Hunt3r2!xyz9Q4111 1111 1111 1111,lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum ",
	"+39 347 123 4567IT60 X054 2811 1010 0000 0123 456sk-proj-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6 my password is Tr0ub4dor&3x,\nsk-proj-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6+39 347 123 4567. ,secret: é\u200d.password: Xk9#mQ2vLp7zépwd=Hunt3r2!xyz9Qésk-proj-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6password: Xk9#mQ2vLp7z a \u200bé\u00a0\" 4111 1111 1111 1111lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum IT60 X054 2811 1010 0000 0123 4564111 1111 1111 1111password: Xk9#mQ2vLp7zmy password is Tr0ub4dor&3x\t\"Zx8kQ2mP9vLr4TfW7yBn\u200dIT60 X054 2811 1010 0000 0123 456 token \u200b&amp;pwd=Hunt3r2!xyz9Q&amp;\tlorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum pwd=Hunt3r2!xyz9Q\tmy password is Tr0ub4dor&3xpassword: Xk9#mQ2vLp7z",
	"+39 347 123 4567,token \u200bsecret: password: Xk9#mQ2vLp7zsk-proj-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6+39 347 123 4567 +39 347 123 4567word &amp;Zx8kQ2mP9vLr4TfW7yBn.a\nsk-proj-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6secret:     ésecret: a\u200dtoken \u00a0 &amp;\tsk-proj-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6sk-proj-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6word \n.sk-proj-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum +39 347 123 4567lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum lorem ipsum ,my password is Tr0ub4dor&3x\u00a0sk-proj-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6pwd=Hunt3r2!xyz9Qmy password is Tr0ub4dor&3x\n ",
}

// streamAll runs text through a stream guard of g in chunks of size bytes.
func streamAll(t *testing.T, g *Guard, text string, size int) string {
	t.Helper()
	sg := g.NewStream()
	var out strings.Builder
	for i := 0; i < len(text); i += size {
		o, err := sg.Write(text[i:min(i+size, len(text))])
		if err != nil {
			t.Fatal(err)
		}
		out.WriteString(o)
	}
	o, err := sg.Flush()
	if err != nil {
		t.Fatal(err)
	}
	return out.String() + o
}

// TestStreamGuardMatchesCheckOnMashedTexts: on the texts that once
// differed, every chunking gives what Check gives for the whole text
// (the oracle: the stream guard's contract).
func TestStreamGuardMatchesCheckOnMashedTexts(t *testing.T) {
	g := mustScanner(t).NewGuard(GuardPolicy{Default: GuardMask})
	for i, text := range mashedGuardTexts {
		want, _, err := g.Check(text)
		if err != nil {
			t.Fatal(err)
		}
		for _, size := range []int{1, 2, 3, 5, 8, 13, 21, 34, 55, 80, 144} {
			if got := streamAll(t, g, text, size); got != want {
				k := 0
				for k < len(got) && k < len(want) && got[k] == want[k] {
					k++
				}
				t.Errorf("text %d, chunks of %d: stream differs from Check at %d:\n got %q\nwant %q", i, size, k, got[max(0, k-40):min(len(got), k+40)], want[max(0, k-40):min(len(want), k+40)])
				break
			}
		}
	}
}

// TestStreamGuardMatchesCheckOnRandomMashes: random texts glued from
// values, keywords, invisible characters and escapes give the same
// output streamed in random chunks as Check gives whole.
func TestStreamGuardMatchesCheckOnRandomMashes(t *testing.T) {
	g := mustScanner(t).NewGuard(GuardPolicy{Default: GuardMask})
	pieces := []string{"password: Xk9#mQ2vLp7z", "pwd=Hunt3r2!xyz9Q", "my password is Tr0ub4dor&3x", " ", "\n", "\t", "\u200b", "\u200d", "a",
		"word ", "mario.rossi@example.it", "4111 1111 1111 1111", "token ", "secret: ", "Zx8kQ2mP9vLr4TfW7yBn", "\"", ",", ".", "%20", "&amp;",
		"é", "\u00a0", strings.Repeat("lorem ipsum ", 10), "sk-proj-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6", "+39 347 123 4567", "IT60 X054 2811 1010 0000 0123 456"}
	r := rand.New(rand.NewPCG(5, 9))
	for round := 0; round < 2000; round++ {
		var b strings.Builder
		for b.Len() < 200+r.IntN(1500) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		text := b.String()
		want, _, err := g.Check(text)
		if err != nil {
			t.Fatal(err)
		}
		sg := g.NewStream()
		var got strings.Builder
		for i := 0; i < len(text); {
			n := 1 + r.IntN(80)
			o, err := sg.Write(text[i:min(i+n, len(text))])
			if err != nil {
				t.Fatal(err)
			}
			got.WriteString(o)
			i += n
		}
		o, err := sg.Flush()
		if err != nil {
			t.Fatal(err)
		}
		if got.String()+o != want {
			t.Fatalf("round %d: stream differs from Check on %q:\n got %q\nwant %q", round, text, got.String()+o, want)
		}
	}
}
