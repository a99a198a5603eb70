package redaction

// Keys written in groups. People paste some fixed-length keys the way they
// read them out, four characters at a time: "AKIA IOSF ODNN 7EXA MPLE",
// "AKIA-IOSF-ODNN-7EXA-MPLE". The gitleaks rules and the hand-written
// ones match a key whole, so a grouped one is read here, as cards and IBANs
// are read through their spacing (numeric.go): from the rule's keyword hit,
// five groups of four apart by one separator, the same one each time.
//
// Only AWS access key ids are read grouped: they are short (20
// characters, five groups of four) and fixed in length, so a grouped one
// has one shape. The other providers' tokens (GitHub's ghp_ + 36, Slack's
// xox…, OpenAI's sk-…) are long or of varying length, have a prefix that
// does not fill a group, and are copied, not read out; their grouped
// forms are not a shape people write.

// groupedAWSKeyAt returns the end of an AWS access key id written in five
// groups of four from p (the prefix AKIA, ASIA, ABIA, ACCA or A3T plus one
// character, then sixteen characters of the key alphabet), with one
// separator between groups, the same each time (' ', or '-': the view maps
// every dash and space to these), or -1. The key stands apart from the
// text around it (no word byte before or after, and when the groups are
// apart by dashes, no dashed group glued before or after: a longer dashed
// code). Against prose in capitals ("ASIA WILL HOST GAME SOON") the
// sixteen characters after the prefix must be of the key alphabet (AWS
// encodes them in base32: letters and the digits 2 to 7) and hold at
// least one digit; an id without any digit (about one in thirty) is found
// only when written unbroken.
func groupedAWSKeyAt(text string, p int) int {
	if len(text)-p < 24 || wordByte(before(text, p)) {
		return -1
	}
	switch pre := text[p : p+4]; {
	case pre == "AKIA" || pre == "ASIA" || pre == "ABIA" || pre == "ACCA":
	case pre[:3] == "A3T" && (isUpper(pre[3]) || isDigit(pre[3])):
	default:
		return -1
	}
	sep := text[p+4]
	if sep != ' ' && sep != '-' {
		return -1
	}
	if sep == '-' && before(text, p) == '-' && isAlnum(before(text, p-1)) {
		return -1
	}
	digit := false
	j := p + 4
	for g := 0; g < 4; g++ {
		if text[j] != sep {
			return -1
		}
		j++
		for k := 0; k < 4; k++ {
			c := text[j]
			switch {
			case isUpper(c):
			case c >= '2' && c <= '7':
				digit = true
			default:
				return -1
			}
			j++
		}
	}
	if !digit || wordByte(at(text, j)) || sep == '-' && at(text, j) == '-' && isAlnum(at(text, j+1)) {
		return -1
	}
	return j
}
