package capability

// The lexicons: every cue is a set of phrases matched as whole words in
// the normalised token stream (see normaliser). Phrase syntax:
//
//	a|b        either phrase
//	{x,y,}     brace alternatives, expanded (an empty one makes a word optional)
//	word*      a prefix: the last word may go on ("riassum*" matches "riassumi")
//	\{ \}      a brace itself
//
// Phrases pass through the same normaliser as the prompt, so they are
// written as people type them: "can't", "tl;dr", "c++", "x^", "€".
// Accents fold ("perché" = "perche"; German ä ö ü ß = ae oe ue ss).
// A digit run is the single digit 0 ("0%" matches "15%").
//
// A cue fires at most once per prompt and adds its weight to its category
// (the old regexp rules' semantics: one rule, one MatchString); counters
// (reasoning, constraints, stop words) count every match.
//
// English and Italian are the weighted lexicons the estimator was tuned on;
// the French, German and Spanish phrases are translations of the same cues,
// added to the same rules, and avoid words that are common in English or
// Italian with another meaning (Spanish "resume", French "classe").

// cueDef is one weighted cue of a category.
type cueDef struct {
	cat  string
	w    float64
	any  string    // phrases, any of which fires the cue
	near []nearDef // or: a phrase of first followed by one of then
}

// nearDef fires its cue when a phrase of first is followed by a phrase of
// then with between gap[0] and gap[1] tokens in between (symbols count as
// tokens), and on the same line when line is set.
type nearDef struct {
	first, then string
	gap         [2]int
	line        bool
}

// Strong cues (an explicit instruction verb) weigh 2.5–3, weak ones 1–2.
var taskCues = []cueDef{
	// coding
	{cat: TaskCoding, w: 3, any: "```"},
	{cat: TaskCoding, w: 2, near: []nearDef{{
		first: "def|func|fn|class|public static|import|package|#include|console.log|print",
		then:  `(|\{|:`, gap: [2]int{0, 1 << 20}, line: true,
	}}},
	{cat: TaskCoding, w: 1.5, any: ";\n|=>|:=|)\\{|null pointer*|segfault*|stack trace*|stacktrace*|traceback|npe"},
	{cat: TaskCoding, w: 1.5, any: "python|golang|javascript|typescript|java|rust|c++|kotlin|swift|php|ruby|sql|regex|regexp|" +
		"bash|shell script|html|css|react|docker|kubernetes|git|linux"},
	{cat: TaskCoding, w: 1.5, any: "function|funzione|method|metodo|variable|variabile|compile|compiler|compiles|compiled|compila*|" +
		"debug*|refactor*|bug|exception|eccezione|unit test|unit tests|codice|code|script|loop|array|endpoint|api|query|" +
		"recursion|ricorsion*|algorithm|algoritmo|" +
		// fr, de, es
		"fonction|methode|debogu*|boucle|requete|recursivite|algorithme|" +
		"funktion|kompilier*|quellcode|skript|schleife|rekursion|algorithmus|" +
		"funcion|compilar*|depurar*|excepcion|codigo|bucle|recursividad"},

	// maths and reasoning
	{cat: TaskMath, w: 2.5, any: "solve|risolvi|equation|equazione|equazioni|integral|integrale|derivative|derivata|theorem|teorema|" +
		"prove that|dimostra che|factorial|fattoriale|square root|radice quadrata|prime number|prime numbers|" +
		"{numero,numeri} {primo,primi}|matrix|matrice|eigen*|logarithm|logaritmo|probabilit*|" +
		"resous|resoudre|resolvez|equations|integrale|derivee|theoreme|{demontrer,montrer,montrez} que|factorielle|racine carree|" +
		"{nombre,nombres} {premier,premiers}|logarithme|" +
		"loese|loesen|gleichung|gleichungen|ableitung|beweise dass|fakultaet|quadratwurzel|primzahl*|logarithmus|wahrscheinlichkeit*|" +
		"resuelve|resolver|ecuacion|ecuaciones|derivada|demuestra que|raiz cuadrada|{numero,numeros} {primo,primos}|matriz"},
	{cat: TaskMath, w: 2, any: "calculate|calcola|compute|how many|percentage|percentuale|percent|per cent|average|media di|sum of|somma di|" +
		"word problem|problema di matematica|" +
		"calcule|calculer|calculez|combien de|pourcentage|moyenne|somme de|" +
		"berechne*|wie viele|prozentsatz|durchschnitt*|summe von|summe der|" +
		"calcula|calcular|cuantos|cuantas|porcentaje|promedio|suma de",
		near: []nearDef{{first: "quanti|quante", then: "ci sono|servono|rimangono|restano|fa|fanno", gap: [2]int{1, 1}}}},
	{cat: TaskMath, w: 1.5, any: "prove|dimostra|dimostrare|lemma|corollary|induction|induzione|" +
		"prouver|prouvez|demontrer|lemme|corollaire|recurrence|" +
		"beweise|beweisen|korollar|induktion|" +
		"demostrar|demuestra|lema|corolario|induccion"},
	{cat: TaskMath, w: 1.5, any: "0-0|0+0|0*0|0/0|0^0|0×0|0÷0|0%|x^|y^|x²|y²|∫|∑|√|π|≤|≥|≠|∞|x=|km/h|" +
		"0 {euro,€,$,dollars,km,kg,ore,hours,minuti,minute,minutes,heures,stunden,minuten,horas,minutos}"},

	// translation
	{cat: TaskTranslation, w: 3, any: "translate*|translation*|translating*|traduci*|tradurre*|traduzione*|traduce*|traducimi*|traduca*|" +
		"tradui*|traduction*|uebersetz*|traduc*"},
	{cat: TaskTranslation, w: 2, any: "how do you say|come si dice|{render,put} {this,it} {into,in}|" +
		"in {english,italian,french,german,spanish,portuguese,japanese,chinese,inglese,italiano,francese,tedesco,spagnolo,portoghese,giapponese,cinese}|" +
		"comment dit-on|comment on dit|wie sagt man|como se dice|" +
		"en {anglais,italien,francais,allemand,espagnol,portugais,japonais,chinois}|" +
		"{auf,ins} {englisch,englische,italienisch,italienische,franzoesisch,franzoesische,deutsch,deutsche,spanisch,spanische,portugiesisch,japanisch,chinesisch}|" +
		"{al,en} {ingles,frances,aleman,espanol,portugues,japones,chino}",
		near: []nearDef{{first: "what does", then: "mean in", gap: [2]int{1, 12}}}},

	// summarisation
	{cat: TaskSummarisation, w: 3, any: "summaris*|summariz*|summary|tl;dr|tldr|riassum*|riassunto|sintetizz*|sintesi|condense|in a nutshell|" +
		"resumer|resumez|resume-moi|un resume|zusammenfass*|resumen|resumir|resumelo|resumeme|resumirlo",
		near: []nearDef{{first: "fasse|fass|fassen sie", then: "zusammen", gap: [2]int{0, 8}}}},
	{cat: TaskSummarisation, w: 1.5, any: "key points|punti chiave|main points|punti principali|" +
		"in {one,two,three,a few,poche,due,tre} {sentence,sentences,line,lines,bullet,bullets,frasi,righe}|in breve|short version|recap|" +
		"points cles|points principaux|en {une,deux,trois,quelques} {phrase,phrases,ligne,lignes}|en bref|" +
		"kernpunkte|wichtigsten punkte|in {einem,einer,zwei,drei,wenigen} {satz,saetzen,zeile,zeilen}|kurz gesagt|" +
		"puntos clave|puntos principales|en {una,dos,tres,pocas} {frase,frases,linea,lineas,oraciones}|en breve"},

	// extraction
	{cat: TaskExtraction, w: 3, any: "extract|estrai|estrarre|estraere|estratt*|pull out|parse|" +
		"extrais|extraire|extrayez|extrahiere|extrahieren|extrae|extraer|extraiga"},
	{cat: TaskExtraction, w: 2, any: "json|yaml|csv|elenca {tutti,tutte}|trova {tutti,tutte}|find all|named entit*|fields|campi|table of|tabella|" +
		"trouve {tous,toutes}|liste {tous,toutes}|champs|tableau|finde alle|liste alle|felder|tabelle|" +
		"encuentra {todos,todas}|lista {todos,todas}|campos|tabla",
		near: []nearDef{{first: "list {all,every}|list {all,every} the", then: "mentioned|in", gap: [2]int{1, 1}}}},
	{cat: TaskExtraction, w: 1, near: []nearDef{{
		first: "date|dates|name|names|nomi|amount|amounts|importi|email|emails|addresses|indirizzi|phone numbers|numeri di telefono|" +
			"noms|montants|adresses|namen|daten|betraege|adressen|fechas|nombres|importes|direcciones|correos",
		then: "mentioned|menzionat*|nel testo|in the text|from the|from this|" +
			"mentionn*|dans le texte|du texte|im text|aus dem text|genannt*|erwaehnt*|mencionad*|en el texto|del texto",
		gap: [2]int{0, 0},
	}}},

	// classification
	{cat: TaskClassification, w: 3, any: "classify|classifica|categorise|categorize|categorizza*|sentiment|label {this,these,each}|etichetta|" +
		"classer|classez|classifie*|categoris*|etiquette chaque|klassifizier*|kategorisier*|clasifica*|categoriza*|sentimiento|etiqueta"},
	{cat: TaskClassification, w: 2, any: "positive or negative|positivo o negativo|positiva o negativa|spam|which category|quale categoria|" +
		"what category|intent of|toxic|tossico|" +
		"{positif,positive} ou {negatif,negative}|quelle categorie|toxique|positiv oder negativ|welche kategorie|toxisch|" +
		"que categoria|toxico"},

	// creative
	{cat: TaskCreative, w: 3, any: "poem|poesia|haiku|limerick|sonnet|sonetto|lyrics|song|canzone|short story|racconto|fairy tale|favola|" +
		"filastrocca|once upon a time|c'era una volta|slogan|tagline|" +
		"poeme|chanson|conte de fees|il etait une fois|gedicht|sonett|songtext|kurzgeschichte|maerchen|es war einmal|" +
		"poema|soneto|cancion|cuento|relato|cuento de hadas|erase una vez|habia una vez"},
	{cat: TaskCreative, w: 2, near: []nearDef{{
		first: "write|scrivi|compose|componi|invent*|imagine|immagina|" +
			"ecris|ecrire|ecrivez|composez|schreib|schreibe|schreiben|erfinde|erfinden|escribe|escribir|compon|imagina",
		then: "story|storia|poem|rhyme|rima|rime|character|personaggio|dialogue|dialogo|scene|scena|name for|names for|nomi per|" +
			"tale|joke|barzelletta|" +
			"histoire|personnage|blague|geschichte|reim*|figur|dialog|szene|witz|historia|personaje|escena|chiste",
		gap: [2]int{0, 6},
	}}},
	{cat: TaskCreative, w: 1.5, any: "brainstorm|creative|creativo|creativa|fiction|rhym*|creatif|kreativ*|ficcion"},
}

// domainLexicons are the cues of well-known adapter domains.
var domainLexicons = map[string][]cueDef{
	"support": {
		{cat: "support", w: 2, near: []nearDef{{
			first: "can't|cannot|unable to|non riesco|non riesco {a,ad}|impossibile|" +
				"je n'arrive pas a|je ne peux pas|impossible de|ich kann mich nicht|kann mich nicht|no puedo",
			then: "log in*|login*|sign in*|access*|accedere*|entrare*|connect*|collegarmi*|" +
				"me connecter*|connecter*|acceder*|anmelden*|einloggen*|iniciar sesion*|entrar*|conectarme*",
			gap: [2]int{0, 0},
		}}},
		{cat: "support", w: 2, any: "password reset|reset {,my }password|reimpost*|forgot {,my }password|password dimenticata|" +
			"account {,is }{locked,blocked,bloccato}|two factor|two-factor|2fa|" +
			"mot de passe oublie|reinitialiser*|compte bloque|passwort vergessen|passwort zuruecksetzen|konto gesperrt|" +
			"olvide mi contrasena|restablecer*|cuenta bloqueada"},
		{cat: "support", w: 1.5, any: "not working|doesn't work|does not work|non funziona|stopped working|smesso di funzionare|" +
			"keeps crashing|crash*|si blocca|error message|messaggio di errore|ticket|help desk|customer service|assistenza|" +
			"supporto|tracking|spedizione|delivery|consegna|order status|stato dell'ordine|ordine|" +
			"ne fonctionne pas|ne marche pas|message d'erreur|service client|livraison|commande|" +
			"funktioniert nicht|fehlermeldung|kundendienst|kundenservice|lieferung|bestellung|" +
			"no funciona|mensaje de error|atencion al cliente|soporte|entrega|pedido|envio"},
	},
	"billing": {
		{cat: "billing", w: 2, any: "invoice|invoices|fattur*|bill|billing|bolletta|bollette|charged twice|double charge|" +
			"addebitat*|addebito|overcharged|refund|rimbors*|" +
			"facture*|rembourse*|rechnung*|rueckerstattung|erstattung|factura*|reembolso*"},
		{cat: "billing", w: 1.5, any: "subscription|abbonamento|plan|piano tariffario|renewal|rinnovo|vat|iva|receipt|ricevuta|" +
			"pricing tier|disdire|cancel {,my }subscription|upgrade {,my }plan|" +
			"abonnement|renouvellement|tva|recu|resilier|abo|verlaengerung|mwst|mehrwertsteuer|quittung|kuendig*|" +
			"suscripcion|renovacion|recibo|darse de baja"},
	},
	"payments": {
		{cat: "payments", w: 2, any: "payment|payments|pagament*|pagare|card {,was }declined|carta {,è stata }rifiutata|credit card|" +
			"carta di credito|debit card|bank transfer|bonifico|wire transfer|iban|sepa|chargeback|storno|paypal|checkout|" +
			"transaction|transazion*|" +
			"paiement*|carte refusee|carte de credit|carte bancaire|virement*|zahlung*|karte abgelehnt|kreditkarte|" +
			"ueberweisung*|transaktion*|pago|pagos|pagar|tarjeta rechazada|tarjeta de credito|transferencia*|transaccion*"},
		{cat: "payments", w: 1, any: "pos|merchant|esercente|3{,-}d{, }secure|acquirer|payout|settlement|" +
			"commercant|haendler|comerciante"},
	},
	"legal": {
		{cat: "legal", w: 2, any: "contract|contratto|contratti|clause|clausola|clausole|gdpr|liabilit*|liable|lawsuit|causa legale|" +
			"terms and conditions|termini e condizioni|lawyer|avvocato|court|tribunale|jurisdiction|giurisdizione|non-compete|" +
			"non concorrenza|nda|indemnif*|copyright|trademark|marchio|" +
			"contrat|avocat|tribunal|droit d'auteur|rgpd|vertrag*|klausel|anwalt|rechtsanwalt|vor gericht|haftung|haftbar|" +
			"urheberrecht|dsgvo|contrato|clausula|abogado|derechos de autor"},
		{cat: "legal", w: 1.5, any: "legal|legale|legally|law|legge|leggi|compliance|regulation|regolamento|enforceable|" +
			"{valid,valida,valido} {under,per} {,the }{law,legge}|sue|citare in giudizio|privacy policy|diritto|" +
			"legalement|loi|reglementation|rechtlich*|gesetz*|verordnung|legalmente|ley|reglamento"},
	},
	"medical": {
		{cat: "medical", w: 2, any: "symptom|symptoms|sintomi|diagnos*|dosage|dosaggio|medication|farmac*|prescription|ricetta medica|" +
			"doctor|medico|patient|paziente|disease|malattia|" +
			"symptomes|medecin|maladie|ordonnance|medicament*|symptome|arzt|krankheit|medikament*|" +
			"sintomas|paciente|enfermedad|medicamento*"},
	},
	"hr": {
		{cat: "hr", w: 2, any: "payroll|busta paga|vacation days|ferie|parental leave|congedo|hiring|assunzion*|onboarding|" +
			"performance review|valutazione annuale|employee|dipendent*|" +
			"fiche de paie|conges payes|embauche|employe|lohnabrechnung|urlaubstage|elternzeit|mitarbeiter*|" +
			"nomina|vacaciones|contratacion|empleado*"},
	},
}

// Difficulty cues. Reasoning cues are prefixes, as in the regexp estimator
// ("deriva" also counts "derivative").
const (
	reasoningCues = "prove*|dimostra*|step by step*|passo passo*|explain why*|spiega perch*|derive*|deriva*|optimise*|optimize*|" +
		"ottimizza*|design*|progetta*|architecture*|architettura*|tradeoff*|trade-off*|compare*|confronta*|analyse*|analyze*|" +
		"analizza*|edge case*|casi limite*|complexity*|complessit*|rigorous*|rigoros*|" +
		"etape par etape*|explique pourquoi*|optimis*|architectur*|cas limite*|complexite*|rigoureu*|" +
		"schritt fuer schritt*|erklaere warum*|optimier*|entwirf*|architektur*|vergleich*|analysier*|randfall*|randfaell*|komplexitaet*|" +
		"paso a paso*|explica por que*|optimiza*|disena*|arquitectura*|analiza*|casos limite*|complejidad*|riguros*"
	constraintCues = "must|should|at least|at most|without|exactly|only|deve|devono|almeno|al massimo|senza|esattamente|solo|" +
		"doit|doivent|au moins|au plus|sans|exactement|seulement|uniquement|" +
		"muss|muessen|sollte|mindestens|hoechstens|ohne|genau|nur|" +
		"debe|deben|al menos|como maximo|exactamente|solamente"
)

// stopWords decide the language by count (Cavnar and Trenkle's observation
// that function words identify a language, reduced to a vote). Words that
// two languages share count for both.
var stopWords = [...]struct{ lang, words string }{
	{"en", "the|and|is|are|of|to|what|how|my|this|with|for|you|can|please"},
	{"it", "il|lo|la|gli|le|di|che|è|non|per|una|un|con|mi|come|questo|questa|sono|del|della|puoi"},
	{"fr", "le|la|les|des|est|et|une|un|du|je|vous|pour|dans|pas|ce|cette|avec|sur|qui|au|aux|nous|sont"},
	{"de", "der|die|das|und|ist|nicht|ich|ein|eine|einen|mit|zu|auf|für|von|dem|den|wie|bitte|kann|sich|auch|oder|wir|sind"},
	{"es", "el|los|las|del|que|y|es|en|por|para|con|pero|esta|este|se|al|su|muy|una|un|lo"},
}
