package redaction

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/spf13/viper"
	glconfig "github.com/zricethezav/gitleaks/v8/config"
)

// secretRule is one compiled secret pattern. The finding covers capture
// group group (0 = whole match; -1 = first non-empty group, gitleaks'
// default when secretGroup is unset).
type secretRule struct {
	id         string
	subtype    string
	re         *regexp.Regexp
	group      int
	entropy    float64  // minimum Shannon entropy (bits/char) of the secret; 0 = none
	keywords   []string // lower case; the rule runs only if one occurs; empty = always
	allow      []*glconfig.Allowlist
	hand       bool           // hand-written rule: reject when glued to a longer token
	stripped   bool           // leading identPrefix removed; rebuild the match start
	leadB      bool           // leading \b removed (so the engine can use the literal prefix); checked by hand
	windowed   bool           // matches contain a keyword: scan only around keyword hits
	anchored   *regexp.Regexp // for semi-generic rules: re anchored with ^, tried at keyword hits
	assign     int            // > 0 for semi-generic rules: the window in which an assignment operator must follow a keyword hit
	start      *startFilter   // for rules whose matches start at a keyword: where a match may start (anchored is then set)
	generic    bool           // gitleaks' generic-api-key rule: the reach filter applies
	minSec     int            // least length of the secret group (semi-generic rules)
	width      int            // most bytes a match spans, -1 = unbounded (anchored rules)
	required   []string       // literals every match contains after its start
	lineTarget bool           // an allowlist of the rule looks at the whole line
	// window, for unbounded rules that have one, returns where a match
	// starting at p must end by (see pemWindowBlock), so the rule runs
	// on a bounded input.
	window func(text string, p int) int
	// privateKey: gitleaks' private-key rule, matched by hand
	// (matchPrivateKeyGitleaks).
	privateKey bool
	// grouped: the rule's keys are also read written in groups of four
	// (groupedAWSKeyAt, see grouped.go).
	grouped bool
	orig    string // the pattern before the speed-ups (for tests)
	// near: every match holds a keyword that starts at most reach bytes
	// after the match (keywordReach) and no assertion before its first
	// byte reads the byte before it, so the rule runs only where a match
	// can start, [hit-reach, hit] for each keyword hit: on the window
	// that also holds the longest match from there (span bytes, when
	// bounded), or anchored at each of those starts (tries, when
	// unbounded).
	near  bool
	reach int
	span  int
	tries *regexp.Regexp
	// inner, when set, is re for a window that starts past the start of
	// the text: re with its ^ made to match nothing (withoutBeginText).
	inner *regexp.Regexp
}

// semiGenericMiddle is the part gitleaks' GenerateSemiGenericRegex puts
// between the keyword and the secret: up to 20 identifier bytes, up to 3
// quotes or spaces, then an assignment operator. A hit with no operator
// byte within reach cannot start a match, so the regular expression is
// not tried there.
const semiGenericMiddle = `(?:[ \t\w.-]{0,20})[\s'"]{0,3}(?:=|>|:{1,3}=|\|\||:|=>|\?=|,)`

// identPrefix opens most gitleaks rules so that the reported match includes
// the identifier before the key word ("my_api_key = ..."). It makes every
// byte a candidate start and the regexp engine slow; Molly drops it and
// rebuilds the match start for allowlists that look at the match.
const identPrefix = `[\w.-]{0,50}?`

// stripIdentPrefix removes identPrefix from the start of a rule's source
// (also after "(?i)" and inside a leading "(?i:").
func stripIdentPrefix(src string) (string, bool) {
	flags := ""
	if strings.HasPrefix(src, "(?i)") {
		flags, src = "(?i)", src[4:]
	}
	stripped := false
	for {
		switch {
		case strings.HasPrefix(src, identPrefix):
			src, stripped = src[len(identPrefix):], true
			continue
		case strings.HasPrefix(src, "(?i:"+identPrefix):
			src, stripped = "(?i:"+src[4+len(identPrefix):], true
			continue
		}
		return flags + src, stripped
	}
}

// stripLeadB removes a leading \b (after optional "(?i)"): RE2 cannot use
// a literal prefix to skip ahead when the pattern starts with an assertion.
func stripLeadB(src string) (string, bool) {
	flags := ""
	if strings.HasPrefix(src, "(?i)") {
		flags, src = "(?i)", src[4:]
	}
	if strings.HasPrefix(src, `\b`) {
		return flags + src[2:], true
	}
	return flags + src, false
}

// windowable reports whether every match of a rule contains one of its
// keywords, so scanning ±1 KiB around keyword hits finds them all: the
// generic rule (its alternation is its keyword list), and rules whose
// pattern spells a keyword literally and cannot span lines.
func windowable(id, src string, kw []string) bool {
	if id == "generic-api-key" {
		return true
	}
	if strings.Contains(src, `\s\S`) || len(kw) == 0 {
		return false
	}
	l := strings.NewReplacer(`\.`, ".", `\-`, "-", `\_`, "_", `\/`, "/", `\~`, "~").Replace(strings.ToLower(src))
	for _, k := range kw {
		if !strings.Contains(l, k) {
			return false
		}
	}
	return true
}

// identStart returns where the identPrefix would have started a match that
// now starts at i: up to 50 bytes of [\w.-] before it.
func identStart(text string, i int) int {
	j := i
	for j > 0 && i-j < 50 {
		c := text[j-1]
		if !(isAlnum(c) || c == '_' || c == '.' || c == '-') {
			break
		}
		j--
	}
	return j
}

// secretDetector finds credentials with two rule sets:
//
//   - gitleaks' embedded default rule set (github.com/zricethezav/gitleaks/v8
//     config/gitleaks.toml, ~220 provider rules, JWTs, PEM private keys and
//     the generic "key-like name = high-entropy value" rule), applied the way
//     gitleaks' detector applies it: keyword prefilter, secret group, Shannon
//     entropy threshold, global and per-rule allowlists (regex and stopword
//     criteria; path and commit criteria never match a prompt). Two
//     changes: gitleaks' trailing boundary (quote, space, ';' or end) also
//     accepts prose punctuation (, . ! ? ) ] } >), because a key in a chat
//     message is usually followed by one; and Markdown emphasis by
//     underscores around a secret ("__…__", "_…_") is no part of it (see
//     unemphasise), nor, for the hand-written rules, glue to a word; and
//     the keyword rules also read an assignment without its Markdown
//     markers ('*', '~': "**api_key**: …", "token: **…**"; see detect).
//   - a few hand-written patterns for the providers the gateway cares most
//     about (OpenAI, Anthropic, AWS, GitHub, Slack, Stripe, Google, JWT, PEM
//     private keys, also truncated, passwords (assignments, prose, HTML
//     form fields; in a query string up to the next parameter), HTTP
//     bearer tokens and Basic
//     credentials), which accept key shapes gitleaks' stricter
//     rules miss (e.g. OpenAI project keys without the T3BlbkFJ marker).
//
// Subtype names the kind: "openai", "anthropic", "aws_access_key",
// "aws_secret_key", "github", "slack", "stripe", "google", "jwt",
// "private_key", "password", "bearer", "generic" (gitleaks' generic-api-key), or the gitleaks rule
// id with '-' replaced by '_' for every other provider.
type secretDetector struct {
	rules  []secretRule
	global []*glconfig.Allowlist
}

var handSecretRules = []struct {
	subtype, re string
	group       int
	entropy     float64
	keywords    []string
}{
	{"openai", `\bsk-(?:proj|svcacct|admin)-[A-Za-z0-9_-]{20,}`, 0, 3, []string{"sk-"}},
	{"openai", `\bsk-[A-Za-z0-9]{32,}`, 0, 3.5, []string{"sk-"}},
	{"anthropic", `\bsk-ant-(?:api|admin|oat|ort)\d\d-[A-Za-z0-9_-]{20,}`, 0, 3, []string{"sk-ant-"}},
	{"aws_access_key", `\b(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16}`, 0, 0, []string{"akia", "asia", "abia", "acca", "a3t"}},
	{"aws_secret_key", `(?i)aws.{0,20}secret.{0,20}?['"=:\s]\s*([A-Za-z0-9/+]{40})`, 1, 3.5, []string{"aws"}},
	{"github", `\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{36,}`, 0, 0, []string{"ghp_", "gho_", "ghu_", "ghs_", "ghr_"}},
	{"github", `\bgithub_pat_[A-Za-z0-9_]{22,255}`, 0, 0, []string{"github_pat_"}},
	{"slack", `\bxox[abposre]-[A-Za-z0-9-]{10,}`, 0, 0, []string{"xox"}},
	{"slack", `\bxapp-\d-[A-Za-z0-9-]{10,}`, 0, 0, []string{"xapp-"}},
	{"stripe", `\b(?:sk|rk)_(?:live|test|prod)_[A-Za-z0-9]{10,99}`, 0, 0, []string{"sk_", "rk_"}},
	{"stripe", `\bwhsec_[A-Za-z0-9]{24,}`, 0, 0, []string{"whsec_"}},
	{"google", `\bAIza[0-9A-Za-z_-]{35}`, 0, 0, []string{"aiza"}},
	{"jwt", `\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}`, 0, 0, []string{"eyj"}},
	{"private_key", `-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----[\s\S]*?-----END[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----`, 0, 0, []string{"-----begin"}},
	// A password written as an assignment or in prose ("db_password:
	// Xk9#mQ2vLp7z", `password = "Hunt3r2!xyz9Q"`, "my password is …",
	// "Passwort: …", "la mia password è …", "contraseña: …"): a keyword
	// (password, passwd, passphrase, pwd, passwort, secret, contraseña;
	// the prefilter keys on the ASCII "contrase"), an operator or a
	// copula, then 6 to 128 printable bytes without quotes, brackets, '$'
	// or ',' ';', not ending in sentence punctuation; passwordValue then
	// tells a password from code and prose.
	{"password", `(?i)(?:(?:password|passwd|passphrase|passwort|contraseña|pwd)[a-z_]{0,20}|secret)(?:[ \t]*["']?[ \t]*(?::=|=>|=|:)|[ \t]+(?:is|was|ist|è|es|est)(?::|[ \t]))[ \t]*["'\x60]?([^\s"'\x60<>(){}\[\]$,;]{5,127}[^\s"'\x60<>(){}\[\]$,;.!?:])`, 1, 2.5, []string{"password", "passwd", "passphrase", "passwort", "contrase", "pwd", "secret"}},
	// A password in an HTML form field whose type, name or id says so,
	// before or after its value: <input type="password" value="…">.
	{"password", `(?i)<input\b[^>]{0,200}?\b(?:type|name|id)[ \t]*=[ \t]*["']?(?:password|passwd|pwd)[\w-]{0,20}[^>]{0,200}?\bvalue[ \t]*=[ \t]*["']([^\s"'<>]{5,127}[^\s"'<>.!?:,;])["']`, 1, 2.5, []string{"<input"}},
	{"password", `(?i)<input\b[^>]{0,200}?\bvalue[ \t]*=[ \t]*["']([^\s"'<>]{5,127}[^\s"'<>.!?:,;])["'][^>]{0,200}?\b(?:type|name|id)[ \t]*=[ \t]*["']?(?:password|passwd|pwd)`, 1, 2.5, []string{"<input"}},
	// An HTTP bearer token (RFC 6750 §2.1: "Authorization: Bearer
	// <b64token>", also pasted without the header name) and Basic
	// credentials in an Authorization header (RFC 7617): gitleaks only
	// finds them in curl commands. bearerValue then asks for a digit or
	// mixed case, so that prose ("bearer instruments") is left alone.
	{"bearer", `(?i)\bbearer[ \t]+([A-Za-z0-9._~+/-]{16,512}={0,2})`, 1, 3, []string{"bearer"}},
	{"bearer", `(?i)\bauthorization[ \t]*[:=][ \t]*["']?[ \t]*basic[ \t]+([A-Za-z0-9+/]{8,512}={0,2})`, 1, 2.5, []string{"authorization"}},
	// A pasted key cut short: BEGIN line then base64 lines.
	{"private_key", `-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----(?:\s*[A-Za-z0-9+/=]{16,})+`, 0, 0, []string{"-----begin"}},
}

var (
	secretOnce  sync.Once
	secretRules *secretDetector
	secretErr   error
)

// newSecretDetector compiles the rule sets once per process (~220 regular
// expressions) and shares them: the detector is read-only afterwards.
func newSecretDetector() (*secretDetector, error) {
	secretOnce.Do(func() { secretRules, secretErr = buildSecretDetector() })
	return secretRules, secretErr
}

// gitleaksTail is gitleaks' trailing boundary; proseTail widens it.
const (
	gitleaksTail = `(?:[\x60'"\s;]|\\[nr]|$)`
	proseTail    = `(?:[\x60'"\s;,.!?)\]}>]|\\[nr]|$)`
)

func buildSecretDetector() (*secretDetector, error) {
	d := &secretDetector{}
	for _, h := range handSecretRules {
		src, leadB := stripLeadB(h.re)
		d.rules = append(d.rules, secretRule{
			id: "molly-" + h.subtype, subtype: h.subtype, re: regexp.MustCompile(src),
			group: h.group, entropy: h.entropy, keywords: h.keywords, hand: true, leadB: leadB, orig: h.re,
			grouped: h.subtype == "aws_access_key",
		})
		d.anchorAtStart(&d.rules[len(d.rules)-1], src)
	}
	v := viper.New()
	v.SetConfigType("toml")
	if err := v.ReadConfig(strings.NewReader(glconfig.DefaultConfig)); err != nil {
		return nil, fmt.Errorf("redaction: reading gitleaks default rules: %w", err)
	}
	var vc glconfig.ViperConfig
	if err := v.Unmarshal(&vc); err != nil {
		return nil, fmt.Errorf("redaction: decoding gitleaks default rules: %w", err)
	}
	cfg, err := vc.Translate()
	if err != nil {
		return nil, fmt.Errorf("redaction: translating gitleaks default rules: %w", err)
	}
	d.global = cfg.Allowlists
	for _, id := range cfg.OrderedRules {
		r := cfg.Rules[id]
		if r.Regex == nil || len(r.RequiredRules) > 0 || r.SkipReport {
			continue // path-only, composite, or helper rules need file context
		}
		orig := strings.ReplaceAll(r.Regex.String(), gitleaksTail, proseTail)
		src, stripped := stripIdentPrefix(orig)
		src, leadB := stripLeadB(src)
		re, err := regexp.Compile(src)
		if err != nil {
			return nil, fmt.Errorf("redaction: gitleaks rule %s: %w", id, err)
		}
		group := r.SecretGroup
		if group == 0 {
			group = -1
		}
		kw := make([]string, len(r.Keywords))
		for i, k := range r.Keywords {
			kw[i] = strings.ToLower(k)
		}
		lineTarget := false
		for _, a := range r.Allowlists {
			lineTarget = lineTarget || a != nil && a.RegexTarget == "line"
		}
		for _, a := range cfg.Allowlists {
			lineTarget = lineTarget || a != nil && a.RegexTarget == "line"
		}
		d.rules = append(d.rules, secretRule{
			id: id, subtype: gitleaksSubtype(id), re: re, group: group, lineTarget: lineTarget,
			entropy: r.Entropy, keywords: kw, allow: r.Allowlists, stripped: stripped, leadB: leadB,
			windowed: windowable(id, src, kw), orig: orig,
		})
		if _, starts := newStartFilter(src, kw); stripped && (windowable(id, src, kw) || starts) {
			// gitleaks generates these rules (GenerateSemiGenericRegex) from
			// their keyword list: once the identifier prefix is gone, every
			// match starts with a keyword ("linked[_-]?in" with keywords
			// linkedin, linked_in, linked-in).
			d.rules[len(d.rules)-1].anchored = regexp.MustCompile(`^(?:` + src + `)`)
			if strings.Contains(src, semiGenericMiddle) {
				longest := 0
				for _, k := range kw {
					longest = max(longest, len(k))
				}
				// The keyword alternatives of these rules are at most a few
				// bytes longer than their keywords ("passw(?:or)?d").
				d.rules[len(d.rules)-1].assign = longest + 4 + 20 + 3 + 1
				// The group gitleaks reports: SecretGroup, else the first.
				d.rules[len(d.rules)-1].minSec = minGroupWidth(src, max(group, 1))
				// A secret of n bytes has at most log2(n) bits of entropy
				// per byte, so one that must exceed the rule's threshold
				// is longer than 2^threshold bytes.
				if e := r.Entropy; e > 0 {
					d.rules[len(d.rules)-1].minSec = max(d.rules[len(d.rules)-1].minSec, int(math.Pow(2, e))+1)
				}
			}
			d.rules[len(d.rules)-1].generic = id == "generic-api-key"
		} else {
			d.anchorAtStart(&d.rules[len(d.rules)-1], src)
		}
		d.nearKeywords(&d.rules[len(d.rules)-1], src)
	}
	return d, nil
}

// genericAfter bounds the bytes of a generic-api-key match after its
// operator's start, on ASCII text: the operator (4), quotes (5), the
// secret's first alternative (150) and the tail (2). A longer match (its
// secret's second, unbounded alternative, or non-ASCII letters that fold
// to its classes) reaches the cut there, ending at it by its tail's $,
// and is read again without the cut; every match holds its secret's first
// ten bytes well inside.
const genericAfter = 4 + 5 + 150 + 2

// maxTries is the most starts before a keyword hit at which a rule of
// unbounded span is tried anchored (see secretRule.near).
const maxTries = 8

// nearKeywords sets r.near when r is neither anchored at its hits nor run
// over the whole text for another reason and its matches hold a keyword
// near their start (see secretRule.near).
func (d *secretDetector) nearKeywords(r *secretRule, src string) {
	if r.anchored != nil || r.grouped || r.privateKey || len(r.keywords) == 0 {
		return
	}
	reach, ok := keywordReach(src, r.keywords)
	if !ok || leftContext(src) {
		return
	}
	span := ruleWidth(src)
	inner := withoutBeginText(src)
	switch {
	case span >= 0:
		r.near, r.reach, r.span = true, reach, span
		if inner != "" {
			r.inner = regexp.MustCompile(inner)
		}
	case reach <= maxTries && inner == "":
		r.near, r.reach, r.span, r.tries = true, reach, -1, anchoredRe(src)
	}
}

// anchorAtStart makes r tried anchored at its keyword hits when every
// match of src starts with one of its keywords (see newStartFilter).
func (d *secretDetector) anchorAtStart(r *secretRule, src string) {
	if r.stripped {
		return // the rebuilt match start needs the unanchored rule
	}
	if f, ok := newStartFilter(src, r.keywords); ok {
		r.start, r.anchored, r.windowed = f, anchoredRe(src), true
		r.width, r.required = ruleWidth(src), requiredLiterals(src)
	}
	switch {
	case r.start == nil || r.width >= 0:
	case r.id == "private-key" && r.orig == privateKeyGitleaks:
		r.privateKey = true
	case r.hand && r.subtype == "private_key" && strings.Contains(src, "-----END"):
		r.window = pemWindowBlock
	case r.hand && r.subtype == "private_key":
		r.window = pemWindowCut
	}
}

func gitleaksSubtype(id string) string {
	switch {
	case strings.HasPrefix(id, "openai"):
		return "openai"
	case strings.HasPrefix(id, "anthropic"):
		return "anthropic"
	case id == "aws-access-token":
		return "aws_access_key"
	case strings.HasPrefix(id, "github"):
		return "github"
	case strings.HasPrefix(id, "slack"):
		return "slack"
	case strings.HasPrefix(id, "stripe"):
		return "stripe"
	case id == "gcp-api-key":
		return "google"
	case strings.HasPrefix(id, "jwt"):
		return "jwt"
	case id == "private-key":
		return "private_key"
	case id == "generic-api-key":
		return "generic"
	}
	return strings.ReplaceAll(id, "-", "_")
}

// detect runs every rule one of whose keywords occurs in text (hits[r]
// lists the offsets of rule r's keyword hits, sorted) and appends one
// finding per secret, covering the rule's secret group.
func (d *secretDetector) detect(text string, hits [][]int32, dst []Finding, b *budget) []Finding {
	memo := allowMemo{}
	// The keyword rules of gitleaks' template (assign > 0) also read the
	// text as Markdown renders it: emphasis and strike-through markers
	// ('*', '~') are no part of an assignment ("**api_key**: …",
	// "token: **…**", "- **Token:** `…`"). They run again at the hits
	// with a marker in reach, on unmarked: the text with its markers
	// blanked, as long as the text, so that its offsets are the text's.
	var unmarked string
	var markers, marked []int32 // markdownMarkers(text) once markersFound; the hits near one
	markersFound := false
	for i := range d.rules {
		hs := hits[i]
		if len(hs) == 0 {
			continue
		}
		r := &d.rules[i]
		if !b.spend(len(hs)) {
			return dst
		}
		if r.grouped {
			// Grouped keys are all as long: of overlapping ones, resolve
			// keeps the first, so a hit inside the last is not read.
			end := -1
			for _, h := range hs {
				if int(h) < end {
					continue
				}
				if e := groupedAWSKeyAt(text, int(h)); e > 0 {
					dst = append(dst, Finding{Type: TypeSecret, Subtype: r.subtype, Start: int(h), End: e})
					end = e
				}
			}
		}
		if r.near {
			dst = d.detectNear(r, text, hs, dst, b, memo)
			continue
		}
		if !r.windowed {
			if !b.spend(len(text) / 256) {
				return dst
			}
			dst = d.detectIn(r, text, 0, len(text), dst, memo)
			continue
		}
		// Anchored tries at the hits, behind the rule's cheap necessary
		// conditions; each costs at most ~400 bytes of regexp work.
		if r.anchored != nil {
			dst = d.detectAt(r, text, hs, dst, b, memo)
			if r.assign > 0 {
				if !markersFound {
					markers, markersFound = markdownMarkers(text), true
				}
				if hm := markedHits(hs, markers, r.assign+genericAfter, &marked); len(hm) > 0 {
					if unmarked == "" {
						var bp *[]byte
						unmarked, bp = blankMarkers(text, markers)
						defer unmarkedBufs.Put(bp)
					}
					dst = d.detectAt(r, unmarked, hm, dst, b, memo)
				}
			}
			continue
		}
		ws := windows(text, hs)
		for _, w := range ws {
			if !b.spend((w[1] - w[0]) / 64) {
				return dst
			}
			dst = d.detectIn(r, text, w[0], w[1], dst, memo)
		}
	}
	return dst
}

// markedHits returns the hits of hs (increasing) with one of markers
// (increasing offsets) in the n bytes from them, in buf's array.
func markedHits(hs, markers []int32, n int, buf *[]int32) []int32 {
	out := (*buf)[:0]
	j := 0
	for _, h := range hs {
		for j < len(markers) && markers[j] < h {
			j++
		}
		if j == len(markers) {
			break
		}
		if int(markers[j]) < int(h)+n {
			out = append(out, h)
		}
	}
	*buf = out
	return out
}

// markdownMarkers returns the offsets of the '*' and '~' of text,
// increasing (nil: none), found by the vectorised byte search.
func markdownMarkers(text string) []int32 {
	var out []int32
	for _, c := range [...]byte{'*', '~'} {
		for i := 0; ; {
			k := strings.IndexByte(text[i:], c)
			if k < 0 {
				break
			}
			out = append(out, int32(i+k))
			i += k + 1
		}
	}
	slices.Sort(out)
	return out
}

// blankMarkers returns text with the bytes at markers (its '*' and '~')
// replaced by spaces, in a buffer of unmarkedBufs (one copy, then a store
// per marker), and the buffer, which the caller puts back once nothing
// holds the string (detect's findings hold offsets only).
func blankMarkers(text string, markers []int32) (string, *[]byte) {
	bp := unmarkedBufs.Get().(*[]byte)
	b := append((*bp)[:0], text...)
	for _, m := range markers {
		b[m] = ' '
	}
	*bp = b
	return unsafe.String(unsafe.SliceData(b), len(b)), bp
}

// unmarkedBufs are blankMarkers' buffers, reused: a fresh copy of a long
// prompt per scan cost more than the rules' second run (page faults).
var unmarkedBufs = sync.Pool{New: func() any { return new([]byte) }}

// PEM windows. The private-key rules are unbounded; each match still ends
// at a landmark a literal search finds, so the rule runs on text[p:window]
// with the result it has on text[p:]. The header "-----BEGIN[ A-Z0-9_-]{0,100}
// PRIVATE KEY( BLOCK)?-----" ends at most pemHeaderMax bytes after p.
//
//   - gitleaks' private-key is matched by hand (pemmatch.go).
//   - Molly's complete block: the lazy body ends at the first "-----END"
//     line that completes ("-----END", up to 100 of [ A-Z0-9_-], "PRIVATE
//     KEY", " BLOCK"?, "-----") after the longest header, within
//     pemHeaderMax bytes of its dashes (pemWindowBlock).
//   - Molly's cut block: each header that can end the "BEGIN" line (a
//     "PRIVATE KEY-----" or "PRIVATE KEY BLOCK-----" reached through at
//     most 100 header bytes) must be followed by white space and a run of
//     16 base64 bytes; the match cannot pass the first byte after it that
//     is neither white space nor base64. No such header: no match.
const pemHeaderMax = 10 + 100 + 11 + 6 + 5

func isPEMHeaderByte(c byte) bool { return pemHeaderByte[c] }

// pemHeaderByte holds the bytes of [ A-Z0-9_-], a PEM header's.
var pemHeaderByte = func() (t [256]bool) {
	for c := range t {
		b := byte(c)
		t[c] = isUpper(b) || isDigit(b) || b == ' ' || b == '_' || b == '-'
	}
	return t
}()

func pemWindowBlock(text string, p int) int {
	// The header's [ A-Z0-9_-]{0,100} is greedy: the match takes the
	// latest header end (hEnd) after which an END line completes, and its
	// lazy body the first such line. Without one after hEnd, a shorter
	// header's END line starts before hEnd (one inside the longest
	// header, "-----BEGIN-----END RSA PRIVATE KEY-----…") and ends within
	// pemHeaderMax bytes of its start.
	hEnd := pemHeaderEnd(text, p)
	if hEnd < 0 {
		return p // no header: no match
	}
	for k := hEnd; ; {
		i := strings.Index(text[k:], "-----END")
		if i < 0 {
			return min(len(text), hEnd+pemHeaderMax+1)
		}
		q := k + i + len("-----END")
		// Does this END line complete?
		j := q
		for j < len(text) && j-q <= 100+11 && isPEMHeaderByte(text[j]) {
			if strings.HasPrefix(text[j:], "PRIVATE KEY") {
				e := j + len("PRIVATE KEY")
				if strings.HasPrefix(text[e:], "-----") || strings.HasPrefix(text[e:], " BLOCK-----") {
					return min(len(text), q+pemHeaderMax+1)
				}
			}
			j++
		}
		k = q
	}
}

// pemHeaderEnd returns the end of the longest "-----BEGIN" header at p
// ("-----BEGIN", up to 100 of [ A-Z0-9_-], "PRIVATE KEY", " BLOCK"?,
// "-----"), or -1 when none ends there.
func pemHeaderEnd(text string, p int) int {
	end := -1
	for j := p + 10; j < len(text) && j-(p+10) <= 100; j++ {
		if text[j] == 'P' && strings.HasPrefix(text[j:], "PRIVATE KEY") {
			e := j + len("PRIVATE KEY")
			switch {
			case strings.HasPrefix(text[e:], " BLOCK-----"):
				end = e + len(" BLOCK-----")
			case strings.HasPrefix(text[e:], "-----"):
				end = e + len("-----")
			}
		}
		if !isPEMHeaderByte(text[j]) {
			break
		}
	}
	return end
}

func pemWindowCut(text string, p int) int {
	end := p
	for j := p + 10; j < len(text) && j-(p+10) <= 100; j++ {
		if text[j] == 'P' && strings.HasPrefix(text[j:], "PRIVATE KEY") {
			e := j + len("PRIVATE KEY")
			switch {
			case strings.HasPrefix(text[e:], "-----"):
				e += len("-----")
			case strings.HasPrefix(text[e:], " BLOCK-----"):
				e += len(" BLOCK-----")
			default:
				e = -1
			}
			if e >= 0 {
				if b := pemCutBody(text, e); b > e {
					end = max(end, b) // only a header with a body can end a match
				}
			}
		}
		if !isPEMHeaderByte(text[j]) {
			break
		}
	}
	return end
}

// pemCutBody returns, for a header ending at e, one past the first byte
// a cut block's body (white space, then 16 or more base64 bytes, repeated)
// cannot reach, or e when no body follows.
func pemCutBody(text string, e int) int {
	k := e
	for k < len(text) && isSpaceByte(text[k]) {
		k++
	}
	run := k
	for run < len(text) && isBase64Byte(text[run]) {
		run++
	}
	if run-k < 16 {
		return e
	}
	for run < len(text) && (isBase64Byte(text[run]) || isSpaceByte(text[run])) {
		run++
	}
	return min(len(text), run+1)
}

func isBase64Byte(c byte) bool { return isAlnum(c) || c == '+' || c == '/' || c == '=' }

// indexFold is strings.Index for a lower-case ASCII needle, ASCII
// case-insensitively.
func indexFold(s, needle string) int {
	for i := 0; i+len(needle) <= len(s); i++ {
		if lowerByte[s[i]] == needle[0] && hasPrefixFold(s, i, needle) {
			return i
		}
	}
	return -1
}

// lastIndexFold is strings.LastIndex for a lower-case ASCII needle,
// ASCII case-insensitively.
func lastIndexFold(s, needle string) int {
	for i := len(s) - len(needle); i >= 0; i-- {
		if lowerByte[s[i]] == needle[0] && hasPrefixFold(s, i, needle) {
			return i
		}
	}
	return -1
}

// secretRunAfter reports whether, after the operator byte at o (at most
// four bytes long, then up to five quotes, spaces or '='), a run of at
// least need bytes that are neither white space nor quotes starts: the
// shape of the rule's secret group, whose least width is need.
func secretRunAfter(text string, o, need int) bool {
	run := 0
	for k := o + 1; k < len(text) && k <= o+4+5+need; k++ {
		switch text[k] {
		case ' ', '\t', '\n', '\r', '\f', '\v', '\'', '"', '`':
			run = 0
		default:
			run++
			if run >= need {
				return true
			}
		}
	}
	return false
}

// runScan is secretRunAfter for the hits of one text and one need, which
// come in increasing order. A start is an offset s where the need bytes
// text[s:s+need] hold no break (white space or quote); runScan remembers
// that no start lies in [from, at) and, when found, that at is one, in
// the run of break-free bytes [at, end): a flood of one long run
// ("key=key=…") is read once, not once per hit.
type runScan struct {
	need, from, at, end int
	found, valid        bool
}

// runBreak holds the break bytes of runScan: white space and quotes.
var runBreak = func() (t [256]bool) {
	for _, c := range []byte(" \t\n\r\f\v'\"`") {
		t[c] = true
	}
	return t
}()

// runAfter is secretRunAfter(text, o, need): a run of need bytes without
// a break starts within the ten bytes after o.
func (rs *runScan) runAfter(text string, o, need int) bool {
	x, last := o+1, min(o+10, len(text)-1)
	if x > last {
		return false
	}
	s := x
	if rs.valid && rs.need == need && x >= rs.from {
		switch {
		case x <= rs.at && rs.found:
			return rs.at <= last
		case x <= rs.at:
			if rs.at > last {
				return false
			}
			s = rs.at // no start in [x, at): read on from at
		case rs.found && x+need <= rs.end:
			return true // x is inside the remembered run
		}
	}
	if s == x {
		rs.from = x
	}
	rs.need, rs.valid = need, true
	// Each window text[s:s+need] is read backwards: a break at b rules
	// out every start up to b at once (the skip of Boyer and Moore's
	// string search, R. S. Boyer, J. S. Moore, "A fast string searching
	// algorithm", CACM 20(10), 1977), so a flood of short runs is read a
	// byte or two per window.
	for s <= last {
		if s+need > len(text) {
			s = len(text) // no start fits
			break
		}
		b := s + need - 1
		for b >= s && !runBreak[text[b]] {
			b--
		}
		if b < s {
			// A start: its run goes on to the next break.
			e := s + need
			for e < len(text) && !runBreak[text[e]] {
				e++
			}
			rs.at, rs.end, rs.found = s, e, true
			return true
		}
		s = b + 1
	}
	rs.at, rs.found = s, false
	return false
}

// reachScan tracks, for hits in increasing order, the next byte where a
// generic-api-key match could end (its tail: a quote, space, ; , . ! ? )
// ] } > or a backslash) and the last byte before that which cannot be in
// its unbounded base64 alternative. Both only move forward, so checking
// every hit of a text costs at most one pass.
type reachScan struct {
	nextTail int // first tail byte at or after the last position asked
	scanned  int
	lastBad  int // last byte < badTo that is not [A-Za-z0-9+/], or a byte before badTo-160
	badTo    int
}

// newReachScan returns a reachScan that has read nothing: no tail found
// yet (a nextTail of 0 would read as a tail at offset 0, admitting a hit
// there whatever follows).
func newReachScan() reachScan { return reachScan{nextTail: -1} }

// genericTail and base64Body are byte classes of reachScan, as tables:
// a byte test in one load where a switch is a chain of branches.
var genericTail, base64Body = func() (tail, body [256]bool) {
	for _, c := range []byte("`'\" \t\n\r\f\v;,.!?)]}>\\") {
		tail[c] = true
	}
	for c := range 256 {
		body[c] = isAlnum(byte(c)) || c == '+' || c == '/'
	}
	return tail, body
}()

// admits reports whether a generic-api-key match may start at p: its
// secret of at most 150 bytes ([\w.=-]) must end at a tail byte within
// reach, or else its base64 alternative must run on past the reach.
// For one rule, assign is fixed and p increases, so the reach w only
// moves forward.
func (rs *reachScan) admits(text string, p, assign int) bool {
	if rs.scanned < p {
		rs.scanned = p
	}
	if rs.nextTail < p {
		k := max(rs.scanned, p)
		for k < len(text) && !genericTail[text[k]] {
			k++
		}
		rs.nextTail, rs.scanned = k, k
	}
	w := p + assign + 9 + 151
	if rs.nextTail <= w {
		return true // a tail, or the end of the text, within reach
	}
	// No tail within reach: only a base64 run spanning [w-160, w) can
	// still make a match. The last bad byte before w is sought backwards
	// from w, down to badTo or w-160, whichever is later: a bad byte
	// before w-160 decides nothing, now or for a later (larger) w, so
	// the bytes below it need not be read; in a flood of short
	// assignments (key=key=…) the search stops within a few bytes.
	if rs.lastBad >= w-160 {
		// Decided by a bad byte already seen; the bytes up to w, not yet
		// read, can only hold later ones.
		return false
	}
	if rs.badTo < w {
		for k, lo := w-1, max(rs.badTo, w-160); k >= lo; k-- {
			if !base64Body[text[k]] {
				rs.lastBad = k
				break
			}
		}
		rs.badTo = w
	}
	return rs.lastBad < w-160
}

// hitFilter returns a necessary condition for a keyword hit to matter to
// any of rules (by index), or nil when one of them has none: the start
// filter of a rule anchored at its own start, the assignment shape of a
// semi-generic one, or, for a rule whose keys are read grouped, a key
// written in groups from the hit (groupedAWSKeyAt).
func (d *secretDetector) hitFilter(rules []int32) func(string, int) bool {
	type cond struct {
		start          *startFilter
		assign, minSec int
	}
	var conds []cond
	grouped := false
	for _, ri := range rules {
		r := &d.rules[ri]
		grouped = grouped || r.grouped
		// Only start filters: they reject most hits of short keywords
		// ("ey", "sk") at once; an assignment shape is checked later.
		if r.start == nil {
			return nil
		}
		conds = append(conds, cond{start: r.start})
	}
	if len(conds) == 1 && !grouped {
		return conds[0].start.admits
	}
	return func(text string, p int) bool {
		if grouped && groupedAWSKeyAt(text, p) >= 0 {
			return true // a key written in groups (see grouped.go)
		}
		for _, c := range conds {
			if c.start != nil && c.start.admits(text, p) || c.assign > 0 && assignmentNear(text, p, c.assign, c.minSec, nil) {
				return true
			}
		}
		return false
	}
}

// thirdBytes returns the bytes that may follow the two-byte keyword kw at
// a hit hitFilter(rules) admits (see startFilter.addThirds), or nil when
// hitFilter sets no condition.
func (d *secretDetector) thirdBytes(rules []int32, kw string) *thirdBytes {
	var t thirdBytes
	for _, ri := range rules {
		r := &d.rules[ri]
		if r.start == nil {
			return nil
		}
		r.start.addThirds(kw, &t)
	}
	return &t
}

// assignmentNear reports whether an assignment operator byte follows the
// keyword hit at p within n bytes, with only identifier, space and quote
// bytes between: the shape every semi-generic match has. runs, when not
// nil, remembers the runs it read for later hits of the same text.
func assignmentNear(text string, p, n, minSec int, runs *runScan) bool {
	e := min(len(text), p+n)
	for k := p + 1; k < e; k++ {
		switch assignClass[text[k]] {
		case assignOp:
			if runs != nil {
				return runs.runAfter(text, k, minSec)
			}
			return secretRunAfter(text, k, minSec)
		case assignOther:
			return false
		}
	}
	return false
}

// Byte classes of assignmentNear: an assignment operator, a byte that may
// come between a keyword and its operator (identifier, space and quote
// bytes), anything else.
const (
	assignBetween = iota
	assignOp
	assignOther
)

var assignClass = func() (t [256]uint8) {
	for c := range t {
		switch b := byte(c); {
		case b == '=' || b == '>' || b == ':' || b == '|' || b == '?' || b == ',':
			t[c] = assignOp
		case isAlnum(b) || b == '_' || b == '.' || b == '-' || b == '\'' || b == '"' || isSpaceByte(b):
			t[c] = assignBetween
		default:
			t[c] = assignOther
		}
	}
	return t
}()

// windows returns the sorted, disjoint byte ranges to scan for a rule whose
// matches contain a keyword: [hit-256, hit+1024] around each keyword hit,
// widened to whitespace so that no token is cut, and merged. If some range
// cannot be widened within 256 bytes, the whole text is one range (so that
// widening stays linear on text without spaces).
func windows(text string, hits []int32) [][2]int {
	var out [][2]int
	for _, h := range hits {
		p := int(h)
		ws, we := max(0, p-256), min(len(text), p+1024)
		if n := len(out); n > 0 && ws <= out[n-1][1] {
			if we > out[n-1][1] {
				out[n-1][1] = we
			}
			continue
		}
		out = append(out, [2]int{ws, we})
	}
	merged := out[:0]
	for _, w := range out {
		ws, we := w[0], w[1]
		lo, hi := ws, we
		for ws > 0 && !isSpaceByte(text[ws-1]) && lo-ws < 256 {
			ws--
		}
		for we < len(text) && !isSpaceByte(text[we]) && we-hi < 256 {
			we++
		}
		if ws > 0 && !isSpaceByte(text[ws-1]) || we < len(text) && !isSpaceByte(text[we]) {
			return [][2]int{{0, len(text)}}
		}
		if n := len(merged); n > 0 && ws <= merged[n-1][1] {
			merged[n-1][1] = max(merged[n-1][1], we)
			continue
		}
		merged = append(merged, [2]int{ws, we})
	}
	return merged
}

// detectIn runs rule r over text[ws:we]: leftmost-first matches, each
// searched for after the one before; after a match of a hand-written rule
// that finding rejects, from the byte after that match's start.
func (d *secretDetector) detectIn(r *secretRule, text string, ws, we int, dst []Finding, memo allowMemo) []Finding {
	sub := text[ws:we]
	for pos := 0; pos <= len(sub); {
		m := r.re.FindStringSubmatchIndex(sub[pos:])
		if m == nil {
			break
		}
		for k := range m {
			if m[k] >= 0 {
				m[k] += pos + ws
			}
		}
		pos = max(m[1], m[0]+1) - ws
		if r.leadB && r.boundaryFails(text, m[0]) {
			pos = m[0] + 1 - ws // \b failed here; a match may start later
			continue
		}
		if f, ok := d.finding(r, text, m, memo); ok {
			dst = append(dst, f)
		} else if r.hand {
			// A hand-written rule's rejected match hides nothing: the
			// next match may start inside it (see detectAt). Hand rules
			// start at their keyword, so the search from the byte after
			// the rejected start finds the next keyword's match.
			pos = m[0] + 1 - ws
		}
	}
	return dst
}

// detectNear runs a near rule (see secretRule.near) where its matches can
// start, with the leftmost-first semantics of a scan of the whole text:
// every match starts in [h-reach, h] for a keyword hit h, so the hits
// are taken in groups whose ranges overlap the window of the group
// before, and each group's text[lo:last+span+1] is searched for matches
// that start by its last hit (the window holds the longest match from
// any such start, and one more byte for a trailing assertion; a match
// found starting later is left to the next group). A rule of unbounded
// span is tried anchored at each start of the ranges instead.
func (d *secretDetector) detectNear(r *secretRule, text string, hits []int32, dst []Finding, b *budget, memo allowMemo) []Finding {
	pos := 0 // where the scan goes on: the end of the last match
	for i := 0; i < len(hits); {
		lo := max(pos, int(hits[i])-r.reach)
		j := i
		for j+1 < len(hits) && (r.span < 0 && int(hits[j+1])-r.reach <= int(hits[j])+1 || r.span >= 0 && int(hits[j+1])-r.reach <= int(hits[j])+r.span+1) {
			j++
		}
		last := int(hits[j])
		i = j + 1
		if lo > last {
			continue
		}
		if r.span < 0 {
			// Unbounded: anchored at each start in turn.
			for s := lo; s <= last; s++ {
				if s < pos {
					continue
				}
				if !b.spend(8) {
					return dst
				}
				if r.leadB && r.boundaryFails(text, s) {
					continue
				}
				m := r.tries.FindStringSubmatchIndex(text[s:])
				if m == nil {
					continue
				}
				for k := range m {
					if m[k] >= 0 {
						m[k] += s
					}
				}
				pos = max(m[1], m[0]+1)
				s = pos - 1
				if f, ok := d.finding(r, text, m, memo); ok {
					dst = append(dst, f)
				}
			}
			continue
		}
		we := min(len(text), last+r.span+1)
		if !b.spend((we - lo) / 64) {
			return dst
		}
		for lo <= last {
			re := r.re
			if lo > 0 && r.inner != nil {
				re = r.inner
			}
			m := re.FindStringSubmatchIndex(text[lo:we])
			if m == nil {
				break
			}
			for k := range m {
				if m[k] >= 0 {
					m[k] += lo
				}
			}
			if m[0] > last {
				break
			}
			if r.leadB && r.boundaryFails(text, m[0]) {
				lo = m[0] + 1 // \b failed here; a match may start later
				pos = lo
				continue
			}
			pos = max(m[1], m[0]+1)
			lo = pos
			if f, ok := d.finding(r, text, m, memo); ok {
				dst = append(dst, f)
			}
		}
	}
	return dst
}

// detectAt tries r.anchored at each keyword hit, left to right, skipping
// hits inside the previous match kept (the leftmost-first semantics of a
// scan, less the matches finding rejects).
func (d *secretDetector) detectAt(r *secretRule, text string, hits []int32, dst []Finding, b *budget, memo allowMemo) []Finding {
	last := -1
	reach := newReachScan()
	var runs runScan
	// The last occurrence of each literal the rule needs: a hit after it
	// cannot start a match.
	limit := len(text)
	for _, l := range r.required {
		if l[0] == 0 {
			limit = min(limit, lastIndexFold(text, l[1:]))
		} else if strings.Index(text, l) < 0 { // forward search is vectorised; a miss costs little
			limit = -1
		} else {
			limit = min(limit, strings.LastIndex(text, l))
		}
	}
	landmark := -1
	if r.privateKey {
		if landmark = lastPrivateKeyLandmark(text); landmark < 0 {
			return dst // no match can end anywhere
		}
	}
	for _, h := range hits {
		p := int(h)
		if p < last {
			continue
		}
		if r.start != nil && !r.start.admits(text, p) {
			continue
		}
		if r.leadB && r.boundaryFails(text, p) {
			continue
		}
		// The reach check before the assignment's: in prose both reject
		// at once, in a flood of one keyword's assignments (key=key=…)
		// only the reach does.
		if r.generic && !reach.admits(text, p, r.assign) {
			continue
		}
		if r.assign > 0 && !assignmentNear(text, p, r.assign, r.minSec, &runs) {
			continue
		}
		if !b.spend(8) {
			return dst
		}
		var m []int
		if r.start != nil {
			// Rules anchored at their own start: a bounded rule is tried
			// on as many bytes as a match can span (plus one, for a
			// trailing assertion), an unbounded one on the rest of the
			// text once the literals it needs are known to follow.
			if p >= limit {
				continue
			}
			e := len(text)
			if r.width >= 0 {
				e = min(len(text), p+r.width+1)
				m = r.anchored.FindStringSubmatchIndex(text[p:e])
			} else if r.privateKey {
				if end := matchPrivateKeyGitleaks(text, p, landmark); end >= 0 {
					m = []int{0, end - p}
				}
			} else if r.window != nil {
				we := min(len(text), r.window(text, p))
				if we <= p {
					continue // no match can end anywhere (an empty one is no finding)
				}
				m = r.anchored.FindStringSubmatchIndex(text[p:we])
			} else {
				// Unbounded: try the next 512 bytes, then 2 KiB (Go's
				// backtracker runs there, the NFA on longer inputs; its
				// cost grows with the input, matched or not); a match
				// ending well inside a window is the match, anything
				// else is decided on the rest of the text.
				m = nil
				for _, size := range [...]int{512, 2048, len(text)} {
					w := min(len(text), p+size)
					if m = r.anchored.FindStringSubmatchIndex(text[p:w]); w == len(text) || m != nil && m[1] <= w-p-256 {
						break
					}
				}
			}
		} else {
			// Every semi-generic match is shorter than 300 bytes (bounded
			// quantifiers; unbounded ones end at the cut). A match that
			// ends at the cut may have used the cut as its end ($): retry
			// without the cut.
			e := min(len(text), p+400)
			if r.generic {
				// generic-api-key: its operator starts at the first
				// operator byte, within assign bytes (assignmentNear: its
				// middle and quote classes hold none), and what follows
				// is bounded (genericAfter); the backtracker's cost grows
				// with its input, so it gets no more.
				e = min(e, p+r.assign+genericAfter)
			}
			m = r.anchored.FindStringSubmatchIndex(text[p:e])
			if m != nil && m[1] == e-p && e < len(text) {
				m = r.anchored.FindStringSubmatchIndex(text[p:])
			}
		}
		if m == nil {
			continue
		}
		for k := range m {
			if m[k] >= 0 {
				m[k] += p
			}
		}
		// Only a match the rule keeps hides the hits inside it: a rejected
		// one ("secret: password" of "secret: password: Xk9#mQ2vLp7z",
		// whose value is a word) must not hide the match that starts at a
		// later hit inside it, or whether that match is found would depend
		// on where the scan began (what consumed the first hit), and a
		// stream guard, which scans a window behind its cut, would read
		// it otherwise than the whole answer.
		if f, ok := d.finding(r, text, m, memo); ok {
			dst = append(dst, f)
			last = m[1]
		}
	}
	return dst
}

// allowMemo remembers allowlist decisions within one scan: a text that
// repeats a secret (or a flood of one) pays for the allowlist regular
// expressions once per distinct (rule, secret, match).
type allowMemo map[allowKey]bool

type allowKey struct {
	rule          *secretRule
	secret, match string
}

func (d *secretDetector) allowedCached(r *secretRule, secret, match, text string, at int, memo allowMemo) bool {
	if memo == nil || r.lineTarget {
		return allowed(d.global, secret, match, text, at) || allowed(r.allow, secret, match, text, at)
	}
	k := allowKey{r, secret, match}
	if v, ok := memo[k]; ok {
		return v
	}
	v := allowed(d.global, secret, match, text, at) || allowed(r.allow, secret, match, text, at)
	memo[k] = v
	return v
}

// finding applies the secret group, entropy and allowlists to match m.
func (d *secretDetector) finding(r *secretRule, text string, m []int, memo allowMemo) (Finding, bool) {
	s, e := m[0], m[1]
	switch {
	case r.group > 0 && 2*r.group+1 < len(m):
		s, e = m[2*r.group], m[2*r.group+1]
	case r.group < 0:
		for g := 1; 2*g+1 < len(m); g++ {
			if m[2*g] >= 0 && m[2*g+1] > m[2*g] {
				s, e = m[2*g], m[2*g+1]
				break
			}
		}
	}
	if s < 0 || e <= s {
		return Finding{}, false
	}
	// gitleaks trims newlines from the match.
	for e > s && (text[e-1] == '\n' || text[e-1] == '\r') {
		e--
	}
	// Markdown emphasis by underscores around the secret ("__ghp_…__",
	// "_AKIA…_") is no part of it, and glues it to nothing: lead and tail
	// are then the emphasis' bounds.
	lead, tail := s, e
	if vs, ve, o, c, ok := unemphasise(text, s, e); ok {
		s, e, lead, tail = vs, ve, o, c
	}
	secret := text[s:e]
	if r.hand {
		if wordByte(before(text, lead)) && lead == m[0] {
			return Finding{}, false
		}
		if c := at(text, tail); isAlnum(c) || c == '_' || c == '-' {
			return Finding{}, false
		}
	}
	if r.entropy > 0 && shannon(secret) <= r.entropy {
		return Finding{}, false
	}
	if r.hand && r.subtype == "password" {
		// In a query string or form body ("user=mario&password=Xk9#mQ&x=1")
		// the value ends before the next parameter.
		if k := nextParam(secret); k >= 0 {
			if k < 6 {
				return Finding{}, false // shorter than the rule's value
			}
			e = s + k
			secret = text[s:e]
		}
		if !passwordValue(secret) {
			return Finding{}, false
		}
	}
	if r.hand && r.subtype == "bearer" && !bearerValue(secret) {
		return Finding{}, false
	}
	ms := m[0]
	if r.stripped {
		ms = identStart(text, ms)
	}
	match := text[ms:m[1]]
	if !r.hand && d.allowedCached(r, secret, match, text, m[0], memo) {
		return Finding{}, false
	}
	return Finding{Type: TypeSecret, Subtype: r.subtype, Start: s, End: e}, true
}

// nextParam returns the offset in v of the first '&' that starts another
// parameter of a query string or form body (an '&', a name of letters,
// digits, '_', '.', '-', '[' or ']', then '='), or -1. An '&' not followed
// by one ("Tr0ub4dor&3x") is part of the password.
func nextParam(v string) int {
	for i := strings.IndexByte(v, '&'); i >= 0; {
		j := i + 1
		for j < len(v) && (isAlnum(v[j]) || strings.IndexByte("_.-[]", v[j]) >= 0) {
			j++
		}
		if j > i+1 && j < len(v) && v[j] == '=' {
			return i
		}
		k := strings.IndexByte(v[i+1:], '&')
		if k < 0 {
			break
		}
		i += 1 + k
	}
	return -1
}

// bearerValue reports whether the token after "Bearer" looks like a
// credential rather than a word: it holds a digit, or upper- and
// lower-case letters past its first byte.
func bearerValue(s string) bool {
	var digit, upper, lower bool
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
			digit = true
		case i > 0 && c >= 'A' && c <= 'Z':
			upper = true
		case i > 0 && c >= 'a' && c <= 'z':
			lower = true
		}
	}
	return digit || upper && lower
}

// passwordValue reports whether the value of a password assignment looks
// like a password rather than code or prose. It accepts a letter with a
// digit, a letter with a symbol other than '.', '_' and '-', or 16 or more
// letters alone ("correcthorsebatterystaple"); it rejects dotted
// identifier paths (req.body.password2), file paths, URLs, masks
// ("****", "xxxx"), template variables and words about password handling
// ("sha256hashed", "base64encoded", "bcrypt").
func passwordValue(s string) bool {
	var letter, digit, symbol bool
	letters := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80:
			letter = true
			letters++
		case c >= '0' && c <= '9':
			digit = true
		case c != '.' && c != '_' && c != '-':
			symbol = true
		}
	}
	if !(letter && (digit || symbol) || letters == len(s) && letters >= 16) {
		return false
	}
	l := strings.ToLower(s)
	for _, p := range []string{"/", "./", "~/"} {
		if strings.HasPrefix(l, p) {
			return false
		}
	}
	if strings.Contains(l, "://") || strings.Contains(l, "****") || strings.Contains(l, "xxxx") ||
		strings.Contains(l, "{{") || strings.HasPrefix(l, "%(") || identPath.MatchString(s) {
		return false
	}
	if !symbol && handlingWord.MatchString(l) {
		return false
	}
	return true
}

var (
	// identPath is a dotted identifier path: member access in code.
	identPath = regexp.MustCompile(`^[A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)+$`)
	// handlingWord names a way of storing a password, not a password.
	handlingWord = regexp.MustCompile(`hash|encod|encrypt|base64|sha\d|md5|bcrypt|argon|scrypt|pbkdf`)
)

func isSpaceByte(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

// boundaryFails reports whether the \b that starts r's pattern (leadB)
// fails at p. A hand-written rule also starts after Markdown emphasis by
// underscores ("_AKIA…_", "__sk_live_…__": see emphasisOpens); finding
// then turns the match down unless a run as long closes the emphasis
// (see unemphasise).
func (r *secretRule) boundaryFails(text string, p int) bool {
	return wordASCII(before(text, p)) == wordASCII(at(text, p)) && !(r.hand && emphasisOpens(text, p))
}

// wordASCII is RE2's \b word class.
func wordASCII(c byte) bool { return isAlnum(c) || c == '_' }

// allowed evaluates gitleaks allowlists the way gitleaks' detector does,
// with only the criteria that apply to text without a file: regexes (on the
// secret, the match or the line, per RegexTarget) and stop words (on the
// secret). An allowlist with commit or path criteria under the AND
// condition can never match. The hand-written rules skip allowlists: their
// shapes are precise, and redacting a documentation example costs less than
// forwarding a real key.
func allowed(lists []*glconfig.Allowlist, secret, match, text string, at int) bool {
	for _, a := range lists {
		if a == nil {
			continue
		}
		target := secret
		switch a.RegexTarget {
		case "match":
			target = match
		case "line":
			ls := strings.LastIndexByte(text[:at], '\n') + 1
			le := strings.IndexByte(text[at:], '\n')
			if le < 0 {
				target = text[ls:]
			} else {
				target = text[ls : at+le]
			}
		}
		var crit []bool
		if len(a.Commits) > 0 {
			crit = append(crit, false)
		}
		if len(a.Paths) > 0 {
			crit = append(crit, false)
		}
		if len(a.Regexes) > 0 {
			crit = append(crit, a.RegexAllowed(target))
		}
		if len(a.StopWords) > 0 {
			ok, _ := a.ContainsStopWord(secret)
			crit = append(crit, ok)
		}
		if len(crit) == 0 {
			continue
		}
		all, anyOK := true, false
		for _, c := range crit {
			all = all && c
			anyOK = anyOK || c
		}
		if a.MatchCondition == glconfig.AllowlistMatchAnd && all || a.MatchCondition != glconfig.AllowlistMatchAnd && anyOK {
			return true
		}
	}
	return false
}

// shannon returns the Shannon entropy of s in bits per byte, as gitleaks
// computes it (over bytes here; gitleaks counts runes, the same on ASCII):
// H = -Σ p·log2 p with p = c/n for each byte's count c, written as
// log2 n - (Σ c·log2 c)/n so that c·log2 c comes from a table and each
// distinct byte is visited once.
func shannon(s string) float64 {
	n := len(s)
	if n == 0 {
		return 0
	}
	var counts [256]int32
	for i := 0; i < n; i++ {
		counts[s[i]]++
	}
	sum := 0.0
	for i := 0; i < n; i++ {
		if c := counts[s[i]]; c != 0 {
			sum += cLog2c(c)
			counts[s[i]] = 0
		}
	}
	return math.Log2(float64(n)) - sum/float64(n)
}

// cLog2cTable holds c·log2 c for counts up to 256.
var cLog2cTable = func() (t [257]float64) {
	for c := 2; c < len(t); c++ {
		t[c] = float64(c) * math.Log2(float64(c))
	}
	return t
}()

// cLog2c returns c·log2 c (0 for c = 1).
func cLog2c(c int32) float64 {
	if int(c) < len(cLog2cTable) {
		return cLog2cTable[c]
	}
	return float64(c) * math.Log2(float64(c))
}
