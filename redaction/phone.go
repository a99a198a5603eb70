package redaction

import (
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/nyaruka/phonenumbers"
)

// Phone numbers are validated against libphonenumber's per-region
// metadata (github.com/nyaruka/phonenumbers, from Google's
// PhoneNumberMetadata.xml): a national significant number is valid for a
// region when it matches the region's general pattern and the pattern of
// one number type (fixed line, mobile, toll free, premium rate, shared
// cost, VoIP, personal, pager, UAN, voicemail), with a possible length
// for that type — the test libphonenumber's IsValidNumber makes
// (getNumberTypeHelper). The patterns are compiled once per region, so a
// check costs a few anchored matches instead of a Parse.

// phoneDesc is one number type of a region: possible lengths and the
// anchored national number pattern, also as an automaton over digits
// when it has one (see digitDFA).
type phoneDesc struct {
	lengths []int32
	re      *regexp.Regexp
	dfa     *digitDFA
}

func (d *phoneDesc) match(nsn string) bool {
	if d == nil || !slices.Contains(d.lengths, int32(len(nsn))) {
		return false
	}
	if d.dfa != nil {
		if m, ok := d.dfa.match(nsn); ok {
			return m
		}
	}
	return d.re.MatchString(nsn)
}

// phoneRegion is the compiled metadata of one region.
type phoneRegion struct {
	id       string
	cc       int
	prefix   string // national (trunk) prefix, e.g. "0" or "1"
	general  *phoneDesc
	types    []*phoneDesc
	mobile   *phoneDesc
	sameMobF bool
}

var (
	phoneMetaOnce sync.Once
	phoneMeta     map[string]*phoneMetadataEntry // region -> metadata
	phoneByCC     map[int][]string               // country calling code -> regions
)

type phoneMetadataEntry struct {
	once sync.Once
	meta *phonenumbers.PhoneMetadata
	r    *phoneRegion
}

func loadPhoneMeta() {
	phoneMeta = map[string]*phoneMetadataEntry{}
	phoneByCC = map[int][]string{}
	coll, err := phonenumbers.MetadataCollection()
	if err != nil {
		return
	}
	for _, m := range coll.GetMetadata() {
		id := m.GetId()
		phoneMeta[id] = &phoneMetadataEntry{meta: m}
		cc := int(m.GetCountryCode())
		if m.GetMainCountryForCode() {
			phoneByCC[cc] = append([]string{id}, phoneByCC[cc]...)
		} else {
			phoneByCC[cc] = append(phoneByCC[cc], id)
		}
	}
}

// region returns the compiled metadata of region id, or nil.
func phoneRegionFor(id string) *phoneRegion {
	phoneMetaOnce.Do(loadPhoneMeta)
	e := phoneMeta[id]
	if e == nil {
		return nil
	}
	e.once.Do(func() {
		m := e.meta
		r := &phoneRegion{id: id, cc: int(m.GetCountryCode()), prefix: m.GetNationalPrefix(), sameMobF: m.GetSameMobileAndFixedLinePattern()}
		general := m.GetGeneralDesc()
		desc := func(d *phonenumbers.PhoneNumberDesc) *phoneDesc {
			if d == nil || d.GetNationalNumberPattern() == "" {
				return nil
			}
			lengths := d.GetPossibleLength()
			if len(lengths) == 0 {
				lengths = general.GetPossibleLength()
			}
			if len(lengths) == 0 || lengths[0] == -1 {
				return nil
			}
			re, err := regexp.Compile("^(?:" + d.GetNationalNumberPattern() + ")$")
			if err != nil {
				return nil
			}
			return &phoneDesc{lengths: lengths, re: re, dfa: newDigitDFA("(?:" + d.GetNationalNumberPattern() + ")")}
		}
		r.general = desc(general)
		for _, d := range []*phonenumbers.PhoneNumberDesc{m.GetPremiumRate(), m.GetTollFree(), m.GetSharedCost(), m.GetVoip(),
			m.GetPersonalNumber(), m.GetPager(), m.GetUan(), m.GetVoicemail(), m.GetFixedLine(), m.GetMobile()} {
			if pd := desc(d); pd != nil {
				r.types = append(r.types, pd)
			}
		}
		r.mobile = desc(m.GetMobile())
		e.r = r
	})
	return e.r
}

// validRegion reports whether region is a region the phone metadata knows.
func validRegion(region string) bool {
	return phoneRegionFor(region) != nil && region != "001"
}

// valid reports whether nsn is a valid national significant number of r.
func (r *phoneRegion) valid(nsn string) bool {
	if r == nil || !r.general.match(nsn) {
		return false
	}
	for _, d := range r.types {
		if d.match(nsn) {
			return true
		}
	}
	return false
}

// validNational reports whether digits, written in the national format of
// region r (with or without its trunk prefix), are a valid number there.
func validNational(digits string, r *phoneRegion) bool {
	if r == nil {
		return false
	}
	if r.prefix != "" && strings.HasPrefix(digits, r.prefix) && r.valid(digits[len(r.prefix):]) {
		return true
	}
	return r.valid(digits)
}

// validIntl reports whether digits (country calling code first, without
// '+' or 00) are a valid international number (ITU-T E.164: at most 15
// digits); a trunk prefix written after the code ("+44 (0)20 …") is
// accepted.
//
// A number written with '+' and separators is a phone number by its shape;
// for it (plus) a possible length for the country (libphonenumber's
// IsPossibleNumber) is enough, so numbers in ranges the metadata does not
// list yet (Ofcom's drama ranges, new mobile blocks) are still found.
func validIntl(digits string, plus bool) bool {
	if len(digits) > 15 || len(digits) < 8 {
		return false
	}
	phoneMetaOnce.Do(loadPhoneMeta)
	for l := 1; l <= 3; l++ {
		cc := 0
		for _, c := range []byte(digits[:l]) {
			cc = cc*10 + int(c-'0')
		}
		regions := phoneByCC[cc]
		if len(regions) == 0 {
			continue
		}
		nsn := digits[l:]
		for _, id := range regions {
			r := phoneRegionFor(id)
			if r.valid(nsn) || r.prefix != "" && strings.HasPrefix(nsn, r.prefix) && r.valid(nsn[len(r.prefix):]) {
				return true
			}
			if plus && r.general != nil && slices.Contains(r.general.lengths, int32(len(nsn))) && nsn[0] != '0' {
				return true
			}
		}
		return false // calling codes are prefix-free (ITU-T E.164 §6)
	}
	return false
}

// phoneContext are words that, shortly before a run of digits without any
// separator or international prefix, make it a phone number rather than an
// order, customer or reference number (EN, IT, FR, DE, ES).
var phoneContext = newCtxWords("tel", "phone", "call", "cell", "mobile", "whatsapp", "fax", "sms", "text me", "ring",
	"chiam", "cellulare", "numero", "contatt", "portable", "appel", "numéro", "handy", "rufnummer", "anruf",
	"móvil", "movil", "llam", "contact", "reach me")

// identifierWords are words after which a bare run of digits is an
// identifier of some other kind (when one of the two words before it).
var identifierWords = map[string]bool{"order": true, "ordine": true, "invoice": true, "fattura": true, "ticket": true, "id": true,
	"ref": true, "account": true, "conto": true, "pratica": true, "tracking": true, "parcel": true, "pedido": true, "commande": true,
	"colis": true, "lote": true, "lotto": true, "bestellnummer": true, "kundennummer": true, "rechnung": true, "rechnungsnummer": true,
	"aktenzeichen": true, "protocollo": true, "sku": true, "n": true, "no": true, "nr": true, "iva": true, "vat": true, "isbn": true,
	"epoch": true, "build": true, "référence": true, "reference": true, "referencia": true, "riferimento": true, "serial": true,
	"matricola": true, "lot": true, "customer": true, "cliente": true, "client": true, "kunde": true, "number": true, "nummer": true}

// cjkIdentifierWords are the identifier words of identifierWords in
// Chinese, Japanese and Korean (order, order number, serial number,
// ticket, version, invoice); words that name a phone or a card ("电话号码",
// "電話番号", "卡号") are not among them.
var cjkIdentifierWords = []string{"订单号", "订单编号", "订单", "單號", "单号", "编号", "編號", "工单", "发票", "版本", "批号",
	"注文番号", "注文", "受付番号", "伝票番号", "請求書", "バージョン", "주문번호", "주문", "송장번호", "버전", "일련번호"}

// cjkIdentifierBefore reports whether the text right before i ends with
// one of cjkIdentifierWords (after a ':' or spaces): Chinese, Japanese and
// Korean put no space between the word and the number ("订单号2024-118734"),
// which numbers glued to those scripts are read apart from (see
// numGlueBefore).
func cjkIdentifierBefore(text string, i int) bool {
	k := i
	for k > 0 && (text[k-1] == ' ' || text[k-1] == ':') && i-k < 4 {
		k--
	}
	if before(text, k) < 0x80 {
		return false
	}
	for _, c := range cjkIdentifierWords {
		if strings.HasSuffix(text[:k], c) {
			return true
		}
	}
	return false
}

// identifierBefore reports whether one of the two words before i is an
// identifier word ("order 3471234567", "customer id 347…", "n. 347…").
func identifierBefore(text string, i int) bool {
	k := i
	for w := 0; w < 2; w++ {
		for k > 0 && (text[k-1] == ' ' || text[k-1] == ':' || text[k-1] == '.' || text[k-1] == '#' || text[k-1] == '=' || text[k-1] == '\xb0' || text[k-1] == '\xba') {
			k--
		}
		e := k
		for k > 0 && (isAlpha(text[k-1]) || text[k-1] >= 0x80 && text[k-1] != 0xb0 && text[k-1] != 0xba) {
			k--
		}
		if k == e {
			return false
		}
		if identifierWords[strings.ToLower(text[k:e])] {
			return true
		}

	}
	return false
}

// phone checks atoms [i, j) of the current cluster as a phone number.
func (ns *numScan) phone(i, j int) {
	text, c := ns.text, &ns.c
	start, end := c.atoms[i].s, c.atoms[j-1].e
	digits := ns.digitsOf(i, j)
	// An international prefix: '+' right before (or ending the gap
	// before), or 00.
	intl, plus := false, false
	if i == 0 {
		p := start
		for p > 0 && text[p-1] == ' ' && start-p < 1 {
			p--
		}
		if before(text, p) == '+' {
			intl, plus, start = true, true, p-1
		}
	} else if g := c.gap(text, i); g[len(g)-1] == '+' || strings.HasSuffix(g, "+ ") {
		intl, plus = true, true
		start -= len(g) - strings.LastIndexByte(g, '+')
	}
	if !intl && strings.HasPrefix(digits, "00") && len(digits) > 9 {
		intl, digits = true, digits[2:]
	}
	// Parentheses around an area code belong to the number.
	if i == 0 && before(text, start) == '(' && j-i > 1 && strings.IndexByte(c.gap(text, i+1), ')') >= 0 {
		start--
	}
	if i == 0 && leftGluedPhone(text, start) && !(j == len(c.atoms) && underscored(text, start, end)) {
		return
	}
	// Shapes that are not phone numbers: dates, versions, decimals.
	ns.lens = c.lens(i, j, ns.lens[:0])
	single := c.allSingle(i, j)
	if !single && !intl && looksLikeDate(text, c, i, j, ns.lens) {
		return
	}
	if !single && !intl && j-i >= 4 && c.gapsAre(text, i, j, ".") {
		return // 1.2.3.4 and longer dotted runs: versions, addresses
	}
	// Edges inside a cluster must be more than one separator byte
	// ("+39 333 123 4567 / 02 1234 5678"): a number one space away from
	// more digits is part of something longer.
	if i > 0 && len(c.gap(text, i)) == 1 && !intl || j < len(c.atoms) && len(c.gap(text, j)) == 1 {
		return
	}
	// 3-2-4 is how SSNs are written; a year before or after a slash is a
	// reference ("2024/123456", "12345/2024").
	if len(ns.lens) == 3 && ns.lens[0] == 3 && ns.lens[1] == 2 && ns.lens[2] == 4 {
		return
	}
	for k := i + 1; k < j; k++ {
		if strings.IndexByte(c.gap(text, k), '/') >= 0 && (isYear(text[c.atoms[k-1].s:c.atoms[k-1].e]) || isYear(text[c.atoms[k].s:c.atoms[k].e])) {
			return
		}
	}
	// A decimal with one digit before the point ("0.123456789", "3.1415926535"):
	// no numbering plan writes a lone digit as a group of its own.
	if j-i == 2 && ns.lens[0] == 1 && c.gap(text, i+1) == "." && !intl {
		return
	}
	// Decimals in a list ("20.147752, 166.903277").
	if j-i == 2 && c.gap(text, i+1) == "." && before(text, start) == ' ' && before(text, start-1) == ',' && isDigit(before(text, start-2)) {
		return
	}
	if cjkIdentifierBefore(text, start) {
		return
	}
	bare := j-i == 1 && !intl
	itMobile := false
	if bare {
		switch {
		case identifierBefore(text, start):
			return
		case hasContext(text, start, phoneContext, 40):
		case len(digits) == 10 && digits[0] == '3' && italianMobile(digits):
			// Italian mobile numbers (AGCOM plan: 3xx + 7 digits) are
			// written without separators and without a word often
			// enough to be found on their own, whatever the region.
			itMobile = true
		default:
			return
		}
	}
	var ok bool
	switch {
	case itMobile:
		ok = true
	case intl:
		ok = validIntl(digits, plus)
	default:
		ok = ns.nationalPhone(digits)
	}
	if ok && !hasContext(text, start, versionContext, 24) {
		ns.add(TypePhone, "", start, end)
	}
}

// isYear reports whether a four-digit atom is a year 1900–2099.
func isYear(a string) bool {
	return len(a) == 4 && (a[:2] == "19" || a[:2] == "20")
}

// leftGluedPhone reports whether a phone candidate starting at s (at its
// '+' or first digit) continues something else.
func leftGluedPhone(text string, s int) bool {
	p := before(text, s)
	switch {
	case p >= 0x80:
		return numGlueBefore(text, s)
	case wordByte(p), p == '#', p == '$', p == '.' && isDigit(before(text, s-1)), p == '-' && wordByte(before(text, s-1)), p == '/' && wordByte(before(text, s-1)):
		return true
	case p == ':' && isDigit(before(text, s-1)):
		return true
	}
	return false
}

var italianMobileRegion = sync.OnceValue(func() *phoneRegion { return phoneRegionFor("IT") })

// italianMobile reports whether ten digits are an Italian mobile number.
func italianMobile(d string) bool {
	r := italianMobileRegion()
	return r != nil && r.mobile.match(d)
}

// looksLikeDate reports whether atoms [i, j) are a date: 2024-03-15,
// 15/03/2024, 15.03.24 (three atoms of 1–4 digits with - / . between, a
// four-digit year first or last).
func looksLikeDate(text string, c *cluster, i, j int, lens []int) bool {
	if j-i != 3 {
		return false
	}
	for k := i + 1; k < j; k++ {
		g := c.gap(text, k)
		if g != "-" && g != "/" && g != "." {
			return false
		}
	}
	return lens[0] == 4 && lens[1] <= 2 && lens[2] <= 2 || lens[0] <= 2 && lens[1] <= 2 && (lens[2] == 4 || lens[2] == 2)
}
