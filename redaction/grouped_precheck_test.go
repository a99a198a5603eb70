package redaction

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// precheckTexts are random texts of letters (month and omocodic ones
// among them), digits, separators, a multi-byte letter and now and then
// a valid IBAN or fiscal code: the shapes
// the early tests of detectFiscalGrouped and detectNumbers read.
func precheckTexts(n int) []string {
	rng := rand.New(rand.NewPCG(5, 6))
	const bytes = "ABCDEHLMPRSTLMNPQRSTUVabdelmrsqxyzXYZ0123456789 -._/+="
	var out []string
	for range n {
		b := make([]byte, 0, 40)
		for len(b) < 1+rng.IntN(39) {
			if rng.IntN(30) == 0 {
				b = append(b, "是"...)
				continue
			}
			if rng.IntN(60) == 0 {
				b = append(b, []string{"IT60X0542811101000000123456", "DE89370400440532013000", "RSSMRA80A01H501U"}[rng.IntN(3)]...)
				continue
			}
			b = append(b, bytes[rng.IntN(len(bytes))])
		}
		out = append(out, string(b))
	}
	return out
}

// TestFiscalOmocodicPrecheckIsNecessary: wherever detectFiscalOmocodic
// would keep a code (fiscalGroupedAt reads one, its separators lie
// between fields, no digit is left), fiscalOmocodicMaybe and
// fiscalOmocodicHead admit its start; on the fully omocodic codes of TestGroupedFullyOmocodicFiscalCodes
// with separators at any of the positions between fields and at some
// that cut one, and on precheckTexts (the oracle is fiscalGroupedAt).
func TestFiscalOmocodicPrecheckIsNecessary(t *testing.T) {
	texts := precheckTexts(100000)
	cuts := []int{3, 6, 8, 9, 11, 15, 4, 5, 7}
	for _, code := range []string{"RSSMRAULALMHRLMD", "BNCLRAURTRLFNLRT", "VRDGPPVVCPMLNMVY"} {
		for set := range 1 << len(cuts) {
			for _, sep := range []string{" ", "-", ".", "_", "/"} {
				var b strings.Builder
				b.WriteString("CF ")
				for i := range code {
					for k, c := range cuts {
						if set>>k&1 != 0 && c == i {
							b.WriteString(sep)
						}
					}
					b.WriteByte(code[i])
				}
				b.WriteString(".")
				texts = append(texts, b.String())
			}
		}
	}
	var up [16]byte
	accepted := 0
	for _, text := range texts {
		for st := 0; st+17 <= len(text); st++ {
			if !isUpper(text[st]) || !isUpper(text[st+1]) || !isUpper(text[st+2]) {
				continue
			}
			e, ok := fiscalGroupedAt(text, st, &up)
			if !ok || !fiscalFieldGroups(text, st, e) || strings.ContainsAny(string(up[:]), "0123456789") {
				continue
			}
			accepted++
			if !fiscalOmocodicMaybe(text, st) {
				t.Fatalf("%q at %d: a fully omocodic code the first test turns down", text, st)
			}
			if !fiscalOmocodicHead(text, st) {
				t.Fatalf("%q at %d: a fully omocodic code fiscalOmocodicHead turns down", text, st)
			}
		}
	}
	if accepted == 0 {
		t.Fatal("no fully omocodic code was read: the texts do not test the condition")
	}
	t.Logf("%d codes admitted", accepted)
}

// TestFiscalYearPrecheckIsNecessary: wherever fiscalYearAt accepts a
// digit run, fiscalYearMaybe does (it only saves calls; the oracle is
// fiscalYearAt itself).
func TestFiscalYearPrecheckIsNecessary(t *testing.T) {
	accepted := 0
	for _, text := range precheckTexts(200000) {
		for i := 0; i < len(text); i++ {
			if !isDigit(text[i]) || i > 0 && isDigit(text[i-1]) {
				continue
			}
			n := i
			for n < len(text) && isDigit(text[n]) {
				n++
			}
			if fiscalYearAt(text, i, n) {
				accepted++
				if !fiscalYearMaybe(text, i, n) {
					t.Fatalf("%q at %d: fiscalYearAt accepts what the first test turns down", text, i)
				}
			}
		}
	}
	if accepted == 0 {
		t.Fatal("fiscalYearAt accepted no run: the texts do not test the condition")
	}
}

// TestGluedIBANPrecheckIsNecessary: where ibanInWord has detectNumbers
// leave out iban for a digit run glued to a letter, iban finds nothing.
func TestGluedIBANPrecheckIsNecessary(t *testing.T) {
	s, err := NewScanner(Config{})
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, text := range precheckTexts(100000) {
		for i := 1; i < len(text); i++ {
			if !isDigit(text[i]) || !isAlpha(text[i-1]) {
				continue
			}
			e := i
			for e < len(text) && isDigit(text[e]) {
				e++
			}
			ns := numScan{s: s, text: text}
			ns.c.atoms = append(ns.c.atoms, numAtom{i, e})
			ns.iban()
			found += len(ns.dst)
			if ibanInWord(text, i) && len(ns.dst) > 0 {
				t.Fatalf("%q at %d: iban finds %v where it is left out", text, i, ns.dst)
			}
		}
	}
	if found == 0 {
		t.Fatal("no IBAN found at all: the texts do not test the condition")
	}
}

// TestSubrangeBelowMinValueDigits: subrange finds nothing in a range of
// fewer than minValueDigits digits, whatever the separators, so cluster
// does not call it there; and an IPv4 address of minValueDigits digits
// is still found.
func TestSubrangeBelowMinValueDigits(t *testing.T) {
	s, err := NewScanner(Config{DefaultRegion: "IT"})
	if err != nil {
		t.Fatal(err)
	}
	seps := []string{"", " ", ".", "-", "/", "  "}
	for _, d := range []string{"1", "12", "123", "911", "112", "000"} {
		for _, sep := range seps {
			text := "call " + d[:1]
			for _, c := range d[1:] {
				text += sep + string(c)
			}
			text += " now"
			ns := numScan{s: s, text: text}
			end := readCluster(text, 5, &ns.c)
			if end < 0 {
				t.Fatal(end)
			}
			ns.gapIDs()
			n := len(ns.c.atoms)
			ns.digits, ns.off = ns.digits[:0], ns.off[:0]
			for _, a := range ns.c.atoms {
				ns.off = append(ns.off, len(ns.digits))
				ns.digits = append(ns.digits, text[a.s:a.e]...)
			}
			ns.off = append(ns.off, len(ns.digits))
			ns.ds = string(ns.digits)
			for i := 0; i < n; i++ {
				for j := i + 1; j <= n; j++ {
					if nd := ns.off[j] - ns.off[i]; nd < minValueDigits {
						ns.subrange(i, j, nd, true)
						ns.subrange(i, j, nd, false)
					}
				}
			}
			if len(ns.dst) > 0 {
				t.Errorf("%q: subrange found %v", text, ns.dst)
			}
		}
	}
	runScanCases(t, []scanCase{{"an IPv4 address of four digits", "", "server at 1.2.3.4 today", []string{"IP_ADDRESS/public:1.2.3.4"}}})
}

// TestGroupedFiscalCodesOfEitherCaseAreFound: valid fiscal codes (their
// check letters computed apart from Molly with the ministerial tables of
// odd and even values; two have the day's digits replaced), written in
// upper or in lower case with each separator and grouping, are found with
// exactly their bounds, whatever follows them outside a word; the same
// code with its letters' case mixed is not one (detectFiscalGrouped reads
// only codes of one case, and skips a digit run whose neighbouring
// letters differ in case).
func TestGroupedFiscalCodesOfEitherCaseAreFound(t *testing.T) {
	s, err := NewScanner(Config{})
	if err != nil {
		t.Fatal(err)
	}
	group := func(code, sep string, sizes []int) string {
		var out []string
		for _, n := range sizes {
			out = append(out, code[:n])
			code = code[n:]
		}
		return strings.Join(out, sep)
	}
	groupings := [][]int{{3, 3, 5, 5}, {6, 10}, {6, 2, 3, 5}, {3, 3, 2, 1, 2, 4, 1}, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}}
	for _, code := range []string{"RSSMRA80A01H501U", "RSSMRA85T10A562S", "RSSMRA8LALMHRLMG", "RSSMRA80ALMHRLMV"} {
		for _, sep := range []string{" ", "-", ".", "_", "/"} {
			for _, g := range groupings {
				for _, c := range []string{code, strings.ToLower(code)} {
					v := group(c, sep, g)
					for _, after := range []string{", grazie", ".", "", "-", "- ok", "\n", ")"} {
						text := "il mio codice è " + v + after
						found := false
						for _, f := range s.Scan(text) {
							if f.Type == TypeITFiscalCode && text[f.Start:f.End] == v {
								found = true
							}
						}
						if !found {
							t.Errorf("%q: the fiscal code %q was not found whole", text, v)
						}
					}
				}
			}
		}
	}
	// Fully omocodic (no digit left), in upper case and groups of whole
	// fields: found by detectFiscalOmocodic.
	for _, sep := range []string{" ", "-", ".", "_", "/"} {
		for _, g := range [][]int{{3, 3, 5, 5}, {6, 10}, {3, 3, 2, 1, 2, 4, 1}, {6, 2, 1, 2, 5}} {
			v := group("RSSMRAULALMHRLMD", sep, g)
			text := "CF: " + v + "."
			found := false
			for _, f := range s.Scan(text) {
				found = found || f.Type == TypeITFiscalCode && text[f.Start:f.End] == v
			}
			if !found {
				t.Errorf("%q: the fully omocodic code %q was not found whole", text, v)
			}
		}
	}
	mixed := "il mio codice è rsS-MRa-80A01-H501U, grazie"
	for _, f := range s.Scan(mixed) {
		if f.Type == TypeITFiscalCode {
			t.Fatalf("%q: a code of mixed case was read as one: %q", mixed, mixed[f.Start:f.End])
		}
	}
}

// TestFiscalYearAtAdmitsEveryGroupedCodesYear: wherever fiscalGroupedAt
// reads a code holding a digit, fiscalYearAt admits the code's year run
// (the run holding its 8th character when that is a digit, else its 7th:
// the year's second digit replaced), so detectFiscalGrouped, which reads
// codes only from runs fiscalYearAt admits, misses none. The codes are
// RSSMRA80A01H501U with none to six of its digits replaced (check letters
// by fiscalCheckByHand), in either case, with each separator and grouping,
// amid precheckTexts' noise.
func TestFiscalYearAtAdmitsEveryGroupedCodesYear(t *testing.T) {
	var codes []string
	code := []byte("RSSMRA80A01H501U")
	codes = append(codes, string(code))
	for _, pos := range []int{14, 13, 12, 10, 9, 7} {
		code[pos] = "LMNPQRSTUV"[code[pos]-'0']
		code[15] = fiscalCheckByHand(string(code))
		codes = append(codes, string(code))
	}
	noise := precheckTexts(3000)
	var texts []string
	for k, c := range codes {
		for _, cs := range []string{c, strings.ToLower(c)} {
			for _, sep := range []string{" ", "-", ".", "_", "/"} {
				for _, cuts := range [][]int{{3, 6, 11}, {6}, {6, 8, 11}, {3, 6, 8, 9, 11, 15}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {7}} {
					var b strings.Builder
					for i := range cs {
						if slices.Contains(cuts, i) {
							b.WriteString(sep)
						}
						b.WriteByte(cs[i])
					}
					for q := range 4 {
						texts = append(texts, noise[(k*31+q)%len(noise)]+" "+b.String()+[]string{" ", ".", "", ", "}[q])
					}
				}
			}
		}
	}
	texts = append(texts, precheckTexts(100000)...)
	var up [16]byte
	admitted := 0
	for _, text := range texts {
		for st := range len(text) {
			if !isAlpha(text[st]) {
				continue
			}
			if _, ok := fiscalGroupedAt(text, st, &up); !ok || !strings.ContainsAny(string(up[:]), "0123456789") {
				continue
			}
			// The offsets of the code's 7th and 8th characters, read as
			// fiscalGroupedAt reads the code.
			var pos [8]int
			j := st
			for k := range 8 {
				if k > 0 && fiscalSep(text[j]) && isAlnum(text[j+1]) {
					j++
				}
				pos[k] = j
				j++
			}
			y := pos[7]
			if !isDigit(text[y]) {
				y = pos[6]
			}
			i, n := y, y
			for i > 0 && isDigit(text[i-1]) {
				i--
			}
			for n < len(text) && isDigit(text[n]) {
				n++
			}
			admitted++
			if !fiscalYearAt(text, i, n) {
				t.Fatalf("%q: the code at %d is read, but fiscalYearAt turns down its year %q", text, st, text[i:n])
			}
			if !fiscalCaseBefore(text, i, n) {
				t.Fatalf("%q: the code at %d is read, but fiscalCaseBefore turns down its year %q", text, st, text[i:n])
			}
		}
	}
	if admitted < len(codes)*2*5*6 {
		t.Fatalf("only %d codes read: the texts do not test the condition", admitted)
	}
}
