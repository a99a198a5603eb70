package classify

import (
	"encoding/base64"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// refField is a field as the reference walker records it.
type refField struct {
	path, text string
	kind       fieldKind
	mediaType  string
}

// refAnnotation is what the reference walker fills in.
type refAnnotation struct {
	body      string
	fields    []refField
	unscanned []Unscanned
	modal     []string
}

func (a *refAnnotation) addModality(m string) {
	if !slices.Contains(a.modal, m) {
		a.modal = append(a.modal, m)
	}
}

// refWalk walks body (a valid request) as Classify did.
func refWalk(body string) (*refAnnotation, *refWalker) {
	a := &refAnnotation{body: body, modal: []string{"text"}}
	w := &refWalker{a: a}
	w.walk(gjson.Parse(body), 0)
	return a, w
}

// refWalker is the walker as it was before the one-pass parser (a gjson
// walk, a path string per leaf, a gjson.Get per message for its role): the
// oracle of the differential tests. It visits every value of the body once, in document order.
type refWalker struct {
	a        *refAnnotation
	segs     []string // path segments; "#" stands for the index in matching
	idx      []bool   // whether segs[i] is an array index
	lastUser string
	prompts  strings.Builder
	user     strings.Builder
}

func (w *refWalker) path() string {
	var b strings.Builder
	for i, s := range w.segs {
		if i > 0 {
			b.WriteByte('.')
		}
		if w.idx[i] {
			b.WriteString(s)
		} else {
			b.WriteString(escapePath(s))
		}
	}
	return b.String()
}

// at reports whether the current path matches pattern.
func (w *refWalker) at(pattern ...string) bool {
	if len(pattern) != len(w.segs) {
		return false
	}
	for i, p := range pattern {
		if p == "#" {
			if !w.idx[i] {
				return false
			}
		} else if w.idx[i] || p != w.segs[i] {
			return false
		}
	}
	return true
}

// enum reports whether s at the current path is one of the schema's enum
// values for it (and so is not content).
func (w *refWalker) enum(s string) bool {
	for _, p := range enumPaths {
		if w.at(p.path...) {
			return p.values == nil || p.values[s]
		}
	}
	return false
}

func (w *refWalker) push(seg string, index bool) {
	w.segs = append(w.segs, seg)
	w.idx = append(w.idx, index)
}

func (w *refWalker) pop() {
	w.segs = w.segs[:len(w.segs)-1]
	w.idx = w.idx[:len(w.idx)-1]
}

func (w *refWalker) add(text string, kind fieldKind) {
	w.a.fields = append(w.a.fields, refField{path: w.path(), text: text, kind: kind})
}

func (w *refWalker) walk(v gjson.Result, depth int) {
	switch {
	case v.IsObject():
		v.ForEach(func(k, e gjson.Result) bool {
			w.push(k.Str, false)
			if !schemaKeys[k.Str] {
				w.add(k.Str, kindKey)
			}
			w.walk(e, depth+1)
			w.pop()
			return true
		})
		if w.at("messages", "#") {
			w.endMessage(v)
		}
	case v.IsArray():
		i := 0
		v.ForEach(func(_, e gjson.Result) bool {
			w.push(strconv.Itoa(i), true)
			w.walk(e, depth+1)
			w.pop()
			i++
			return true
		})
	case v.Type == gjson.String:
		w.str(v.Str)
	case v.Type == gjson.Number:
		w.add(v.Raw, kindNumber)
	}
}

// endMessage notes the text of a user message for the estimator.
func (w *refWalker) endMessage(m gjson.Result) {
	if m.Get("role").Str != "user" {
		return
	}
	w.lastUser = w.user.String()
	w.user.Reset()
}

func (w *refWalker) str(s string) {
	if len(w.segs) == 0 {
		return
	}
	if w.at("messages", "#", "content", "#", "type") {
		// A part's type says what the target must accept, whatever the
		// part holds (a file part may name an uploaded file by id only).
		switch s {
		case "image_url":
			w.a.addModality("image")
		case "input_audio":
			w.a.addModality("audio")
		case "file":
			w.a.addModality("file")
		}
	}
	if w.enum(s) {
		return
	}
	if strings.HasPrefix(s, "data:") {
		w.dataURL(s)
		return
	}
	switch {
	case w.at("messages", "#", "content"), w.at("messages", "#", "content", "#", "text"), w.at("messages", "#", "content", "#", "refusal"):
		w.add(s, kindContent)
		if w.messageRole() == "user" {
			w.user.WriteString(s)
			w.user.WriteByte('\n')
		}
	case w.at("messages", "#", "name"), w.at("tools", "#", "function", "name"), w.at("functions", "#", "name"),
		w.at("messages", "#", "tool_calls", "#", "function", "name"), w.at("messages", "#", "function_call", "name"),
		w.at("tool_choice", "function", "name"):
		w.add(s, kindName)
	case w.at("messages", "#", "tool_calls", "#", "function", "arguments"), w.at("messages", "#", "function_call", "arguments"):
		w.add(s, kindArgs)
	case w.at("messages", "#", "content", "#", "input_audio", "data"):
		w.a.addModality("audio")
		w.a.unscanned = append(w.a.unscanned, Unscanned{Path: w.path(), Reason: "audio data"})
	case w.at("messages", "#", "content", "#", "file", "file_data"):
		w.a.addModality("file")
		w.a.unscanned = append(w.a.unscanned, Unscanned{Path: w.path(), Reason: "file data"})
	case w.at("prompt"), w.at("prompt", "#"), w.at("input"), w.at("input", "#"):
		w.add(s, kindPrompt)
		w.prompts.WriteString(s)
		w.prompts.WriteByte('\n')
	default:
		if w.at("messages", "#", "content", "#", "image_url", "url") {
			w.a.addModality("image")
		}
		w.add(s, kindText)
	}
}

// messageRole returns the role of the message the refWalker is inside.
func (w *refWalker) messageRole() string {
	return gjson.Get(w.a.body, "messages."+w.segs[1]+".role").Str
}

// dataURL handles an RFC 2397 data: URL: a text media type is decoded and
// scanned (its redaction is re-encoded as a base64 data URL of the same
// type); a binary one (an image, audio, a PDF) is listed in Unscanned.
func (w *refWalker) dataURL(s string) {
	meta, payload, ok := strings.Cut(s[len("data:"):], ",")
	if w.at("messages", "#", "content", "#", "image_url", "url") {
		w.a.addModality("image")
	}
	params := strings.Split(meta, ";")
	mt := params[0]
	b64 := slices.Contains(params[1:], "base64")
	if !ok {
		w.add(s, kindText)
		return
	}
	if !textMediaType(mt) {
		w.a.unscanned = append(w.a.unscanned, Unscanned{Path: w.path(), Reason: "binary " + strings.ToLower(mt) + " data URL"})
		return
	}
	var text string
	if b64 {
		dec, err := base64.StdEncoding.DecodeString(payload)
		if err != nil {
			dec, err = base64.RawStdEncoding.DecodeString(payload)
		}
		if err != nil {
			w.a.unscanned = append(w.a.unscanned, Unscanned{Path: w.path(), Reason: "undecodable base64 data URL"})
			return
		}
		text = string(dec)
	} else {
		dec, err := url.PathUnescape(payload)
		if err != nil {
			w.a.unscanned = append(w.a.unscanned, Unscanned{Path: w.path(), Reason: "undecodable data URL"})
			return
		}
		text = dec
	}
	if mt == "" {
		mt = "text/plain"
	}
	w.a.fields = append(w.a.fields, refField{path: w.path(), text: text, kind: kindDataURL, mediaType: mt})
}
