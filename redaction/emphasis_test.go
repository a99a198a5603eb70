package redaction

import (
	"fmt"
	"strings"
	"testing"
)

// emphasisKeys are keys of the secret rules' formats (see handSecretRules
// and gitleaks' default rules), built here, so that where each key starts
// and ends is known without the scanner.
var emphasisKeys = []struct{ name, sub, key string }{
	{"github classic", "github", keyGitHub},
	{"github oauth", "github", keyGitHubOA},
	{"github fine-grained", "github", keyGitHubPAT},
	{"openai project", "openai", keyOpenAI},
	{"openai project with _ and - inside", "openai", "sk-proj-" + rnd(21, 20, alnum) + "_" + rnd(22, 20, alnum) + "-" + rnd(23, 20, alnum)},
	{"openai project, gitleaks' shape", "openai", "sk-proj-" + rnd(24, 74, alnum+"-") + "T3BlbkFJ" + rnd(25, 74, alnum+"-")},
	{"openai legacy", "openai", keyOpenAIOld},
	{"anthropic", "anthropic", keyAnthropic},
	{"aws access key", "aws_access_key", keyAWS},
	{"aws session key", "aws_access_key", "ASIA" + rnd(26, 16, upperD)},
	{"slack bot", "slack", keySlack},
	{"slack app", "slack", "xapp-1-A" + rnd(27, 10, upperD) + "-" + rnd(28, 13, digitsA) + "-" + rnd(29, 64, "0123456789abcdef")},
	{"stripe secret", "stripe", keyStripe},
	{"stripe restricted", "stripe", keyStripeRK},
	{"stripe webhook", "stripe", "whsec_" + rnd(30, 32, alnum)},
	{"google", "google", keyGoogle},
	{"google with - and _ inside", "google", "AIza" + rnd(31, 15, alnum) + "-" + rnd(32, 10, alnum) + "_" + rnd(33, 8, alnum)},
	{"jwt", "jwt", keyJWT},
}

// emphasisWrappers are the Markdown ways of setting a value apart: the
// markers on either side are no part of it.
var emphasisWrappers = []struct{ open, close string }{
	{"", ""},
	{"__", "__"},
	{"_", "_"},
	{"**", "**"},
	{"*", "*"},
	{"`", "`"},
	{"~~", "~~"},
	{"***", "***"},
	{"**_", "_**"},
	{"_**", "**_"},
}

// TestSecretsInMarkdownEmphasis checks that a key set in Markdown
// emphasis (bold or italics with '*' or '_', strike-through, inline code)
// is found once, with exactly its own bounds, at the start of a text and
// in a sentence: the offsets come from how the text was put together.
func TestSecretsInMarkdownEmphasis(t *testing.T) {
	s, err := NewScanner(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range emphasisKeys {
		for _, w := range emphasisWrappers {
			for _, ctx := range [][2]string{{"", ""}, {"my token is ", " — keep it safe."}, {"key:\n", ",\n"}} {
				pre := ctx[0] + w.open
				text := pre + k.key + w.close + ctx[1]
				name := fmt.Sprintf("%s in %s%s %q", k.name, w.open, w.close, ctx[0])
				checkOneSecret(t, s, name, text, k.sub, len(pre), len(pre)+len(k.key))
			}
		}
	}
}

// TestSecretsEndingInUnderscoreInEmphasis checks the keys whose alphabet
// has '_' and which end in one: a closing run of '_' as long as the
// opening run is the emphasis, any '_' left before it is the key's.
func TestSecretsEndingInUnderscoreInEmphasis(t *testing.T) {
	s, err := NewScanner(Config{})
	if err != nil {
		t.Fatal(err)
	}
	keys := []struct{ name, sub, key string }{
		{"openai project", "openai", "sk-proj-" + rnd(34, 40, alnum) + "_"},
		{"openai project ending in two", "openai", "sk-proj-" + rnd(35, 40, alnum) + "__"},
		{"anthropic", "anthropic", "sk-ant-api03-" + rnd(36, 80, alnum) + "_"},
		{"google", "google", "AIza" + rnd(37, 34, alnum) + "_"},
	}
	for _, k := range keys {
		for _, w := range []string{"", "_", "__"} {
			pre := "see " + w
			text := pre + k.key + w + " now"
			checkOneSecret(t, s, fmt.Sprintf("%s in %s%s", k.name, w, w), text, k.sub, len(pre), len(pre)+len(k.key))
		}
	}
}

// TestSecretValuesInUnderscoreEmphasis checks the rules that read a value
// after a keyword, whose alphabets have '_': the emphasis around the
// value is no part of it.
func TestSecretValuesInUnderscoreEmphasis(t *testing.T) {
	s, err := NewScanner(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ sub, before, value, after string }{
		{"password", "password: ", "Hunt3r2!xyz9Q", " ok"},
		{"bearer", "Authorization: Bearer ", keyGeneric, " now"},
		{"generic", "api_key = ", keyGeneric, ""},
	} {
		for _, w := range []string{"_", "__"} {
			pre := c.before + w
			text := pre + c.value + w + c.after
			checkOneSecret(t, s, c.sub+" in "+w+w, text, c.sub, len(pre), len(pre)+len(c.value))
		}
	}
}

// TestUnderscoreGlueIsNoEmphasis checks that '_' runs that do not set a
// value apart still glue it to an identifier for the rules that ask for
// a word boundary: an opening run after a word byte, or a run left open,
// or closed by a run of another length.
func TestUnderscoreGlueIsNoEmphasis(t *testing.T) {
	s, err := NewScanner(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{
		"id_" + keyAWS + "_x",
		"my_" + keyAWS,
		"x__" + keyAWS + "__",
		"_" + keyAWS + "x",
		"__" + keyAWS + "_ and",
		"_" + keyAWS + "__ and",
		"v_" + keyStripe + "_",
	} {
		var got []string
		for _, f := range s.Scan(text) {
			if f.Type == TypeSecret {
				got = append(got, text[f.Start:f.End])
			}
		}
		if len(got) > 0 {
			t.Errorf("Scan(%q): secrets %q, want none", text, got)
		}
	}
}

// checkOneSecret asserts that Scan finds exactly one secret in text, of
// subtype sub, at [start, end).
func checkOneSecret(t *testing.T, s *Scanner, name, text, sub string, start, end int) {
	t.Helper()
	var got []Finding
	for _, f := range s.Scan(text) {
		if f.Type == TypeSecret {
			got = append(got, f)
		}
	}
	if len(got) != 1 || got[0].Subtype != sub || got[0].Start != start || got[0].End != end {
		var desc []string
		for _, f := range got {
			desc = append(desc, fmt.Sprintf("%s [%d,%d) %q", f.Subtype, f.Start, f.End, text[f.Start:f.End]))
		}
		t.Errorf("%s: Scan(%q)\n got %s\nwant one %s secret [%d,%d) %q", name, text, strings.Join(desc, "; "), sub, start, end, text[start:end])
	}
}

// TestKeywordSecretsInMarkdown checks the keyword rules (gitleaks'
// generic-api-key and its semi-generic family) on assignments as Markdown
// writes them: the keyword or the value in bold, italics or strike-through,
// a list item, a bold label with the value in inline code. Each text holds
// one value, found once with exactly its own bounds (from how the text was
// put together).
func TestKeywordSecretsInMarkdown(t *testing.T) {
	s, err := NewScanner(Config{})
	if err != nil {
		t.Fatal(err)
	}
	v := rnd(61, 32, alnum)
	for _, c := range []struct{ before, after string }{
		{"token: **", "**"},
		{"token: *", "*"},
		{"token: ~~", "~~"},
		{"token: ***", "***"},
		{"**api_key**: ", ""},
		{"*api_key*: ", " (rotate it monthly)"},
		{"~~api_key~~ = ", ""},
		{"- **Token:** `", "`"},
		{"* **Access token**: ", "\n* **Expires**: never"},
		{"**API key** = **", "**"},
		{"Here it is:\n\n**auth_token:** ", "\n\nKeep it safe."},
		{"| key | value |\n|---|---|\n| **api_key** => `", "` |"},
	} {
		text := c.before + v + c.after
		checkOneSecret(t, s, fmt.Sprintf("%q…%q", c.before, c.after), text, "generic", len(c.before), len(c.before)+len(v))
	}
}

// TestMarkdownWithoutSecretsHasNone checks that reading Markdown without
// its markers finds no secret where there is none: keywords in emphasis
// next to words, numbers and placeholders.
func TestMarkdownWithoutSecretsHasNone(t *testing.T) {
	s, err := NewScanner(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{
		"**Token** budget: *1,500 tokens* per request, **max_tokens**: 256.",
		"The **api_key** field is *required*; see **Authentication**: the docs.",
		"**Note:** set `token: <your token>` in the config, then restart.",
		"a * key * value and key ** 2 = key_squared",
		"~~secret~~: **see the vault**, not this page.",
		"- **Key**: `Enter`\n- **Token**: *none yet*",
	} {
		for _, f := range s.Scan(text) {
			if f.Type == TypeSecret {
				t.Errorf("Scan(%q): secret %q (%s), want none", text, text[f.Start:f.End], f.Subtype)
			}
		}
	}
}

// TestIBANsInUnderscoreEmphasis checks IBANs (the registry's published
// examples, whose check digits are right) written whole and in groups of
// four, set in Markdown emphasis: found once, with the IBAN's own bounds;
// glued to an identifier by '_', not found.
func TestIBANsInUnderscoreEmphasis(t *testing.T) {
	s, err := NewScanner(Config{})
	if err != nil {
		t.Fatal(err)
	}
	grouped := func(iban string) string {
		var b strings.Builder
		for i := 0; i < len(iban); i += 4 {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(iban[i:min(len(iban), i+4)])
		}
		return b.String()
	}
	for _, iban := range []string{"IT60X0542811101000000123456", "DE89370400440532013000", "GB29NWBK60161331926819", "FR1420041010050500013M02606", "NL91ABNA0417164300"} {
		for _, v := range []string{iban, grouped(iban)} {
			for _, w := range []string{"", "_", "__", "**", "*"} {
				pre := "IBAN: " + w
				text := pre + v + w + " please"
				var got []Finding
				for _, f := range s.Scan(text) {
					if f.Type == TypeIBAN {
						got = append(got, f)
					}
				}
				if len(got) != 1 || got[0].Start != len(pre) || got[0].End != len(pre)+len(v) {
					t.Errorf("Scan(%q): IBANs %v, want one at [%d,%d)", text, got, len(pre), len(pre)+len(v))
				}
			}
		}
		for _, text := range []string{"id_" + iban, "ref_" + iban + "_x"} {
			for _, f := range s.Scan(text) {
				if f.Type == TypeIBAN {
					t.Errorf("Scan(%q): IBAN %q, want none (glued to an identifier)", text, text[f.Start:f.End])
				}
			}
		}
	}
}
