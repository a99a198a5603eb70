package redaction

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

var fuzzSeeds = []string{
	"",
	"Scrivi a mario.rossi@example.it o chiama +39 333 123 4567, oppure 02 1234 5678.",
	"card 4111 1111 1111 1111, IBAN IT60 X054 2811 1010 0000 0123 456, SSN 536-22-1234",
	"key " + keyOpenAI + " and " + keyAWS + "\n" + keyPEM,
	"ｍａｒｉｏ＠ｅｘａｍｐｌｅ．ｃｏｍ m\u200bario@exa\u200dmple.com mаrio@exаmple.com mario%40example.com",
	"postgres://admin:s3cr3t@db.example.com:5432/app 2001:db8::1 192.168.1.10 RSSMRA85T10A562S",
	"\xff\xfe@\xc3.\xe2\x80 [EMAIL_1] [EMAIL_ [",
	"order ORD-2024-118734 on 2024-03-15 10:30, v1.2.3.4.5, € 1.234,56",
}

// FuzzScan checks Scan's contract on any input: findings in bounds,
// non-empty, sorted, non-overlapping, of an enabled type; and that a
// Redact/Restore round trip gives the input back.
func FuzzScan(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	s, err := NewScanner(Config{DefaultRegion: "IT"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, text string) {
		fs := s.Scan(text)
		end := 0
		for _, x := range fs {
			if x.Start < end || x.End <= x.Start || x.End > len(text) {
				t.Fatalf("bad finding %+v after end %d in %q (len %d)", x, end, text, len(text))
			}
			if !slices.Contains(builtinTypes, x.Type) {
				t.Fatalf("unknown type %q", x.Type)
			}
			end = x.End
		}
		v := NewVault()
		red := v.Redact(text, fs, allTypes)
		if back := v.Restore(red); back != text {
			t.Fatalf("round trip changed the text:\n in %q\nred %q\nout %q", text, red, back)
		}
	})
}

// FuzzStreamRestorer checks that any chunking of any answer restores to
// what Restore gives, never emits a split UTF-8 sequence of valid input,
// and holds back a bounded tail. cuts picks the chunk sizes (1–64 bytes).
func FuzzStreamRestorer(f *testing.F) {
	v, answer := streamFixture(f)
	f.Add(answer, []byte{1, 2, 3, 5, 8, 13})
	f.Add("[EMAIL_1][EMAIL_10][[PHONE_1]]", []byte{1})
	f.Add("ab\xc3\xa9[SECRET_1]\xe2\x98\xba", []byte{2, 1, 7})
	f.Add("[", []byte{0})
	f.Fuzz(func(t *testing.T, answer string, cuts []byte) {
		want := v.Restore(answer)
		r := v.NewStreamRestorer()
		var got strings.Builder
		rest := answer
		for i := 0; rest != ""; i++ {
			n := len(rest)
			if len(cuts) > 0 {
				n = min(n, 1+int(cuts[i%len(cuts)])%64)
			}
			out := r.Write(rest[:n])
			if utf8.ValidString(answer) && !utf8.ValidString(out) {
				t.Fatalf("emitted invalid UTF-8 %q", out)
			}
			if r.Pending() > maxPlaceholderLen+utf8.UTFMax {
				t.Fatalf("holding back %d bytes", r.Pending())
			}
			got.WriteString(out)
			rest = rest[n:]
		}
		got.WriteString(r.Flush())
		if got.String() != want {
			t.Fatalf("stream = %q, want %q", got.String(), want)
		}
	})
}

// FuzzNormalise checks that the view's offset map is monotonic, points
// at rune boundaries of the original, and that the view of a text without
// anything to rewrite is the text itself (oracle: the definition of the
// map, not the detectors).
func FuzzNormalise(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		v, ok := normalise(text)
		if !ok {
			return
		}
		prev := 0
		for i := range len(v.text) {
			s, e := v.orig(i)
			if s < prev || e <= s || e > len(text) {
				t.Fatalf("byte %d maps to [%d,%d) after %d", i, s, e, prev)
			}
			if utf8.ValidString(text) && utf8.RuneStart(v.text[i]) && !utf8.RuneStart(text[s]) {
				t.Fatalf("rune at byte %d maps into the middle of a rune at %d", i, s)
			}
			prev = s
		}
	})
}

// FuzzScanAcross checks ScanAcross's contract on any text cut at any two
// points into three segments: parts in bounds, non-empty, sorted by
// segment then offset, non-overlapping within a segment, every value in
// two or more segments, value ids numbered from 0 in order; and that
// redacting every segment with the parts and restoring gives them back.
func FuzzScanAcross(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s, uint8(len(s)/3), uint8(len(s)/2))
	}
	f.Add("my card is 4111 1111 1111 1111 thanks", uint8(19), uint8(25))
	f.Add("write to mario.rossi@example.it please", uint8(20), uint8(24))
	s, err := NewScanner(Config{DefaultRegion: "IT", Dictionaries: map[string][]string{"PROJECT": {"Falcon"}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, text string, a, b uint8) {
		i, j := min(int(a), len(text)), min(int(b), len(text))
		if i > j {
			i, j = j, i
		}
		segs := []string{text[:i], text[i:j], text[j:]}
		fs := s.ScanAcross(segs)
		perSeg := make([][]Finding, len(segs))
		segsOf := map[int]map[int]bool{}
		next := 0
		for k, x := range fs {
			if x.Segment < 0 || x.Segment >= len(segs) || x.Start < 0 || x.End <= x.Start || x.End > len(segs[x.Segment]) {
				t.Fatalf("bad part %+v of %q", x, segs)
			}
			if k > 0 && (fs[k-1].Segment > x.Segment || fs[k-1].Segment == x.Segment && fs[k-1].End > x.Start) {
				t.Fatalf("parts out of order or overlapping: %+v then %+v", fs[k-1], x)
			}
			if x.Value > next {
				t.Fatalf("value %d before value %d", x.Value, next)
			}
			if x.Value == next {
				next++
			}
			if segsOf[x.Value] == nil {
				segsOf[x.Value] = map[int]bool{}
			}
			segsOf[x.Value][x.Segment] = true
			perSeg[x.Segment] = append(perSeg[x.Segment], x.Finding)
		}
		for id, in := range segsOf {
			if len(in) < 2 {
				t.Fatalf("value %d lies in one segment only: %+v", id, fs)
			}
		}
		v := NewVault()
		types := map[string]bool{"PROJECT": true}
		for k := range allTypes {
			types[k] = true
		}
		for k, seg := range segs {
			if back := v.Restore(v.Redact(seg, perSeg[k], types)); back != seg {
				t.Fatalf("round trip changed segment %d: %q -> %q", k, seg, back)
			}
		}
	})
}

// FuzzRedactJSON checks, on any JSON document, that RedactJSON keeps it
// valid JSON and that RestoreJSON gives back a document equal to the
// input (encoding/json is the oracle for both).
func FuzzRedactJSON(f *testing.F) {
	for _, s := range []string{
		`{"card": 4111111111111111, "to": "mario.rossi@example.it"}`,
		`[536221234, "a\u0040b.it", {"mario@example.com": true}]`,
		`{"iban": "IT60 X054 2811 1010 0000 0123 456", "n": -1.5e3}`,
		`"plain"`, `{}`,
	} {
		f.Add(s)
	}
	s, err := NewScanner(Config{DefaultRegion: "IT", Patterns: map[string][]string{"FLAG": {`true|null`}}})
	if err != nil {
		f.Fatal(err)
	}
	types := map[string]bool{"FLAG": true}
	for k := range allTypes {
		types[k] = true
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if !json.Valid([]byte(raw)) {
			return
		}
		v := NewVault()
		red := v.RedactJSON(raw, s.Scan(raw), types)
		if !json.Valid([]byte(red)) {
			t.Fatalf("RedactJSON broke the JSON:\n in  %s\n out %s", raw, red)
		}
		decode := func(b []byte) (any, error) {
			d := json.NewDecoder(bytes.NewReader(b))
			d.UseNumber()
			var x any
			err := d.Decode(&x)
			return x, err
		}
		a, err := decode([]byte(raw))
		if err != nil {
			return
		}
		b, err := decode(v.RestoreJSON([]byte(red)))
		if err != nil {
			t.Fatalf("restored text is not JSON: %v", err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("round trip changed the document:\n in  %s\n red %s\n out %s", raw, red, v.RestoreJSON([]byte(red)))
		}
	})
}

// FuzzStreamGuard checks that any chunking of any answer gives what the
// whole-answer Check gives (or the same block), never half a UTF-8
// character of valid input, and a held-back tail under the stated bound
// for text with white space.
func FuzzStreamGuard(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s, []byte{3, 9, 1})
	}
	g, err := NewScanner(Config{DefaultRegion: "IT"})
	if err != nil {
		f.Fatal(err)
	}
	guard := g.NewGuard(GuardPolicy{Default: GuardMask, Actions: map[string]GuardAction{TypeSecret: GuardBlock}}, "mario.rossi@example.it")
	f.Fuzz(func(t *testing.T, answer string, cuts []byte) {
		want, _, wantErr := guard.Check(answer)
		sg := guard.NewStream()
		var got strings.Builder
		var err error
		for i, k := 0, 0; i < len(answer) && err == nil; k++ {
			n := len(answer) - i
			if len(cuts) > 0 {
				n = min(n, 1+int(cuts[k%len(cuts)]))
			}
			var out string
			out, err = sg.Write(answer[i : i+n])
			if utf8.ValidString(answer) && !utf8.ValidString(out) {
				t.Fatalf("emitted invalid UTF-8 %q", out)
			}
			got.WriteString(out)
			i += n
		}
		if err == nil {
			var out string
			out, err = sg.Flush()
			got.WriteString(out)
		}
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("stream error %v, Check error %v", err, wantErr)
		}
		if err == nil && got.String() != want {
			t.Fatalf("stream %q\nCheck  %q", got.String(), want)
		}
	})
}
