package redaction

// ibanLength is the total IBAN length per country code, from the SWIFT IBAN
// Registry maintained under ISO 13616-1.
var ibanLength = map[string]int{
	"AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BI": 27,
	"BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DJ": 27, "DK": 18, "DO": 28,
	"EE": 20, "EG": 29, "ES": 24, "FI": 18, "FK": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23,
	"GL": 18, "GR": 27, "GT": 28, "HN": 28, "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26,
	"IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21,
	"LY": 25, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MN": 20, "MR": 27, "MT": 31, "MU": 30, "NI": 28,
	"NL": 18, "NO": 15, "OM": 23, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22,
	"RU": 33, "SA": 24, "SC": 31, "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "SO": 23, "ST": 25,
	"SV": 28, "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20, "YE": 30,
}

// ibanLengthOf is ibanLength by the country code's two letters ('A'-based
// indices; 0: no such country), read without hashing a key.
var ibanLengthOf = func() (t [26][26]uint8) {
	for cc, n := range ibanLength {
		t[cc[0]-'A'][cc[1]-'A'] = uint8(n)
	}
	return t
}()

// IBANs (ISO 13616-1): a country code from the registry (any case), two
// check digits, and a BBAN of the length the registry gives for that
// country, written compact, in the paper format of ISO 13616-1 §5.4 or
// with other separators between characters (numeric.go), with the check
// digits verified by ISO 7064 MOD 97-10. Subtype is the country code.

// ibanValid checks the ISO 7064 MOD 97-10 check digits of a compact,
// upper-case IBAN: move the first four characters to the end, replace each
// letter by two digits (A=10 … Z=35) and the remainder mod 97 must be 1.
// Check digits 00, 01 and 99 never occur.
func ibanValid(s []byte) bool {
	if len(s) < 5 {
		return false
	}
	if cd := (s[2]-'0')*10 + s[3] - '0'; cd < 2 || cd > 98 {
		return false
	}
	rem := 0
	for k := 0; k < len(s); k++ {
		c := s[(k+4)%len(s)]
		switch {
		case isDigit(c):
			rem = (rem*10 + int(c-'0')) % 97
		case isUpper(c):
			rem = (rem*100 + int(c-'A'+10)) % 97
		default:
			return false
		}
	}
	return rem == 1
}
