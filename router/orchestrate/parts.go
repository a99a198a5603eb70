package orchestrate

import (
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/molly-gateway/molly/router/capability"
)

// MaxParts bounds the parts SplitParts cuts a message into; the rest
// joins the last part.
const MaxParts = 8

// Parts is the last user message cut into the pieces a plan addresses as
// part:<index>.
type Parts struct {
	// Preamble is the text before the first list item: context every part
	// is shown with.
	Preamble string
	Items    []string
	// Tasks is each item's category (capability.Estimator).
	Tasks []string
}

var (
	listMarker = regexp.MustCompile(`^\s*(?:\(?\d{1,2}[.):]|[-*•]|\(?[a-h]\))\s+`)
	// sentenceEnd is the end of a sentence: terminal punctuation, then
	// white space and an upper-case letter or a digit.
	sentenceEnd = regexp.MustCompile(`[.?!;]+\s+`)
	// inlineMarker is a piece that is only a list marker written inline
	// ("… invoice? 2. Is clause 7 …"): it opens the next sentence.
	inlineMarker = regexp.MustCompile(`^\(?(?:\d{1,2}|[a-h])[.):]$`)
)

// SplitParts cuts text, the last user message, into parts, deterministically:
//
//  1. two or more lines that start with a list marker ("1.", "2)", "-",
//     "*", "•", "a)") make one part each (a marker-less line continues
//     the item above; the lines before the first item are the Preamble);
//  2. otherwise the text is cut into sentences (terminal punctuation and
//     white space before an upper-case letter or a digit), each sentence
//     estimated by est, and consecutive sentences of the same category
//     joined; a chat sentence (no category of its own) joins the part
//     before it, or the one after it at the start.
//
// At most MaxParts parts; the rest joins the last. Every item's task is
// in Tasks.
func SplitParts(text string, est *capability.Estimator) Parts {
	var p Parts
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	markers := 0
	for _, l := range lines {
		if listMarker.MatchString(l) {
			markers++
		}
	}
	if markers >= 2 {
		var pre []string
		for _, l := range lines {
			switch {
			case listMarker.MatchString(l):
				p.Items = append(p.Items, strings.TrimSpace(listMarker.ReplaceAllString(l, "")))
			case len(p.Items) == 0:
				pre = append(pre, l)
			case strings.TrimSpace(l) != "":
				p.Items[len(p.Items)-1] += "\n" + strings.TrimSpace(l)
			}
		}
		p.Preamble = strings.TrimSpace(strings.Join(pre, "\n"))
		for _, it := range p.Items {
			p.Tasks = append(p.Tasks, est.Estimate(it, false).Task)
		}
	} else {
		for _, s := range sentences(text) {
			task := est.Estimate(s, false).Task
			n := len(p.Items)
			switch {
			case n > 0 && (task == p.Tasks[n-1] || task == capability.TaskChat):
				p.Items[n-1] += " " + s
			case n == 1 && p.Tasks[0] == capability.TaskChat:
				p.Items[0] += " " + s
				p.Tasks[0] = task
			default:
				p.Items = append(p.Items, s)
				p.Tasks = append(p.Tasks, task)
			}
		}
	}
	if len(p.Items) > MaxParts {
		rest := strings.Join(p.Items[MaxParts-1:], "\n")
		p.Items = append(p.Items[:MaxParts-1], rest)
		p.Tasks = append(p.Tasks[:MaxParts-1], est.Estimate(rest, false).Task)
	}
	return p
}

// sentences cuts text at sentence ends (see SplitParts), trimming each;
// an inline list marker ("2.") is dropped, not made a sentence of its own.
func sentences(text string) []string {
	var out []string
	start := 0
	for _, m := range sentenceEnd.FindAllStringIndex(text, -1) {
		next, _ := utf8.DecodeRuneInString(text[m[1]:])
		if !unicode.IsUpper(next) && !unicode.IsDigit(next) {
			continue
		}
		if s := strings.TrimSpace(text[start:m[1]]); s != "" && !inlineMarker.MatchString(s) {
			out = append(out, s)
		}
		start = m[1]
	}
	if s := strings.TrimSpace(text[start:]); s != "" {
		out = append(out, s)
	}
	return out
}

// dependencyCues open (or appear in) a part that builds on the part
// before it: least-to-most prompting (Zhou et al., "Least-to-Most
// Prompting Enables Complex Reasoning in Large Language Models", ICLR
// 2023) answers such a part after the one it builds on, with its answer.
var (
	dependencyOpeners = []string{"then", "after that", "afterwards", "next,", "finally", "using", "based on", "with that", "given that",
		"poi", "dopo", "quindi", "in base a", "usando"}
	dependencyPhrases = []string{"the result", "the above", "previous answer", "that answer", "the answer to", "il risultato"}
)

// buildsOnPrevious reports a dependency cue in part.
func buildsOnPrevious(part string) bool {
	s := strings.ToLower(strings.TrimSpace(part))
	for _, o := range dependencyOpeners {
		if strings.HasPrefix(s, o) && (len(s) == len(o) || !isLetter(s[len(o)])) {
			return true
		}
	}
	for _, ph := range dependencyPhrases {
		if strings.Contains(s, ph) {
			return true
		}
	}
	return false
}

func isLetter(b byte) bool { return b >= 'a' && b <= 'z' }

// mentions reports whether text names word as a whole word (any case).
func mentions(text, word string) bool {
	t, w := strings.ToLower(text), strings.ToLower(word)
	for i := 0; ; {
		j := strings.Index(t[i:], w)
		if j < 0 {
			return false
		}
		j += i
		before := j == 0 || !isLetter(t[j-1])
		after := j+len(w) == len(t) || !isLetter(t[j+len(w)])
		if before && after {
			return true
		}
		i = j + 1
	}
}

// shorten cuts s to at most n runes on a word boundary, with "…".
func shorten(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)[:n]
	if i := strings.LastIndexByte(string(r), ' '); i > n/2 {
		return string(r)[:i] + "…"
	}
	return string(r) + "…"
}
