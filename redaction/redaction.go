// Package redaction finds sensitive values in text (e-mail addresses, phone
// numbers, payment cards, IBANs, national identifiers, IP addresses,
// credentials and secrets), replaces them with typed placeholders for one
// request, and puts the original values back into the answer, also when the
// answer arrives as a stream cut at arbitrary points.
//
// The package is pure Go and does not import Caddy. The gateway builds one
// Scanner at provision time (it compiles every pattern once) and one Vault
// per request.
//
// Detection runs on a normalised view of the text whenever that view
// differs from it: Unicode NFKC per rune (fullwidth digits and letters
// become ASCII), zero-width and other format characters removed, common
// Cyrillic/Greek look-alike letters and dash/space variants mapped to
// ASCII, and %XX escapes of address characters decoded. Findings are mapped
// back to byte offsets in the original text, so the original bytes
// (zero-width characters included) are what gets replaced. Runs of base64
// and hex that decode to text are scanned too; a run hiding a value becomes
// one finding covering the whole run.
//
// Sources: RFC 5322/5321 (e-mail), libphonenumber metadata via
// github.com/nyaruka/phonenumbers (phone), ISO/IEC 7812-1 and the Luhn
// algorithm (cards), ISO 13616-1 and ISO 7064 MOD 97-10 (IBAN), the SSA
// numbering rules (US SSN), DM 23/12/1976 (Italian fiscal code), RFC 791,
// RFC 4291 and RFC 1918/4193 (IP), RFC 3986 §3.2.1 (URL credentials), and
// gitleaks' default rule set (secrets).
package redaction

import (
	"fmt"
	"slices"
	"sort"
	"strings"
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
}

// Scanner runs a fixed set of detectors over text. Build it once with
// NewScanner; it is safe for concurrent use.
type Scanner struct {
	detectors []Detector
	types     []string
	prio      map[string]int
}

// NewScanner validates cfg and builds the detectors. It returns an error
// naming the offending value when cfg.Types holds an unknown type name or a
// duplicate, when cfg.DefaultRegion is not a region known to the phone
// number metadata, or when a user-defined type is badly named, is a
// built-in name, has an expression that does not compile or matches the
// empty string, or has an empty word.
func NewScanner(cfg Config) (*Scanner, error) {
	region := strings.ToUpper(strings.TrimSpace(cfg.DefaultRegion))
	if region == "" {
		region = "US"
	}
	if !validRegion(region) {
		return nil, fmt.Errorf("redaction: default_region %q is not a known ISO 3166-1 alpha-2 region", cfg.DefaultRegion)
	}
	types := cfg.Types
	if len(types) == 0 {
		types = builtinTypes
	}
	seen := make(map[string]bool, len(types))
	for _, t := range types {
		if !slices.Contains(builtinTypes, t) {
			return nil, fmt.Errorf("redaction: unknown entity type %q (known: %s)", t, strings.Join(builtinTypes, ", "))
		}
		if seen[t] {
			return nil, fmt.Errorf("redaction: entity type %q listed twice", t)
		}
		seen[t] = true
	}
	s := &Scanner{prio: make(map[string]int, len(builtinTypes))}
	for i, t := range builtinTypes {
		s.prio[t] = i
		if !seen[t] {
			continue
		}
		var d Detector
		switch t {
		case TypeEmail:
			d = emailDetector{}
		case TypePhone:
			d = phoneDetector{region: region}
		case TypeCreditCard:
			d = cardDetector{}
		case TypeIBAN:
			d = ibanDetector{}
		case TypeSecret:
			sd, err := newSecretDetector()
			if err != nil {
				return nil, err
			}
			d = sd
		case TypeUSSSN:
			d = ssnDetector{}
		case TypeITFiscalCode:
			d = fiscalCodeDetector{}
		case TypeIPAddress:
			d = ipDetector{}
		case TypeURLCredentials:
			d = urlCredentialsDetector{}
		}
		s.detectors = append(s.detectors, d)
		s.types = append(s.types, t)
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
// view (see the package comment). Scan is safe for concurrent use.
func (s *Scanner) Scan(text string) []Finding {
	if text == "" {
		return nil
	}
	var cand []Finding
	v, ok := normalise(text)
	scan := text
	if ok {
		// The view only removes obfuscation (see normalise), so scanning
		// it alone finds what a raw scan finds and more, at the cost of
		// one scan.
		scan = v.text
	}
	for _, d := range s.detectors {
		cand = d.Detect(scan, cand)
	}
	cand = s.detectEncoded(scan, cand)
	if ok {
		for i := range cand {
			cand[i].Start, cand[i].End = v.span(cand[i].Start, cand[i].End)
		}
	}
	return s.resolve(cand)
}

// detectEncoded scans the decoded text of every base64 or hex run in text
// and, for a run hiding a value, appends one finding covering the whole
// run (the value cannot be replaced inside the encoding), with the type
// and subtype of the highest-priority value inside.
func (s *Scanner) detectEncoded(text string, dst []Finding) []Finding {
	var inner []Finding
	for _, seg := range encodedSegments(text) {
		inner = inner[:0]
		for _, d := range s.detectors {
			inner = d.Detect(seg.decoded, inner)
		}
		if len(inner) == 0 {
			continue
		}
		best := inner[0]
		for _, f := range inner[1:] {
			if s.prio[f.Type] < s.prio[best.Type] {
				best = f
			}
		}
		dst = append(dst, Finding{Type: best.Type, Subtype: best.Subtype, Start: seg.start, End: seg.end})
	}
	return dst
}

// resolve keeps a maximal set of non-overlapping findings, preferring longer
// ones, and returns it sorted by Start.
func (s *Scanner) resolve(cand []Finding) []Finding {
	if len(cand) <= 1 {
		return cand
	}
	sort.SliceStable(cand, func(i, j int) bool {
		a, b := cand[i], cand[j]
		if la, lb := a.End-a.Start, b.End-b.Start; la != lb {
			return la > lb
		}
		if pa, pb := s.prio[a.Type], s.prio[b.Type]; pa != pb {
			return pa < pb
		}
		return a.Start < b.Start
	})
	out := make([]Finding, 0, len(cand))
	for _, f := range cand {
		// out is kept sorted by Start; find where f would go.
		i := sort.Search(len(out), func(k int) bool { return out[k].Start >= f.Start })
		if i > 0 && out[i-1].End > f.Start {
			continue
		}
		if i < len(out) && out[i].Start < f.End {
			continue
		}
		out = slices.Insert(out, i, f)
	}
	return out
}
