// Package redaction finds sensitive values in text (e-mail addresses, phone
// numbers, payment cards, IBANs, national identifiers, IP addresses,
// credentials and secrets, names of people), replaces them with typed
// placeholders for one request, puts the original values back into the
// answer (also when the answer arrives as a stream cut at arbitrary
// points), and guards answers: values the model wrote are passed, masked
// or block the answer, per type.
//
// The package is pure Go and does not import Caddy. The gateway builds one
// Scanner at provision time (it compiles every pattern once) and one Vault
// per request.
//
// How a scan runs, in time linear in the text (BenchmarkScan measures it
// next to a plain-regex baseline, BenchmarkScanGateway on the inputs of
// the gateway's `make bench` table):
//
//   - Normalisation: when the text holds anything to undo, detection runs
//     on a normalised view of it: Unicode NFKC per rune (fullwidth digits
//     and letters become ASCII), decimal digits of every script mapped to
//     ASCII, format characters (zero-width, soft hyphen, bidi) and
//     combining marks dropped, Unicode TR #39 homoglyphs, dashes and
//     spaces mapped, percent-escapes of printable ASCII, JSON \uXXXX
//     escapes and HTML character references (&#64;, &commat;) decoded,
//     also when escaped again ("%2540", "&amp;#64;", "\\u0040"),
//     quoted-printable soft line breaks ("=" ending a line) removed.
//     Findings are mapped back to byte offsets in the original text, so the
//     original bytes are what gets replaced. A text that holds
//     quoted-printable escapes of '@', '=' or '.' ("=40", "=3D", "=2E") or
//     of UTF-8 bytes is read a second time with every =XX decoded.
//   - One prefilter pass (prefilter.go) collects the literal anchors of
//     every detector: digit runs, '@', ':' next to hex digits, base64 and
//     spaced-hex runs, 16-byte tokens, capitalised words and, through one
//     keyword index, gitleaks' rule keywords, "://", the words that write
//     an address out and the cues before names. It reads the text eight
//     bytes at a time (byte masks in a 64-bit word) and probes a hashed
//     3-gram filter of the keywords at every offset without branching.
//   - Validators only look at those candidates: numbers (cards, IBANs,
//     SSNs, phones, IPv4) from digit clusters that see through any
//     spacing (numeric.go; phone patterns run as automata over digits), e-mail addresses from '@' and at-words
//     (also with spaced dots, "john . doe @ example . com"), fiscal codes
//     from 16-character tokens and, written in groups ("RSS MRA 80A01
//     H501U", omocodic ones with up to six letters for digits), from short
//     digit runs, AWS access key ids also in groups of four ("AKIA IOSF
//     ODNN 7EXA MPLE", grouped.go), secrets by gitleaks' rules anchored
//     at their keyword hits behind necessary conditions read off each
//     rule's syntax tree, also over line breaks (wrap.go: a key wrapped
//     over lines or string literals; not inside a base64 body already
//     found whole), names from cues and name lists. Runs of base64 and hex
//     that decode to text are scanned too, nested up to three levels, and
//     so are base64 bodies wrapped over lines of one length (LF or CRLF, as
//     MIME and PEM wrap them); a run or body hiding a value becomes one
//     finding covering all of it.
//   - A scan budget (Config.ScanTimeout, Config.MaxScanBytes and a work
//     bound linear in the text) makes ScanBounded and ScanAcrossBounded
//     return ErrScanBudget instead of running long: the caller treats the
//     text as opaque.
//
// JSON texts (tool-call arguments) are redacted with Vault.RedactJSON so
// that placeholders never break the JSON (a number becomes a quoted
// placeholder that restores to the number). Answers are guarded with a
// Guard (Check for whole answers, StreamGuard for streams, holding back
// GuardHoldBytes).
//
// Sources: RFC 5322/5321 (e-mail), the Public Suffix List via
// golang.org/x/net/publicsuffix (written-out addresses), libphonenumber
// metadata via github.com/nyaruka/phonenumbers (phone), ISO/IEC 7812-1 and
// the Luhn algorithm (cards), ISO 13616-1 and ISO 7064 MOD 97-10 (IBAN),
// the SSA numbering rules (US SSN), DM 23/12/1976 (Italian fiscal code),
// RFC 791, RFC 4291 and RFC 1918/4193 (IP), RFC 3986 §3.2.1 (URL
// credentials), gitleaks' default rule set (secrets), RFC 4648 and RFC
// 2045 (encodings), Unicode UAX #15 and TR #39 (normalisation), FakerPHP's
// name lists (PERSON, see names.txt).
package redaction

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"
)

// Entity type names. They are used verbatim in Rego policies
// (decision.redact["T3"] = ["EMAIL", ...]) and in placeholders ([EMAIL_1]).
const (
	TypeEmail          = "EMAIL"           // RFC 5322 addr-spec, practical subset
	TypePhone          = "PHONE"           // validated with libphonenumber metadata
	TypeCreditCard     = "CREDIT_CARD"     // ISO/IEC 7812 PAN, Luhn-checked
	TypeIBAN           = "IBAN"            // ISO 13616, mod-97 checked
	TypeSecret         = "SECRET"          // API keys, tokens, private keys; Subtype names the kind
	TypeUSSSN          = "US_SSN"          // US Social Security number, SSA area/group/serial rules
	TypeITFiscalCode   = "IT_FISCAL_CODE"  // Italian codice fiscale, DM 23/12/1976 check character
	TypeIPAddress      = "IP_ADDRESS"      // IPv4 dotted quad or IPv6; Subtype "public", "private", "loopback", ...
	TypeURLCredentials = "URL_CREDENTIALS" // userinfo "user:password" inside a URL (RFC 3986 §3.2.1)
	TypePerson         = "PERSON"          // a person's name in context (see person.go)
)

// builtinTypes lists every built-in type in tie-break priority order: when
// two findings cover exactly the same bytes, the one whose type comes first
// wins (a 16-digit Luhn-valid number is a card before it is a phone).
var builtinTypes = []string{
	TypeSecret,
	TypeURLCredentials,
	TypeCreditCard,
	TypeIBAN,
	TypeUSSSN,
	TypeITFiscalCode,
	TypeEmail,
	TypeIPAddress,
	TypePhone,
	TypePerson,
}

// BuiltinTypes returns the names of all built-in entity types, in tie-break
// priority order. The caller owns the returned slice.
func BuiltinTypes() []string { return slices.Clone(builtinTypes) }

// Finding is one detected value: text[Start:End], where Start and End are
// byte offsets into the string given to Scan (0 <= Start < End <= len(text)).
type Finding struct {
	Type    string // one of the Type* constants, or a user-defined type
	Subtype string // e.g. for SECRET: "openai", "aws_access_key", "github", "jwt", "private_key"; may be empty
	Start   int    // byte offset of the first byte
	End     int    // byte offset one past the last byte
}

// Detector finds one entity type. Detect appends the findings it sees in
// text to dst and returns the extended slice; findings may overlap each
// other and need not be sorted (the Scanner resolves that).
// Implementations must be safe for concurrent use.
type Detector interface {
	Type() string
	Detect(text string, dst []Finding) []Finding
}

// Config selects and tunes the built-in detectors.
type Config struct {
	// DefaultRegion is the region used to parse phone numbers written
	// without an international prefix: an ISO 3166-1 alpha-2 code such as
	// "US", "IT" or "GB". Empty means "US".
	DefaultRegion string
	// Types lists the enabled entity types by name (see BuiltinTypes);
	// empty means all built-in types.
	Types []string
	// Patterns maps a user-defined entity type (upper-case A-Z, 0-9 and _,
	// starting with a letter, at most 32 bytes, not a built-in name) to Go
	// RE2 regular expressions (https://github.com/google/re2/wiki/Syntax);
	// every match is a finding, or only the group named "value" when the
	// expression has one. Always enabled, whatever Types says.
	Patterns map[string][]string
	// Dictionaries maps a user-defined entity type (same naming rules) to
	// words or phrases (e.g. project code names) found case-insensitively
	// as whole words; spaces inside a phrase match any run of white space.
	// A type may have both patterns and words. Always enabled.
	Dictionaries map[string][]string
	// PhoneRegions lists further regions (ISO 3166-1 alpha-2) whose
	// national formats are accepted beside DefaultRegion's, e.g. ["US"]
	// for a gateway in Italy with American users. Numbers written with
	// '+' or 00 are checked against their own country whatever this says.
	PhoneRegions []string
	// ScanTimeout bounds the wall-clock time of one ScanBounded or
	// ScanAcrossBounded call; past it they return ErrScanBudget. Zero means
	// DefaultScanTimeout; negative means no time limit (the work bound
	// below still holds).
	ScanTimeout time.Duration
	// MaxScanBytes is the longest text ScanBounded accepts; a longer one
	// returns ErrScanBudget at once. Zero means DefaultMaxScanBytes.
	MaxScanBytes int
}

// Defaults of the scan budget (see Config).
const (
	DefaultScanTimeout  = time.Second
	DefaultMaxScanBytes = 16 << 20
	// workPerByte bounds the candidate work of one scan (validator calls,
	// regular-expression bytes, decoded bytes) to this many units per byte
	// of text, plus workSlack. Linear detectors stay far below it; it
	// only trips on inputs built to make some stage superlinear.
	workPerByte = 64
	workSlack   = 1 << 16
)

// ErrScanBudget is returned by ScanBounded and ScanAcrossBounded when a
// text is longer than Config.MaxScanBytes or its scan would take more
// than Config.ScanTimeout or its work bound. The findings of such a scan
// are incomplete: the caller must treat the text as opaque (not scanned),
// i.e. fail closed.
var ErrScanBudget = errors.New("redaction: scan budget exceeded")

// Scanner runs a fixed set of detectors over text. Build it once with
// NewScanner; it is safe for concurrent use.
type Scanner struct {
	detectors    []Detector // user-defined
	types        []string
	prio         map[string]int
	on           map[string]bool // enabled built-in types
	en           enabled         // the same, as fields (hot path)
	secrets      *secretDetector
	index        keywordIndex
	kwRules      [][]int32    // keyword id -> secret rules using it
	kwRule       []int32      // keyword id -> its one secret rule, noRule (none) or manyRules
	atWord       []atWordInfo // by keyword id; word "" = not an at-word
	schemeKW     int32        // id of "://" in index
	phoneRegions []*phoneRegion
	person       *personDetector
	timeout      time.Duration
	maxBytes     int
	states       sync.Pool
	// secretsOnly is this Scanner with only the secret rules enabled
	// (nil when they are off): detectWrapped keeps only the secrets of
	// the lines it joins, so it scans them with this one.
	secretsOnly *Scanner
	// kwOnly is set when the enabled detectors read no anchor but the
	// keyword hits (secretsOnly): the prefilter then collects only those.
	kwOnly bool
}

// enabled says which built-in types a Scanner runs.
type enabled struct {
	CreditCard, IBAN, USSSN, Phone, IPAddress, Email, ITFiscalCode, URLCredentials, Person, Secret bool
}

type atWordInfo struct {
	word   string
	strong bool
}

// scanState is the reusable memory of one scan.
type scanState struct {
	a      anchors
	hits   [][]int32
	view   []byte     // the normalised view's bytes
	marks  []viewMark // and its map
	breaks []int32    // view offsets of dropped invisible characters
	num    numScan    // detectNumbers' buffers
	res    resolveScratch
	enc    encScratch // encodedSegments' buffers
	fiscal []int32    // the starts detectFiscalGrouped turned down, for detectFiscalOmocodic
}

// NewScanner validates cfg and builds the detectors. It returns an error
// naming the offending value when cfg.Types holds an unknown type name or a
// duplicate, when cfg.DefaultRegion or a PhoneRegions entry is not a region
// known to the phone number metadata, or when a user-defined type is badly
// named, is a built-in name, has an expression that does not compile or
// matches the empty string, or has an empty word.
func NewScanner(cfg Config) (*Scanner, error) {
	region := strings.ToUpper(strings.TrimSpace(cfg.DefaultRegion))
	if region == "" {
		region = "US"
	}
	if !validRegion(region) {
		return nil, fmt.Errorf("redaction: default_region %q is not a known ISO 3166-1 alpha-2 region", cfg.DefaultRegion)
	}
	s := &Scanner{prio: make(map[string]int, len(builtinTypes)), on: map[string]bool{}, timeout: cfg.ScanTimeout, maxBytes: cfg.MaxScanBytes}
	if s.timeout == 0 {
		s.timeout = DefaultScanTimeout
	}
	if s.maxBytes <= 0 {
		s.maxBytes = DefaultMaxScanBytes
	}
	s.phoneRegions = append(s.phoneRegions, phoneRegionFor(region))
	for _, r := range cfg.PhoneRegions {
		r = strings.ToUpper(strings.TrimSpace(r))
		if !validRegion(r) {
			return nil, fmt.Errorf("redaction: phone region %q is not a known ISO 3166-1 alpha-2 region", r)
		}
		if pr := phoneRegionFor(r); !slices.Contains(s.phoneRegions, pr) {
			s.phoneRegions = append(s.phoneRegions, pr)
		}
	}
	types := cfg.Types
	if len(types) == 0 {
		types = builtinTypes
	}
	for _, t := range types {
		if !slices.Contains(builtinTypes, t) {
			return nil, fmt.Errorf("redaction: unknown entity type %q (known: %s)", t, strings.Join(builtinTypes, ", "))
		}
		if s.on[t] {
			return nil, fmt.Errorf("redaction: entity type %q listed twice", t)
		}
		s.on[t] = true
	}
	for i, t := range builtinTypes {
		s.prio[t] = i
		if s.on[t] {
			s.types = append(s.types, t)
		}
	}
	s.en = enabled{CreditCard: s.on[TypeCreditCard], IBAN: s.on[TypeIBAN], USSSN: s.on[TypeUSSSN], Phone: s.on[TypePhone],
		IPAddress: s.on[TypeIPAddress], Email: s.on[TypeEmail], ITFiscalCode: s.on[TypeITFiscalCode],
		URLCredentials: s.on[TypeURLCredentials], Person: s.on[TypePerson], Secret: s.on[TypeSecret]}
	if s.en.Secret {
		sd, err := newSecretDetector()
		if err != nil {
			return nil, err
		}
		s.secrets = sd
		for ri, r := range sd.rules {
			for _, k := range r.keywords {
				if len(k) < 2 {
					continue
				}
				id := s.index.add(k)
				for int(id) >= len(s.kwRules) {
					s.kwRules = append(s.kwRules, nil)
				}
				if !slices.Contains(s.kwRules[id], int32(ri)) {
					s.kwRules[id] = append(s.kwRules[id], int32(ri))
				}
			}
		}
	}
	atIDs := map[int32]atWordInfo{}
	if s.en.Email {
		for _, w := range atWords {
			atIDs[s.index.add(w.word)] = atWordInfo{w.word, w.strong}
		}
	}
	s.schemeKW = s.index.add("://")
	if s.en.Person {
		s.person = newPersonDetector(&s.index)
	}
	for len(s.kwRules) < len(s.index.words) {
		s.kwRules = append(s.kwRules, nil)
	}
	s.index.keep = make([]func(string, int) bool, len(s.index.words))
	for id, rules := range s.kwRules {
		_, at := atIDs[int32(id)]
		cue := s.person != nil && s.person.cues[int32(id)] != 0
		if s.secrets != nil && len(rules) > 0 && !at && !cue && int32(id) != s.schemeKW {
			s.index.keep[id] = s.secrets.hitFilter(rules)
			if w := s.index.words[id]; len(w) == 2 {
				for len(s.index.thirds) <= id {
					s.index.thirds = append(s.index.thirds, nil)
				}
				s.index.thirds[id] = s.secrets.thirdBytes(rules, w)
			}
		}
	}
	s.index.build()
	s.kwRule = make([]int32, len(s.kwRules))
	for id, rules := range s.kwRules {
		switch len(rules) {
		case 0:
			s.kwRule[id] = noRule
		case 1:
			s.kwRule[id] = rules[0]
		default:
			s.kwRule[id] = manyRules
		}
	}
	s.atWord = make([]atWordInfo, len(s.index.words))
	for id, w := range atIDs {
		s.atWord[id] = w
	}
	if s.person != nil {
		s.person.kinds = make([]cueKind, len(s.index.words))
		for id, k := range s.person.cues {
			s.person.kinds[id] = k
		}
	}
	// User-defined types come after the built-ins in tie-break order: on
	// exactly the same bytes, a built-in's validated finding (and the
	// sensitivity class it implies) wins.
	custom, customTypes, err := customDetectors(cfg)
	if err != nil {
		return nil, err
	}
	for i, t := range customTypes {
		s.prio[t] = len(builtinTypes) + i
	}
	s.detectors = append(s.detectors, custom...)
	s.types = append(s.types, customTypes...)
	if s.secrets != nil {
		s.secretsOnly = &Scanner{types: s.types, prio: s.prio, on: s.on, en: enabled{Secret: true}, secrets: s.secrets,
			index: s.index, kwRules: s.kwRules, kwRule: s.kwRule, atWord: s.atWord, schemeKW: s.schemeKW, phoneRegions: s.phoneRegions,
			timeout: s.timeout, maxBytes: s.maxBytes, kwOnly: true}
	}
	return s, nil
}

// Types returns the enabled entity types in tie-break priority order:
// built-ins first, then user-defined types by name. The caller owns the
// returned slice.
func (s *Scanner) Types() []string { return slices.Clone(s.types) }

// Scan returns the findings in text, sorted by Start and non-overlapping.
// When two candidates overlap, the longer one wins; on equal length the
// type earlier in BuiltinTypes wins, then the earlier start. Offsets are
// byte offsets into text, also for values only visible in the normalised
// view (see the package comment). Scan is safe for concurrent use. It has
// no time limit and runs in time linear in len(text) (see BenchmarkScan);
// use ScanBounded where a caller must fail closed on a budget.
func (s *Scanner) Scan(text string) []Finding {
	return s.scan(text, nil, 0)
}

// ScanBounded is Scan under the scan budget of Config (ScanTimeout,
// MaxScanBytes and a work bound linear in len(text)). When the budget is
// exceeded it returns the findings so far and an error wrapping
// ErrScanBudget: the caller must then treat text as opaque.
func (s *Scanner) ScanBounded(text string) ([]Finding, error) {
	b, err := s.newBudget(len(text))
	if err != nil {
		return nil, err
	}
	fs := s.scan(text, b, 0)
	if b.exceeded {
		return fs, fmt.Errorf("scanning %d bytes: %w", len(text), ErrScanBudget)
	}
	return fs, nil
}

func (s *Scanner) newBudget(n int) (*budget, error) {
	if n > s.maxBytes {
		return nil, fmt.Errorf("text of %d bytes is over the %d-byte limit: %w", n, s.maxBytes, ErrScanBudget)
	}
	b := &budget{left: int64(n)*workPerByte + workSlack}
	if s.timeout > 0 {
		b.deadline = time.Now().Add(s.timeout)
	}
	return b, nil
}

// budget is the work and time left to one scan; a nil budget is
// unlimited.
type budget struct {
	left     int64
	deadline time.Time
	tick     int
	exceeded bool
}

// spend takes w units of work and reports whether the scan may go on.
func (b *budget) spend(w int) bool {
	if b == nil {
		return true
	}
	if b.exceeded {
		return false
	}
	b.left -= int64(w)
	if b.left < 0 {
		b.exceeded = true
		return false
	}
	if !b.deadline.IsZero() {
		if b.tick += w; b.tick >= 1024 {
			b.tick = 0
			if time.Now().After(b.deadline) {
				b.exceeded = true
				return false
			}
		}
	}
	return true
}

func (s *Scanner) state() *scanState {
	if st, ok := s.states.Get().(*scanState); ok {
		return st
	}
	// Non-nil buffers: normaliseInto keeps (and returns for reuse) only
	// buffers it was given.
	return &scanState{view: []byte{}, marks: []viewMark{}}
}

// scan is Scan at nesting depth depth (values inside encodings).
func (s *Scanner) scan(text string, b *budget, depth int) []Finding {
	return s.scanAs(text, b, depth, false)
}

// scanAs is scan; with plain set the caller knows text's normalised view
// is text itself (normaliseInto would report ok=false: no byte of it is
// >= 0x80 or in specialASCII, or each '=' of it is followed by a byte
// other than a line break), and the first pass does not build it.
func (s *Scanner) scanAs(text string, b *budget, depth int, plain bool) []Finding {
	if text == "" {
		return nil
	}
	if !b.spend(len(text) / 64) {
		return nil
	}
	st := s.state()
	cand := s.pass(text, st, b, depth, false, plain)
	if qpEscaped(text) {
		// Quoted-printable text (RFC 2045 §6.7): a second pass over the
		// view with its =XX escapes decoded ("john=40example.com"). Not in
		// the first view: "width=40" or "key=41bc…" in code would read as
		// "width@" and "keyAbc…". Only what this pass finds through an
		// escape is new.
		for _, f := range s.pass(text, st, b, depth, true, false) {
			if hasQPEscape(text[f.Start:f.End]) {
				cand = append(cand, f)
			}
		}
	}
	cand = s.resolveWith(cand, &st.res)
	if cap(st.view) > 4<<20 || cap(st.marks) > 1<<18 || cap(st.res.order) > 1<<16 || cap(st.enc.buf)+cap(st.enc.joined) > 4<<20 || cap(st.enc.segs) > 1<<16 {
		// Keep the pool small after a huge text.
		st.view, st.marks, st.res, st.enc = []byte{}, []viewMark{}, resolveScratch{}, encScratch{}
	}
	s.states.Put(st)
	return cand
}

// pass runs the detectors on the normalised view of text (with
// quoted-printable escapes decoded when qp is set) and returns their
// candidates in text's offsets. With plain set (see scanAs) text is its
// own view.
func (s *Scanner) pass(text string, st *scanState, b *budget, depth int, qp, plain bool) []Finding {
	// The view aliases st.view until st goes back to the pool, after the
	// findings are mapped back (nothing else keeps it).
	var v view
	var ok bool
	if !plain {
		v, ok, st.view, st.marks = normaliseInto(text, st.view, st.marks, qp)
	}
	scan := text
	if ok {
		// The view only removes obfuscation (see normalise), so scanning
		// it alone finds what a raw scan finds and more.
		scan = v.text
	}
	if s.kwOnly {
		s.index.prefilterKeywords(scan, &st.a)
	} else {
		s.index.prefilter(scan, &st.a)
	}
	st.breaks = st.breaks[:0]
	if ok && s.en.Email && len(st.a.ats) > 0 {
		st.breaks = dropBreaks(text, v.marks, st.breaks)
	}
	cand := s.detect(scan, st, b, depth)
	if ok {
		k := -1
		for i := range cand {
			cand[i].Start, cand[i].End = v.spanFrom(cand[i].Start, cand[i].End, &k)
		}
	}
	return cand
}

// Scanner.kwRule's marks of a keyword used by no secret rule or by
// several (see kwRules).
const (
	noRule    int32 = -1
	manyRules int32 = -2
)

// detect runs every enabled detector on the candidates of text.
func (s *Scanner) detect(text string, st *scanState, b *budget, depth int) []Finding {
	var cand []Finding
	a := &st.a
	if s.en.CreditCard || s.en.IBAN || s.en.USSSN || s.en.Phone || s.en.IPAddress {
		cand = s.detectNumbers(text, a, cand, b, &st.num)
	}
	if s.en.Email {
		cand = s.detectEmails(text, a, st.breaks, cand)
	}
	if s.en.IPAddress {
		cand = detectIPv6(text, a.colons, cand)
	}
	if s.en.ITFiscalCode {
		cand = detectFiscal(text, a.tok16, cand)
		cand, st.fiscal = detectFiscalGrouped(text, a.digits, cand, st.fiscal[:0])
		cand = detectFiscalOmocodic(text, a.caps, cand, st.fiscal)
	}
	var schemes []int32
	for _, h := range a.kw {
		if h.id == s.schemeKW {
			schemes = append(schemes, h.pos)
		}
	}
	if s.en.URLCredentials && len(schemes) > 0 {
		cand = detectURLCredentials(text, schemes, cand)
	}
	if s.secrets != nil && len(a.kw) > 0 {
		if st.hits == nil {
			st.hits = make([][]int32, len(s.secrets.rules))
		}
		for i := range st.hits {
			st.hits[i] = st.hits[i][:0]
		}
		// Hits of one rule come in runs (a flood of one keyword): the
		// run's slice is held in cur and stored back when it ends.
		any := false
		cur, curRule := []int32(nil), noRule
		for _, h := range a.kw {
			r := s.kwRule[h.id]
			if r == curRule {
				if r >= 0 {
					cur = append(cur, h.pos)
				}
				continue
			}
			if r == noRule {
				continue
			}
			if curRule >= 0 {
				st.hits[curRule] = cur
			}
			any = true
			if r >= 0 {
				curRule, cur = r, append(st.hits[r], h.pos)
				continue
			}
			curRule = noRule
			for _, r := range s.kwRules[h.id] {
				st.hits[r] = append(st.hits[r], h.pos)
			}
		}
		if curRule >= 0 {
			st.hits[curRule] = cur
		}
		if any {
			cand = s.secrets.detect(text, st.hits, cand, b)
		}
	}
	if s.person != nil {
		cand = s.person.detect(text, a, cand, b)
	}
	for _, d := range s.detectors {
		if !b.spend(len(text) / 64) {
			break
		}
		cand = d.Detect(text, cand)
	}
	// The encoded runs are decoded first, so that the wrapped-key search
	// can leave out the lines inside a run already found whole (see
	// detectWrapped); their findings are then moved after the wrapped
	// keys' (the order of detection is resolve's last tie-break).
	n0 := len(cand)
	if depth < maxEncodedDepth && (len(a.runs) > 0 || len(a.hex2) >= 5) {
		cand = s.detectEncoded(text, a.runs, a.hex2, cand, b, depth, &st.enc)
	}
	if n1 := len(cand); depth == 0 && s.secrets != nil && len(a.runs) > 0 {
		cand = s.detectWrapped(text, a.runs, cand, b, depth, cand[n0:n1])
		if n1 > n0 && len(cand) > n1 {
			// Rotate cand[n0:] by n1-n0: the wrapped keys first.
			slices.Reverse(cand[n0:n1])
			slices.Reverse(cand[n1:])
			slices.Reverse(cand[n0:])
		}
	}
	return cand
}

// detectEncoded scans the decoded text of every base64 or hex run in text
// (recursively, up to maxEncodedDepth levels) and, for a run hiding a
// value, appends one finding covering the whole run (the value cannot be
// replaced inside the encoding), with the type and subtype of the
// highest-priority value inside.
func (s *Scanner) detectEncoded(text string, runs [][2]int32, hex2 []int32, dst []Finding, b *budget, depth int, sc *encScratch) []Finding {
	segs, buf := encodedSegments(text, runs, hex2, b, sc)
	// buf and segs go back to sc for the next scan: the inner scan's
	// findings are offsets, and nothing else keeps the string on buf.
	defer func() { sc.buf, sc.segs = buf[:0], segs[:0] }()
	if len(segs) == 0 {
		return dst
	}
	// One scan of all the decoded texts, joined by encodedSep (which no
	// detector reads through), instead of one scan each: the cost of a
	// scan's set-up is paid once.
	if !b.spend(len(buf) / 16) {
		return dst
	}
	inner := s.scan(unsafe.String(unsafe.SliceData(buf), len(buf)), b, depth+1)
	// inner is sorted by Start and the segments by their place in buf:
	// one walk over both finds each segment's strongest finding.
	i := 0
	dst = slices.Grow(dst, len(segs))
	for _, seg := range segs {
		best := -1
		for ; i < len(inner) && inner[i].Start < seg.de; i++ {
			if f := inner[i]; f.Start >= seg.ds && (best < 0 || s.prio[f.Type] < s.prio[inner[best].Type]) {
				best = i
			} // else in a separator
		}
		if best >= 0 {
			f := inner[best]
			dst = append(dst, Finding{Type: f.Type, Subtype: f.Subtype, Start: seg.start, End: seg.end})
		}
	}
	return dst
}

// rangeTaken reports whether a bit of [s, e) is set.
func rangeTaken(bits []uint64, s, e int) bool {
	for k := s; k < e; {
		if k&63 == 0 && e-k >= 64 {
			if bits[k>>6] != 0 {
				return true
			}
			k += 64
			continue
		}
		if bits[k>>6]&(1<<(k&63)) != 0 {
			return true
		}
		k++
	}
	return false
}

// resolve keeps a maximal set of non-overlapping findings, preferring
// longer ones, and returns it sorted by Start (cand: Start < End each),
// in cand's memory. The choice is greedy: in the order longer first,
// then the type's priority, then earlier, then as detected, a candidate
// is kept when it overlaps no kept one. Whether a candidate is kept
// depends only on the candidates it overlaps, so resolve sorts the
// candidates by start, cuts them into clusters (runs in which each
// candidate starts before the end of one before it) and makes the greedy
// choice inside each cluster of two or more; a lone candidate is kept.
// That is the greedy choice over all the candidates, in time O(n log n)
// for the sort plus the cluster sizes and spans.
func (s *Scanner) resolve(cand []Finding) []Finding { return s.resolveWith(cand, &resolveScratch{}) }

// resolveScratch is resolve's reusable memory.
type resolveScratch struct {
	order []uint64
	out   []Finding
	taken []uint64
}

// resolveWith is resolve with scratch memory sc.
func (s *Scanner) resolveWith(cand []Finding, sc *resolveScratch) []Finding {
	if len(cand) <= 1 {
		return cand
	}
	sc.order = startOrder(cand, sc.order[:0])
	order := sc.order
	if len(order) == 0 {
		order = nil // cand is sorted
	}
	// The kept candidates go to sc.out, then back into cand; while cand is
	// sorted and nothing overlaps, they are cand[:c] and stay there.
	out, copied := sc.out[:0], order != nil
	for c := 0; c < len(cand); {
		end := cand[rank(order, c)].End
		e := c + 1
		for ; e < len(cand) && cand[rank(order, e)].Start < end; e++ {
			end = max(end, cand[rank(order, e)].End)
		}
		switch {
		case e > c+1 && !copied:
			out, copied = append(out, cand[:c]...), true
			fallthrough
		case e > c+1:
			out, sc.taken = s.resolveCluster(cand, order, c, e, out, sc.taken)
		case copied:
			out = append(out, cand[rank(order, c)])
		}
		c = e
	}
	if !copied {
		return cand // sorted, and no candidate overlaps another
	}
	cand = cand[:copy(cand, out)]
	clear(out) // drop the strings
	sc.out = out[:0]
	return cand
}

// startOrder appends to buf the indices of cand by Start, then by index,
// and returns it; it returns buf empty when that order is the identity.
func startOrder(cand []Finding, buf []uint64) []uint64 {
	sorted := true
	for i := 1; i < len(cand); i++ {
		if cand[i].Start <= cand[i-1].Start {
			sorted = false
			break
		}
	}
	if sorted {
		return buf
	}
	// Start and index packed into one integer (a plain integer sort is
	// much faster than a sort by a comparison function), while they fit.
	keys := slices.Grow(buf, len(cand))[:len(cand)]
	for i, f := range cand {
		if f.Start < 0 || f.Start >= 1<<32 || i >= 1<<32 {
			for k := range keys {
				keys[k] = uint64(k)
			}
			slices.SortFunc(keys, func(a, b uint64) int {
				return cmp.Or(cmp.Compare(cand[a].Start, cand[b].Start), cmp.Compare(a, b))
			})
			return keys
		}
		keys[i] = uint64(f.Start)<<32 | uint64(i)
	}
	slices.Sort(keys)
	for k := range keys {
		keys[k] &= 1<<32 - 1
	}
	return keys
}

// rank returns the index of the candidate of rank r in order (see
// startOrder).
func rank(order []uint64, r int) int {
	if order == nil {
		return r
	}
	return int(order[r])
}

// resolveCluster appends to out, sorted by Start, the greedy choice (see
// resolve) among the candidates of ranks c to e-1 in order, which span
// cand[rank(order, c)].Start up to their largest End. taken is scratch memory,
// returned for reuse.
func (s *Scanner) resolveCluster(cand []Finding, order []uint64, c, e int, out []Finding, taken []uint64) ([]Finding, []uint64) {
	// Each candidate's key is computed once (the priority is a map
	// look-up), then sorted.
	keys := make([]resolveKey, 0, e-c)
	base, end := cand[rank(order, c)].Start, 0
	for r := c; r < e; r++ {
		i := rank(order, r)
		f := cand[i]
		keys = append(keys, resolveKey{length: f.End - f.Start, prio: s.prio[f.Type], start: f.Start, idx: i})
		end = max(end, f.End)
	}
	slices.SortFunc(keys, func(a, b resolveKey) int {
		switch {
		case a.length != b.length:
			return b.length - a.length
		case a.prio != b.prio:
			return a.prio - b.prio
		case a.start != b.start:
			return a.start - b.start
		}
		return a.idx - b.idx
	})
	// Longest first, keep a finding when none of its bytes is taken; a
	// bitmap of the cluster's taken bytes makes each test proportional
	// to the finding.
	taken = slices.Grow(taken[:0], (end-base)/64+1)[:(end-base)/64+1]
	clear(taken)
	first := len(out)
	for _, key := range keys {
		f := cand[key.idx]
		if rangeTaken(taken, f.Start-base, f.End-base) {
			continue
		}
		for k := f.Start - base; k < f.End-base; k++ {
			taken[k>>6] |= 1 << (k & 63)
		}
		out = append(out, f)
	}
	// Kept findings do not overlap, so their starts differ.
	slices.SortFunc(out[first:], func(a, b Finding) int { return a.Start - b.Start })
	return out, taken
}

// resolveKey is a candidate's place in resolve's order.
type resolveKey struct{ length, prio, start, idx int }
