package capability

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

// labelled is the labelled prompt set the estimator's accuracy is measured
// on: English and Italian, every built-in category and the four demo
// adapter domains. Written by hand for this test; no prompt was tuned
// after a failure by changing its label.
var labelled = []struct{ task, prompt string }{
	// chat
	{"chat", "hello, how are you today?"},
	{"chat", "What do you think about remote work?"},
	{"chat", "Can you recommend a good book for the holidays?"},
	{"chat", "Thanks a lot, that was helpful!"},
	{"chat", "Who was the first person to walk on the moon?"},
	{"chat", "ciao, come stai?"},
	{"chat", "Mi consigli un ristorante a Milano per stasera?"},
	{"chat", "Cosa ne pensi dello smart working?"},
	{"chat", "Grazie mille per l'aiuto di ieri"},
	{"chat", "Qual è la capitale dell'Australia?"},
	{"chat", "Tell me something interesting about octopuses"},
	{"chat", "Che tempo fa di solito a Roma in aprile?"},
	// coding
	{"coding", "Why does this python function raise a KeyError?"},
	{"coding", "```go\nfunc main() {\n\tfmt.Println(x)\n}\n```\nwhy does it not compile?"},
	{"coding", "Write a SQL query that returns the top 5 customers by revenue"},
	{"coding", "How do I reverse a linked list in Java?"},
	{"coding", "Refactor this JavaScript to use async/await: fetch(url).then(r => r.json())"},
	{"coding", "I get a null pointer exception when I call getUser(), any idea?"},
	{"coding", "Scrivi una funzione in Python che controlla se una stringa è palindroma"},
	{"coding", "Il mio codice Go va in panic con index out of range, perché?"},
	{"coding", "Come faccio il debug di un container Docker che si riavvia?"},
	{"coding", "Write a regex that matches Italian postal codes"},
	{"coding", "def f(x):\n    return x*2\nprint(f(3))\nwhat does this print?"},
	{"coding", "Spiegami la differenza tra una classe e un'interfaccia in TypeScript"},
	// math
	{"math", "what is 12 * 7"},
	{"math", "Solve x squared equals nine"},
	{"math", "Calculate the integral of x^2 from 0 to 3"},
	{"math", "Prove that the square root of 2 is irrational"},
	{"math", "A train travels 120 km in 1.5 hours. What is its average speed?"},
	{"math", "What is the probability of rolling two sixes with two dice?"},
	{"math", "Risolvi l'equazione 3x + 5 = 20"},
	{"math", "Calcola il 15% di 240 euro"},
	{"math", "Quanti numeri primi ci sono tra 1 e 50?"},
	{"math", "Dimostra che la somma di due numeri pari è pari"},
	{"math", "Find the derivative of sin(x) * x"},
	{"math", "If I save 200 euro a month, how many months to reach 5000?"},
	// extraction
	{"extraction", "Extract the names and dates from this letter: Dear Mr. Bianchi, on 3 May we met..."},
	{"extraction", "Return the product name, price and quantity as JSON from: 2x Widget at 3.50"},
	{"extraction", "Pull out every phone number mentioned in the text below"},
	{"extraction", "Parse this address into street, city and zip fields: 10 Downing St, London SW1A 2AA"},
	{"extraction", "List all the companies mentioned in this article"},
	{"extraction", "Estrai i nomi delle persone citate in questo testo"},
	{"extraction", "Dal seguente testo estrai data, importo e destinatario in formato JSON"},
	{"extraction", "Trova tutte le date menzionate nel documento"},
	{"extraction", "Fill a table of author, title and year from these references"},
	{"extraction", "Get the email addresses from the text below and give them as CSV"},
	// summarisation
	{"summarisation", "Please summarise the following article in three sentences"},
	{"summarisation", "TL;DR of this thread please"},
	{"summarisation", "Give me the key points of this meeting transcript"},
	{"summarisation", "Can you write a short summary of the report below?"},
	{"summarisation", "Riassumi questo articolo in poche righe"},
	{"summarisation", "Fammi un riassunto della riunione di oggi"},
	{"summarisation", "Sintetizza il testo seguente in tre punti chiave"},
	{"summarisation", "Condense this paragraph into one line"},
	{"summarisation", "Quali sono i punti principali di questo documento? Dimmeli in breve"},
	{"summarisation", "Recap the main points of the chapter for me"},
	// translation
	{"translation", "Translate this sentence into French: the cat is on the table"},
	{"translation", "How do you say 'good morning' in Japanese?"},
	{"translation", "Traduci in inglese: domani piove"},
	{"translation", "Puoi tradurre questa email in tedesco?"},
	{"translation", "Come si dice 'arrivederci' in spagnolo?"},
	{"translation", "Please translate the paragraph below to Italian"},
	{"translation", "Translate to English: Ich habe Hunger"},
	{"translation", "Mi serve la traduzione di questo contratto d'affitto in inglese"},
	{"translation", "Render this into Spanish, keeping the tone: we miss you"},
	{"translation", "What does 'saudade' mean in English?"},
	// creative
	{"creative", "Write a haiku about autumn"},
	{"creative", "Write a short story about a robot who learns to paint"},
	{"creative", "Compose a limerick about a cat named Pasta"},
	{"creative", "Give me a catchy slogan for a bakery"},
	{"creative", "Scrivi una poesia sul mare d'inverno"},
	{"creative", "Inventa una favola per bambini con un drago gentile"},
	{"creative", "Scrivi una canzone per il compleanno di mia nonna"},
	{"creative", "Brainstorm names for a new coffee shop"},
	{"creative", "Imagine a dialogue between Socrates and a smartphone"},
	{"creative", "Write the opening scene of a noir novel set in Naples"},
	// classification
	{"classification", "Classify this review as positive or negative: the food was cold"},
	{"classification", "Is this email spam? 'You won a free iPhone, click here'"},
	{"classification", "What is the sentiment of this tweet: I love Mondays"},
	{"classification", "Categorize these support tickets by urgency"},
	{"classification", "Label each sentence as question, statement or command"},
	{"classification", "Classifica questa recensione come positiva o negativa"},
	{"classification", "Questo messaggio è spam oppure no?"},
	{"classification", "In quale categoria rientra questo prodotto: elettronica, casa o sport?"},
	{"classification", "Determine the intent of this user message: book a table for two"},
	{"classification", "Etichetta ogni frase con l'emozione che esprime"},
	// support
	{"support", "I can't log in to my account since the last update"},
	{"support", "The app keeps crashing when I open the settings page"},
	{"support", "How do I reset my password?"},
	{"support", "My account is locked after too many attempts, please help"},
	{"support", "Non riesco ad accedere al mio account"},
	{"support", "L'app non funziona più da ieri sera"},
	{"support", "Where is my order? The tracking has not changed for a week"},
	{"support", "Ho dimenticato la password, come la reimposto?"},
	// billing
	{"billing", "I was charged twice on my last invoice"},
	{"billing", "Why is my bill higher this month?"},
	{"billing", "How do I cancel my subscription and get a refund?"},
	{"billing", "Can I get a copy of the VAT receipt for March?"},
	{"billing", "La bolletta di questo mese è troppo alta"},
	{"billing", "Vorrei disdire l'abbonamento e avere il rimborso"},
	{"billing", "Mi è stato addebitato due volte l'importo della fattura"},
	{"billing", "Upgrade my plan to the annual pricing tier"},
	// payments
	{"payments", "My card was declined at checkout, why?"},
	{"payments", "How long does a SEPA bank transfer take?"},
	{"payments", "I see a transaction I don't recognise on my credit card"},
	{"payments", "Can I pay with PayPal instead?"},
	{"payments", "Il pagamento con carta di credito non va a buon fine"},
	{"payments", "Quanto tempo ci vuole per un bonifico verso un IBAN estero?"},
	{"payments", "Come posso aprire uno storno per una transazione non autorizzata?"},
	{"payments", "The merchant says the payment failed but my money is gone"},
	// legal
	{"legal", "Is this non-compete clause enforceable in Italy?"},
	{"legal", "What does GDPR say about keeping customer data?"},
	{"legal", "Can my landlord end the contract early?"},
	{"legal", "Who is liable if a delivery driver damages my car?"},
	{"legal", "Questa clausola del contratto è valida per legge?"},
	{"legal", "Posso citare in giudizio il mio ex datore di lavoro?"},
	{"legal", "Cosa prevede il GDPR sul diritto all'oblio?"},
	{"legal", "Do I need a lawyer to register a trademark?"},
}

var demoDomains = []string{"support", "billing", "payments", "legal"}

// TestEstimatorAccuracy measures the estimator on the labelled set with the
// demo adapters registered and prints the confusion table.
func TestEstimatorAccuracy(t *testing.T) {
	e := NewEstimator(func() []string { return demoDomains })
	cats := append(slices.Clone(Tasks), demoDomains...)
	confusion := map[string]map[string]int{}
	correct := 0
	for _, l := range labelled {
		got := e.Estimate(l.prompt, false).Task
		if confusion[l.task] == nil {
			confusion[l.task] = map[string]int{}
		}
		confusion[l.task][got]++
		if got == l.task {
			correct++
		} else {
			t.Logf("miss: %-14s → %-14s %q", l.task, got, l.prompt)
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
	acc := float64(correct) / float64(len(labelled))
	t.Logf("accuracy %d/%d = %.3f\n%s", correct, len(labelled), acc, b.String())
	if len(labelled) < 80 {
		t.Fatalf("the labelled set has %d prompts, want at least 80", len(labelled))
	}
	if acc < 0.85 {
		t.Fatalf("accuracy %.3f, want at least 0.85", acc)
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := NewEstimator(func() []string { return tt.domains })
			if got := e.Estimate(tt.prompt, false).Task; got != tt.want {
				t.Fatalf("Task = %q, want %q (scores %v)", got, tt.want, e.Estimate(tt.prompt, false).Scores)
			}
		})
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
		// "hello": 2 tokens, chat, no English stop word (language "").
		{"a greeting is easy", "hello", false, sig(-1.6 + 0.5*math.Log1p(2.0/40) + 0.2 - 0.4)},
		{"tools add 0.4 to the logit", "hello", true, sig(-1.6 + 0.5*math.Log1p(2.0/40) + 0.2 - 0.4 + 0.4)},
		// 58 runes → 15 tokens; math; "prove" and "step by step"; "must"; English.
		{"a proof step by step is hard", "Prove step by step that the sum must be even for all n > 1", false,
			sig(-1.6 + 0.5*math.Log1p(15.0/40) + 0.8*2 + 0.3*1 + 0.6)},
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
}

func TestEstimateEntropy(t *testing.T) {
	one := Estimate{Scores: []CategoryScore{{"coding", 10}}}
	two := Estimate{Scores: []CategoryScore{{"coding", 1}, {"math", 1}}}
	if one.Entropy() != 0 || math.Abs(two.Entropy()-math.Ln2) > 1e-12 {
		t.Fatalf("entropies %v, %v; want 0 and ln 2", one.Entropy(), two.Entropy())
	}
}

// heldOut was written after the estimator's weights were frozen and was
// never used to change them: its accuracy estimates how the estimator does
// on prompts it was not written against (the labelled set above is in-sample).
var heldOut = []struct{ task, prompt string }{
	{"chat", "Good evening! Any plans for the weekend?"},
	{"chat", "Which is bigger, a blue whale or an elephant?"},
	{"chat", "Buongiorno, oggi mi sento un po' stanco"},
	{"chat", "Chi ha scritto I promessi sposi?"},
	{"coding", "My Rust program fails to borrow a mutable reference twice, how do I fix it?"},
	{"coding", "Write a bash script that backs up my home folder every night"},
	{"coding", "Perché questa query SQL è così lenta su una tabella da un milione di righe?"},
	{"coding", "How can I mock an HTTP client in Go unit tests?"},
	{"math", "What is the sum of the first 100 positive integers?"},
	{"math", "Compute 17% of 3,400"},
	{"math", "Calcola l'area di un cerchio con raggio 4 cm"},
	{"math", "Is 221 a prime number?"},
	{"extraction", "From this invoice text, extract the invoice number and the total as JSON"},
	{"extraction", "List all the cities mentioned in the paragraph below"},
	{"extraction", "Estrai dal CV il nome, l'email e gli anni di esperienza"},
	{"extraction", "Parse the log lines and give me timestamp and level fields"},
	{"summarisation", "Summarize this email thread for my manager"},
	{"summarisation", "Give me a two-line recap of the attached minutes"},
	{"summarisation", "Riassumi il capitolo in cinque punti"},
	{"summarisation", "Can you boil this report down to its key points?"},
	{"translation", "Translate 'where is the station' into Portuguese"},
	{"translation", "Traduci questo paragrafo in francese"},
	{"translation", "How do you say 'cheers' in German?"},
	{"translation", "Please translate the following menu into English"},
	{"creative", "Write a poem about rain on a Sunday"},
	{"creative", "Scrivi un racconto breve su un gatto detective"},
	{"creative", "Invent a funny name and slogan for a pizza truck"},
	{"creative", "Write song lyrics about leaving home"},
	{"classification", "Classify these emails into sales, support or spam"},
	{"classification", "Is the sentiment of this review positive or negative? 'Never again.'"},
	{"classification", "Classifica il tono di questo messaggio: formale o informale"},
	{"classification", "Which category does this news headline belong to: sport, politics or tech?"},
	{"support", "I cannot sign in with two-factor authentication anymore"},
	{"support", "The website shows an error message when I upload a file"},
	{"support", "Non riesco a collegarmi al Wi-Fi dell'ufficio"},
	{"billing", "Why was I charged for a plan I cancelled?"},
	{"billing", "Where can I download last month's invoice?"},
	{"billing", "Vorrei una copia della fattura di febbraio"},
	{"payments", "Does the checkout accept debit cards?"},
	{"payments", "Il bonifico che ho fatto ieri non risulta ancora"},
	{"payments", "My PayPal payment is stuck as pending"},
	{"legal", "Can I use a song in my video without breaking copyright?"},
	{"legal", "Is a verbal contract legally binding in Italy?"},
	{"legal", "Quali sono i miei diritti se il tribunale respinge il ricorso?"},
}

func TestEstimatorHeldOutAccuracy(t *testing.T) {
	e := NewEstimator(func() []string { return demoDomains })
	correct := 0
	for _, l := range heldOut {
		if got := e.Estimate(l.prompt, false).Task; got == l.task {
			correct++
		} else {
			t.Logf("miss: %-14s → %-14s %q", l.task, got, l.prompt)
		}
	}
	acc := float64(correct) / float64(len(heldOut))
	t.Logf("held-out accuracy %d/%d = %.3f", correct, len(heldOut), acc)
	if acc < 0.8 {
		t.Fatalf("held-out accuracy %.3f, want at least 0.8", acc)
	}
}
