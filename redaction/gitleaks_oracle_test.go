package redaction

import (
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/viper"
	glconfig "github.com/zricethezav/gitleaks/v8/config"
	gldetect "github.com/zricethezav/gitleaks/v8/detect"
)

// oracleSecrets makes real-looking secrets of the rules whose keywords
// turn up by chance in base64 or prose and which Molly tries anchored at
// their keyword hits, written after each rule's pattern in gitleaks'
// default configuration.
func oracleSecrets(r *rand.Rand) map[string][]func() string {
	from := func(n int, alphabet string) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		return string(b)
	}
	pick := func(s ...string) string { return s[r.IntN(len(s))] }
	digits, hexd, lowalnum := "0123456789", "0123456789abcdefABCDEF", "abcdefghijklmnopqrstuvwxyz0123456789"
	return map[string][]func() string{
		"facebook-page-access-token": {func() string { return pick("EAAM", "EAAC") + from(100+r.IntN(60), alnum) }},
		"slack-legacy-token": {func() string {
			return "xox" + pick("o", "s") + "-" + from(1+r.IntN(12), digits) + "-" + from(1+r.IntN(12), digits) + "-" + from(1+r.IntN(12), digits) + "-" + from(8+r.IntN(32), hexd)
		}},
		"slack-legacy-workspace-token": {func() string { return "xox" + pick("a", "r") + "-" + pick("", "2-") + from(8+r.IntN(41), alnum) }},
		"slack-user-token": {func() string {
			return "xox" + pick("p", "e") + "-" + from(10+r.IntN(4), digits) + "-" + from(10+r.IntN(4), digits) + "-" + from(10+r.IntN(4), digits) + "-" + from(28+r.IntN(7), alnum)
		}},
		"github-app-token": {func() string { return pick("ghu_", "ghs_") + from(36, alnum) }},
		"stripe-access-token": {func() string {
			return pick("sk", "rk") + "_" + pick("test", "live", "prod") + "_" + from(10+r.IntN(90), alnum)
		}},
		"linkedin-client-id": {func() string {
			return pick("linkedin", "LINKED_IN", "linked-in") + pick("_client_id", "ClientId", "") + pick(" = ", ": ", "=\"") + from(14, lowalnum)
		}},
		"linkedin-client-secret": {func() string {
			return pick("linkedin", "Linked_In") + pick("_secret", "") + pick(" = ", ":") + from(16, lowalnum)
		}},
		"messagebird-api-token": {func() string {
			return pick("messagebird", "message_bird", "MESSAGE-BIRD") + pick("_api_key", "Token", "") + pick(" = ", ": ", "=") + from(25, lowalnum)
		}},
		"privateai-api-token": {func() string {
			return pick("privateai", "PRIVATE_AI", "private-ai") + pick("_token", "") + pick(" = ", ":") + from(32, lowalnum)
		}},
		// Rules run on windows before and after their keyword hits.
		"lob-api-key": {func() string {
			return pick("lob", "LOB") + pick("_api_key", "Key", "") + pick(" = ", ": ", "=") + pick("live_", "test_") + from(35, "0123456789abcdef")
		}},
		"lob-pub-api-key": {func() string {
			return "lob" + pick("_pub_key", "") + pick(" = ", ":") + pick("live", "test") + "_pub_" + from(31, "0123456789abcdef")
		}},
		"hashicorp-tf-api-token": {func() string { return from(14, lowalnum) + ".atlasv1." + from(60+r.IntN(11), lowalnum+"-_=") }},
		"azure-ad-client-secret": {func() string {
			return pick("", "secret=", "'") + from(3, alnum+"_~.") + from(1, digits) + "Q~" + from(31+r.IntN(4), alnum+"_~.-") + pick("", "'", ",")
		}},
		"maxmind-license-key": {func() string { return from(6, alnum) + "_" + from(29, alnum) + "_mmk" }},
		"openai-api-key": {
			func() string {
				return "sk-" + pick("proj", "admin") + "-" + from(74, alnum+"_-") + "T3BlbkFJ" + from(74, alnum+"_-")
			},
			func() string { return "sk-" + from(20, alnum) + "T3BlbkFJ" + from(20, alnum) },
		},
		"freemius-secret-key": {func() string {
			return pick(`'secret_key'`, `"SECRET_KEY"`) + pick(" => ", "=>", " \n=> ") + `'sk_` + from(29, alnum+"!#%") + `'`
		}},
		// Molly's own rules, which gitleaks does not have: the plain
		// evaluation is their oracle (and freemius-secret-key's).
		"molly-password": {
			func() string {
				return pick("password", "db_passwd", "Passphrase", "PWD", "user_pwd", "secret", "Passwort") + pick(": ", " = ", "=\"", " is ") + from(8+r.IntN(10), alnum) + pick("#", "!", "9")
			},
			func() string {
				return pick("contraseña", "la contraseña es") + pick(": ", " ") + from(6+r.IntN(10), alnum) + "7"
			},
		},
		"molly-github": {func() string { return pick("ghp_", "gho_", "ghu_", "ghs_", "ghr_") + from(36+r.IntN(10), alnum) }},
	}
}

// gitleaksDetector returns gitleaks' own detector with only the given
// rules of its default configuration, each with Molly's one change to
// the pattern (the prose tail, see secretDetector).
func gitleaksDetector(t *testing.T, ids []string) *gldetect.Detector {
	t.Helper()
	v := viper.New()
	v.SetConfigType("toml")
	if err := v.ReadConfig(strings.NewReader(glconfig.DefaultConfig)); err != nil {
		t.Fatal(err)
	}
	var vc glconfig.ViperConfig
	if err := v.Unmarshal(&vc); err != nil {
		t.Fatal(err)
	}
	cfg, err := vc.Translate()
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string]glconfig.Rule{}
	cfg.Keywords = map[string]struct{}{}
	cfg.OrderedRules = nil
	for _, id := range ids {
		r, ok := cfg.Rules[id]
		if !ok {
			t.Fatalf("gitleaks has no rule %s", id)
		}
		r.Regex = regexp.MustCompile(strings.ReplaceAll(r.Regex.String(), gitleaksTail, proseTail))
		rules[id] = r
		for _, k := range r.Keywords {
			cfg.Keywords[strings.ToLower(k)] = struct{}{}
		}
		cfg.OrderedRules = append(cfg.OrderedRules, id)
	}
	cfg.Rules = rules
	return gldetect.NewDetector(cfg)
}

// oracleFinding is one secret: the rule, where the secret starts, the
// secret.
type oracleFinding struct {
	rule   string
	start  int
	secret string
}

func cmpOracle(a, b oracleFinding) int {
	if a.start != b.start {
		return a.start - b.start
	}
	if c := strings.Compare(a.rule, b.rule); c != 0 {
		return c
	}
	return strings.Compare(a.secret, b.secret)
}

// gitleaksFindings runs gitleaks' detector on text: its findings give the
// match's line and column (the column counts the newline before the line)
// and the secret, which is then looked for in the match.
func gitleaksFindings(t *testing.T, det *gldetect.Detector, text string) []oracleFinding {
	t.Helper()
	var nl []int
	for i := 0; i < len(text); i++ {
		if text[i] == '\n' {
			nl = append(nl, i)
		}
	}
	var out []oracleFinding
	for _, f := range det.DetectString(text) {
		start := f.StartColumn - 1
		if f.StartLine > 0 {
			start += nl[f.StartLine-1]
		}
		for start < len(text) && text[start] == '\n' && !strings.HasPrefix(f.Match, "\n") {
			start++ // gitleaks trims line breaks off both ends of the match
		}
		k := strings.Index(f.Match, f.Secret)
		if k < 0 || !strings.HasPrefix(text[start:], f.Match) {
			t.Fatalf("gitleaks finding %s %q at line %d column %d: not at the offset read off it (%d)", f.RuleID, f.Match, f.StartLine, f.StartColumn, start)
		}
		out = append(out, oracleFinding{f.RuleID, start + k, f.Secret})
	}
	slices.SortFunc(out, cmpOracle)
	return out
}

// mollyRuleFindings runs Molly's scan of the secret rules (prefilter,
// keyword hits, anchored tries or windows) with the hits of the rules
// with the given ids only, and names each finding's rule.
func mollyRuleFindings(s *Scanner, text string, ids []string) []oracleFinding {
	st := &scanState{}
	s.index.prefilter(text, &st.a)
	var out []oracleFinding
	for ri := range s.secrets.rules {
		r := &s.secrets.rules[ri]
		if !slices.Contains(ids, r.id) {
			continue
		}
		hits := make([][]int32, len(s.secrets.rules))
		for _, h := range st.a.kw {
			if slices.Contains(s.kwRules[h.id], int32(ri)) {
				hits[ri] = append(hits[ri], h.pos)
			}
		}
		for _, f := range s.secrets.detect(text, hits, nil, nil) {
			out = append(out, oracleFinding{r.id, f.Start, text[f.Start:f.End]})
		}
	}
	slices.SortFunc(out, cmpOracle)
	return out
}

// plainRuleFindings is the plain evaluation of Molly's own rules (see
// naiveSecrets): the original pattern over the whole text when a keyword
// occurs.
func plainRuleFindings(t *testing.T, d *secretDetector, text string, ids []string) []oracleFinding {
	t.Helper()
	lower := strings.ToLower(text)
	var out []oracleFinding
	for _, r := range d.rules {
		if !slices.Contains(ids, r.id) || !slices.ContainsFunc(r.keywords, func(k string) bool { return strings.Contains(lower, k) }) {
			continue
		}
		plain := r
		plain.stripped, plain.leadB, plain.anchored = false, false, nil
		plain.re = regexp.MustCompile(r.orig)
		for _, m := range plain.re.FindAllStringSubmatchIndex(text, -1) {
			if f, ok := d.finding(&plain, text, m, nil); ok {
				out = append(out, oracleFinding{r.id, f.Start, text[f.Start:f.End]})
			}
		}
	}
	slices.SortFunc(out, cmpOracle)
	return out
}

// oracleText is about size bytes of random base64 wrapped at 76 columns
// (a pasted attachment), or unwrapped (a data URL), or prose and code,
// with secrets at random offsets: glued to the bytes before them or
// after a space or a line break, followed by a space or a line break.
func oracleText(r *rand.Rand, size int, gens map[string][]func() string, ids []string) string {
	var bg string
	switch r.IntN(3) {
	case 0, 1:
		raw := make([]byte, size*3/4)
		for i := range raw {
			raw[i] = byte(r.Uint32())
		}
		enc := base64.StdEncoding.EncodeToString(raw)
		if r.IntN(2) == 0 {
			var b strings.Builder
			for i := 0; i+76 <= len(enc); i += 76 {
				b.WriteString(enc[i : i+76])
				b.WriteByte('\n')
			}
			enc = b.String()
		}
		bg = enc
	default:
		paras := []string{prosePara, codePara, densePara}
		var b strings.Builder
		for b.Len() < size {
			b.WriteString(paras[r.IntN(len(paras))])
		}
		bg = b.String()
	}
	cuts := make([]int, 1+r.IntN(6))
	for i := range cuts {
		cuts[i] = r.IntN(len(bg))
	}
	slices.Sort(cuts)
	var b strings.Builder
	last := 0
	for _, c := range cuts {
		b.WriteString(bg[last:c])
		last = c
		g := gens[ids[r.IntN(len(ids))]]
		b.WriteString([]string{"", " ", "\n"}[r.IntN(3)])
		b.WriteString(g[r.IntN(len(g))]())
		b.WriteString([]string{" ", "\n"}[r.IntN(2)])
	}
	b.WriteString(bg[last:])
	return b.String()
}

// TestAnchoredRulesMatchGitleaks checks the rules Molly tries at their
// keyword hits (and no longer over the whole text: see
// TestRulesRunNearTheirKeywords) against gitleaks' own detector: on texts
// of random base64 and prose with secrets of those rules at random
// offsets (a fixed seed), Molly reports the same secrets of each rule at
// the same offsets. Molly's own rules (and freemius-secret-key, which
// gitleaks runs on PHP files only) are checked against the plain
// evaluation on the same texts.
func TestAnchoredRulesMatchGitleaks(t *testing.T) {
	s := mustScanner(t)
	r := rand.New(rand.NewPCG(2045, 8))
	gens := oracleSecrets(r)
	var ids, glIDs, mollyIDs []string
	for id := range gens {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		// freemius-secret-key also names a path (PHP files): gitleaks
		// runs it on files only, Molly on every text.
		if strings.HasPrefix(id, "molly-") || id == "freemius-secret-key" {
			mollyIDs = append(mollyIDs, id)
		} else {
			glIDs = append(glIDs, id)
		}
	}
	det := gitleaksDetector(t, glIDs)
	perRule := map[string]int{}
	for i := range 120 {
		text := oracleText(r, 4<<10+r.IntN(12<<10), gens, ids)
		got := mollyRuleFindings(s, text, glIDs)
		want := gitleaksFindings(t, det, text)
		if !slices.Equal(got, want) {
			t.Errorf("text %d (%d bytes): Molly %v\ngitleaks %v", i, len(text), got, want)
		}
		for _, f := range want {
			perRule[f.rule]++
		}
		got = mollyRuleFindings(s, text, mollyIDs)
		want = plainRuleFindings(t, s.secrets, text, mollyIDs)
		if !slices.Equal(got, want) {
			t.Errorf("text %d (%d bytes): Molly %v\nplain %v", i, len(text), got, want)
		}
		for _, f := range want {
			perRule[f.rule]++
		}
	}
	for _, id := range ids {
		if perRule[id] < 3 {
			t.Errorf("rule %s: %d findings in all texts, the comparison proves little for it", id, perRule[id])
		}
	}
	t.Logf("findings per rule: %v", fmt.Sprint(perRule))
}

// TestRulesRunNearTheirKeywords checks that every rule with keywords runs
// only near its keyword hits (anchored at them, or on the windows its
// pattern bounds: see secretRule.near), never over the whole text, but
// for the rules listed here with the reason.
func TestRulesRunNearTheirKeywords(t *testing.T) {
	d, err := newSecretDetector()
	if err != nil {
		t.Fatal(err)
	}
	// gitleaks runs a rule over the whole text when one of its keywords
	// occurs anywhere: these rules' matches need not hold one, so Molly
	// does the same.
	whole := map[string]string{
		"airtable-personnal-access-token": "keyword airtable, matches pat…",
		"facebook-access-token":           "keyword facebook, matches digits|…",
		"slack-config-access-token":       "the '.' of its keywords' xoxe.xox is any byte in the pattern",
		"sourcegraph-access-token":        "matches 40 hex digits alone",
	}
	// Windows of 256 bytes before and 1 KiB after each hit (see windows):
	// the pattern bounds no window.
	heuristic := map[string]string{
		"kubernetes-secret-yaml":  "unbounded [ \\t]* and \\s+ before the keyword",
		"microsoft-teams-webhook": "unbounded host name before the keyword",
		"sidekiq-sensitive-url":   "the keyword's dots are any byte in the pattern",
		"slack-webhook-url":       "the keyword's dots are any byte in the pattern",
	}
	for i := range d.rules {
		r := &d.rules[i]
		if len(r.keywords) == 0 {
			continue
		}
		switch {
		case r.anchored != nil || r.near:
			if _, ok := whole[r.id]; ok {
				t.Errorf("%s runs near its hits: take it off the list", r.id)
			}
			if _, ok := heuristic[r.id]; ok {
				t.Errorf("%s runs near its hits: take it off the list", r.id)
			}
		case r.windowed:
			if _, ok := heuristic[r.id]; !ok {
				t.Errorf("%s runs on unbounded windows", r.id)
			}
		default:
			if _, ok := whole[r.id]; !ok {
				t.Errorf("%s runs over the whole text", r.id)
			}
		}
	}
}

// TestGenericKeysOfAnyLengthAreFoundAsByThePlainRule compares
// generic-api-key's findings (tried at its keyword hits, on a window cut
// after its operator) with the plain rule's, its whole pattern over the
// whole text (plainRuleFindings), on assignments whose values run from
// ten bytes to past the window (its bounded alternative's 150, the
// unbounded one's hundreds), after every operator and quoting, in ASCII
// and with letters that fold to the rule's classes (the Kelvin sign, the
// long s).
func TestGenericKeysOfAnyLengthAreFoundAsByThePlainRule(t *testing.T) {
	s := mustScanner(t)
	r := rand.New(rand.NewPCG(77, 5))
	word := func(n int, alphabet string) string {
		var b strings.Builder
		for range n {
			b.WriteByte(alphabet[r.IntN(len(alphabet))])
		}
		return b.String()
	}
	const b64 = "abcdefghijklmnopqrstuvwxyz0123456789+/"
	const w = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.=-"
	checked := 0
	for _, n := range []int{10, 40, 149, 150, 151, 160, 250, 300, 390, 401, 600} {
		for _, op := range []string{"=", ":", " := ", ":::=", "=>", ": ", "?=", "||"} {
			for _, q := range []string{"", `"`, "'", "`", "  "} {
				for _, v := range []string{word(n, b64), word(n, w), word(n/2, w) + "\u212a\u017f" + word(n/2, w)} {
					text := "config:\n  my_api_token" + op + q + v + q + "\nnext line here\n"
					got := mollyRuleFindings(s, text, []string{"generic-api-key"})
					want := plainRuleFindings(t, s.secrets, text, []string{"generic-api-key"})
					if !slices.Equal(got, want) {
						t.Errorf("%q: Molly %v\nplain %v", text, got, want)
					}
					checked += len(want)
				}
			}
		}
	}
	if checked < 100 {
		t.Fatalf("the plain rule found %d keys in all texts: the comparison proves little", checked)
	}
}
