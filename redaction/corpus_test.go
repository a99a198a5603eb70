package redaction

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math/big"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	"github.com/nyaruka/phonenumbers"
)

// label is one planted value: its type and byte span in the prompt.
type label struct {
	typ        string
	start, end int
}

// corpusGen builds a labelled synthetic corpus: English and Italian
// prompts with planted values of every type, near-misses that must not be
// found (invalid cards and IBANs, order ids, dates, versions, times,
// amounts, never-issued SSNs, wrong fiscal-code check letters) and
// evasions (fullwidth digits, zero-width characters, Cyrillic homoglyphs,
// no-break spaces, percent-encoding). Seeded, so every run is the same.
type corpusGen struct{ r *rand.Rand }

func (g *corpusGen) digits(n int) string { return g.from(n, digitsA) }
func (g *corpusGen) from(n int, alphabet string) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[g.r.IntN(len(alphabet))]
	}
	return string(b)
}
func (g *corpusGen) pick(xs ...string) string { return xs[g.r.IntN(len(xs))] }

var (
	firstNames = []string{"mario", "anna", "giulia", "luca", "john", "emily", "sofia", "marco", "chiara", "david"}
	lastNames  = []string{"rossi", "bianchi", "verdi", "smith", "brown", "esposito", "ferrari", "jones", "ricci", "colombo"}
	domains    = []string{"example.it", "example.com", "mail.example.co.uk", "azienda-example.it", "example.org"}
)

func (g *corpusGen) email() string {
	sep := g.pick(".", "_", "-", "")
	local := g.pick(firstNames...) + sep + g.pick(lastNames...)
	if g.r.IntN(3) == 0 {
		local += g.digits(2)
	}
	return local + "@" + g.pick(domains...)
}

func (g *corpusGen) phone() string {
	for {
		var s string
		switch g.r.IntN(5) {
		case 0:
			s = "+39 " + g.pick("333", "347", "348", "349", "320", "328", "339", "340", "345", "366", "388", "392") + " " + g.digits(3) + " " + g.digits(4)
		case 1:
			s = g.pick("333", "347", "328", "340") + " " + g.digits(7)
		case 2:
			s = "02 " + g.digits(4) + " " + g.digits(4)
		case 3:
			s = "+44 79" + g.digits(2) + " " + g.digits(6)
		default:
			s = "+1 " + g.pick("212", "415", "617", "312", "646") + "-" + g.pick("2", "3", "4", "6", "7", "8") + g.digits(2) + "-" + g.digits(4)
		}
		if n, err := phonenumbers.Parse(s, "IT"); err == nil && phonenumbers.IsValidNumber(n) {
			return s
		}
	}
}

func luhnDigit(body string) byte {
	for c := byte('0'); c <= '9'; c++ {
		d := make([]byte, 0, len(body)+1)
		for i := 0; i < len(body); i++ {
			d = append(d, body[i]-'0')
		}
		d = append(d, c-'0')
		if luhn(d) {
			return c
		}
	}
	panic("unreachable")
}

func (g *corpusGen) cardDigits(valid bool) string {
	var body string
	switch g.r.IntN(4) {
	case 0:
		body = "4" + g.digits(14)
	case 1:
		body = g.pick("51", "52", "53", "54", "55") + g.digits(13)
	case 2:
		body = g.pick("34", "37") + g.digits(12)
	default:
		body = "6011" + g.digits(11)
	}
	c := luhnDigit(body)
	if !valid {
		c = '0' + (c-'0'+1+byte(g.r.IntN(8)))%10
	}
	return body + string(c)
}

func (g *corpusGen) card(valid bool) string {
	d := g.cardDigits(valid)
	sep := g.pick("", " ", "-")
	if sep == "" {
		return d
	}
	if len(d) == 15 {
		return d[:4] + sep + d[4:10] + sep + d[10:]
	}
	return d[:4] + sep + d[4:8] + sep + d[8:12] + sep + d[12:]
}

func ibanCheck(cc, bban string) string {
	var num strings.Builder
	for _, c := range bban + cc + "00" {
		if c >= 'A' && c <= 'Z' {
			fmt.Fprintf(&num, "%d", c-'A'+10)
		} else {
			num.WriteRune(c)
		}
	}
	n, _ := new(big.Int).SetString(num.String(), 10)
	return fmt.Sprintf("%02d", 98-new(big.Int).Mod(n, big.NewInt(97)).Int64())
}

func (g *corpusGen) iban(valid bool) string {
	var cc, bban string
	switch g.r.IntN(4) {
	case 0:
		cc, bban = "IT", g.from(1, "ABCDEFGHIJKLMNOPQRSTUVWXYZ")+g.digits(10)+g.from(12, "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ")
	case 1:
		cc, bban = "DE", g.digits(18)
	case 2:
		cc, bban = "GB", g.from(4, "ABCDEFGHIJKLMNOPQRSTUVWXYZ")+g.digits(14)
	default:
		cc, bban = "FR", g.digits(10)+g.from(11, "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ")+g.digits(2)
	}
	check := ibanCheck(cc, bban)
	if !valid {
		c := []byte(check)
		c[1] = '0' + (c[1]-'0'+1+byte(g.r.IntN(8)))%10
		check = string(c)
	}
	s := cc + check + bban
	if g.r.IntN(2) == 0 {
		var b strings.Builder
		for i := 0; i < len(s); i += 4 {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(s[i:min(i+4, len(s))])
		}
		s = b.String()
	}
	return s
}

func (g *corpusGen) ssn(valid bool) string {
	area := fmt.Sprintf("%03d", 1+g.r.IntN(665))
	if area == "078" || area == "123" || area == "219" {
		area = "457"
	}
	if !valid {
		area = g.pick("000", "666", "9"+g.digits(2))
	}
	return area + "-" + fmt.Sprintf("%02d", 1+g.r.IntN(99)) + "-" + fmt.Sprintf("%04d", 1+g.r.IntN(9999))
}

func (g *corpusGen) fiscalCode(valid bool) string {
	const L = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	day := 1 + g.r.IntN(31)
	if g.r.IntN(2) == 0 {
		day += 40
	}
	s := g.from(6, L) + g.digits(2) + g.from(1, fiscalMonths) + fmt.Sprintf("%02d", day) + g.from(1, L) + g.digits(3)
	b := []byte(s + "A")
	for c := byte('A'); c <= 'Z'; c++ {
		b[15] = c
		if fiscalCheck(b) {
			break
		}
	}
	if !valid {
		b[15] = 'A' + (b[15]-'A'+1+byte(g.r.IntN(24)))%26
	}
	return string(b)
}

func (g *corpusGen) ip() string {
	if g.r.IntN(4) == 0 {
		return fmt.Sprintf("2001:db8:%x::%x", g.r.IntN(0xffff), 1+g.r.IntN(0xffff))
	}
	return fmt.Sprintf("%d.%d.%d.%d", g.pick2(10, 172, 192, 8, 34, 151), g.r.IntN(256), g.r.IntN(256), 1+g.r.IntN(254))
}

func (g *corpusGen) pick2(xs ...int) int { return xs[g.r.IntN(len(xs))] }

func (g *corpusGen) secret() string {
	switch g.r.IntN(9) {
	case 0:
		return "sk-proj-" + g.from(56, alnum)
	case 1:
		return "sk-ant-api03-" + g.from(93, alnum) + "AA"
	case 2:
		return "AKIA" + g.from(16, upperD)
	case 3:
		return "ghp_" + g.from(36, alnum)
	case 4:
		return "xoxb-" + g.digits(12) + "-" + g.digits(13) + "-" + g.from(24, alnum)
	case 5:
		return "sk_live_" + g.from(24, alnum)
	case 6:
		return "AIza" + g.from(35, alnum)
	case 7:
		return "github_pat_" + g.from(22, alnum) + "_" + g.from(59, alnum)
	default:
		return "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI" + g.from(24, alnum) + "In0." + g.from(43, alnum)
	}
}

func (g *corpusGen) urlCreds() (prefix, creds, suffix string) {
	return g.pick("postgres", "mysql", "https", "redis", "amqp") + "://",
		g.pick(firstNames...) + ":" + g.from(12, alnum),
		"@" + g.pick("db", "cache", "mq") + ".example.com:5432/app"
}

// evade rewrites a planted value the way people (or attackers) hide it.
func (g *corpusGen) evade(typ, v string) string {
	switch g.r.IntN(9) {
	case 7: // base64 (standard or URL-safe)
		if typ == TypeURLCredentials {
			return v // userinfo inside a URL is not pasted encoded
		}
		if g.r.IntN(2) == 0 {
			return base64.StdEncoding.EncodeToString([]byte(v))
		}
		return base64.RawURLEncoding.EncodeToString([]byte(v))
	case 8: // hex
		if typ == TypeURLCredentials {
			return v
		}
		return hex.EncodeToString([]byte(v))
	case 0: // fullwidth digits
		return strings.Map(func(r rune) rune {
			if r >= '0' && r <= '9' {
				return r - '0' + '０'
			}
			return r
		}, v)
	case 1: // a zero-width space after the first rune (not inside secrets' keyword prefix)
		if typ == TypeSecret || len(v) < 4 {
			return v
		}
		return v[:2] + "\u200b" + v[2:]
	case 2: // Cyrillic а for Latin a in e-mail addresses
		if typ == TypeEmail {
			return strings.Replace(v, "a", "а", 1)
		}
	case 3: // no-break spaces as separators
		return strings.ReplaceAll(v, " ", "\u00a0")
	case 4: // percent-encoded @
		if typ == TypeEmail {
			return strings.Replace(v, "@", "%40", 1)
		}
	}
	return v
}

var (
	templatesEN = []string{
		"Hi, please contact me at %s, thanks.",
		"Can you check %s for me? It's urgent.",
		"Here are the details: %s; let me know.",
		"Send the invoice to %s.",
		"My data: %s (please keep it private).",
	}
	templatesIT = []string{
		"Ciao, contattami pure a %s, grazie.",
		"Il dato che ti serve è %s, fammi sapere.",
		"Ecco i dettagli: %s; a presto.",
		"Per favore usa %s per il pagamento.",
		"I miei dati (%s) sono riservati.",
	}
)

// nearMiss returns a phrase that contains no sensitive value.
func (g *corpusGen) nearMiss() string {
	switch g.r.IntN(10) {
	case 0:
		return "Order ORD-2024-" + g.digits(6) + " shipped on 2024-0" + fmt.Sprint(1+g.r.IntN(9)) + "-1" + fmt.Sprint(g.r.IntN(10)) + "."
	case 1:
		return "Ordine n. " + g.digits(8) + " del " + fmt.Sprintf("%02d/%02d/20%02d", 1+g.r.IntN(28), 1+g.r.IntN(12), g.r.IntN(30)) + "."
	case 2:
		return fmt.Sprintf("Version %d.%d.%d released at %02d:%02d, build %d.%d.%d.%d.%d.", g.r.IntN(20), g.r.IntN(20), g.r.IntN(99), g.r.IntN(24), g.r.IntN(60), g.r.IntN(9), g.r.IntN(9), g.r.IntN(9), g.r.IntN(9), g.r.IntN(9))
	case 3:
		return "This card was declined: " + g.card(false) + "."
	case 4:
		return "IBAN sbagliato: " + g.iban(false) + "."
	case 5:
		return "Test SSN " + g.ssn(false) + " is not real."
	case 6:
		return "Codice fiscale errato " + g.fiscalCode(false) + "."
	case 7:
		return fmt.Sprintf("Totale € %d.%03d,%02d; sconto %d%%.", 1+g.r.IntN(99), g.r.IntN(1000), g.r.IntN(100), g.r.IntN(50))
	case 8:
		return "Ticket #" + g.digits(7) + ", customer id " + g.digits(9) + ", invoice INV-" + g.digits(5) + "."
	default:
		return "The key point is that the token budget and the password policy are documented."
	}
}

func (g *corpusGen) prompt() (string, []label) {
	var b strings.Builder
	var labels []label
	for k := 0; k < 1+g.r.IntN(3); k++ {
		if g.r.IntN(2) == 0 {
			b.WriteString(g.nearMiss())
			b.WriteByte(' ')
		}
		tmpl := templatesEN[g.r.IntN(len(templatesEN))]
		if g.r.IntN(2) == 0 {
			tmpl = templatesIT[g.r.IntN(len(templatesIT))]
		}
		typ := builtinTypes[g.r.IntN(len(builtinTypes))]
		var pre, v, post string
		switch typ {
		case TypeEmail:
			v = g.email()
		case TypePhone:
			v = g.phone()
		case TypeCreditCard:
			v = g.card(true)
		case TypeIBAN:
			v = g.iban(true)
		case TypeUSSSN:
			v = g.ssn(true)
		case TypeITFiscalCode:
			v = g.fiscalCode(true)
		case TypeIPAddress:
			v = g.ip()
		case TypeSecret:
			v = g.secret()
		case TypeURLCredentials:
			pre, v, post = g.urlCreds()
		}
		if g.r.IntN(3) == 0 {
			v = g.evade(typ, v)
		}
		i := strings.Index(tmpl, "%s")
		b.WriteString(tmpl[:i] + pre)
		labels = append(labels, label{typ, b.Len(), b.Len() + len(v)})
		b.WriteString(v + post + tmpl[i+2:])
		b.WriteByte(' ')
	}
	return b.String(), labels
}

// TestCorpusPrecisionAndRecall scans a seeded labelled corpus and fails if
// any type's recall is below 0.99 or precision below 0.97. A finding is a
// true positive when it has the planted type and covers the whole planted
// value (so redacting it removes every byte). The table is printed with -v.
func TestCorpusPrecisionAndRecall(t *testing.T) {
	s := mustScanner(t)
	g := &corpusGen{r: rand.New(rand.NewPCG(2026, 11))}
	type counts struct{ tp, fp, fn int }
	per := map[string]*counts{}
	for _, typ := range builtinTypes {
		per[typ] = &counts{}
	}
	var misses []string
	for n := 0; n < 3000; n++ {
		text, labels := g.prompt()
		found := s.Scan(text)
		used := make([]bool, len(found))
		for _, l := range labels {
			hit := false
			for i, f := range found {
				if !used[i] && f.Type == l.typ && f.Start <= l.start && f.End >= l.end {
					used[i], hit = true, true
					break
				}
			}
			if hit {
				per[l.typ].tp++
			} else {
				per[l.typ].fn++
				if len(misses) < 20 {
					misses = append(misses, fmt.Sprintf("missed %s %q in %q", l.typ, text[l.start:l.end], text))
				}
			}
		}
		for i, f := range found {
			if !used[i] {
				per[f.Type].fp++
				if len(misses) < 20 {
					misses = append(misses, fmt.Sprintf("false %s %q in %q", f.Type, text[f.Start:f.End], text))
				}
			}
		}
	}
	types := append([]string(nil), builtinTypes...)
	sort.Strings(types)
	var table strings.Builder
	fmt.Fprintf(&table, "%-16s %6s %6s %6s %9s %7s\n", "type", "tp", "fp", "fn", "precision", "recall")
	fail := false
	for _, typ := range types {
		c := per[typ]
		p, r := ratio(c.tp, c.tp+c.fp), ratio(c.tp, c.tp+c.fn)
		fmt.Fprintf(&table, "%-16s %6d %6d %6d %9.4f %7.4f\n", typ, c.tp, c.fp, c.fn, p, r)
		if p < 0.97 || r < 0.99 || c.tp == 0 {
			fail = true
		}
	}
	t.Logf("\n%s", table.String())
	if fail {
		t.Errorf("precision/recall below 0.97/0.99:\n%s\n%s", table.String(), strings.Join(misses, "\n"))
	}
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 1
	}
	return float64(a) / float64(b)
}
