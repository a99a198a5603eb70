package openai

import (
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
)

// dupOracle reports the first member name repeated in one object of the
// valid JSON text s, read with encoding/json's tokenizer.
func dupOracle(t *testing.T, s string) (string, bool) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	type level struct {
		obj   bool
		names map[string]bool
		key   bool // the next string token of this object is a name
	}
	var stack []*level
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return "", false
		}
		if err != nil {
			t.Fatalf("oracle on %q: %v", s, err)
		}
		top := (*level)(nil)
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.obj && top.key {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				if len(stack) > 0 && stack[len(stack)-1].obj {
					stack[len(stack)-1].key = true
				}
				continue
			}
			name := tok.(string)
			if top.names[name] {
				return name, true
			}
			top.names[name] = true
			top.key = false
			continue
		}
		switch d, _ := tok.(json.Delim); d {
		case '{':
			stack = append(stack, &level{obj: true, names: map[string]bool{}, key: true})
			continue
		case '[':
			stack = append(stack, &level{})
			continue
		case ']':
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 && stack[len(stack)-1].obj {
			stack[len(stack)-1].key = true // a value ended: a name comes next
		}
	}
}

// TestCheckJSONAgreesWithEncodingJSON: CheckJSON's validity is
// encoding/json.Valid's, and its repeated name the first one
// encoding/json's tokenizer meets, on hand-written answers and on random
// mutations of them; nesting past MaxJSONDepth is deep.
func TestCheckJSONAgreesWithEncodingJSON(t *testing.T) {
	seeds := []string{
		`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":5}}`,
		`{"a":1,"b":{"a":2,"c":[1,2,{"d":null,"e":true}]},"a":3}`,
		`{"a":{"x":1,"x":2},"b":[{"y":1},{"y":1}]}`,
		`{"k\u0061":1,"ka":2}`,
		`[1, 2.5e3, -0.1, "s\"q", false, null, {}]`,
		`  {"choices": []}  `,
		`{"a":1,}`, `{"a" 1}`, `[1 2]`, `"unterminated`, ``, `nul`, `{"a":01}`,
	}
	check := func(s string) {
		valid, key, dup, deep := CheckJSON([]byte(s))
		if want := json.Valid([]byte(s)); valid != want {
			t.Fatalf("CheckJSON(%q) valid %v, encoding/json %v", s, valid, want)
		}
		if !valid {
			return
		}
		wantKey, wantDup := dupOracle(t, s)
		if dup != wantDup || dup && key != wantKey || deep {
			t.Fatalf("CheckJSON(%q) = key %q dup %v deep %v; want key %q dup %v", s, key, dup, deep, wantKey, wantDup)
		}
	}
	for _, s := range seeds {
		check(s)
	}
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte(`{}[]:,"\ a1.-etrufnl`)
	for range 20000 {
		b := []byte(seeds[r.IntN(6)])
		for range 1 + r.IntN(3) {
			b[r.IntN(len(b))] = alphabet[r.IntN(len(alphabet))]
		}
		check(string(b))
	}
	deepText := strings.Repeat("[", MaxJSONDepth+1) + strings.Repeat("]", MaxJSONDepth+1)
	if valid, _, _, deep := CheckJSON([]byte(deepText)); !valid || !deep {
		t.Fatalf("%d levels: valid %v deep %v", MaxJSONDepth+1, valid, deep)
	}
	if _, _, _, deep := CheckJSON([]byte(deepText[1 : len(deepText)-1])); deep {
		t.Fatalf("%d levels read as too deep", MaxJSONDepth)
	}
}
