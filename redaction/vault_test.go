package redaction

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

var allTypes = map[string]bool{
	TypeEmail: true, TypePhone: true, TypeCreditCard: true, TypeIBAN: true, TypeSecret: true,
	TypeUSSSN: true, TypeITFiscalCode: true, TypeIPAddress: true, TypeURLCredentials: true,
}

func mustScanner(t testing.TB) *Scanner {
	t.Helper()
	s, err := NewScanner(Config{DefaultRegion: "IT"})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestRedactAndRestoreRoundTrip(t *testing.T) {
	s := mustScanner(t)
	cases := []struct {
		name      string
		text      string
		types     map[string]bool
		redacted  string
		vaultSize int
	}{
		{"a repeated value gets the same placeholder every time",
			"mail mario@example.it, again mario@example.it, or anna@example.it",
			allTypes,
			"mail [EMAIL_1], again [EMAIL_1], or [EMAIL_2]", 2},
		{"values of different types are numbered per type",
			"mario@example.it +39 333 123 4567 anna@example.it 4111 1111 1111 1111",
			allTypes,
			"[EMAIL_1] [PHONE_1] [EMAIL_2] [CREDIT_CARD_1]", 4},
		{"only the types asked for are redacted",
			"mario@example.it +39 333 123 4567",
			map[string]bool{TypePhone: true},
			"mario@example.it [PHONE_1]", 1},
		{"no types redacts nothing",
			"mario@example.it +39 333 123 4567",
			nil,
			"mario@example.it +39 333 123 4567", 0},
		{"a placeholder the user typed is never issued",
			"literal [EMAIL_1] and mario@example.it",
			allTypes,
			"literal [EMAIL_1] and [EMAIL_2]", 1},
		{"multi-byte text around values survives",
			"È già tutto qui: mario@example.it — grazie ☺",
			allTypes,
			"È già tutto qui: [EMAIL_1] — grazie ☺", 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := NewVault()
			got := v.Redact(c.text, s.Scan(c.text), c.types)
			if got != c.redacted {
				t.Fatalf("Redact = %q, want %q", got, c.redacted)
			}
			if v.Len() != c.vaultSize {
				t.Errorf("Len() = %d, want %d", v.Len(), c.vaultSize)
			}
			if back := v.Restore(got); back != c.text {
				t.Errorf("Restore = %q, want %q", back, c.text)
			}
			if v.Unknown() != 0 {
				t.Errorf("Unknown() = %d after a clean round trip", v.Unknown())
			}
		})
	}
}

func TestPlaceholdersArePrefixFree(t *testing.T) {
	v := NewVault()
	var text strings.Builder
	var fs []Finding
	for i := 1; i <= 12; i++ {
		val := fmt.Sprintf("user%02d@example.com", i)
		fs = append(fs, Finding{Type: TypeEmail, Start: text.Len(), End: text.Len() + len(val)})
		text.WriteString(val)
		text.WriteString(" ")
	}
	red := v.Redact(text.String(), fs, allTypes)
	phs := v.Placeholders()
	if len(phs) != 12 {
		t.Fatalf("issued %d placeholders, want 12", len(phs))
	}
	for a := range phs {
		for b := range phs {
			if a != b && strings.HasPrefix(b, a) {
				t.Errorf("placeholder %q is a prefix of %q", a, b)
			}
		}
	}
	// [EMAIL_1] and [EMAIL_10] … [EMAIL_12] restore to their own values.
	answer := "first [EMAIL_1], tenth [EMAIL_10], twelfth [EMAIL_12]."
	want := "first user01@example.com, tenth user10@example.com, twelfth user12@example.com."
	if got := v.Restore(answer); got != want {
		t.Errorf("Restore(%q) = %q, want %q", answer, got, want)
	}
	if got := v.Restore(red); got != text.String() {
		t.Errorf("round trip = %q", got)
	}
}

func TestRestoreLeavesUnknownAndMangledPlaceholders(t *testing.T) {
	v := NewVault()
	v.Redact("a@example.com", []Finding{{Type: TypeEmail, Start: 0, End: 13}}, allTypes)
	cases := []struct {
		name    string
		in      string
		want    string
		unknown int
	}{
		{"a known placeholder is restored", "to [EMAIL_1]", "to a@example.com", 0},
		{"an invented number of a known type stays and is counted", "to [EMAIL_2] and [PHONE_7]", "to [EMAIL_2] and [PHONE_7]", 2},
		{"a mangled placeholder stays and is not restored", "to [EMAIL_1 ] [email_1] [EMAIL_01] EMAIL_1] [EMAIL_1", "to [EMAIL_1 ] [email_1] [EMAIL_01] EMAIL_1] [EMAIL_1", 0},
		{"a bracketed word that is no entity type is not counted", "see [STEP_1] and [NOTE_2]", "see [STEP_1] and [NOTE_2]", 0},
		{"a placeholder glued to text is still restored", "x[EMAIL_1]y", "xa@example.comy", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := v.Unknown()
			if got := v.Restore(c.in); got != c.want {
				t.Errorf("Restore(%q) = %q, want %q", c.in, got, c.want)
			}
			if d := v.Unknown() - before; d != c.unknown {
				t.Errorf("Unknown grew by %d, want %d", d, c.unknown)
			}
		})
	}
}

func TestRestoreJSONEscapesValues(t *testing.T) {
	v := NewVault()
	val := "pa\"ss\\wo\nrd\t\x01\u2028é"
	text := "secret: " + val
	v.Redact(text, []Finding{{Type: TypeSecret, Start: 8, End: len(text)}}, allTypes)
	raw := []byte(`{"choices":[{"message":{"content":"it is [SECRET_1] ok"}}]}`)
	out := v.RestoreJSON(raw)
	var doc struct {
		Choices []struct {
			Message struct{ Content string }
		}
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("RestoreJSON produced invalid JSON %s: %v", out, err)
	}
	if got, want := doc.Choices[0].Message.Content, "it is "+val+" ok"; got != want {
		t.Errorf("decoded content = %q, want %q", got, want)
	}
	if !strings.Contains(string(out), `pa\"ss\\wo\nrd\t\u0001\u2028é`) {
		t.Errorf("RestoreJSON = %s, want the value JSON-escaped", out)
	}
	if string(raw) != `{"choices":[{"message":{"content":"it is [SECRET_1] ok"}}]}` {
		t.Error("RestoreJSON modified its input")
	}
}

func TestVaultIsSafeForConcurrentUse(t *testing.T) {
	s := mustScanner(t)
	v := NewVault()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				text := fmt.Sprintf("from user%d@example.com to shared@example.com, n %d", (g*50+i)%20, i)
				red := v.Redact(text, s.Scan(text), allTypes)
				if back := v.Restore(red); back != text {
					t.Errorf("round trip %q -> %q -> %q", text, red, back)
					return
				}
				r := v.NewStreamRestorer()
				got := r.Write(red[:len(red)/2]) + r.Write(red[len(red)/2:]) + r.Flush()
				if got != text {
					t.Errorf("stream round trip %q -> %q", text, got)
					return
				}
				_ = v.RestoreJSON([]byte(`"` + red + `"`))
				_, _ = v.Len(), v.Unknown()
			}
		}()
	}
	wg.Wait()
	if v.Len() != 21 { // user0..user19 plus shared
		t.Errorf("Len() = %d, want 21", v.Len())
	}
}

// streamFixture is a vault holding a dozen values and an answer that uses
// them, unknown and mangled placeholders, brackets, and multi-byte text.
func streamFixture(t testing.TB) (*Vault, string) {
	v := NewVault()
	var fs []Finding
	var text strings.Builder
	vals := []string{"mario@example.it", "+39 333 123 4567", "4111 1111 1111 1111", "IT60 X054 2811 1010 0000 0123 456", "sk-ant-ÿ\"\\x"}
	for i := 0; i < 12; i++ {
		val := vals[i%len(vals)] + strings.Repeat("·", i/len(vals))
		fs = append(fs, Finding{Type: builtinTypes[i%len(builtinTypes)], Start: text.Len(), End: text.Len() + len(val)})
		text.WriteString(val)
		text.WriteString("|")
	}
	red := v.Redact(text.String(), fs, allTypes)
	answer := "Ecco: " + red + " — [EMAIL_99] [EMAIL_1 [[PHONE_1]] [" + " naïve ☺ 日本語 [SECRET_1]"
	return v, answer
}

func TestStreamRestorerMatchesRestoreUnderRandomChunking(t *testing.T) {
	v, answer := streamFixture(t)
	want := v.Restore(answer)
	rng := rand.New(rand.NewPCG(42, 4242))
	for trial := range 2000 {
		r := v.NewStreamRestorer()
		var got strings.Builder
		for rest := answer; rest != ""; {
			n := 1 + rng.IntN(min(len(rest), 1+rng.IntN(24)))
			out := r.Write(rest[:n])
			if !utf8.ValidString(out) {
				t.Fatalf("trial %d: emitted invalid UTF-8 %q", trial, out)
			}
			if r.Pending() > maxPlaceholderLen+utf8.UTFMax {
				t.Fatalf("trial %d: holding back %d bytes", trial, r.Pending())
			}
			got.WriteString(out)
			rest = rest[n:]
		}
		got.WriteString(r.Flush())
		if got.String() != want {
			t.Fatalf("trial %d: stream = %q\nwant %q", trial, got.String(), want)
		}
	}
}

func TestStreamRestorerHoldsBackOnlyPossiblePlaceholders(t *testing.T) {
	v := NewVault()
	v.Redact("a@example.com", []Finding{{Type: TypeEmail, Start: 0, End: 13}}, allTypes)
	cases := []struct {
		name   string
		chunks []string
		emits  []string // what each Write returns
		flush  string
	}{
		{"plain text passes straight through", []string{"hello ", "world"}, []string{"hello ", "world"}, ""},
		{"a placeholder split across three chunks is restored whole", []string{"to [EM", "AIL_", "1] now"}, []string{"to ", "", "a@example.com now"}, ""},
		{"a bracket followed by a non-placeholder byte is released at once", []string{"x [a", "b]"}, []string{"x [a", "b]"}, ""},
		{"a half UTF-8 character is held until complete", []string{"caf\xc3", "\xa9!"}, []string{"caf", "é!"}, ""},
		{"an unfinished placeholder at the end is flushed as is", []string{"to [EMAIL_1"}, []string{"to "}, "[EMAIL_1"},
		{"a run longer than any placeholder is released", []string{"[" + strings.Repeat("A", maxPlaceholderLen)}, []string{"[" + strings.Repeat("A", maxPlaceholderLen)}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := v.NewStreamRestorer()
			for i, ch := range c.chunks {
				if got := r.Write(ch); got != c.emits[i] {
					t.Errorf("Write(%q) = %q, want %q", ch, got, c.emits[i])
				}
			}
			if got := r.Flush(); got != c.flush {
				t.Errorf("Flush() = %q, want %q", got, c.flush)
			}
		})
	}
}

func TestScannerIsSafeForConcurrentUse(t *testing.T) {
	s := mustScanner(t)
	texts := []string{
		repeatTo(densePara, 3000),
		"ｍａｒｉｏ＠ｅｘａｍｐｌｅ．ｃｏｍ and " + keyOpenAI + " and " + keyJWT,
		repeatTo(prosePara, 2000),
	}
	want := make([][]Finding, len(texts))
	for i, x := range texts {
		want[i] = s.Scan(x)
	}
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				k := (g + i) % len(texts)
				if got := s.Scan(texts[k]); !slices.Equal(got, want[k]) {
					t.Errorf("concurrent Scan of text %d differs", k)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestModesMaskAndHashAreIrreversible(t *testing.T) {
	text := "mail mario@example.it, card 4111 1111 1111 1111, phone +39 333 123 4567, mario@example.it"
	s := mustScanner(t)
	fs := s.Scan(text)
	key := []byte("0123456789abcdef0123456789abcdef")
	newVault := func() *Vault {
		return NewVault(WithMode(TypeCreditCard, ModeMask), WithMode(TypeEmail, ModeHash), WithHMACKey(key))
	}
	v := newVault()
	red := v.Redact(text, fs, allTypes)
	ps := v.pseudonym(TypeEmail, "mario@example.it")
	if !regexp.MustCompile(`^\[EMAIL#[0-9a-f]{16}\]$`).MatchString(ps) {
		t.Fatalf("pseudonym %q does not have the shape [EMAIL#<16 hex>]", ps)
	}
	if want := "mail " + ps + ", card [CREDIT_CARD], phone [PHONE_1], " + ps; red != want {
		t.Fatalf("Redact = %q, want %q", red, want)
	}
	if v.Len() != 1 {
		t.Errorf("Len() = %d, want 1 (only the phone is held)", v.Len())
	}
	if got := v.Restore(red); got != strings.Replace(red, "[PHONE_1]", "+39 333 123 4567", 1) {
		t.Errorf("Restore = %q: only the phone comes back", got)
	}
	if other := newVault().Redact(text, fs, allTypes); other != red {
		t.Errorf("a second vault with the same key gave %q, want %q", other, red)
	}
	if v.Unknown() != 0 {
		t.Errorf("masks and pseudonyms were counted as unknown placeholders: %d", v.Unknown())
	}
	for _, m := range []Mode{ModePlaceholder, ModeMask, ModeHash} {
		if p, err := ParseMode(m.String()); err != nil || p != m {
			t.Errorf("ParseMode(%q) = %v, %v", m.String(), p, err)
		}
	}
	if _, err := ParseMode("shred"); err == nil || !strings.Contains(err.Error(), `"shred"`) {
		t.Errorf("ParseMode(shred) error = %v, want one naming it", err)
	}
}

func TestJSONStreamRestorerEscapesValuesInToolArguments(t *testing.T) {
	v := NewVault()
	val := `a"b\c`
	v.Redact(val, []Finding{{Type: TypeSecret, Start: 0, End: len(val)}}, allTypes)
	args := `{"password":"[SECRET_1]","n":1}`
	r := v.NewJSONStreamRestorer()
	var got strings.Builder
	for i := 0; i < len(args); i += 5 {
		got.WriteString(r.Write(args[i:min(i+5, len(args))]))
	}
	got.WriteString(r.Flush())
	var doc struct{ Password string }
	if err := json.Unmarshal([]byte(got.String()), &doc); err != nil {
		t.Fatalf("restored arguments %s are not JSON: %v", got.String(), err)
	}
	if doc.Password != val {
		t.Errorf("password = %q, want %q", doc.Password, val)
	}
	if want := string(v.RestoreJSON([]byte(args))); got.String() != want {
		t.Errorf("stream = %s, RestoreJSON = %s", got.String(), want)
	}
}
