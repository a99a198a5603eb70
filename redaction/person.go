package redaction

import (
	_ "embed"
	"strings"
	"unicode"
	"unicode/utf8"
)

// PERSON: names of people in context. A name is one to four capitalised
// words (letters, with inner apostrophes and hyphens: O'Brien,
// Jean-Pierre; lower-case particles such as "de", "di", "van" between
// them), found
//
//   - after a cue that introduces a name: a title or honorific ("Mr.",
//     "Dr.", "Sig.ra", "Dott.", "Mme", "Herr", "Frau", "Sr.", …), a
//     self-introduction ("my name is", "mi chiamo", "je m'appelle", "ich
//     heiße", "me llamo"), or a closing formula before a signature ("Best
//     regards,", "Cordiali saluti,", "Cordialement,", "Mit freundlichen
//     Grüßen", "Un saludo,") when the name ends its line;
//   - after a weaker cue (a salutation such as "Dear", "Gentile", "Cher",
//     "Lieber", "Hola", or "I am", "From:", "Name:") when the first word is
//     a known given name or surname, or two capitalised words follow;
//   - anywhere as a known given name followed by a known surname
//     ("Marco Rossi"), and after a found name in a list ("A, B and C")
//     when the next word is a known given name.
//
// The given names and surnames (names.txt) are FakerPHP's lists for
// en_US, en_GB, it_IT, fr_FR, de_DE and es_ES (MIT; see the file's header).
// The finding covers the name, not the title before it.

//go:embed names.txt
var namesTxt string

// cueKind is how much a cue says about the capitalised words after it.
type cueKind uint8

const (
	cueTitle      cueKind = iota + 1 // an honorific: the next capitalised word is a name
	cueIntro                         // "my name is": likewise
	cueClosing                       // a signature follows; the name must end its line
	cueSalutation                    // the next words are a name if they look like one
)

// personCues maps each cue (lower case, as the keyword index matches it)
// to its kind. Titles end in '.' or are whole words.
var personCues = map[string]cueKind{
	// EN
	"mr.": cueTitle, "mrs.": cueTitle, "ms.": cueTitle, "dr.": cueTitle, "prof.": cueTitle, "mr ": cueTitle, "mrs ": cueTitle,
	"ms ": cueTitle, "miss ": cueTitle, "sir ": cueSalutation,
	"my name is": cueIntro, "my name's": cueIntro, "name is": cueIntro, "i am": cueSalutation, "i'm": cueSalutation,
	"dear": cueSalutation, "hi ": cueSalutation, "hello": cueSalutation, "from:": cueSalutation, "name:": cueSalutation,
	"patient:": cueSalutation, "attendees:": cueSalutation, "signed": cueSalutation, "contact:": cueSalutation,
	"regards": cueClosing, "best,": cueClosing, "thanks,": cueClosing, "thank you,": cueClosing, "cheers,": cueClosing,
	"sincerely": cueClosing, "yours,": cueClosing, "best wishes": cueClosing,
	// IT
	"sig.": cueTitle, "sig.ra": cueTitle, "sigg.": cueTitle, "dott.": cueTitle, "dott.ssa": cueTitle, "ing.": cueTitle, "avv.": cueTitle,
	"signor ": cueTitle, "signora ": cueTitle, "dottor ": cueTitle, "dottoressa ": cueTitle, "prof.ssa": cueTitle,
	"mi chiamo": cueIntro, "il mio nome è": cueIntro, "sono ": cueSalutation, "gentile": cueSalutation, "gentilissim": cueSalutation,
	"caro ": cueSalutation, "cara ": cueSalutation, "egregio": cueSalutation, "intestato a": cueSalutation, "nome:": cueSalutation,
	"cordiali saluti": cueClosing, "distinti saluti": cueClosing, "saluti,": cueClosing, "un abbraccio": cueClosing, "a presto,": cueClosing, "grazie,": cueClosing,
	// FR
	"m. ": cueTitle, "mme": cueTitle, "mlle": cueTitle, "monsieur": cueTitle, "madame": cueTitle, "je m'appelle": cueIntro,
	"mon nom est": cueIntro, "je suis": cueSalutation, "cher ": cueSalutation, "chère": cueSalutation, "bonjour": cueSalutation,
	"nom :": cueSalutation, "nom:": cueSalutation, "cordialement": cueClosing, "bien à vous": cueClosing, "merci,": cueClosing, "amitiés": cueClosing,
	// DE
	"herr ": cueTitle, "herrn ": cueTitle, "frau ": cueTitle, "ich heiße": cueIntro, "mein name ist": cueIntro, "ich bin": cueSalutation,
	"lieber": cueSalutation, "liebe ": cueSalutation, "sehr geehrte": cueSalutation, "mit freundlichen grüßen": cueClosing,
	"viele grüße": cueClosing, "beste grüße": cueClosing, "danke,": cueClosing, "grüße,": cueClosing,
	// ES
	"sr.": cueTitle, "sra.": cueTitle, "srta.": cueTitle, "don ": cueTitle, "doña ": cueTitle, "me llamo": cueIntro, "mi nombre es": cueIntro,
	"estimado": cueSalutation, "estimada": cueSalutation, "hola": cueSalutation, "soy ": cueSalutation, "nombre:": cueSalutation,
	"un saludo": cueClosing, "saludos": cueClosing, "atentamente": cueClosing, "gracias,": cueClosing,
}

// nameParticles may stand between the words of one name.
var nameParticles = map[string]bool{"de": true, "di": true, "da": true, "del": true, "della": true, "van": true, "von": true,
	"der": true, "den": true, "le": true, "la": true, "du": true, "des": true, "dos": true, "das": true, "y": true, "zu": true}

// notNames are capitalised words that follow cues without being names.
var notNames = map[string]bool{"The": true, "I": true, "We": true, "You": true, "Customer": true, "Team": true, "Sir": true,
	"Madam": true, "All": true, "Support": true, "Everyone": true, "Colleagues": true, "Friends": true, "Hi": true, "Hello": true,
	"Please": true, "Thanks": true, "Thank": true, "Il": true, "La": true, "Le": true, "Lo": true, "Gli": true, "Les": true,
	"Der": true, "Die": true, "Das": true, "El": true, "Los": true, "Las": true, "Cliente": true, "Utente": true, "Signori": true,
	"Kunde": true, "Damen": true, "Herren": true, "Client": true, "Team,": true, "Here": true, "This": true, "It": true,
	"Ecco": true, "Voici": true, "Hier": true, "Aquí": true, "Per": true, "Pour": true, "Para": true, "Bitte": true, "Can": true,
	"Could": true, "Note": true, "Send": true, "My": true, "Mi": true, "Mon": true, "Mein": true, "Ich": true, "Je": true,
	"Nel": true, "Der,": true, "Und": true, "And": true, "Et": true, "Y": true, "E": true,
	"Italian": true, "English": true, "French": true, "German": true, "Spanish": true, "Head": true, "Manager": true}

// nameSuffixes may end a name of two or more words.
var nameSuffixes = map[string]bool{"II": true, "III": true, "IV": true, "Jr": true, "Jr.": true, "Sr": true, "Sr.": true}

type personDetector struct {
	given, surname map[string]bool
	cues           map[int32]cueKind // keyword id -> kind
	kinds          []cueKind         // the same, dense (set by NewScanner)
	ix             *keywordIndex
}

func newPersonDetector(ix *keywordIndex) *personDetector {
	d := &personDetector{given: map[string]bool{}, surname: map[string]bool{}, cues: map[int32]cueKind{}, ix: ix}
	for _, line := range strings.Split(namesTxt, "\n") {
		if len(line) < 3 || line[0] == '#' || strings.Contains(line[2:], " ") {
			continue
		}
		switch line[0] {
		case 'G':
			d.given[line[2:]] = true
		case 'S':
			d.surname[line[2:]] = true
		}
	}
	for cue, k := range personCues {
		d.cues[ix.addWord(cue)] = k
	}
	return d
}

// nameWord returns the end of the capitalised word at text[i:] (an
// upper-case letter, then letters, inner apostrophes or hyphens), or -1.
func nameWord(text string, i int) int {
	if c := text[i]; c < 0x80 {
		// ASCII fast path: an upper-case letter, then lower-case letters;
		// anything else takes the general path below.
		if !isUpper(c) || isUpper(at(text, i+1)) {
			return -1 // not capitalised, or an acronym
		}
		j := i + 1
		for j < len(text) && isLower(text[j]) {
			j++
		}
		if j > i+1 && (j == len(text) || text[j] < 0x80 && !isAlpha(text[j]) && text[j] != '\'' && text[j] != '-') {
			return j
		}
	}
	r, n := utf8.DecodeRuneInString(text[i:])
	if !unicode.IsUpper(r) {
		return -1
	}
	j := i + n
	lower := 0
	for j < len(text) {
		r, n := utf8.DecodeRuneInString(text[j:])
		switch {
		case unicode.IsLower(r):
			lower++
		case unicode.IsUpper(r) && lower == 0 && j-i <= 2: // "McDonald", "O'Brien"
		case unicode.IsUpper(r) && j > i && (text[j-1] == '\'' || text[j-1] == '-' || text[j-2] == 'M' && text[j-1] == 'c'):
		case (r == '\'' || r == '’' || r == '-') && j+n < len(text) && unicode.IsLetter(rune(text[j+n])):
		default:
			if lower == 0 && j-i > 1 {
				return -1 // an acronym
			}
			return j
		}
		j += n
	}
	if lower == 0 && j-i > 1 {
		return -1
	}
	return j
}

// nameAt reads up to four name words starting at i and returns the end of
// the name and how many words it has.
func (d *personDetector) nameAt(text string, i int) (end, words int, first string) {
	end = -1
	for words < 4 && i < len(text) {
		e := nameWord(text, i)
		if e < 0 {
			break
		}
		if words == 0 {
			first = text[i:e]
			if notNames[first] {
				return -1, 0, ""
			}
		}
		words++
		end = e
		// Next word: after one space, possibly a particle.
		if at(text, e) != ' ' {
			break
		}
		k := e + 1
		pe := k
		for pe < len(text) && isLower(text[pe]) {
			pe++
		}
		if pe > k && nameParticles[text[k:pe]] && at(text, pe) == ' ' {
			k = pe + 1
		}
		if words >= 2 {
			se := k
			for se < len(text) && (isAlpha(text[se]) || text[se] == '.') {
				se++
			}
			if nameSuffixes[text[k:se]] && !isAlpha(at(text, se)) {
				end = se
				break
			}
		}
		if k >= len(text) || nameWord(text, k) < 0 || notNames[text[k:nameWord(text, k)]] {
			break
		}
		i = k
	}
	return end, words, first
}

func (d *personDetector) known(w string) bool { return d.given[w] || d.surname[w] }

// skipTitles skips spaces, punctuation of a salutation and titles after a
// cue ending at i.
func (d *personDetector) skipTitles(text string, i int, kind cueKind) int {
	for k := 0; k < 4; k++ {
		for i < len(text) && (text[i] == ' ' || text[i] == ',' || text[i] == ':' || (kind == cueClosing && (text[i] == '\n' || text[i] == '\r'))) {
			i++
		}
		j := i
		for j < len(text) && (isAlpha(text[j]) || text[j] == '.') {
			j++
		}
		// The word is ASCII letters and dots: lower-cased into buf, and
		// looked up as it is and with a space after (a map look-up of
		// string(buf[:n]) does not allocate).
		var buf [32]byte
		if j-i >= len(buf) {
			w := strings.ToLower(text[i:j])
			if kd, ok := personCues[w]; ok && kd == cueTitle || personCues[w+" "] == cueTitle {
				i = j
				continue
			}
			break
		}
		n := copy(buf[:], text[i:j])
		for k := range n {
			buf[k] = lowerByte[buf[k]]
		}
		buf[n] = ' '
		if kd, ok := personCues[string(buf[:n])]; ok && kd == cueTitle || personCues[string(buf[:n+1])] == cueTitle && j > i {
			i = j
			continue
		}
		break
	}
	return i
}

func (d *personDetector) detect(text string, a *anchors, dst []Finding, b *budget) []Finding {
	last := -1
	for _, h := range a.kw {
		kind := d.kinds[h.id]
		if kind == 0 {
			continue
		}
		p := int(h.pos)
		if p < last || isAlpha(before(text, p)) || !b.spend(2) {
			continue
		}
		if kind == cueTitle && (isDigit(before(text, p)) || before(text, p) == ' ' && isDigit(before(text, p-1))) {
			continue // "3247 m. Mis datos": a unit, not "M."
		}
		// The cue must end at a word edge.
		e := p + len(d.ix.words[h.id])
		if e < len(text) && isAlpha(text[e]) && isAlpha(text[e-1]) {
			continue // "hint", "dearth"
		}
		i := d.skipTitles(text, e, kind)
		if i >= len(text) {
			continue
		}
		ne, words, first := d.nameAt(text, i)
		if ne < 0 {
			continue
		}
		switch kind {
		case cueTitle, cueIntro:
		case cueClosing:
			if c := at(text, ne); !(ne == len(text) || c == '\n' || c == '\r' || c == ',' || c == '<') {
				continue
			}
		case cueSalutation:
			if !d.known(first) && words < 2 {
				continue
			}
		}
		dst = addFinding(dst, Finding{Type: TypePerson, Start: i, End: ne})
		last = ne
		dst = d.listAfter(text, ne, dst)
	}
	// A known given name followed by a known surname.
	for _, c := range a.caps {
		i := int(c)
		if i < last || !b.spend(1) {
			continue
		}
		e := nameWord(text, i)
		if e < 0 || at(text, e) != ' ' || !d.given[text[i:e]] {
			continue
		}
		ne, words, _ := d.nameAt(text, i)
		if words < 2 {
			continue
		}
		// The last word must be a known surname.
		ls := strings.LastIndexByte(text[i:ne], ' ') + i + 1
		if !d.surname[text[ls:ne]] {
			continue
		}
		dst = addFinding(dst, Finding{Type: TypePerson, Start: i, End: ne})
		last = ne
	}
	return dst
}

// listAfter finds the names listed after a name ending at e: ", Name",
// " and Name", " e Name", " et Name", " und Name", " y Name".
// listConjunctions join names in a list ("Maria Rossi and Luca Bianchi").
var listConjunctions = []string{"and ", "e ", "et ", "und ", "y ", "or ", "o "}

func (d *personDetector) listAfter(text string, e int, dst []Finding) []Finding {
	for k := 0; k < 16; k++ {
		i := e
		switch {
		case strings.HasPrefix(text[i:], ", "):
			i += 2
		default:
			i = e
		}
		for _, conj := range listConjunctions {
			if strings.HasPrefix(text[i:], " ") && strings.HasPrefix(text[i+1:], conj) {
				i += 1 + len(conj)
				break
			}
			if i > e && strings.HasPrefix(text[i:], conj) {
				i += len(conj)
				break
			}
		}
		if i == e {
			return dst
		}
		ne, _, first := d.nameAt(text, i)
		if ne < 0 || !d.given[first] {
			return dst
		}
		dst = addFinding(dst, Finding{Type: TypePerson, Start: i, End: ne})
		e = ne
	}
	return dst
}
