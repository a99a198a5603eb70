package capability

import (
	"bufio"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// labelledPrompt is one hand-labelled prompt of a testdata set.
type labelledPrompt struct {
	task, prompt string
	line         int
}

// loadSet reads a labelled set: "label<TAB>prompt" lines, the prompt a Go
// double-quoted string; '#' lines are comments.
func loadSet(t *testing.T, name string) []labelledPrompt {
	t.Helper()
	f, err := os.Open("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []labelledPrompt
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		task, quoted, ok := strings.Cut(line, "\t")
		if !ok {
			t.Fatalf("%s:%d: no tab", name, n)
		}
		prompt, err := strconv.Unquote(quoted)
		if err != nil {
			t.Fatalf("%s:%d: prompt: %v", name, n, err)
		}
		out = append(out, labelledPrompt{task, prompt, n})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

var demoDomains = []string{"support", "billing", "payments", "legal"}

// accuracy scores estimate on set, logs the misses and the confusion
// table, and returns the number correct.
func accuracy(t *testing.T, name string, set []labelledPrompt, estimate func(string) string) int {
	t.Helper()
	cats := append(slices.Clone(Tasks), demoDomains...)
	confusion := map[string]map[string]int{}
	correct := 0
	for _, l := range set {
		got := estimate(l.prompt)
		if confusion[l.task] == nil {
			confusion[l.task] = map[string]int{}
		}
		confusion[l.task][got]++
		if got == l.task {
			correct++
		} else {
			t.Logf("%s miss (line %d): %-14s → %-14s %q", name, l.line, l.task, got, l.prompt)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-15s", "label \\ got")
	for _, c := range cats {
		fmt.Fprintf(&b, "%6.5s", c)
	}
	b.WriteString("\n")
	for _, row := range cats {
		fmt.Fprintf(&b, "%-15s", row)
		for _, col := range cats {
			fmt.Fprintf(&b, "%6d", confusion[row][col])
		}
		b.WriteString("\n")
	}
	t.Logf("%s: %d/%d = %.3f\n%s", name, correct, len(set), float64(correct)/float64(len(set)), b.String())
	return correct
}

// TestEstimatorAccuracy measures the automaton and the regexp estimator
// it replaces on the three labelled sets, with the demo adapters
// registered. The automaton must do at least as well as the regexp
// estimator on every set, and reach the floors below, which are the
// accuracies it had when this test was written (the independent set's was
// measured once, after the lexicons were written, and never tuned on).
func TestEstimatorAccuracy(t *testing.T) {
	sets := []struct {
		file     string
		minSize  int
		floorNew float64
	}{
		{"insample.tsv", 110, 1.0},
		{"heldout.tsv", 40, 0.977},
		{"independent.tsv", 120, 0.55},
	}
	e := NewEstimator(func() []string { return demoDomains })
	old := newRegexpEstimator(func() []string { return demoDomains })
	for _, s := range sets {
		t.Run(s.file, func(t *testing.T) {
			set := loadSet(t, s.file)
			if len(set) < s.minSize {
				t.Fatalf("%s has %d prompts, want at least %d", s.file, len(set), s.minSize)
			}
			nNew := accuracy(t, "automaton", set, func(p string) string { return e.Estimate(p, false).Task })
			nOld := accuracy(t, "regexp", set, func(p string) string { return old.Estimate(p, false).Task })
			accNew, accOld := float64(nNew)/float64(len(set)), float64(nOld)/float64(len(set))
			t.Logf("%s: automaton %d/%d = %.3f, regexp %d/%d = %.3f", s.file, nNew, len(set), accNew, nOld, len(set), accOld)
			if nNew < nOld {
				t.Errorf("automaton %d/%d correct, regexp estimator %d/%d: the automaton must not be worse", nNew, len(set), nOld, len(set))
			}
			if accNew < s.floorNew-1e-9 {
				t.Errorf("automaton accuracy %.3f, want at least %.3f", accNew, s.floorNew)
			}
		})
	}
}

func TestEstimatorDomains(t *testing.T) {
	tests := []struct {
		name    string
		domains []string
		prompt  string
		want    string
	}{
		{"a billing question without the billing adapter is chat", nil, "I was charged twice on my last invoice", "chat"},
		{"the same question with the billing adapter is billing", []string{"billing"}, "I was charged twice on my last invoice", "billing"},
		{"an adapter name without a lexicon matches as a word", []string{"shipping"}, "When will my package be shipped?", "shipping"},
		{"an adapter name that is no word never wins", []string{"v2"}, "tell me about v2", "chat"},
		{"a strong generic cue beats a domain cue", demoDomains, "Summarise this contract in two lines", "summarisation"},
		{"domains in any order and repeated are the same set", []string{"legal", "billing", "legal"}, "I was charged twice on my last invoice", "billing"},
		{"an adapter named like a built-in task adds to that task", []string{"coding"}, "I love coding", "coding"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := NewEstimator(func() []string { return tt.domains })
			if got := e.Estimate(tt.prompt, false); got.Task != tt.want {
				t.Fatalf("Task = %q, want %q (scores %v)", got.Task, tt.want, got.Scores)
			}
		})
	}
}

func TestEstimatorReusesTheAutomatonForTheSameDomains(t *testing.T) {
	ds := []string{"legal", "billing"}
	e := NewEstimator(func() []string { return ds })
	e.Estimate("hello", false)
	m := e.model.Load()
	ds = []string{"billing", "legal", "billing"}
	e.Estimate("hello", false)
	if e.model.Load() != m {
		t.Fatal("a reordered domain list compiled a new automaton")
	}
	ds = []string{"billing"}
	if got := e.Estimate("my last invoice", false).Task; got != "billing" || e.model.Load() == m {
		t.Fatalf("after the domains changed: task %q, model changed %v; want billing and a new model", got, e.model.Load() != m)
	}
	if got := e.Estimate("can I sue my landlord over the contract?", false).Task; got == "legal" {
		t.Fatal("legal was unregistered but still won")
	}
}

func TestNilAndZeroEstimatorsHaveNoDomains(t *testing.T) {
	var nilE *Estimator
	var zero Estimator
	for _, e := range []*Estimator{nilE, &zero, NewEstimator(nil)} {
		if got := e.Estimate("I was charged twice on my last invoice", false).Task; got != TaskChat {
			t.Fatalf("Task = %q, want chat", got)
		}
		if got := e.Estimate("Translate this into French", false).Task; got != TaskTranslation {
			t.Fatalf("Task = %q, want translation", got)
		}
	}
}

func TestEstimatorDifficulty(t *testing.T) {
	sig := func(z float64) float64 { return 1 / (1 + math.Exp(-z)) }
	tests := []struct {
		name   string
		prompt string
		tools  bool
		want   float64
	}{
		// "hello": 2 tokens, chat, no stop word (language "").
		{"a greeting is easy", "hello", false, sig(-1.6 + 0.5*math.Log1p(2.0/40) + 0.2 - 0.4)},
		{"tools add 0.4 to the logit", "hello", true, sig(-1.6 + 0.5*math.Log1p(2.0/40) + 0.2 - 0.4 + 0.4)},
		// 58 runes → 15 tokens; math; "prove" and "step by step"; "must"; English.
		{"a proof step by step is hard", "Prove step by step that the sum must be even for all n > 1", false,
			sig(-1.6 + 0.5*math.Log1p(15.0/40) + 0.8*2 + 0.3*1 + 0.6)},
		// 61 runes → 16 tokens; 3 questions; "compare"; math ("calculate"); English.
		{"questions beyond the first add 0.25 each", "Why? How? Can you compare them and calculate the mean of both?", false,
			sig(-1.6 + 0.5*math.Log1p(16.0/40) + 0.25*2 + 0.8*1 + 0.6)},
		// 33 runes → 9 tokens; "étape par étape"; translation ("traduis"); French.
		{"French reasoning cues count", "Traduis ce texte étape par étape.", false,
			sig(-1.6 + 0.5*math.Log1p(9.0/40) + 0.8*1 + 0.2 - 0.1)},
	}
	e := NewEstimator(nil)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := e.Estimate(tt.prompt, tt.tools)
			if math.Abs(got.Difficulty-tt.want) > 1e-12 {
				t.Fatalf("Difficulty = %.6f, want %.6f (task %s, language %q)", got.Difficulty, tt.want, got.Task, got.Language)
			}
		})
	}
	t.Run("difficulty grows with length", func(t *testing.T) {
		short := e.Estimate("Explain recursion", false).Difficulty
		long := e.Estimate(strings.Repeat("Explain recursion with examples and edge cases. ", 40), false).Difficulty
		if !(short < long && long <= 1 && short >= 0) {
			t.Fatalf("short %.3f, long %.3f", short, long)
		}
	})
	t.Run("a long code block adds 0.3", func(t *testing.T) {
		code := "```\n" + strings.Repeat("x\n", 21) + "```"
		// 50 runes → 13 tokens; coding (fence); no stop word.
		want := sig(-1.6 + 0.5*math.Log1p(13.0/40) + 0.3 + 0.2 + 0.5)
		if got := e.Estimate(code, false).Difficulty; math.Abs(got-want) > 1e-12 {
			t.Fatalf("Difficulty = %.6f, want %.6f", got, want)
		}
	})
}

func TestEstimatorLanguage(t *testing.T) {
	tests := []struct{ prompt, want string }{
		{"What is the capital of France and how big is it?", "en"},
		{"Qual è la capitale della Francia e quanto è grande?", "it"},
		{"Quelle est la capitale de la France et est-ce que vous pouvez la décrire pour nous?", "fr"},
		{"Was ist die Hauptstadt von Frankreich und wie groß ist sie?", "de"},
		{"¿Cuál es la capital de Francia y por qué es tan famosa para los turistas?", "es"},
		{"12345", ""},
	}
	e := NewEstimator(nil)
	for _, tt := range tests {
		if got := e.Estimate(tt.prompt, false).Language; got != tt.want {
			t.Errorf("Language(%q) = %q, want %q", tt.prompt, got, tt.want)
		}
	}
}

func TestEstimateEntropy(t *testing.T) {
	one := Estimate{Scores: []CategoryScore{{"coding", 10}}}
	two := Estimate{Scores: []CategoryScore{{"coding", 1}, {"math", 1}}}
	if one.Entropy() != 0 || math.Abs(two.Entropy()-math.Ln2) > 1e-12 {
		t.Fatalf("entropies %v, %v; want 0 and ln 2", one.Entropy(), two.Entropy())
	}
	// "Summarise and translate this text": summarisation 3, translation 3,
	// chat 1, so the softmax is (1, 1, e^-2)/(2+e^-2).
	got := NewEstimator(nil).Estimate("Summarise and translate this text", false)
	z := 2 + math.Exp(-2)
	want := -2*(1/z)*math.Log(1/z) - (math.Exp(-2)/z)*math.Log(math.Exp(-2)/z)
	if math.Abs(got.Entropy()-want) > 1e-12 {
		t.Fatalf("Entropy = %v, want %v (scores %v)", got.Entropy(), want, got.Scores)
	}
}

func TestNormalise(t *testing.T) {
	tests := []struct{ in, want string }{
		{"Hello, World!", " hello , world ! \n "},
		{"x=12.5", " x = 0 . 0 \n "},
		{"  two\t\tspaces  ", " two spaces \n "},
		{"a\n\n\nb", " a \n b \n "},
		{"Perché CITTÀ über Straße Œuvre", " perche citta ueber strasse oeuvre \n "},
		{"can’t “quoted” a–b…", " can ' t \" quoted \" a - b . \n "},
		{"2fa sha256 1,000,000", " 0fa sha0 0 , 0 , 0 \n "},
		{"```go", " ` ` ` go \n "},
		{"3×4 ≤ π²", " 0 × 0 ≤ π ² \n "},
		{"zero\u200bwidth soft\u00adhyphen", " zerowidth softhyphen \n "},
		{"Привет мир", " \x80\x80\x80\x80\x80\x80 \x80\x80\x80 \n "},
		{"emoji 🙂 ok", " emoji \x81 ok \n "},
		{"bad \xff byte", " bad \x81 byte \n "},
		{"e\u0301te", " ete \n "},
	}
	for _, tt := range tests {
		want := tt.want
		// The maths symbols are written in the table as themselves; map
		// them to their codes.
		for i, r := range mathSymbols {
			want = strings.ReplaceAll(want, string(r), string([]byte{codeMath + byte(i)}))
		}
		if got := normalise(tt.in, true); got != want {
			t.Errorf("normalise(%q) = %q, want %q", tt.in, got, want)
		}
	}
}

// TestAutomatonCountsEveryOccurrence checks the automaton against a naive
// search: random phrases over a small alphabet, random texts, every
// (overlapping) occurrence of every phrase in the normalised text counted.
func TestAutomatonCountsEveryOccurrence(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	words := []string{"a", "ab", "b", "ba", "abc", "c", "0", "(", "'", "\n"}
	phrase := func(n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(words[r.IntN(len(words))])
		}
		return b.String()
	}
	for round := range 50 {
		var ps phraseSet
		var specs []string
		seen := map[string]bool{}
		for len(specs) < 12 {
			p := phrase(1 + r.IntN(3))
			if r.IntN(3) == 0 && !strings.ContainsAny(p[len(p)-1:], "0('\n") {
				p += "*"
			}
			if strings.TrimSpace(p) == "" || seen[p] {
				continue
			}
			seen[p] = true
			if err := ps.add(p, action{kind: actCount, cue: int32(len(specs))}); err != nil {
				t.Fatal(err)
			}
			specs = append(specs, p)
		}
		a := ps.build()
		for range 20 {
			text := phrase(r.IntN(30))
			st := scanState{counts: make([]int32, len(specs))}
			norm := normalise(text, true)
			a.feed([]byte(norm), &st)
			for k, p := range specs {
				pat := normalise(strings.TrimSuffix(p, "*"), false)
				if !strings.HasSuffix(p, "*") && !strings.HasSuffix(pat, " ") {
					pat += " "
				}
				want := 0
				for i := 0; i+len(pat) <= len(norm); i++ {
					if norm[i:i+len(pat)] == pat {
						want++
					}
				}
				if int(st.counts[k]) != want {
					t.Fatalf("round %d: phrase %q in %q (normalised %q): %d matches, want %d", round, p, text, norm, st.counts[k], want)
				}
			}
		}
	}
}

// TestScanIsFeedingTheNormalisedStream checks the scanner's fast paths
// against the plain automaton over normalise's output, with every cue of
// every lexicon, on random texts of words, accents, digits, symbols and
// white space.
func TestScanIsFeedingTheNormalisedStream(t *testing.T) {
	var all []string
	for d := range domainLexicons {
		all = append(all, d)
	}
	slices.Sort(all)
	m, err := compile(all)
	if err != nil {
		t.Fatal(err)
	}
	pieces := []string{"the", "summarise", "Translate", "can't", "log in", "x", "0", "12", "3.5", "%", "(", "{", ":", ";", "```",
		"è", "perché", "Übersetze", "日本", "🙂", " ", "  ", "\n", "\t", "\r\n", "?", "'", "’", "-", "print", "story", "write", "\xff", "\u200b"}
	r := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		var b strings.Builder
		for range r.IntN(40) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		text := b.String()
		got := m.pool.Get().(*state)
		z := m.scan(text, got)
		want := scanState{counts: make([]int32, len(m.cueCat)), marks: make([]int32, len(m.ac.pairs))}
		m.ac.start(&want)
		m.ac.feed([]byte(normalise(text, true)[1:]), &want) // start fed the leading space
		if !slices.Equal(got.counts, want.counts) || !slices.Equal(got.marks, want.marks) || got.tok != want.tok || got.nl != want.nl {
			t.Fatalf("text %q: scan counts %v marks %v tok %d nl %d; feed counts %v marks %v tok %d nl %d",
				text, got.counts, got.marks, got.tok, got.nl, want.counts, want.marks, want.tok, want.nl)
		}
		if wantQ := strings.Count(text, "?"); z.questions != wantQ {
			t.Fatalf("text %q: %d questions, want %d", text, z.questions, wantQ)
		}
		m.pool.Put(got)
	}
}

func TestNearCues(t *testing.T) {
	tests := []struct {
		name   string
		prompt string
		fires  bool
	}{
		{"a verb and its object", "write me a story", true},
		{"six tokens between", "write one two three four five six story", true},
		{"seven tokens between", "write one two three four five six seven story", false},
		{"the object first", "a story to write", false},
		{"across a line break within the gap", "write\nstory", true},
	}
	m := modelFor(nil)
	creative := -1
	for i, c := range taskCues {
		if c.cat == TaskCreative && len(c.near) > 0 {
			creative = i // task cues are compiled first, in order
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := m.pool.Get().(*state)
			defer m.pool.Put(st)
			m.scan(tt.prompt, st)
			if got := st.counts[creative] > 0; got != tt.fires {
				t.Fatalf("write…story cue fired %v, want %v", got, tt.fires)
			}
		})
	}
	t.Run("a code call must be on the keyword's line", func(t *testing.T) {
		e := NewEstimator(nil)
		if got := e.Estimate("print(x)", false).Scores; got[0].Task != TaskCoding {
			t.Fatalf("print(x): scores %v, want coding first", got)
		}
		if got := e.Estimate("print\n(x)", false).Task; got != TaskChat {
			t.Fatalf("print, newline, (x): task %q, want chat", got)
		}
	})
	t.Run("exactly one word between", func(t *testing.T) {
		e := NewEstimator(nil)
		if got := e.Estimate("quanti giorni restano", false).Task; got != TaskMath {
			t.Fatalf("task %q, want math", got)
		}
		if got := e.Estimate("quanti restano", false).Task; got != TaskChat {
			t.Fatalf("task %q, want chat", got)
		}
	})
}

func TestEstimatorScansTheHeadAndTailOfLongPrompts(t *testing.T) {
	filler := strings.Repeat("lorem ipsum dolor sit amet ", 2000) // 54,000 bytes
	e := NewEstimator(nil)
	tests := []struct {
		name, prompt, want string
	}{
		{"a cue in the head counts", "Translate this: " + filler, TaskTranslation},
		{"a cue in the tail counts", filler + " translate this", TaskTranslation},
		{"a cue in the middle is outside the window", filler[:20000] + " translate this " + filler[:20000], TaskChat},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := e.Estimate(tt.prompt, false).Task; got != tt.want {
				t.Fatalf("Task = %q, want %q", got, tt.want)
			}
		})
	}
	t.Run("length counts the whole prompt", func(t *testing.T) {
		short := e.Estimate(filler[:20000], false).Difficulty
		long := e.Estimate(filler, false).Difficulty
		if !(long > short) {
			t.Fatalf("difficulty %v at 20 kB, %v at 54 kB; want it to grow", short, long)
		}
	})
	t.Run("the cut keeps runes whole", func(t *testing.T) {
		for _, s := range []string{"a" + strings.Repeat("è", MaxScanBytes), strings.Repeat("日本語", MaxScanBytes/3), strings.Repeat("x", MaxScanBytes+1)} {
			head, tail := window(s)
			if !utf8.ValidString(head) || !utf8.ValidString(tail) || len(head) > headBytes || len(tail) > MaxScanBytes-headBytes ||
				len(head) < headBytes-3 || len(tail) < MaxScanBytes-headBytes-3 {
				t.Fatalf("window of %d bytes: head %d bytes (valid %v), tail %d bytes (valid %v)",
					len(s), len(head), utf8.ValidString(head), len(tail), utf8.ValidString(tail))
			}
		}
		if head, tail := window("short"); head != "short" || tail != "" {
			t.Fatalf("window(short) = %q, %q", head, tail)
		}
	})
}

func TestRuneCount(t *testing.T) {
	for _, s := range []string{"", "a", "hello, world", "perché città", "日本語のテキスト", "🙂🙂 mixed ascii and ünïcödé 12345678",
		strings.Repeat("abcdefgè", 100), strings.Repeat("日本語", 10000), strings.Repeat("🙂", 5000) + "x"} {
		if got, want := runeCount(s), utf8.RuneCountInString(s); got != want {
			t.Errorf("runeCount of %d bytes starting %q = %d, want %d", len(s), s[:min(len(s), 12)], got, want)
		}
	}
}

func TestLexiconsCompile(t *testing.T) {
	var all []string
	for d := range domainLexicons {
		all = append(all, d)
	}
	slices.Sort(all)
	all = append(all, "shipping")
	m, err := compile(all)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d cues, %d states, %d byte classes, %d KiB of transitions",
		len(m.cueCat), len(m.ac.first)-1, m.ac.nc, len(m.ac.delta)*4/1024)
	for _, bad := range []string{"{a,b", "a}", " ", "a||b", "{,}"} {
		var ps phraseSet
		if err := ps.add(bad, action{}); err == nil {
			t.Errorf("phrase %q: no error", bad)
		}
	}
}

func TestEstimateAllocatesOnlyTheScores(t *testing.T) {
	if raceEnabled {
		t.Skip("allocations are not counted under the race detector: sync.Pool drops items at random there")
	}
	prompt := strings.Repeat("Please summarise the invoice below and extract the total as JSON. ", 40)
	var nilE *Estimator
	for _, e := range []*Estimator{NewEstimator(func() []string { return demoDomains }), nilE} {
		e.Estimate(prompt, false)
		if n := testing.AllocsPerRun(100, func() { e.Estimate(prompt, false) }); n > 1 {
			t.Fatalf("%v allocations per Estimate, want 1 (the Scores slice)", n)
		}
	}
}

func TestEstimatorIsSafeForConcurrentUse(t *testing.T) {
	domains := [][]string{nil, {"billing"}, demoDomains}
	e := NewEstimator(nil)
	done := make(chan string)
	for g := range 4 {
		go func() {
			for i := range 200 {
				if g == 0 && i%50 == 0 {
					ds := domains[i/50%len(domains)]
					e.SetDomains(func() []string { return ds })
				}
				if got := e.Estimate("Translate this into German, please", false).Task; got != TaskTranslation {
					done <- got
					return
				}
			}
			done <- ""
		}()
	}
	for range 4 {
		if got := <-done; got != "" {
			t.Errorf("Task = %q, want translation", got)
		}
	}
}

// FuzzEstimate checks the estimate's invariants on any text.
func FuzzEstimate(f *testing.F) {
	for _, s := range []string{"", "hello", "```go\nfunc main() {}\n```", "Risolvi 3x + 5 = 20", "\xff\xfe", strings.Repeat("é", 9000)} {
		f.Add(s, false)
	}
	e := NewEstimator(func() []string { return demoDomains })
	cats := append(slices.Clone(Tasks), demoDomains...)
	f.Fuzz(func(t *testing.T, s string, tools bool) {
		got := e.Estimate(s, tools)
		if !(got.Difficulty > 0 && got.Difficulty < 1) {
			t.Fatalf("Difficulty %v outside (0,1)", got.Difficulty)
		}
		if h := got.Entropy(); !(h >= 0 && h <= math.Log(float64(len(cats)))+1e-9) {
			t.Fatalf("Entropy %v outside [0, ln %d]", h, len(cats))
		}
		if !slices.Contains(cats, got.Task) || got.Scores[0].Task != got.Task {
			t.Fatalf("Task %q, scores %v", got.Task, got.Scores)
		}
	})
}
