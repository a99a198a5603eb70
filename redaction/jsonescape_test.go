package redaction

import "testing"

// TestJSONEscapesDoNotHideValues covers text that is itself JSON (tool-call
// arguments are JSON inside a JSON string): \uXXXX escapes are decoded in the
// normalised view and the finding spans the escaped bytes of the original.
func TestJSONEscapesDoNotHideValues(t *testing.T) {
	s, err := NewScanner(Config{})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, text, typ, value string
	}{
		{"an escaped at sign in an e-mail address", `{"to":"anna\u0040example.org"}`, TypeEmail, `anna\u0040example.org`},
		{"escaped digits of a card number", `{"card":"4111\u00201111\u00201111\u00201111"}`, TypeCreditCard, `4111\u00201111\u00201111\u00201111`},
		{"an upper-case hex escape", `{"to":"anna\u0040EXAMPLE.org"}`, TypeEmail, `anna\u0040EXAMPLE.org`},
		{"a C or JavaScript \\x escape of the at sign", `mail mario.rossi\x40example.com today`, TypeEmail, `mario.rossi\x40example.com`},
		{"\\x escapes of a card's digits", `card \x34111111111111111 ok`, TypeCreditCard, `\x34111111111111111`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []string
			for _, f := range s.Scan(c.text) {
				if f.Type == c.typ {
					got = append(got, c.text[f.Start:f.End])
				}
			}
			if len(got) != 1 || got[0] != c.value {
				t.Fatalf("%s findings %q, want [%q]", c.typ, got, c.value)
			}
		})
	}
	// Escapes that decode to nothing an entity is made of stay unmatched.
	if fs := s.Scan(`{"note":"\u00e8 \u0041BC"}`); len(fs) != 0 {
		t.Fatalf("findings %+v in text without entities", fs)
	}
	if fs := s.Scan(`C:\x00\xff \x4 \xZZ`); len(fs) != 0 {
		t.Fatalf("findings %+v in text without entities", fs)
	}
	if r := jsonEscape(`\ud83d`); r != -1 {
		t.Fatalf("a lone surrogate decoded to %q", r)
	}
}

// TestHashPseudonymsFollowTheEntityNotItsSpelling checks that ModeHash gives
// one pseudonym per entity however it is written.
func TestHashPseudonymsFollowTheEntityNotItsSpelling(t *testing.T) {
	v := NewVault(WithMode(TypeEmail, ModeHash), WithMode(TypeCreditCard, ModeHash), WithHMACKey([]byte("0123456789abcdef0123456789abcdef")))
	for _, tc := range []struct {
		name, typ, a, b string
		same            bool
	}{
		{"e-mail addresses in any case", TypeEmail, "Alice@Example.com", "alice@example.com", true},
		{"card numbers with or without spaces", TypeCreditCard, "4111 1111 1111 1111", "4111111111111111", true},
		{"different addresses", TypeEmail, "alice@example.com", "bob@example.com", false},
		{"an address with a soft hyphen", TypeEmail, "bob@exam\u00adple.com", "bob@example.com", true},
		{"an address in fullwidth forms", TypeEmail, "bob\uff20example\uff0ecom", "bob@example.com", true},
		{"an address with a zero-width space and a NUL", TypeEmail, "b\u200bob@exa\x00mple.com", "BOB@EXAMPLE.COM", true},
		{"a percent-encoded address", TypeEmail, "bob%40example.com", "bob@example.com", true},
		{"a card in fullwidth digits", TypeCreditCard, "\uff14\uff11\uff11\uff11 1111 1111 1111", "4111111111111111", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, pb := v.pseudonym(tc.typ, tc.a), v.pseudonym(tc.typ, tc.b)
			if (pa == pb) != tc.same {
				t.Fatalf("pseudonyms %s and %s, want same=%v", pa, pb, tc.same)
			}
		})
	}
}
