package redaction

import (
	"math/big"
	"strings"
	"testing"
	"unicode"
)

// luhnOK is the Luhn check (ISO/IEC 7812-1 annex B) over the digits of s,
// written here apart from the detector's.
func luhnOK(s string) bool {
	var ds []int
	for _, r := range s {
		if r >= '0' && r <= '9' {
			ds = append(ds, int(r-'0'))
		}
	}
	sum := 0
	for i := range ds {
		d := ds[len(ds)-1-i]
		if i%2 == 1 {
			d *= 2
			if d > 9 {
				d -= 9
			}
		}
		sum += d
	}
	return len(ds) >= 12 && sum%10 == 0
}

// ibanOK is the ISO 13616 check (ISO 7064 mod 97-10) over s with its
// spaces removed, with math/big: apart from the detector's.
func ibanOK(s string) bool {
	s = strings.Map(func(r rune) rune {
		if unicode.IsSpace(r) || r == '-' {
			return -1
		}
		return r
	}, s)
	if len(s) < 15 {
		return false
	}
	var b strings.Builder
	for _, r := range s[4:] + s[:4] {
		switch {
		case r >= '0' && r <= '9':
			b.WriteRune(r)
		case r >= 'A' && r <= 'Z':
			b.WriteString(big.NewInt(int64(r - 'A' + 10)).String())
		default:
			return false
		}
	}
	n, ok := new(big.Int).SetString(b.String(), 10)
	return ok && new(big.Int).Mod(n, big.NewInt(97)).Int64() == 1
}

// TestHuntOraclesAreValid: the cards and IBANs the hunt cases use pass
// the independent checks (and the near-misses fail them).
func TestHuntOraclesAreValid(t *testing.T) {
	for _, c := range huntCards {
		if !luhnOK(c) {
			t.Errorf("card %q fails Luhn", c)
		}
	}
	for _, c := range huntIBANs {
		if !ibanOK(c) {
			t.Errorf("IBAN %q fails mod 97", c)
		}
	}
	if luhnOK("4111 1111 1111 1112") || ibanOK("GB82 WEST 1234 5698 7654 33") {
		t.Error("a near-miss passes its check")
	}
	for _, c := range []string{"4111111111111111", "5555555555554444", "378282246310005"} {
		if !luhnOK(c) {
			t.Errorf("card %q fails Luhn", c)
		}
	}
	for _, c := range []string{"DE89 3704 0044 0532 0130 00", "IT60 X054 2811 1010 0000 0123 456"} {
		if !ibanOK(c) {
			t.Errorf("IBAN %q fails mod 97", c)
		}
	}
}

var huntCards = []string{"4111-1111-1111-1111", "4111.1111.1111.1111", "5555 5555 5555 4444", "5105-1051-0510-5100", "3782 822463 10005", "3782-822463-10005", "6011 1111 1111 1117"}

var huntIBANs = []string{"GB82 WEST 1234 5698 7654 32", "FR14 2004 1010 0505 0001 3M02 606", "ES91 2100 0418 4502 0005 1332", "NL91 ABNA 0417 1643 00", "CH93 0076 2011 6238 5295 7", "BE68 5390 0754 7034", "AT61 1904 3002 3457 3201", "PL61 1090 1014 0000 0712 1981 2874"}

// TestHuntRealisticShapes: values in the shapes people paste them, with
// the spans by hand.
func TestHuntRealisticShapes(t *testing.T) {
	var cases []scanCase
	for _, c := range huntCards {
		cases = append(cases, scanCase{"card " + c, "", "pay with " + c + " today", []string{"CREDIT_CARD:" + c}})
	}
	for _, c := range huntIBANs {
		cases = append(cases, scanCase{"IBAN " + c, "", "IBAN: " + c + ", thanks", []string{"IBAN:" + c}})
	}
	cases = append(cases, []scanCase{
		// Secrets in JSON strings, escaped once and twice.
		{"a key in a JSON string", "", `{"api_key":"sk-proj-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6"}`, []string{"SECRET:sk-proj-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6"}},
		{"a password in an escaped JSON string", "", `{"body":"{\"password\":\"Xk9#mQ2vLp7z\"}"}`, []string{"SECRET:Xk9#mQ2vLp7z"}},
		{"a password with an escaped slash", "", `{"password": "Xk9\/mQ2vLp7z"}`, []string{`SECRET:Xk9\/mQ2vLp7z`}},
		{"a GitHub token in an escaped JSON string", "", `"{\"token\": \"ghp_0123456789abcdefghijABCDEFGHIJ012345\"}"`, []string{"SECRET:ghp_0123456789abcdefghijABCDEFGHIJ012345"}},
		// URL-encoded values.
		{"a password in a query string", "", "https://example.com/login?user=mario&password=Xk9%23mQ2vLp7z&x=1", []string{"SECRET:Xk9%23mQ2vLp7z"}},
		{"an address in a query string", "", "https://example.com/unsubscribe?email=mario.rossi%40example.it&list=3", []string{"EMAIL:mario.rossi%40example.it"}},
		{"a card percent-encoded with spaces", "", "GET /pay?card=4111%201111%201111%201111 HTTP/1.1", []string{"CREDIT_CARD:4111%201111%201111%201111"}},
		// Markdown tables and code fences.
		{"values in a markdown table", "", "| name | email | phone |\n|---|---|---|\n| Mario | mario.rossi@example.it | +39 347 123 4567 |\n", []string{"EMAIL:mario.rossi@example.it", "PHONE:+39 347 123 4567"}},
		{"a key in a code fence", "", "```bash\nexport OPENAI_API_KEY=sk-proj-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6\n```", []string{"SECRET:sk-proj-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6"}},
		{"a card in inline code", "", "use `4111 1111 1111 1111` for tests", []string{"CREDIT_CARD:4111 1111 1111 1111"}},
		{"an IBAN in a table cell", "", "|IBAN|DE89 3704 0044 0532 0130 00|", []string{"IBAN:DE89 3704 0044 0532 0130 00"}},
		// Addresses.
		{"plus addressing", "", "mail me at mario.rossi+newsletter@example.com!", []string{"EMAIL:mario.rossi+newsletter@example.com"}},
		{"sub-domains", "", "write to first.last@mail.dept.example.co.uk.", []string{"EMAIL:first.last@mail.dept.example.co.uk"}},
		{"an address in capitals", "", "CONTACT: MARIO.ROSSI@EXAMPLE.IT", []string{"EMAIL:MARIO.ROSSI@EXAMPLE.IT"}},
		{"an address in a mailto link", "", "[mail](mailto:anna+work@example.org)", []string{"EMAIL:anna+work@example.org"}},
		// Phones in national formats.
		{"a London number", "GB", "call 020 7946 0958 now", []string{"PHONE:020 7946 0958"}},
		{"a London number, international", "", "call +44 20 7946 0958 now", []string{"PHONE:+44 20 7946 0958"}},
		{"a US number with parentheses", "US", "call (415) 555-2671 now", []string{"PHONE:(415) 555-2671"}},
		{"a US number, international with dashes", "", "call +1-415-555-2671 now", []string{"PHONE:+1-415-555-2671"}},
		{"a Paris number", "FR", "appelez le 01 42 68 53 00", []string{"PHONE:01 42 68 53 00"}},
		{"a Paris number, international with dots", "", "appelez le +33 1.42.68.53.00", []string{"PHONE:+33 1.42.68.53.00"}},
		{"a Berlin number", "DE", "Tel. 030 901820", []string{"PHONE:030 901820"}},
		{"a Madrid number", "", "llame al +34 912 345 678", []string{"PHONE:+34 912 345 678"}},
		{"an Italian mobile with dots", "IT", "cell. 347.123.4567", []string{"PHONE:347.123.4567"}},
		// Found in the texts of hunt 8.
		{"a JSON-escaped at sign", "", `{"email":"mario.rossi\u0040example.it"}`, []string{`EMAIL:mario.rossi\u0040example.it`}},
		{"a bare IBAN in JSON", "", `{"iban":"DE89370400440532013000"}`, []string{"IBAN:DE89370400440532013000"}},
		{"a lower-case IBAN", "", "iban de89 3704 0044 0532 0130 00 ok", []string{"IBAN:de89 3704 0044 0532 0130 00"}},
		{"a tel link", "IT", "[chiama](tel:+393471234567)", []string{"PHONE:+393471234567"}},
		{"an address in bold", "", "**mario@example.it**", []string{"EMAIL:mario@example.it"}},
		{"a card between pipes", "", "|4111111111111111|", []string{"CREDIT_CARD:4111111111111111"}},
		{"a bearer token in a curl header", "", `curl -H "Authorization: Bearer abcDEF123ghiJKL456mnoPQR789" https://api.example.com`, []string{"SECRET:abcDEF123ghiJKL456mnoPQR789"}},
		{"a UUID is nothing", "", "id 123e4567-e89b-12d3-a456-426614174000 ok", nil},
		{"an ISBN is nothing", "", "ISBN 978-3-16-148410-0", nil},
		{"a date and time are nothing", "", "on 2024-01-15 at 10:30:00", nil},
		{"a password then an ampersand in a form body", "", "user=mario&password=Hunt3r2xyz9Q&remember=1", []string{"SECRET:Hunt3r2xyz9Q"}},
		{"a URL-encoded password in a form body", "", "username=mario&pwd=S3cr%21t%40pass&submit=Login", []string{"SECRET:S3cr%21t%40pass"}},
		{"a password with an ampersand in prose", "", "my password is Tr0ub4dor&3x ok", []string{"SECRET:Tr0ub4dor&3x"}},
		{"an address with a hyphenated sub-domain", "", "to a-b@x-y.example.com.", []string{"EMAIL:a-b@x-y.example.com"}},
		{"a card with dashes in a sentence end", "", "Card: 5555-5555-5555-4444.", []string{"CREDIT_CARD:5555-5555-5555-4444"}},
		{"an IBAN split with dashes", "", "IBAN GB82-WEST-1234-5698-7654-32", []string{"IBAN:GB82-WEST-1234-5698-7654-32"}},
		{"an escaped newline then a key", "", `"key":"line1\nsk-proj-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6"`, []string{"SECRET:sk-proj-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6"}},
		{"a key after an escaped quote", "", `"cmd":"export KEY=\"sk-proj-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6\""`, []string{"SECRET:sk-proj-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6"}},

		// A password in an HTML form field, either order of attributes.
		{"a password field's value", "", `<input name="password" value="Xk9#mQ2vLp7z">`, []string{"SECRET:Xk9#mQ2vLp7z"}},
		{"a password-typed field's value", "", `<input type="password" name="pw" value="Hunt3r2!xyz9Q"/>`, []string{"SECRET:Hunt3r2!xyz9Q"}},
		{"a value before the type", "", `<input value="Hunt3r2!xyz9Q" type=password>`, []string{"SECRET:Hunt3r2!xyz9Q"}},
		{"a confirmation field", "", `<input name="password_confirm" value="Hunt3r2!xyz9Q">`, []string{"SECRET:Hunt3r2!xyz9Q"}},
		{"an empty or templated password field is nothing", "", `<input type="password" value=""> <input name="password" value="{{ form.password }}">`, nil},
		{"a text field is nothing", "", `<input type="text" name="user" value="mario.rossi">`, nil},
		// The shared git account of a code host is no one's address.
		{"a git remote in scp syntax", "", "git clone git@github.com:org/repo.git", nil},
		{"a git remote over ssh", "", "git remote add origin ssh://git@gitlab.example.com/org/repo.git", nil},
		{"a person's address at a code host", "", "write to mario@github.com: thanks", []string{"EMAIL:mario@github.com"}},
		{"the git address in prose", "", "mail git@example.com now", []string{"EMAIL:git@example.com"}},
		// Markdown emphasis around a value delimits it: a run of '*' or
		// '~' is no part of an address, and a pair of '_' runs glues
		// nothing to an identifier.
		{"an address in italics", "", "*mario@example.it*", []string{"EMAIL:mario@example.it"}},
		{"an address struck through", "", "~~mario@example.it~~", []string{"EMAIL:mario@example.it"}},
		{"an address in underscore italics", "", "scrivi a _mario@example.it_ oggi", []string{"EMAIL:mario@example.it"}},
		{"an address in underscore bold", "", "__mario@example.it__", []string{"EMAIL:mario@example.it"}},
		{"a card in underscore italics", "", "carta _4111 1111 1111 1111_ ok", []string{"CREDIT_CARD:4111 1111 1111 1111"}},
		{"an unbroken card in underscore bold", "", "__4111111111111111__", []string{"CREDIT_CARD:4111111111111111"}},
		{"a fiscal code in underscore italics", "IT", "CF _RSSMRA80A01H501U_", []string{"IT_FISCAL_CODE:RSSMRA80A01H501U"}},
		{"a phone number in underscore italics", "IT", "chiama _+39 347 123 4567_", []string{"PHONE:+39 347 123 4567"}},
		{"an IBAN in underscore italics", "", "IBAN _DE89 3704 0044 0532 0130 00_", []string{"IBAN:DE89 3704 0044 0532 0130 00"}},
		{"an underscore run left open is still glue", "", "id_mario@example.it_ and x__RSSMRA80A01H501U_ and ref_DE89 3704 0044 0532 0130 00", nil},
	}...)
	runScanCases(t, cases)
}
