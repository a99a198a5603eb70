package redaction

import (
	"strings"
	"testing"
)

// covered reports whether the findings fs cover every byte of
// text[start:end].
func covered(fs []Finding, start, end int) bool {
	for k := start; k < end; k++ {
		in := false
		for _, f := range fs {
			if f.Start <= k && k < f.End {
				in = true
				break
			}
		}
		if !in {
			return false
		}
	}
	return true
}

// TestScanFindsEvasions: each text hides one value, written by hand
// (the oracle is the value's bytes as written, not a detector's output);
// the scan must cover all of them with findings of the value's type.
func TestScanFindsEvasions(t *testing.T) {
	s, err := NewScanner(Config{DefaultRegion: "IT"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, text, value, typ string
	}{
		{"a fiscal code in groups of three and five", "codice fiscale RSS MRA 80A01 H501U, grazie", "RSS MRA 80A01 H501U", TypeITFiscalCode},
		{"a fiscal code in dashed groups", "CF: RSS-MRA-80A01-H501U.", "RSS-MRA-80A01-H501U", TypeITFiscalCode},
		{"a fiscal code in two groups, lower case", "il mio cf è rssmra 80a01h501u ok", "rssmra 80a01h501u", TypeITFiscalCode},
		{"a fiscal code in dotted groups", "cf RSS.MRA.80A01.H501U", "RSS.MRA.80A01.H501U", TypeITFiscalCode},
		{"a fiscal code in underscored groups", "cf RSS_MRA_80A01_H501U", "RSS_MRA_80A01_H501U", TypeITFiscalCode},
		{"a fiscal code in slashed groups", "cf RSS/MRA/80A01/H501U", "RSS/MRA/80A01/H501U", TypeITFiscalCode},
		{"a fiscal code with every character apart", "cf R S S M R A 8 0 A 0 1 H 5 0 1 U.", "R S S M R A 8 0 A 0 1 H 5 0 1 U", TypeITFiscalCode},
		{"a fiscal code with its year split", "cf RSS MRA 8 0 A01 H501U", "RSS MRA 8 0 A01 H501U", TypeITFiscalCode},
		// One separator as far from the year as a code holds one (after
		// the first letter, before the check letter), and none outside it.
		{"a fiscal code apart after its first letter", "cf:R/SSMRA80A01H501U;", "R/SSMRA80A01H501U", TypeITFiscalCode},
		{"a fiscal code apart before its check letter", "cf:RSSMRA80A01H501 U;", "RSSMRA80A01H501 U", TypeITFiscalCode},
		{"a fiscal code with a split year apart before its check letter", "cf:RSSMRA8 0A01H501U;", "RSSMRA8 0A01H501U", TypeITFiscalCode},
		{"a six-letter omocodic code apart before its check letter", "cf:RSSMRA8LALMHRLM G;", "RSSMRA8LALMHRLM G", TypeITFiscalCode},
		{"an omocodic fiscal code in groups", "codice RSS MRA 85T10 A56NH", "RSS MRA 85T10 A56NH", TypeITFiscalCode},
		// RSSMRA80A01H501U with its last five and six digits replaced by
		// omocodic letters (LMNPQRSTUV), the check letter computed by hand
		// with the DM 23/12/1976 tables (and by fiscalCheckByHand below).
		{"a fiscal code with five omocodic letters in groups", "codice RSS MRA 80ALM HRLMV grazie", "RSS MRA 80ALM HRLMV", TypeITFiscalCode},
		{"a fiscal code with six omocodic letters in groups", "codice RSS MRA 8LALM HRLMG grazie", "RSS MRA 8LALM HRLMG", TypeITFiscalCode},
		{"a fiscal code with six omocodic letters in dashed groups, lower case", "cf: rss-mra-8lalm-hrlmg.", "rss-mra-8lalm-hrlmg", TypeITFiscalCode},
		// AWS's documented example access key id, AKIAIOSFODNN7EXAMPLE,
		// written in groups of four.
		{"an AWS key id in groups of four", "my key is AKIA IOSF ODNN 7EXA MPLE, thanks", "AKIA IOSF ODNN 7EXA MPLE", TypeSecret},
		{"an AWS key id in dashed groups", "aws_access_key_id: AKIA-IOSF-ODNN-7EXA-MPLE", "AKIA-IOSF-ODNN-7EXA-MPLE", TypeSecret},
		{"an AWS key id in groups apart by en dashes", "key (AKIA–IOSF–ODNN–7EXA–MPLE)", "AKIA–IOSF–ODNN–7EXA–MPLE", TypeSecret},
		{"an AWS key id in groups apart by no-break spaces", "key AKIA IOSF ODNN 7EXA MPLE.", "AKIA IOSF ODNN 7EXA MPLE", TypeSecret},
		{"a temporary AWS key id in groups", "ASIA Y34F ZKBO KMUT VVIX here", "ASIA Y34F ZKBO KMUT VVIX", TypeSecret},
		{"a card in groups apart by middle dots", "card 4111·1111·1111·1111 ok", "4111·1111·1111·1111", TypeCreditCard},
		{"a card in groups apart by katakana middle dots", "カード: 4111・1111・1111・1111 です", "4111・1111・1111・1111", TypeCreditCard},
		{"a card glued to Japanese", "カード4111 1111 1111 1111です", "4111 1111 1111 1111", TypeCreditCard},
		{"a card glued to Chinese", "卡号4111111111111111谢谢", "4111111111111111", TypeCreditCard},
		{"a card glued to Korean", "카드4111-1111-1111-1111입니다", "4111-1111-1111-1111", TypeCreditCard},
		{"an IBAN glued to Chinese", "IBAN是DE89370400440532013000谢谢", "DE89370400440532013000", TypeIBAN},
		{"a phone number glued to Chinese", "电话+8613812345678", "+8613812345678", TypePhone},
		{"a key wrapped at a line break", "token: ghp_0123456789abcdefghij\n  ABCDEFGHIJ012345 end", "ghp_0123456789abcdefghij\n  ABCDEFGHIJ012345", TypeSecret},
		{"a key wrapped at CRLF", "key sk-proj-abcdefghijABCDEFGHIJ0123456789abcdefghijABCDEFGHIJ01\r\n23456789abcdefghij", "sk-proj-abcdefghijABCDEFGHIJ0123456789abcdefghijABCDEFGHIJ01\r\n23456789abcdefghij", TypeSecret},
		{"a key in two adjacent string literals", "token = \"ghp_0123456789abcdefghij\"\n    \"ABCDEFGHIJ012345\"", "ghp_0123456789abcdefghij\"\n    \"ABCDEFGHIJ012345", TypeSecret},
		{"a key in concatenated literals", "const k = \"ghp_0123456789abcdefghij\" +\n\t\"ABCDEFGHIJ012345\";", "ghp_0123456789abcdefghij\" +\n\t\"ABCDEFGHIJ012345", TypeSecret},
		{"a key over three lines", "export GH=ghp_0123456789ab\\\ncdefghijABCDEFGH\\\nIJ012345 ok", "ghp_0123456789ab\\\ncdefghijABCDEFGH\\\nIJ012345", TypeSecret},
		{"a key wrapped after its prefix", "OPENAI_API_KEY=\"sk-\"\n  \"proj-abcdefghijABCDEFGHIJ0123456789abcdefghijABCDEFGHIJ0123456789abcdefghij\"", "sk-\"\n  \"proj-abcdefghijABCDEFGHIJ0123456789abcdefghijABCDEFGHIJ0123456789abcdefghij", TypeSecret},
		{"an address with spaced dots and a spaced at", "write to john . doe @ example . com today", "john . doe @ example . com", TypeEmail},
		{"an address with a spaced at only", "write to john.doe @ example.com today", "john.doe @ example.com", TypeEmail},
		{"an address with a spaced dot in the domain", "write to john.doe@example . com today", "john.doe@example . com", TypeEmail},
		{"an address with a spaced dot in the local part", "write to john . doe@example.com today", "john . doe@example.com", TypeEmail},
		{"an address with a spaced dot after a dotted domain", "write to anna@mail.example . org today", "anna@mail.example . org", TypeEmail},
		{"an address with [at] and [dot]", "write to john [at] example [dot] com today", "john [at] example [dot] com", TypeEmail},
		{"an address with (at) and (dot)", "write to john(at)example(dot)com today", "john(at)example(dot)com", TypeEmail},
		{"a quoted-printable at", "From: john=40example.com", "john=40example.com", TypeEmail},
		{"a quoted-printable at and a soft break", "To: john.doe=40exa=\r\nmple.com\r\n", "john.doe=40exa=\r\nmple.com", TypeEmail},
		{"a quoted-printable fullwidth at", "mail john=EF=BC=A0example.com now", "john=EF=BC=A0example.com", TypeEmail},
		{"a percent-escape encoded twice", "mail john%2540example.com now", "john%2540example.com", TypeEmail},
		{"a percent-escape encoded three times", "mail john%252540example.com now", "john%252540example.com", TypeEmail},
		{"a character reference escaped again", "mail john&amp;#64;example&amp;#46;com now", "john&amp;#64;example&amp;#46;com", TypeEmail},
		{"a JSON escape escaped again", `mail john\\u0040example.com now`, `john\\u0040example.com`, TypeEmail},
		{"a hex escape escaped again", `mail john\\x40example.com now`, `john\\x40example.com`, TypeEmail},
		{"a quoted-printable assignment", "api_key=3D\"ghp_0123456789abcdefghijABCDEFGHIJ012345\"", "ghp_0123456789abcdefghijABCDEFGHIJ012345", TypeSecret},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			i := strings.Index(tc.text, tc.value)
			if i < 0 {
				t.Fatalf("bad case: %q not in %q", tc.value, tc.text)
			}
			fs := s.Scan(tc.text)
			var typed []Finding
			for _, f := range fs {
				if f.Type == tc.typ {
					typed = append(typed, f)
				}
			}
			if !covered(typed, i, i+len(tc.value)) {
				t.Errorf("Scan(%q) = %v: %s %q not covered", tc.text, fs, tc.typ, tc.value)
			}
		})
	}
}

// TestScanLeavesLookalikesAlone: texts shaped like the evasions above
// that hold no value.
func TestScanLeavesLookalikesAlone(t *testing.T) {
	s, err := NewScanner(Config{DefaultRegion: "IT"})
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{
		"<td width=40 height=3D>x</td> and a=3D b=40 c=2E",
		"meet me @ home. It was late . Then we left",
		"See section RSS MRA 80A01 H501X of the manual.", // wrong check letter
		"cf RSS MRA 8LALM HRLMH",                         // six omocodic letters, wrong check letter
		// Capitals in groups of four after an AWS prefix: words, a year
		// (0 is not in the key alphabet), too few groups, a longer dashed
		// code, groups of five.
		"ASIA WILL HOST GAME SOON AND THEN",
		"ASIA TOUR 2024 LIVE SHOW TONIGHT",
		"ACCA EXAM PREP TIPS BOOK",
		"ref AKIA IOSF ODNN 7EXA only",
		"serial XQ7Z-AKIA-IOSF-ODNN-7EXA-MPLE",
		"serial AKIA-IOSF-ODNN-7EXA-MPLE-XQ7Z",
		"The quick brown fox jumps over the lazy dog and\nkeeps running through the extraordinarily\nlong meadow until dusk.",
		"func someVeryLongFunctionName2024(x int)\n    return anotherLongIdentifier42",
		"The ratio is 3 . 5 and the score 4 . 2 at best.",
		"cartéDE89370400440532013000 is a word, not an IBAN",
		"订单号2024-118734。バージョン1.4.2。주문번호 2024-118735",
		`path C:\\users\\x41bc and 100%25 off, 50%2525 more &amp;amp; less`,
	} {
		if fs := s.Scan(text); len(fs) != 0 {
			t.Errorf("Scan(%q) = %v, want none", text, fs)
		}
	}
}

// fiscalCheckByHand is the check letter of the first 15 characters of a
// fiscal code, written from the tables of DM 23/12/1976 (annex) apart
// from the detector's: odd positions (1st, 3rd, …) by the decree's table,
// even positions by their rank (0-9, A-Z = 0-25), the sum modulo 26 as a
// letter.
func fiscalCheckByHand(code string) byte {
	odd := map[byte]int{
		'0': 1, '1': 0, '2': 5, '3': 7, '4': 9, '5': 13, '6': 15, '7': 17, '8': 19, '9': 21,
		'A': 1, 'B': 0, 'C': 5, 'D': 7, 'E': 9, 'F': 13, 'G': 15, 'H': 17, 'I': 19, 'J': 21, 'K': 2, 'L': 4, 'M': 18,
		'N': 20, 'O': 11, 'P': 3, 'Q': 6, 'R': 8, 'S': 12, 'T': 14, 'U': 16, 'V': 10, 'W': 22, 'X': 25, 'Y': 24, 'Z': 23,
	}
	sum := 0
	for i := 0; i < 15; i++ {
		c := code[i]
		switch {
		case i%2 == 0:
			sum += odd[c]
		case c >= '0' && c <= '9':
			sum += int(c - '0')
		default:
			sum += int(c - 'A')
		}
	}
	return byte('A' + sum%26)
}

// TestGroupedOmocodicFiscalCodes: RSSMRA80A01H501U with one to six of its
// digits replaced by omocodic letters, in the order the Agenzia delle
// Entrate replaces them (from the right: positions 15, 14, 13, 11, 10, 8,
// 7 counted from 1), each written in the usual groups 3-3-5-5 and found.
// The check letters come from fiscalCheckByHand; those of five and six
// letters were also computed by hand (V and G).
func TestGroupedOmocodicFiscalCodes(t *testing.T) {
	s := mustScanner(t)
	code := []byte("RSSMRA80A01H501U")
	want := map[int]string{5: "RSSMRA80ALMHRLMV", 6: "RSSMRA8LALMHRLMG"}
	for n, pos := range []int{14, 13, 12, 10, 9, 7} {
		code[pos] = "LMNPQRSTUV"[code[pos]-'0']
		code[15] = fiscalCheckByHand(string(code))
		c := string(code)
		if w, ok := want[n+1]; ok && c != w {
			t.Fatalf("%d letters: built %s, computed by hand %s", n+1, c, w)
		}
		grouped := c[:3] + " " + c[3:6] + " " + c[6:11] + " " + c[11:]
		text := "il codice fiscale è " + grouped + ", grazie"
		fs := s.Scan(text)
		i := strings.Index(text, grouped)
		if len(fs) != 1 || fs[0].Type != TypeITFiscalCode || fs[0].Start != i || fs[0].End != i+len(grouped) {
			t.Errorf("%d omocodic letters: Scan(%q) = %v, want the code %q", n+1, text, fs, grouped)
		}
	}
}
