package classify

import (
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/molly-gateway/molly/redaction"
)

// ErrUnscannedType is returned by Redact for a type no detector finds: what
// was never looked for cannot be removed (fail closed).
var ErrUnscannedType = errors.New("no detector finds this entity type")

// Redacted is a body with some entity types replaced.
type Redacted struct {
	Body string
	// Vault restores placeholders in the answer; nil when nothing
	// restorable was replaced.
	Vault *redaction.Vault
	// Replaced counts the distinct values replaced, by placeholders, masks
	// or pseudonyms (a value split across fields counts once per part).
	Replaced int
}

// Redact returns the body with every finding whose type is in types
// replaced by a placeholder (or a mask or keyed pseudonym, per the
// classifier's WithRedactionModes), each written back so that the JSON stays
// valid: a string in place of a number, a renamed key, a re-encoded data
// URL, a participant or function name fitting ^[a-zA-Z0-9_-]+$. The
// parts of a value split across fields are replaced each in its field.
// Errors: ErrUnscannedType (wrapped) for a type the scanner does not look
// for; a body that cannot be rewritten.
func (a *Annotation) Redact(types []string) (Redacted, error) {
	out := Redacted{Body: a.body}
	if len(types) == 0 {
		return out, nil
	}
	scanned := a.Scanned()
	set := make(map[string]bool, len(types))
	for _, ty := range types {
		if !slices.Contains(scanned, ty) {
			return out, fmt.Errorf("%s: %w", ty, ErrUnscannedType)
		}
		set[ty] = true
	}
	vault := redaction.NewVault(a.classifier.vaultOpts...)
	// Reserve every placeholder-shaped string the client wrote, in any
	// field and in the raw body, before issuing one: otherwise a literal
	// "[EMAIL_1]" in a field without findings (or in a later field) could
	// be issued for a real value and "restored" into it in the answer.
	vault.Redact(a.body, nil, nil)
	for _, f := range a.fields {
		vault.Redact(f.text, nil, nil)
	}
	body := a.body
	type rename struct{ path, parent, key string }
	var renames []rename
	var err error
	for i := 0; i < len(a.findings); {
		fi := a.findings[i].Field
		var fs []redaction.Finding
		for ; i < len(a.findings) && a.findings[i].Field == fi; i++ {
			fs = append(fs, a.findings[i].Finding)
		}
		f := a.fields[fi]
		var red string
		if f.kind == kindArgs {
			// JSON inside a string: a number or key replaced must leave valid
			// JSON (a quoted placeholder), restored exactly in the answer.
			red = vault.RedactJSON(f.text, fs, set)
		} else {
			red = vault.Redact(f.text, fs, set)
		}
		if red == f.text {
			continue
		}
		path := a.fieldPath(fi)
		switch f.kind {
		case kindName:
			red = participantName(red)
		case kindDataURL:
			red = "data:" + f.mediaType + ";base64," + base64.StdEncoding.EncodeToString([]byte(red))
		case kindKey:
			parent := ""
			if j := lastSegment(path); j > 0 {
				parent = path[:j-1]
			}
			renames = append(renames, rename{path, parent, red})
			continue
		}
		if body, err = sjson.Set(body, path, red); err != nil {
			return out, fmt.Errorf("redacting %s: %w", path, err)
		}
	}
	// Keys last, deepest first (reverse document order), so the paths of
	// the values above still named the original keys.
	for k := len(renames) - 1; k >= 0; k-- {
		rn := renames[k]
		raw := gjson.Get(body, rn.path).Raw
		if body, err = sjson.Delete(body, rn.path); err != nil {
			return out, fmt.Errorf("redacting a key at %s: %w", rn.path, err)
		}
		np := escapePath(rn.key)
		if rn.parent != "" {
			np = rn.parent + "." + np
		}
		if body, err = sjson.SetRaw(body, np, raw); err != nil {
			return out, fmt.Errorf("redacting a key at %s: %w", rn.path, err)
		}
	}
	out.Body = body
	if vault.Len() > 0 {
		out.Vault = vault
	}
	out.Replaced = vault.Replaced()
	return out, nil
}

// lastSegment returns the byte offset where the last segment of an sjson
// path starts (after an unescaped '.'), 0 for a one-segment path.
func lastSegment(path string) int {
	for i := len(path) - 1; i > 0; i-- {
		if path[i] == '.' {
			n := 0
			for j := i - 1; j >= 0 && path[j] == '\\'; j-- {
				n++
			}
			if n%2 == 0 {
				return i + 1
			}
		}
	}
	return 0
}

// participantName makes a redacted name fit OpenAI's pattern for
// participant and function names, ^[a-zA-Z0-9_-]+$ ("[EMAIL_1]" becomes
// "EMAIL_1", "[EMAIL#3f2a...]" becomes "EMAIL_3f2a..."), so that an upstream
// does not refuse the request for the placeholder's brackets.
func participantName(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '[' || r == ']':
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	if b.Len() == 0 {
		return "redacted"
	}
	return b.String()
}
