package capability

// The regexp estimator this package replaces (router/capability.go before
// the keyword automaton), kept verbatim but for names as the baseline of
// the accuracy tests and benchmarks: same run, same labelled sets.

import (
	"math"
	"regexp"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// reChatBias is the score chat starts with; a category must beat it to win.
const reChatBias = 1.0

// regexpEstimator is the fast capability estimator that runs in the request path
// without a model call. It is a linear classifier over hand-weighted
// features — keyword and phrase cues in English and Italian, code fences
// and code-like syntax, arithmetic and maths symbols, question types — one
// weight vector per category, argmax wins (the bag-of-features linear
// model of fastText, Joulin et al. 2017, with weights set by hand, not
// learned). Chat has a bias of reChatBias: another category must collect more
// than that to win. Difficulty is a logistic over length, question count,
// reasoning and constraint markers, tool use, language and category, after
// the query-difficulty signals that RouteLLM (Ong et al. 2024) and Hybrid LLM
// (Ding et al., ICLR 2024) learn from text; ours are hand-set.
//
// Adapter domains: every name that Domains returns (the T0 engine's adapter
// names, e.g. "billing" for "molly-demo:billing") becomes a category. Names
// with a built-in lexicon (support, billing, payments, legal, medical, hr)
// use it; any other name is matched as a word (and its stem) in the prompt.
// Accuracy on the labelled set in capability_test.go is asserted there.
//
// Safe for concurrent use.
type regexpEstimator struct {
	// Domains returns the adapter domains registered now; nil means none.
	Domains func() []string

	mu      sync.Mutex
	unknown map[string][]reFeature // rules made from unknown adapter names
}

// reMaxRunes bounds the text the keyword features scan (the head and
// the tail of longer prompts), so a multi-megabyte prompt costs the same
// as a 16k one. Length itself is counted on the whole prompt.
const reMaxRunes = 16 << 10

type reFeature struct {
	task string
	w    float64
	re   *regexp.Regexp
}

func reRule(task string, w float64, expr string) reFeature {
	return reFeature{task, w, regexp.MustCompile("(?i)" + expr)}
}

// reTaskFeatures: strong cues (an explicit instruction verb) weigh 2.5, weak
// ones 1.0–1.5. Patterns avoid \b after non-ASCII letters (Go's \b is ASCII).
var reTaskFeatures = []reFeature{
	// coding
	reRule(TaskCoding, 3, "```"),
	reRule(TaskCoding, 2, `\b(def|func|fn|class|public static|import|package|#include|console\.log|print)\b[^\n]*[({:]`),
	reRule(TaskCoding, 1.5, `(;\s*$|=>|:=|\)\s*\{|\bnull pointer|\bsegfault|\bstack ?trace|\btraceback\b|\bnpe\b)`),
	reRule(TaskCoding, 1.5, `\b(python|golang|javascript|typescript|java|rust|c\+\+|kotlin|swift|php|ruby|sql|regex|regexp|bash|shell script|html|css|react|docker|kubernetes|git|linux)\b`),
	reRule(TaskCoding, 1.5, `\b(function|funzione|method|metodo|variable|variabile|compile[rsd]?|compila\w*|debug\w*|refactor\w*|bug|exception|eccezione|unit tests?|codice|code|script|loop|array|endpoint|api|query|recursion|ricorsion\w*|algorithm|algoritmo)\b`),
	// math / reasoning
	reRule(TaskMath, 2.5, `\b(solve|risolvi|equation|equazione|equazioni|integral|integrale|derivative|derivata|theorem|teorema|prove that|dimostra che|factorial|fattoriale|square root|radice quadrata|prime numbers?|numer[oi] prim[oi]|matrix|matrice|eigen\w*|logarithm|logaritmo|probabilit\w*)\b`),
	reRule(TaskMath, 2, `\b(calculate|calcola|compute|how many|quant[ie] \w+ (ci sono|servono|rimangono|restano|fa|fanno)|percentage|percentuale|per ?cent|average|media di|sum of|somma di|word problem|problema di matematica)\b`),
	reRule(TaskMath, 1.5, `\b(prove|dimostra|dimostrare|lemma|corollary|induction|induzione)\b`),
	reRule(TaskMath, 1.5, `\d+(\.\d+)?\s*[-+*/^×÷]\s*\d+|\b\d+\s*%|\b[xy]\s*[\^²]|[∫∑√π≤≥≠∞]|\bx\s*=|\bkm/h\b|\b\d+\s*(euro|€|\$|dollars|km|kg|ore|hours|minut[ie]|minutes)\b`),
	// translation
	reRule(TaskTranslation, 3, `\b(translate|translation|translating|tradu(ci|rre|zione|ce|cimi|ca))\w*`),
	reRule(TaskTranslation, 2, `\b(how do you say|come si dice|(render|put) (this|it) (into|in) \w+|what does .{1,40} mean in|in (english|italian|french|german|spanish|portuguese|japanese|chinese|inglese|italiano|francese|tedesco|spagnolo|portoghese|giapponese|cinese))\b`),
	// summarisation
	reRule(TaskSummarisation, 3, `\b(summari[sz]\w*|summary|tl;?dr|riassum\w*|riassunto|sintetizz\w*|sintesi|condense|in a nutshell)\b`),
	reRule(TaskSummarisation, 1.5, `\b(key points|punti chiave|main points|punti principali|in (one|two|three|a few|poche|due|tre) (sentences?|lines?|bullets?|frasi|righe)|in breve|short version|recap)\b`),
	// extraction
	reRule(TaskExtraction, 3, `\b(extract|estra(i|rre|ere|tt\w*)|pull out|parse)\b`),
	reRule(TaskExtraction, 2, `\b(as json|in json|json|yaml|csv|list (all|every) (the )?\w+ (mentioned|in)|elenca tutt[ie]|trova tutt[ie]|find all|named entit\w*|fields|campi|table of|tabella)\b`),
	reRule(TaskExtraction, 1, `\b(dates?|date|names?|nomi|amounts?|importi|emails?|addresses|indirizzi|phone numbers|numeri di telefono)\b (mentioned|menzionat\w*|nel testo|in the text|from (the|this))`),
	// classification
	reRule(TaskClassification, 3, `\b(classify|classifica|categori[sz]e|categorizza\w*|sentiment|label (this|these|each)|etichetta)\b`),
	reRule(TaskClassification, 2, `\b(positive or negative|positivo o negativo|positiva o negativa|spam|which category|quale categoria|what category|intent of|toxic|tossico)\b`),
	// creative
	reRule(TaskCreative, 3, `\b(poem|poesia|haiku|limerick|sonnet|sonetto|lyrics|song|canzone|short story|racconto|fairy tale|favola|filastrocca|once upon a time|c'era una volta|slogan|tagline)\b`),
	reRule(TaskCreative, 2, `\b(write|scrivi|compose|componi|invent\w*|imagine|immagina)\b.{0,30}\b(story|storia|poem|rhyme|rima|rime|character|personaggio|dialogue|dialogo|scene|scena|names? for|nomi per|tale|joke|barzelletta)\b`),
	reRule(TaskCreative, 1.5, `\b(brainstorm|creative|creativ[oa]|fiction|rhym\w*)\b`),
}

// reDomainLexicons are the cues of well-known adapter domains, English and
// Italian. Each matched rule adds its weight.
var reDomainLexicons = map[string][]reFeature{
	"support": {
		reRule("support", 2, `\b(can't|cannot|unable to|non riesco ad?|impossibile)\s+(log ?in|sign in|access|accedere|entrare|connect\w*|collegarmi|login)`),
		reRule("support", 2, `\b(password reset|reset (my )?password|reimpost\w*|forgot (my )?password|password dimenticata|account (is )?(locked|blocked|bloccato)|two.factor|2fa)\b`),
		reRule("support", 1.5, `\b(not working|doesn't work|does not work|non funziona|stopped working|smesso di funzionare|keeps crashing|crash\w*|si blocca|error message|messaggio di errore|ticket|help desk|customer service|assistenza|supporto|tracking|spedizione|delivery|consegna|order status|stato dell'ordine|ordine)\b`),
	},
	"billing": {
		reRule("billing", 2, `\b(invoice|invoices|fattur\w*|bill|billing|bolletta|bollette|charged twice|double charge|addebitat\w*|addebito|overcharged|refund|rimbors\w*)\b`),
		reRule("billing", 1.5, `\b(subscription|abbonamento|plan|piano tariffario|renewal|rinnovo|vat|iva|receipt|ricevuta|pricing tier|disdire|cancel (my )?subscription|upgrade (my )?plan)\b`),
	},
	"payments": {
		reRule("payments", 2, `\b(payment|payments|pagament\w*|pagare|card (was )?declined|carta (è stata )?rifiutata|credit card|carta di credito|debit card|bank transfer|bonifico|wire transfer|iban|sepa|chargeback|storno|paypal|checkout|transaction|transazion\w*)\b`),
		reRule("payments", 1, `\b(pos|merchant|esercente|3-?d ?secure|acquirer|payout|settlement)\b`),
	},
	"legal": {
		reRule("legal", 2, `\b(contract|contratto|contratti|clause|clausola|clausole|gdpr|liabilit\w*|liable|lawsuit|causa legale|terms and conditions|termini e condizioni|lawyer|avvocato|court|tribunale|jurisdiction|giurisdizione|non-compete|non concorrenza|nda|indemnif\w*|copyright|trademark|marchio)\b`),
		reRule("legal", 1.5, `\b(legal|legale|legally|law|legge|leggi|compliance|regulation|regolamento|enforceable|valid[ao]? (under|per) (the )?(law|legge)|sue|citare in giudizio|privacy policy|diritto)\b`),
	},
	"medical": {
		reRule("medical", 2, `\b(symptoms?|sintomi|diagnos\w*|dosage|dosaggio|medication|farmac\w*|prescription|ricetta medica|doctor|medico|patient|paziente|disease|malattia)\b`),
	},
	"hr": {
		reRule("hr", 2, `\b(payroll|busta paga|vacation days|ferie|parental leave|congedo|hiring|assunzion\w*|onboarding|performance review|valutazione annuale|employee|dipendent\w*)\b`),
	},
}

// difficulty features.
var (
	reReasoning  = regexp.MustCompile(`(?i)\b(prove|dimostra|step by step|passo passo|explain why|spiega perch|derive|deriva|optimi[sz]e|ottimizza|design|progetta|architecture|architettura|trade-?offs?|compare|confronta|analy[sz]e|analizza|edge cases?|casi limite|complexity|complessit|rigorous|rigoros)`)
	reConstraint = regexp.MustCompile(`(?i)\b(must|should|at least|at most|without|exactly|only|deve|devono|almeno|al massimo|senza|esattamente|solo)\b`)
	reEnStop     = regexp.MustCompile(`(?i)\b(the|and|is|are|of|to|what|how|my|this|with|for|you|can|please)\b`)
	reItStop     = regexp.MustCompile(`(?i)\b(il|lo|la|gli|le|di|che|è|non|per|una|un|con|mi|come|questo|questa|sono|del|della|puoi)\b`)
)

// reDifficultyOffset shifts the difficulty logit by category.
var reDifficultyOffset = map[string]float64{
	TaskMath: 0.6, TaskCoding: 0.5, TaskExtraction: 0.1, TaskClassification: -0.4, TaskChat: -0.4,
	TaskTranslation: -0.1, TaskSummarisation: 0, TaskCreative: 0, "legal": 0.3,
}

// newRegexpEstimator returns an estimator whose adapter domains come from domains (nil: none).
func newRegexpEstimator(domains func() []string) *regexpEstimator {
	return &regexpEstimator{Domains: domains}
}

// Estimate scores text (the last user message, or the prompt) and returns
// the task, difficulty and language. tools says whether the request
// declares tools or carries tool messages.
func (e *regexpEstimator) Estimate(text string, tools bool) Estimate {
	scan := reClip(text)
	scores := map[string]float64{TaskChat: reChatBias}
	for _, f := range reTaskFeatures {
		if f.re.MatchString(scan) {
			scores[f.task] += f.w
		}
	}
	var domains []string
	if e != nil && e.Domains != nil {
		domains = e.Domains()
	}
	for _, d := range domains {
		for _, f := range e.reDomainFeatures(d) {
			if f.re.MatchString(scan) {
				scores[d] += f.w
			}
		}
	}
	var out Estimate
	for _, t := range Tasks {
		if s, ok := scores[t]; ok {
			out.Scores = append(out.Scores, CategoryScore{t, s})
		}
	}
	slices.Sort(domains)
	for _, d := range slices.Compact(domains) {
		if s, ok := scores[d]; ok && !slices.Contains(Tasks, d) {
			out.Scores = append(out.Scores, CategoryScore{d, s})
		}
	}
	// Stable: ties keep the built-in order, then domains alphabetically.
	slices.SortStableFunc(out.Scores, func(a, b CategoryScore) int {
		switch {
		case a.Score > b.Score:
			return -1
		case a.Score < b.Score:
			return 1
		}
		return 0
	})
	out.Task = out.Scores[0].Task
	out.Language = reLanguage(scan)
	out.Difficulty = reDifficulty(text, scan, out.Task, tools, out.Language)
	return out
}

func (e *regexpEstimator) reDomainFeatures(d string) []reFeature {
	if fs, ok := reDomainLexicons[d]; ok {
		return fs
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if fs, ok := e.unknown[d]; ok {
		return fs
	}
	var fs []reFeature
	// An unknown name: the word itself, or its stem without an English
	// inflection (so "shipping" also matches "shipped"). Names that are not
	// plain words (e.g. "v2") get no rule and never win.
	if name := strings.ToLower(d); len(name) >= 3 && reIsWord(name) {
		stem := name
		for _, suf := range []string{"ing", "ed", "es", "s"} {
			if len(stem)-len(suf) >= 4 && strings.HasSuffix(stem, suf) {
				stem = strings.TrimSuffix(stem, suf)
				break
			}
		}
		fs = []reFeature{reRule(d, 2, `\b`+regexp.QuoteMeta(stem)+`\w*`)}
	}
	if e.unknown == nil {
		e.unknown = map[string][]reFeature{}
	}
	e.unknown[d] = fs
	return fs
}

func reIsWord(s string) bool {
	for _, r := range s {
		if r > unicode.MaxASCII || !unicode.IsLetter(r) {
			return false
		}
	}
	return true
}

// clip keeps the head and tail of a long text (reMaxRunes in all).
func reClip(s string) string {
	if len(s) <= reMaxRunes { // bytes ≥ runes: short enough
		return s
	}
	if utf8.RuneCountInString(s) <= reMaxRunes {
		return s
	}
	r := []rune(s)
	head := reMaxRunes * 3 / 4
	return string(r[:head]) + "\n" + string(r[len(r)-(reMaxRunes-head):])
}

func reLanguage(s string) string {
	en := len(reEnStop.FindAllStringIndex(s, 50))
	it := len(reItStop.FindAllStringIndex(s, 50))
	switch {
	case en == 0 && it == 0:
		return ""
	case it > en:
		return "it"
	case en > it:
		return "en"
	}
	return ""
}

// Difficulty weights: the logit is
//
//	−1.6 + 0.5·ln(1+tokens/40) + 0.25·min(questions−1, 3) + 0.8·min(reasoning cues, 2)
//	     + 0.3·min(constraints, 3) + 0.4·tools + 0.3·[code lines > 20] + 0.2·[not English]
//	     + offset(task)
//
// so "hello" scores ≈ 0.12 and a long multi-part proof ≈ 0.9.
func reDifficulty(text, scan, task string, tools bool, lang string) float64 {
	z := -1.6
	z += 0.5 * math.Log1p(float64((utf8.RuneCountInString(text)+3)/4)/40)
	if q := strings.Count(scan, "?"); q > 1 {
		z += 0.25 * float64(min(q-1, 3))
	}
	z += 0.8 * float64(min(len(reReasoning.FindAllStringIndex(scan, 2)), 2))
	z += 0.3 * float64(min(len(reConstraint.FindAllStringIndex(scan, 3)), 3))
	if tools {
		z += 0.4
	}
	if strings.Contains(scan, "```") && strings.Count(scan, "\n") > 20 {
		z += 0.3
	}
	if lang != "en" {
		z += 0.2
	}
	z += reDifficultyOffset[task]
	return 1 / (1 + math.Exp(-z))
}
