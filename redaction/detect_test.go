package redaction

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// rnd returns n pseudo-random characters from alphabet, fixed by seed, so
// that test secrets have realistic entropy and never change.
func rnd(seed uint64, n int, alphabet string) string {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

const (
	alnum   = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	upperD  = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
	digitsA = "0123456789"
)

var (
	keyOpenAI     = "sk-proj-" + rnd(1, 56, alnum)
	keyOpenAIOld  = "sk-" + rnd(2, 48, alnum)
	keyAnthropic  = "sk-ant-api03-" + rnd(3, 93, alnum) + "AA"
	keyAWS        = "AKIA" + rnd(4, 16, upperD)
	keyGitHub     = "ghp_" + rnd(5, 36, alnum)
	keyGitHubOA   = "gho_" + rnd(6, 36, alnum)
	keyGitHubPAT  = "github_pat_" + rnd(7, 22, alnum) + "_" + rnd(8, 59, alnum)
	keySlack      = "xoxb-" + rnd(9, 12, digitsA) + "-" + rnd(10, 13, digitsA) + "-" + rnd(11, 24, alnum)
	keyStripe     = "sk_live_" + rnd(12, 24, alnum)
	keyStripeRK   = "rk_live_" + rnd(13, 24, alnum)
	keyGoogle     = "AIza" + rnd(14, 35, alnum)
	keyJWT        = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
	keyPEMBody    = rnd(15, 64, alnum+"+/") + "\n" + rnd(16, 64, alnum+"+/") + "\n" + rnd(17, 40, alnum+"+/") + "=="
	keyPEM        = "-----BEGIN RSA PRIVATE KEY-----\n" + keyPEMBody + "\n-----END RSA PRIVATE KEY-----"
	keyPEMCut     = "-----BEGIN OPENSSH PRIVATE KEY-----\n" + keyPEMBody
	keyGeneric    = rnd(18, 32, alnum)
	awsSecretBody = rnd(19, 40, alnum+"/+")
)

// scanCase is one detector table case: text, and the findings Scan must
// return in order, written "TYPE:value" or "TYPE/subtype:value".
type scanCase struct {
	name   string
	region string
	text   string
	want   []string
}

func runScanCases(t *testing.T, cases []scanCase) {
	t.Helper()
	scanners := map[string]*Scanner{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			region := c.region
			if region == "" {
				region = "US"
			}
			s := scanners[region]
			if s == nil {
				var err error
				s, err = NewScanner(Config{DefaultRegion: region})
				if err != nil {
					t.Fatal(err)
				}
				scanners[region] = s
			}
			var got []string
			for _, f := range s.Scan(c.text) {
				got = append(got, describe(c.text, f, hasSubtype(c.want, f.Type)))
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("Scan(%q)\n got %q\nwant %q", c.text, got, c.want)
			}
		})
	}
}

// hasSubtype reports whether the expectations for typ spell a subtype.
func hasSubtype(want []string, typ string) bool {
	for _, w := range want {
		if strings.HasPrefix(w, typ+"/") {
			return true
		}
	}
	return false
}

func describe(text string, f Finding, sub bool) string {
	if sub {
		return fmt.Sprintf("%s/%s:%s", f.Type, f.Subtype, text[f.Start:f.End])
	}
	return fmt.Sprintf("%s:%s", f.Type, text[f.Start:f.End])
}

func TestEmailDetection(t *testing.T) {
	runScanCases(t, []scanCase{
		{"a plain address in a sentence is found", "", "Scrivi a mario.rossi@example.it per favore", []string{"EMAIL:mario.rossi@example.it"}},
		{"plus tags, hyphens and sub-domains are part of the address", "", "cc first.last+tag@mail.sub-domain.co.uk today", []string{"EMAIL:first.last+tag@mail.sub-domain.co.uk"}},
		{"a full stop after the address is not part of it", "", "Write to anna_b-1@example.org.", []string{"EMAIL:anna_b-1@example.org"}},
		{"angle brackets and quotes around the address are not part of it", "", `From: "Anna" <anna@example.com>, 'bob@example.net'`, []string{"EMAIL:anna@example.com", "EMAIL:bob@example.net"}},
		{"a host without a dot is not an address", "", "login as root@localhost", nil},
		{"a one-letter top-level label is not an address", "", "a@b.c and x@y.z", nil},
		{"a numeric top-level label is not an address", "", "ping admin@10.0.0", nil},
		{"a social handle is not an address", "", "follow @mollygateway on X", nil},
		{"a local part ending in a dot is not an address", "", "bad.@example.com", nil},
		{"an accented local part is found", "", "scrivi a josé@example.com grazie", []string{"EMAIL:josé@example.com"}},
		{"umlauts on both sides of the local part's dot are found", "", "an jürgen.müller@example.de bitte", []string{"EMAIL:jürgen.müller@example.de"}},
		{"an IDN domain label is found", "", "anna@exämple.de schreibt", []string{"EMAIL:anna@exämple.de"}},
		{"a Cyrillic domain with a Cyrillic top-level label is found", "", "pisat' x@пример.рф", []string{"EMAIL:x@пример.рф"}},
		{"a Punycode top-level label is found", "", "mail x@example.xn--p1ai now", []string{"EMAIL:x@example.xn--p1ai"}},
		{"curly quotes around the address are not part of it", "", "“anna@example.com”", []string{"EMAIL:anna@example.com"}},
		{"accented prose without an @ is not an address", "", "él visitó exämple.de y über.com ayer", nil},
		{"an accented host without a dot is not an address", "", "login als jürgen@müller", nil},
		{"an address in a Chinese sentence ends where the Chinese starts", "", "请联系bob@example.com谢谢", []string{"EMAIL:bob@example.com"}},
		{"an address in a Japanese sentence", "", "メールはtaro.yamada@example.co.jpです", []string{"EMAIL:taro.yamada@example.co.jp"}},
		{"an address in a Korean sentence", "", "연락처는kim@example.kr입니다", []string{"EMAIL:kim@example.kr"}},
		{"a Chinese local part takes the whole run before the @: nothing marks where it starts", "", "写信到用户@例子.中国", []string{"EMAIL:写信到用户@例子.中国"}},
	})
}

func TestPhoneDetection(t *testing.T) {
	runScanCases(t, []scanCase{
		{"a US number with +1 and dashes is found", "", "Call +1 415-555-2671 now", []string{"PHONE:+1 415-555-2671"}},
		{"a US number with area code in parentheses is found in region US", "", "Call (415) 555-2671 now", []string{"PHONE:(415) 555-2671"}},
		{"a US number with dots is found in region US", "", "Call 415.555.2671 now", []string{"PHONE:415.555.2671"}},
		{"a UK number in international form is found", "", "Ring +44 20 7946 0958 please", []string{"PHONE:+44 20 7946 0958"}},
		{"an Italian mobile in international form is found from region US", "", "Chiama il +39 333 123 4567 stasera", []string{"PHONE:+39 333 123 4567"}},
		{"an Italian landline with the 00 prefix is found", "", "Tel. 0039 02 1234 5678", []string{"PHONE:0039 02 1234 5678"}},
		{"an Italian mobile in national form is found in region IT", "IT", "il mio cellulare è 333 123 4567.", []string{"PHONE:333 123 4567"}},
		{"an Italian landline in national form is found in region IT", "IT", "ufficio 02 1234 5678, grazie", []string{"PHONE:02 1234 5678"}},
		{"an Italian mobile in national form is not a US number", "", "il mio cellulare è 333 123 4567.", nil},
		{"a bare run of digits next to a phone word is a phone number", "", "phone: 4155552671", []string{"PHONE:4155552671"}},
		{"a bare run of digits without a phone word is an order number", "", "order 4155552671 shipped", nil},
		{"an order id with a prefix is not a phone number", "", "Order ORD-2024-118734 and #4155552671", nil},
		{"ISO and European dates are not phone numbers", "", "on 2024-03-15, 15/03/2024 and 15.03.2024 10:30", nil},
		{"version strings are not phone numbers", "", "upgrade v10.0.19045 to 10.0.19045.2965 or 1.2.3", nil},
		{"times and amounts are not phone numbers", "", "at 12:30:45 pay € 1.234.567,89 or $4155552671", nil},
	})
}

func TestCreditCardDetection(t *testing.T) {
	runScanCases(t, []scanCase{
		{"a Visa number in groups of four is found", "", "card 4111 1111 1111 1111 exp 12/27", []string{"CREDIT_CARD/visa:4111 1111 1111 1111"}},
		{"a Mastercard number with dashes is found", "", "card 5555-5555-5555-4444.", []string{"CREDIT_CARD/mastercard:5555-5555-5555-4444"}},
		{"a Mastercard 2-series number is found", "", "2221000000000009", []string{"CREDIT_CARD/mastercard:2221000000000009"}},
		{"an American Express number is found", "", "amex 378282246310005", []string{"CREDIT_CARD/amex:378282246310005"}},
		{"an Amex number in 4-6-5 groups is found", "", "amex 3782 822463 10005", []string{"CREDIT_CARD/amex:3782 822463 10005"}},
		{"a Discover number is found", "", "6011111111111117", []string{"CREDIT_CARD/discover:6011111111111117"}},
		{"a JCB number is found", "", "3530111333300000", []string{"CREDIT_CARD/jcb:3530111333300000"}},
		{"a number failing the Luhn check is not a card", "", "card 4111 1111 1111 1112", nil},
		{"a Luhn-valid number with an unknown issuer prefix is not a card", "", "ref 1234 5678 9012 3452", nil},
		{"mixed separators are still a card (an evasion)", "", "4111 1111-1111 1111", []string{"CREDIT_CARD:4111 1111-1111 1111"}},
		{"a card number inside a longer digit run is not a card", "", "id 41111111111111111", nil},
		{"a whole card number glued to an identifier is still a card", "", "TX4111111111111111 call_4111111111111111", []string{"CREDIT_CARD:4111111111111111", "CREDIT_CARD:4111111111111111"}},
		{"a card-length digit run inside a longer word is not", "", "TX4111111111111111Z", nil},
	})
}

func TestIBANDetection(t *testing.T) {
	runScanCases(t, []scanCase{
		{"an Italian IBAN in paper format is found", "", "IBAN IT60 X054 2811 1010 0000 0123 456 grazie", []string{"IBAN/IT:IT60 X054 2811 1010 0000 0123 456"}},
		{"a German IBAN in electronic format is found", "", "DE89370400440532013000.", []string{"IBAN/DE:DE89370400440532013000"}},
		{"a British IBAN in groups is found", "", "to GB82 WEST 1234 5698 7654 32 today", []string{"IBAN/GB:GB82 WEST 1234 5698 7654 32"}},
		{"a French IBAN with letters in the BBAN is found", "", "FR14 2004 1010 0505 0001 3M02 606", []string{"IBAN/FR:FR14 2004 1010 0505 0001 3M02 606"}},
		{"a Dutch IBAN is found", "", "NL91ABNA0417164300", []string{"IBAN/NL:NL91ABNA0417164300"}},
		{"wrong check digits are not an IBAN", "", "IT61 X054 2811 1010 0000 0123 456", nil},
		{"a German IBAN one digit short is not an IBAN", "", "DE8937040044053201300", nil},
		{"a German IBAN one digit long is not an IBAN", "", "DE893704004405320130001", nil},
		{"an unknown country code is not an IBAN", "", "XX89370400440532013000", nil},
	})
}

func TestSecretDetection(t *testing.T) {
	runScanCases(t, []scanCase{
		{"an OpenAI project key is found", "", "OPENAI_API_KEY=" + keyOpenAI + "\n", []string{"SECRET/openai:" + keyOpenAI}},
		{"a legacy OpenAI key at the end of a sentence is found", "", "my key is " + keyOpenAIOld + ".", []string{"SECRET/openai:" + keyOpenAIOld}},
		{"an Anthropic key is found", "", "use " + keyAnthropic + ", thanks", []string{"SECRET/anthropic:" + keyAnthropic}},
		{"an AWS access key id is found", "", "aws id " + keyAWS + " in us-east-1", []string{"SECRET/aws_access_key:" + keyAWS}},
		{"an AWS secret access key next to its name is found", "", "aws_secret_access_key = " + awsSecretBody, []string{"SECRET/aws_secret_key:" + awsSecretBody}},
		{"GitHub tokens of three kinds are found", "", keyGitHub + " " + keyGitHubOA + " " + keyGitHubPAT, []string{"SECRET/github:" + keyGitHub, "SECRET/github:" + keyGitHubOA, "SECRET/github:" + keyGitHubPAT}},
		{"a Slack bot token is found", "", "SLACK=" + keySlack, []string{"SECRET/slack:" + keySlack}},
		{"Stripe live secret and restricted keys are found", "", "(" + keyStripe + ") and " + keyStripeRK, []string{"SECRET/stripe:" + keyStripe, "SECRET/stripe:" + keyStripeRK}},
		{"a Google API key is found", "", "key=" + keyGoogle + "&q=x", []string{"SECRET/google:" + keyGoogle}},
		{"a JWT is found", "", "Authorization: Bearer " + keyJWT, []string{"SECRET/jwt:" + keyJWT}},
		{"an opaque bearer token in an Authorization header is found", "", "curl -s https://api.example.com/v1 -H 'Authorization: Bearer 8yQk2Lw9ZtP4nR7vXc3MdF6h' -d x", []string{"SECRET/bearer:8yQk2Lw9ZtP4nR7vXc3MdF6h"}},
		{"a bearer token in prose is found", "", "use bearer tR4nQ9zLk2mW8vXs7pY3 for the staging API", []string{"SECRET/bearer:tR4nQ9zLk2mW8vXs7pY3"}},
		{"Basic credentials in an Authorization header are found", "", "Authorization: Basic YWxhZGRpbjpvcGVuc2VzYW1l", []string{"SECRET/bearer:YWxhZGRpbjpvcGVuc2VzYW1l"}},
		{"prose about bearer tokens is not a secret", "", "Bearer authentication sends a bearer tokenauthentication string; bearer instrumentalities, Authorization: Basic realm", nil},
		{"a PEM private key block is found whole", "", "here:\n" + keyPEM + "\nbye", []string{"SECRET/private_key:" + keyPEM}},
		{"a PEM private key cut short is found", "", "here:\n" + keyPEMCut + "\n\nwhat is it?", []string{"SECRET/private_key:" + keyPEMCut}},
		{"a high-entropy value after a key-like name is found", "", `config: api_token = "` + keyGeneric + `"`, []string{"SECRET/generic:" + keyGeneric}},
		{"prose about keys is not a secret", "", "The key point: sk-learn and the token economy; password reset link sent.", nil},
		{"a low-entropy value after a key-like name is not a secret", "", `password = "aaa111" and api_key = "aaaaaaaaaaaaaaaa"`, nil},
		{"a template variable is not a secret", "", "token: ${API_TOKEN}", nil},
		{"a GitHub token prefix with too few characters is not a secret", "", "ghp_" + rnd(20, 20, alnum), nil},
	})
}

func TestIdentifierDetection(t *testing.T) {
	runScanCases(t, []scanCase{
		{"an SSN with dashes is found", "", "SSN 536-22-1234.", []string{"US_SSN:536-22-1234"}},
		{"an SSN with spaces is found", "", "ssn 536 22 1234", []string{"US_SSN:536 22 1234"}},
		{"SSNs with never-issued area, group or serial are not SSNs", "", "000-12-3456 666-12-3456 900-12-3456 536-00-1234 536-22-0000", nil},
		{"SSNs voided by the SSA are not SSNs", "", "078-05-1120 and 123-45-6789", nil},
		{"an SSN-shaped part of a longer number is not an SSN", "", "536-22-12345 and 1536-22-1234", nil},
		{"an Italian fiscal code is found", "", "CF: RSSMRA85T10A562S", []string{"IT_FISCAL_CODE:RSSMRA85T10A562S"}},
		{"a woman's fiscal code (day + 40) is found", "", "cf BNCLRA90A41F205I.", []string{"IT_FISCAL_CODE:BNCLRA90A41F205I"}},
		{"an omocodic fiscal code is found", "", "codice RSSMRA85T10A56NH", []string{"IT_FISCAL_CODE:RSSMRA85T10A56NH"}},
		{"a lower-case fiscal code is found", "", "cf vrdgpp80a01h501u", []string{"IT_FISCAL_CODE:vrdgpp80a01h501u"}},
		{"a fiscal code with a wrong check letter is not one", "", "RSSMRA85T10A562T", nil},
		{"IPv4 addresses are found and classified", "", "hosts 192.168.1.10, 8.8.8.8 and 127.0.0.1.", []string{"IP_ADDRESS/private:192.168.1.10", "IP_ADDRESS/public:8.8.8.8", "IP_ADDRESS/loopback:127.0.0.1"}},
		{"IPv6 addresses are found and classified", "", "v6 2001:db8::1, fe80::1 and ::1", []string{"IP_ADDRESS/public:2001:db8::1", "IP_ADDRESS/link_local:fe80::1", "IP_ADDRESS/loopback:::1"}},
		{"version strings, times and out-of-range octets are not IP addresses", "", "1.2.3.4.5 256.1.1.1 192.168.01.1 10:30:00 std::vector cafe::beef", nil},
		{"URL credentials are found, not the host", "", "dsn postgres://admin:s3cr3t@db.example.com:5432/app", []string{"URL_CREDENTIALS:admin:s3cr3t"}},
		{"a URL without a password has no credentials", "", "see https://example.com/a?b=c", nil},
	})
}

func TestEvasionsAreSeenThroughTheNormalisedView(t *testing.T) {
	runScanCases(t, []scanCase{
		{"zero-width spaces inside an address are covered", "", "m\u200bario@exa\u200dmple.com", []string{"EMAIL:m\u200bario@exa\u200dmple.com"}},
		{"a fullwidth address is found", "", "ｍａｒｉｏ＠ｅｘａｍｐｌｅ．ｃｏｍ", []string{"EMAIL:ｍａｒｉｏ＠ｅｘａｍｐｌｅ．ｃｏｍ"}},
		{"Cyrillic look-alike letters in an address are seen through", "", "write to mаrio@exаmple.com", []string{"EMAIL:mаrio@exаmple.com"}},
		{"a percent-encoded address is found", "", "mailto:mario%40example.com", []string{"EMAIL:mario%40example.com"}},
		{"fullwidth digits in a phone number are found", "", "tel ＋３９ ３３３ １２３ ４５６７", []string{"PHONE:＋３９ ３３３ １２３ ４５６７"}},
		{"no-break spaces in a card number are found", "", "4111\u00a01111\u00a01111\u00a01111", []string{"CREDIT_CARD:4111\u00a01111\u00a01111\u00a01111"}},
		{"en-dashes in an SSN are found", "", "SSN 536–22–1234", []string{"US_SSN:536–22–1234"}},
		{"a soft hyphen inside an IBAN is covered", "", "DE8937040044\u00ad0532013000", []string{"IBAN:DE8937040044\u00ad0532013000"}},
		{"a base64-encoded address is found as the whole encoded run", "", "decode bWFyaW8ucm9zc2lAZXhhbXBsZS5pdA== please", []string{"EMAIL:bWFyaW8ucm9zc2lAZXhhbXBsZS5pdA=="}},
		{"URL-safe unpadded base64 hiding a card is found", "", "blob=Y2FyZCA0MTExIDExMTEgMTExMSAxMTExIG9r;", []string{"CREDIT_CARD/visa:Y2FyZCA0MTExIDExMTEgMTExMSAxMTExIG9r"}},
		{"a hex-encoded phone number is found", "", "hex 2b333920333333203132332034353637", []string{"PHONE:2b333920333333203132332034353637"}},
		{"base64 of harmless text is not a finding", "", "anVzdCBhIGhhcm1sZXNzIHNlbnRlbmNlIGhlcmU=", nil},
		{"a SHA-256 digest is not a finding", "", "sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", nil},
		{"random binary in base64 is not a finding", "", "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==", nil},
	})
}

func TestOverlapsKeepTheLongerFinding(t *testing.T) {
	s, err := NewScanner(Config{})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		in   []Finding
		want []Finding
	}{
		{"a longer finding beats a shorter one inside it",
			[]Finding{{Type: TypePhone, Start: 2, End: 8}, {Type: TypeCreditCard, Start: 0, End: 16}},
			[]Finding{{Type: TypeCreditCard, Start: 0, End: 16}}},
		{"a longer finding beats a shorter one it partly covers",
			[]Finding{{Type: TypeEmail, Start: 0, End: 10}, {Type: TypeSecret, Start: 5, End: 30}},
			[]Finding{{Type: TypeSecret, Start: 5, End: 30}}},
		{"on equal spans the type earlier in BuiltinTypes wins",
			[]Finding{{Type: TypePhone, Start: 0, End: 11}, {Type: TypeUSSSN, Start: 0, End: 11}},
			[]Finding{{Type: TypeUSSSN, Start: 0, End: 11}}},
		{"adjacent findings both stay, sorted by start",
			[]Finding{{Type: TypePhone, Start: 10, End: 20}, {Type: TypeEmail, Start: 0, End: 10}},
			[]Finding{{Type: TypeEmail, Start: 0, End: 10}, {Type: TypePhone, Start: 10, End: 20}}},
		{"a chain of overlaps keeps the longest and what does not touch it",
			[]Finding{{Type: TypePhone, Start: 0, End: 6}, {Type: TypeIBAN, Start: 4, End: 14}, {Type: TypeEmail, Start: 12, End: 18}, {Type: TypeEmail, Start: 20, End: 25}},
			[]Finding{{Type: TypeIBAN, Start: 4, End: 14}, {Type: TypeEmail, Start: 20, End: 25}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := s.resolve(slices.Clone(c.in))
			if !slices.Equal(got, c.want) {
				t.Errorf("resolve(%v) = %v, want %v", c.in, got, c.want)
			}
		})
	}
}

func TestNewScannerValidatesTheConfig(t *testing.T) {
	cases := []struct {
		name    string
		cfg     Config
		wantErr string // substring; "" means success
		types   []string
	}{
		{"an empty config enables every built-in type", Config{}, "", builtinTypes},
		{"a type list enables just those types in priority order", Config{Types: []string{TypePhone, TypeEmail}}, "", []string{TypeEmail, TypePhone}},
		{"an unknown type is an error naming it", Config{Types: []string{"EMAIL", "PASSPORT"}}, `"PASSPORT"`, nil},
		{"a type listed twice is an error", Config{Types: []string{"EMAIL", "EMAIL"}}, `"EMAIL" listed twice`, nil},
		{"an unknown region is an error naming it", Config{DefaultRegion: "XQ"}, `"XQ"`, nil},
		{"a lower-case region is accepted", Config{DefaultRegion: "it"}, "", builtinTypes},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := NewScanner(c.cfg)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("NewScanner(%+v) error = %v, want one containing %s", c.cfg, err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := s.Types(); !slices.Equal(got, c.types) {
				t.Errorf("Types() = %v, want %v", got, c.types)
			}
		})
	}
}

func TestScanOnlyRunsEnabledTypes(t *testing.T) {
	s, err := NewScanner(Config{Types: []string{TypeEmail}})
	if err != nil {
		t.Fatal(err)
	}
	got := s.Scan("a@example.com 4111 1111 1111 1111 +1 415-555-2671")
	want := []Finding{{Type: TypeEmail, Start: 0, End: 13}}
	if !slices.Equal(got, want) {
		t.Errorf("Scan = %v, want %v", got, want)
	}
}

// TestRoundOneEvasions lists the minimal evasions that leaked in round 1,
// each with the finding it must produce (written by hand).
func TestRoundOneEvasions(t *testing.T) {
	runScanCases(t, []scanCase{
		{"a card with a space between every digit", "", "card 4 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 ok", []string{"CREDIT_CARD:4 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1"}},
		{"a card with newlines", "", "card\n4111\n1111\n1111\n1111\nok", []string{"CREDIT_CARD:4111\n1111\n1111\n1111"}},
		{"a card with dots", "", "pan 4.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1 ok", []string{"CREDIT_CARD:4.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1"}},
		{"a card with slashes", "", "pan 4111/1111/1111/1111 ok", []string{"CREDIT_CARD:4111/1111/1111/1111"}},
		{"a card with plus signs", "", "pan 4111+1111+1111+1111 ok", []string{"CREDIT_CARD:4111+1111+1111+1111"}},
		{"a card with underscores", "", "pan 4111_1111_1111_1111 ok", []string{"CREDIT_CARD:4111_1111_1111_1111"}},
		{"a card with %20", "", "pan=4111%201111%201111%201111&x=1", []string{"CREDIT_CARD:4111%201111%201111%201111"}},
		{"a card with doubled separators", "", "pan 4111  1111--1111  1111 ok", []string{"CREDIT_CARD:4111  1111--1111  1111"}},
		{"a card with Arabic-Indic digits", "", "pan ٤١١١ ١١١١ ١١١١ ١١١١ ok", []string{"CREDIT_CARD:٤١١١ ١١١١ ١١١١ ١١١١"}},
		{"a lower-case IBAN", "", "iban it60x0542811101000000123456 ok", []string{"IBAN:it60x0542811101000000123456"}},
		{"an IBAN with Devanagari digits", "", "IBAN DE८९ ३७०४ ००४४ ०५३२ ०१३० ०० ok", []string{"IBAN:DE८९ ३७०४ ००४४ ०५३२ ०१३० ००"}},
		{"a phone right after =", "", "phone=+39 347 123 4567", []string{"PHONE:+39 347 123 4567"}},
		{"an Italian mobile without separators or context", "", "scrivimi, 3471234567 va bene", []string{"PHONE:3471234567"}},
		{"a written-out e-mail", "", "write to maria dot rossi at example dot org please", []string{"EMAIL:maria dot rossi at example dot org"}},
		{"an e-mail with [at]", "", "mail maria.rossi[at]example.org", []string{"EMAIL:maria.rossi[at]example.org"}},
		{"an e-mail with (at)", "", "mail maria.rossi (at) example.org", []string{"EMAIL:maria.rossi (at) example.org"}},
		{"an e-mail with &#64;", "", "mail maria.rossi&#64;example.org", []string{"EMAIL:maria.rossi&#64;example.org"}},
		{"an e-mail with &commat;", "", "mail maria.rossi&commat;example.org", []string{"EMAIL:maria.rossi&commat;example.org"}},
		{"an e-mail with &#64 and no ';'", "", "mail maria.rossi&#64example.org", []string{"EMAIL:maria.rossi&#64example.org"}},
		{"a card in decimal references without ';'", "", "card &#52&#49&#49&#49 1111 1111 1111", []string{"CREDIT_CARD:&#52&#49&#49&#49 1111 1111 1111"}},
		{"a fully percent-encoded e-mail", "", "m=%6D%61%72%69%61%40%65%78%61%6D%70%6C%65%2E%6F%72%67", []string{"EMAIL:%6D%61%72%69%61%40%65%78%61%6D%70%6C%65%2E%6F%72%67"}},
		{"an e-mail with combining marks", "", "mail ma\u0301ri\u0308a@example.org", []string{"EMAIL:ma\u0301ri\u0308a@example.org"}},
		{"an e-mail with the homoglyph ɑ", "", "mail mɑria@exɑmple.org", []string{"EMAIL:mɑria@exɑmple.org"}},
		{"double base64", "", "x WW1GeWFXRkFaWGhoYlhCc1pTNXZjbWM9 y", []string{"EMAIL:WW1GeWFXRkFaWGhoYlhCc1pTNXZjbWM9"}},
		{"hex with spaces", "", "x 6d 61 72 69 61 40 65 78 61 6d 70 6c 65 2e 6f 72 67 y", []string{"EMAIL:6d 61 72 69 61 40 65 78 61 6d 70 6c 65 2e 6f 72 67"}},
		// Decoded runs are scanned together: each finding is the run it is in.
		{"double base64, harmless base64, double base64 of a card and spaced hex, each its own run",
			"", "a WW1GeWFXRkFaWGhoYlhCc1pTNXZjbWM9 b anVzdCBhIGhhcm1sZXNzIHNlbnRlbmNlIGhlcmU= c WTJGeVpDQTBNVEV4SURFeE1URWdNVEV4TVNBeE1URXhJRzly d 6d 61 72 69 61 40 65 78 61 6d 70 6c 65 2e 6f 72 67 e",
			[]string{"EMAIL:WW1GeWFXRkFaWGhoYlhCc1pTNXZjbWM9", "CREDIT_CARD/visa:WTJGeVpDQTBNVEV4SURFeE1URWdNVEV4TVNBeE1URXhJRzly", "EMAIL:6d 61 72 69 61 40 65 78 61 6d 70 6c 65 2e 6f 72 67"}},
		{"an SSN without separators after SSN", "", "SSN 536221234.", []string{"US_SSN:536221234"}},
		{"an SSN with dots", "", "ssn is 536.22.1234.", []string{"US_SSN:536.22.1234"}},
		{"an e-mail with a NUL inside", "", "mail bob@exam\x00ple.com now", []string{"EMAIL:bob@exam\x00ple.com"}},
		{"an e-mail with DEL and an escape", "", "mail b\x7fob@exa\x1bmple.com now", []string{"EMAIL:b\x7fob@exa\x1bmple.com"}},
		{"an e-mail with U+FFFD (a lone surrogate escape, decoded)", "", "mail bob@exam\ufffdple.com now", []string{"EMAIL:bob@exam\ufffdple.com"}},
		{"an e-mail with a C1 control", "", "mail bob@exam\u0090ple.com now", []string{"EMAIL:bob@exam\u0090ple.com"}},
		{"a card with NULs between the groups", "", "pan 4111\x001111\x001111\x001111 ok", []string{"CREDIT_CARD:4111\x001111\x001111\x001111"}},
		{"a quoted password with punctuation", "", `password = "Hunt3r2!xyz9Q"`, []string{"SECRET/password:Hunt3r2!xyz9Q"}},
		{"a prefixed password key with a #", "", "db_password: Xk9#mQ2vLp7z\n", []string{"SECRET/password:Xk9#mQ2vLp7z"}},
		{"a password in prose", "", "my password is Xk9mQ2vLp7zR. thanks", []string{"SECRET/password:Xk9mQ2vLp7zR"}},
		{"an upper-case key and :=", "", "DB_PASSWD := 'q7Rt!x2Zp'", []string{"SECRET/password:q7Rt!x2Zp"}},
		{"a letters-only passphrase of 16+ letters", "", "password=correcthorsebatterystaple", []string{"SECRET/password:correcthorsebatterystaple"}},
		{"a seven-character password with a digit", "", "db_password: hunter2", []string{"SECRET/password:hunter2"}},
		{"a pwd key", "", "pwd=Hunt3r2!xyz9Q", []string{"SECRET/password:Hunt3r2!xyz9Q"}},
		{"a secret key", "", "secret: Hunt3r2!xyz9Q", []string{"SECRET/password:Hunt3r2!xyz9Q"}},
		{"the German keyword", "", "Passwort: Hunt3r2!xyz9Q", []string{"SECRET/password:Hunt3r2!xyz9Q"}},
		{"German prose", "", "das Passwort ist Hunt3r2!xyz9Q", []string{"SECRET/password:Hunt3r2!xyz9Q"}},
		{"Italian prose with è", "", "la mia password è Hunt3r2!xyz9Q", []string{"SECRET/password:Hunt3r2!xyz9Q"}},
		{"the Spanish keyword", "", "contraseña: Hunt3r2!xyz9Q", []string{"SECRET/password:Hunt3r2!xyz9Q"}},
		{"Spanish prose", "", "mi contraseña es Hunt3r2!xyz9Q", []string{"SECRET/password:Hunt3r2!xyz9Q"}},
		{"a password of letters and a symbol", "", "passphrase: Correct#Horse", []string{"SECRET/password:Correct#Horse"}},
		{"two addresses joined by a zero-width space are two findings", "", "hans@example.de\u200bgreta@example.de", []string{"EMAIL:hans@example.de", "EMAIL:greta@example.de"}},
		{"two addresses joined by a word joiner", "", "hans@example.de\u2060greta@example.de", []string{"EMAIL:hans@example.de", "EMAIL:greta@example.de"}},
		{"two addresses joined by a BOM", "", "hans@example.de\ufeffgreta@example.de", []string{"EMAIL:hans@example.de", "EMAIL:greta@example.de"}},
		{"two addresses joined by a NUL", "", "hans@example.de\x00greta@example.de", []string{"EMAIL:hans@example.de", "EMAIL:greta@example.de"}},
		{"two addresses joined by U+0001", "", "hans@example.de\x01greta@example.de", []string{"EMAIL:hans@example.de", "EMAIL:greta@example.de"}},
		{"two addresses joined by an escaped zero-width space", "", `hans@example.de\u200bgreta@example.de`, []string{"EMAIL:hans@example.de", "EMAIL:greta@example.de"}},
		{"an address before a NUL does not swallow the next word", "", "john.doe@acme.com\x00more text", []string{"EMAIL:john.doe@acme.com"}},
		{"glued addresses that do not split are one finding", "", "hans@example.xyzq\u200bgreta@example.de", []string{"EMAIL:hans@example.xyzq\u200bgreta@example.de"}},
		{"an address glued to a dangling one is one finding", "", "to a@b.com@c.org now", []string{"EMAIL:a@b.com@c.org"}},
		{"a zero-width space inside a domain label still joins it", "", "mail bob@exam\u200bple.com now", []string{"EMAIL:bob@exam\u200bple.com"}},
	})
}

// TestPrecisionOnLookAlikes lists look-alikes that must not be found, or
// not with more bytes than the value.
func TestPrecisionOnLookAlikes(t *testing.T) {
	runScanCases(t, []scanCase{
		{"a version string is not an IP address", "", "Version 10.2.3.4 of the firmware", nil},
		// base64 of "pay 4111 1111" and of "1111 1111 ok": decoded and
		// scanned together, but no value reads from one into the next.
		{"halves of a card in two encoded runs are not a card", "", "x cGF5IDQxMTEgMTExMQ== MTExMSAxMTExIG9r y", nil},
		{"a build number is not an IP address", "", "build 4.0.1.22 is out", nil},
		{"an e-mail placeholder does not swallow user=", "", "user=admin@example.com&role=owner", []string{"EMAIL:admin@example.com"}},
		{"an e-mail in a URL path does not swallow the path", "", "https://crm.example.com/contacts/luca.bianchi@example.it ok", []string{"EMAIL:luca.bianchi@example.it"}},
		{"meet at a domain is not an e-mail", "", "meet at example.com tomorrow", nil},
		{"order numbers are not phones", "", "Order 3471234567 shipped", nil},
		{"a decimal with one digit before the point is not a phone", "IT", "ratio 0.123456789, pi 3.1415926535, call 06 4567 8901", []string{"PHONE:06 4567 8901"}},
		{"a CIDR block is not an address", "", "the range 10.0.0.0/8 is private", nil},
		{"a password field description is not a password", "", "password: required, at least 12 characters", nil},
		{"a Kubernetes secret's name is not a password", "", "secretName: tls-cert-2024", nil},
		{"a secret reference in a manifest is not a password", "", "secret_name: db-creds-2", nil},
		{"a password read from the environment is not a password", "", "password = os.environ['DB_PW']", nil},
		{"a template variable is not a password", "", "password=${DB_PASSWORD}", nil},
		{"a masked password is not a password", "", "password: ********", nil},
		{"a reset URL is not a password", "", "password_reset_url: https://example.com/r/abc123", nil},
		{"prose about a password is not a password", "", "the password is incorrect, try again", nil},
		{"a request field is not a password", "", "let password = req.body.password2;", nil},
		{"a form field is not a password", "", "password = form.password2.data", nil},
		{"an argument is not a password", "", "password = args.pw1", nil},
		{"a config path is not a password", "", "password = cfg.db.password_v2", nil},
		{"an input's value is not a password", "", "password = input_field1.value", nil},
		{"a member is not a password", "", "password: user.credentials2", nil},
		{"a method call is not a password", "", "password = self.password_input2.text()", nil},
		{"a hashing description is not a password", "", "The password is sha256hashed", nil},
		{"an encoding description is not a password", "", "password is base64encoded", nil},
		{"getpass is not a password", "", "password = getpass()", nil},
		{"an empty comparison is not a password", "", `if password == "":`, nil},
		{"a hash call is not a password", "", "password_hash = bcrypt(password)", nil},
		{"a working directory is not a password", "", "pwd: /home/user/project", nil},
		{"prose about a secret is not a password", "", "the secret is out there", nil},
		{"a hyphenated secret name is not a password", "", "secretName: my-tls-secret", nil},
	})
}

func TestPersonDetection(t *testing.T) {
	runScanCases(t, []scanCase{
		{"a self-introduction", "", "Hi, my name is Sarah Mitchell and I need help.", []string{"PERSON:Sarah Mitchell"}},
		{"a title", "", "I spoke with Dr. Emily Carter yesterday.", []string{"PERSON:Emily Carter"}},
		{"an Italian title and surname", "", "Gentile Sig. Esposito, le confermiamo.", []string{"PERSON:Esposito"}},
		{"a signature", "", "Best regards,\nThomas Wright\nHead of Operations", []string{"PERSON:Thomas Wright"}},
		{"a known given name and surname without a cue", "", "il conto è intestato a Marco Rossi da anni", []string{"PERSON:Marco Rossi"}},
		{"a list after a name", "", "Attendees: James Anderson, Laura Martinez and Kevin Smith.", []string{"PERSON:James Anderson", "PERSON:Laura Martinez", "PERSON:Kevin Smith"}},
		{"German and Spanish cues", "", "Ich heiße Lukas Schneider. Me llamo Lucía García.", []string{"PERSON:Lukas Schneider", "PERSON:Lucía García"}},
		{"capitalised words that are not names", "", "Rome and Paris are capitals; Apple reported earnings. The Customer Service team replied.", nil},
		{"a unit before a capitalised word is not a title", "", "altitude 3247 m. Mis datos son privados", nil},
	})
}

func TestIBANWithPlusSigns(t *testing.T) {
	runScanCases(t, []scanCase{
		{"an IBAN with a plus between every character", "", "iban I+T+6+0+X+0+5+4+2+8+1+1+1+0+1+0+0+0+0+0+0+1+2+3+4+5+6 ok", []string{"IBAN:I+T+6+0+X+0+5+4+2+8+1+1+1+0+1+0+0+0+0+0+0+1+2+3+4+5+6"}},
	})
}

// TestEmailWithSpacesAroundTheAt: an '@' set apart by spaces still makes
// an address (a model reads it as one); the oracle is the address's span
// written by hand.
func TestEmailWithSpacesAroundTheAt(t *testing.T) {
	runScanCases(t, []scanCase{
		{"spaces around the at", "", "mail mario.rossi @ example.com now", []string{"EMAIL/written:mario.rossi @ example.com"}},
		{"two spaces and a bare local part", "", "write to anna  @  example.it", []string{"EMAIL/written:anna  @  example.it"}},
		{"no domain with a public suffix is no address", "", "ping me @ home, or @ 5pm.", nil},
	})
}

// TestQuotedPrintableSoftBreaks: an address or a number cut by a
// quoted-printable soft line break ("=" at the end of a line, RFC 2045
// §6.7), as raw e-mail source carries it, is found whole; an '=' that
// does not end a line changes nothing. The oracle is the span by hand.
func TestQuotedPrintableSoftBreaks(t *testing.T) {
	runScanCases(t, []scanCase{
		{"a soft break in the local part", "", "Write to mario.ros=\nsi@example.com today", []string{"EMAIL:mario.ros=\nsi@example.com"}},
		{"a soft break with CRLF in the domain", "", "Write to mario.rossi@exa=\r\nmple.com today", []string{"EMAIL:mario.rossi@exa=\r\nmple.com"}},
		{"a soft break in a card number", "", "card 4111 1111 11=\n11 1111 ok", []string{"CREDIT_CARD:4111 1111 11=\n11 1111"}},
		{"assignments are left alone", "", "a = b\nc=\nd x=1 y=40", nil},
	})
}

// TestEmailWithAQuotedLocalPart: RFC 5321's quoted local part ("mario
// rossi"@example.com) is an address, quotes included; a quoted word that
// is no address, or an empty pair of quotes, is not. The oracle is the
// span by hand.
func TestEmailWithAQuotedLocalPart(t *testing.T) {
	runScanCases(t, []scanCase{
		{"a quoted local part with a space", "", `mail "mario rossi"@example.com now`, []string{`EMAIL:"mario rossi"@example.com`}},
		{"an empty quoted local part is none", "", `say ""@example.com and "hi" at example.com`, nil},
	})
}

// TestEmailScratchUserinfoMatchesBackScan checks the forward read of
// emailScratch against inURLUserinfo's back scan from each position (its
// definition), over random texts dense in what either reads (stops,
// slashes, colons, "://") and increasing positions with random gaps
// (some over the 256-byte reach, some backwards).
func TestEmailScratchUserinfoMatchesBackScan(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	pieces := []string{"a", "b@x.it", ":", "/", "://", "http://u:", " ", "\t", "\n", "\"", "<", "(", ",", "\u200b", strings.Repeat("z", 100)}
	hits := 0
	for range 300 {
		var b strings.Builder
		for b.Len() < 2000 {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		text := b.String()
		var sc emailScratch
		for i := r.IntN(20); i < len(text); i += r.IntN(300) - 10 {
			if i < 0 {
				i = 0
			}
			want := inURLUserinfo(text, i)
			if got := sc.inURLUserinfo(text, i); got != want {
				t.Fatalf("at %d of %q: got %v, want %v", i, text, got, want)
			}
			if want {
				hits++
			}
		}
	}
	if hits == 0 {
		t.Fatal("no position inside a URL's userinfo: the texts test nothing")
	}
}

// TestEmailScratchBreakFromMatchesSearch checks breakFrom's cursor against
// a read of every break (the first at or after x) for positions asked
// mostly in increasing order, with jumps back.
func TestEmailScratchBreakFromMatchesSearch(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 17))
	for range 200 {
		var breaks []int32
		for p := int32(r.IntN(5)); p < 2000; p += int32(1 + r.IntN(40)) {
			breaks = append(breaks, p)
		}
		var sc emailScratch
		for x := 0; x < 2100; x += r.IntN(60) - 8 {
			x = max(x, 0)
			want := len(breaks)
			for i, b := range breaks {
				if int(b) >= x {
					want = i
					break
				}
			}
			if got := sc.breakFrom(breaks, x); got != want {
				t.Fatalf("breakFrom(%d) = %d, want %d (breaks %v)", x, got, want, breaks)
			}
		}
	}
}
