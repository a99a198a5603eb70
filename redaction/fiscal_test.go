package redaction

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// TestGroupedFullyOmocodicFiscalCodes: fiscal codes with all seven digits
// replaced by omocodic letters (no digit left) are found written in
// groups between their fields, and nothing else is. The codes and their
// check letters were computed from the tables of DM 23 December 1976
// (odd positions 0=1 1=0 2=5 … A=1 B=0 C=5 …, even positions 0–9 and
// A=0 … Z=25) outside this package, and are checked here once more with
// fiscalCheckByHand: RSSMRA80A01H501U → RSSMRAULALMHRLMD, BNCLRA85T50F205A
// (a woman, day 50) → BNCLRAURTRLFNLRT, VRDGPP99C31L219E → VRDGPPVVCPMLNMVY.
func TestGroupedFullyOmocodicFiscalCodes(t *testing.T) {
	for _, c := range []string{"RSSMRAULALMHRLMD", "BNCLRAURTRLFNLRT", "VRDGPPVVCPMLNMVY"} {
		if got := fiscalCheckByHand(c); got != c[15] {
			t.Fatalf("%s: check letter by hand %c", c, got)
		}
	}
	runScanCases(t, []scanCase{
		{"in groups of 3-3-5-5", "IT", "il codice fiscale è RSS MRA ULALM HRLMD, grazie", []string{"IT_FISCAL_CODE:RSS MRA ULALM HRLMD"}},
		{"in dashed groups", "IT", "CF: RSS-MRA-ULALM-HRLMD.", []string{"IT_FISCAL_CODE:RSS-MRA-ULALM-HRLMD"}},
		{"field by field", "IT", "codice RSS MRA UL A LM HRLM D fine", []string{"IT_FISCAL_CODE:RSS MRA UL A LM HRLM D"}},
		{"a woman's code", "IT", "CF BNC LRA URTRL FNLRT", []string{"IT_FISCAL_CODE:BNC LRA URTRL FNLRT"}},
		{"in dotted groups", "IT", "(VRD.GPP.VVCPM.LNMVY)", []string{"IT_FISCAL_CODE:VRD.GPP.VVCPM.LNMVY"}},
		{"unbroken, as before", "IT", "CF RSSMRAULALMHRLMD", []string{"IT_FISCAL_CODE:RSSMRAULALMHRLMD"}},
		{"a wrong check letter is no code", "IT", "codice RSS MRA ULALM HRLMA", nil},
		{"groups that cut a field are not read", "IT", "codice RSSM RAUL ALMH RLMD", nil},
		{"glued to a longer capital word", "IT", "codice XRSS MRA ULALM HRLMD", nil},
		{"capitals in field-shaped words", "IT", "THE CAT SAT ON THE MAT AND RAN", nil},
	})
}

// TestFullyOmocodicCodesLeaveCapitalsAlone: prose in capitals, words of a
// hand-written list in random order, holds no fiscal code.
func TestFullyOmocodicCodesLeaveCapitalsAlone(t *testing.T) {
	s := mustScanner(t)
	words := strings.Fields("THE AND FOR YOU NOT ALL ARE BUT OUT RUN SUN MUST TRUST LUNAR PLUMS STRUM SLUMP RUMP TURN " +
		"NUN MUM PUT RUT TUTS MULL LULL PURR STUN RUST SMUT VAST MAST PAST LAST ULTRA URN MANTRA LUST " +
		"CHE NON PER UNA SUL TUTTO MOLTO PRIMA VERSO SENZA QUANTO NULLA PUNTO MUSSOLINI RUSTICA MARTE " +
		"APRILE MAGGIO LUGLIO ROMA MILANO TORINO NAPOLI CAPITALE ATTENZIONE URGENTE AVVISO IMPORTANTE")
	seps := []string{" ", " ", " ", "-", ". ", ", "}
	r := rand.New(rand.NewPCG(16, 26))
	var b strings.Builder
	for range 60000 {
		b.WriteString(words[r.IntN(len(words))])
		b.WriteString(seps[r.IntN(len(seps))])
	}
	text := b.String()
	for _, f := range s.Scan(text) {
		if f.Type == TypeITFiscalCode {
			t.Errorf("a fiscal code in capitals: %q", text[f.Start:f.End])
		}
	}
}
