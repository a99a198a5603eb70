package serving

import (
	"fmt"
	"math/big"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// Integer and number bounds (minimum, maximum, exclusiveMinimum,
// exclusiveMaximum, multipleOf 1) as GBNF, for SchemaToGBNF.

// gbnfIntCap is the largest integer magnitude the primitives write:
// integral-part has at most 16 digits.
const gbnfIntCap = 9_999_999_999_999_999

// numBound is the value of the bound keyword key of s (nil where absent).
func numBound(s gjson.Result, key, ptr string) (*big.Rat, error) {
	v := s.Get(key)
	if !v.Exists() {
		return nil, nil
	}
	r, ok := new(big.Rat).SetString(v.Raw)
	if v.Type != gjson.Number || !ok {
		return nil, fmt.Errorf("JSON Schema keyword %q at %q must be a number", key, ptr)
	}
	return r, nil
}

// ratFloor and ratCeil round r to an integer.
func ratFloor(r *big.Rat) *big.Int {
	q, _ := new(big.Int).DivMod(r.Num(), r.Denom(), new(big.Int))
	return q // Euclidean division by a positive denominator floors
}

func ratCeil(r *big.Rat) *big.Int {
	f := ratFloor(r)
	if !r.IsInt() {
		f.Add(f, big.NewInt(1))
	}
	return f
}

// clampInt is v within [-gbnfIntCap, gbnfIntCap].
func clampInt(v *big.Int) int64 {
	if v.Cmp(big.NewInt(gbnfIntCap)) > 0 {
		return gbnfIntCap
	}
	if v.Cmp(big.NewInt(-gbnfIntCap)) < 0 {
		return -gbnfIntCap
	}
	return v.Int64()
}

// numeric is an integer or number schema. minimum, maximum,
// exclusiveMinimum and exclusiveMaximum on an integer become the exact
// range as llama.cpp's _build_min_max_int writes it for two bounds; a
// missing bound is the primitive's own (16 digits), so that only that
// construction is used (llama.cpp's one-bound variant lets through values
// below a minimum such as 100: "15"). On a number, integer-valued bounds
// are written exactly over decimals without an exponent (numberRange); a
// bound with a fraction is refused. multipleOf 1 makes a number an
// integer; any other multipleOf is refused.
func (c *schemaConverter) numeric(s gjson.Result, typ, ruleName, ptr string) (string, error) {
	if m := s.Get("multipleOf"); m.Exists() {
		r, err := numBound(s, "multipleOf", ptr)
		if err != nil {
			return "", err
		}
		if r.Sign() <= 0 {
			return "", fmt.Errorf("multipleOf at %q must be above 0", ptr)
		}
		if r.Cmp(big.NewRat(1, 1)) != 0 {
			return "", &UnsupportedSchemaError{Keyword: "multipleOf", Pointer: ptr + "/multipleOf", Reason: "only multipleOf 1 (any integer) is expressed"}
		}
		typ = "integer"
	}
	var b [4]*big.Rat
	for i, k := range []string{"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"} {
		r, err := numBound(s, k, ptr)
		if err != nil {
			return "", err
		}
		b[i] = r
	}
	minB, exMin, maxB, exMax := b[0], b[1], b[2], b[3]
	if minB == nil && exMin == nil && maxB == nil && exMax == nil {
		return c.addRule(ruleName, c.primitive(typ)), nil
	}
	empty := noValue("the bounds at %q leave no %s of at most 16 digits", ptr, typ)
	if typ == "integer" {
		lo, hi := big.NewInt(-gbnfIntCap), big.NewInt(gbnfIntCap)
		if minB != nil {
			if v := ratCeil(minB); v.Cmp(lo) > 0 {
				lo = v
			}
		}
		if exMin != nil {
			if v := ratFloor(exMin); v.Add(v, big.NewInt(1)).Cmp(lo) > 0 {
				lo = v
			}
		}
		if maxB != nil {
			if v := ratFloor(maxB); v.Cmp(hi) < 0 {
				hi = v
			}
		}
		if exMax != nil {
			if v := ratCeil(exMax); v.Sub(v, big.NewInt(1)).Cmp(hi) < 0 {
				hi = v
			}
		}
		if lo.Cmp(hi) > 0 {
			return "", empty
		}
		var out strings.Builder
		out.WriteString("(")
		buildMinMaxInt(clampInt(lo), clampInt(hi), &out)
		out.WriteString(") space")
		return c.addRule(ruleName, out.String()), nil
	}
	for i, k := range []string{"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"} {
		if b[i] != nil && !b[i].IsInt() {
			return "", &UnsupportedSchemaError{Keyword: k, Pointer: ptr + "/" + k, Reason: "on a number only an integer bound is expressed (use an integer bound, or type integer)"}
		}
	}
	// The tightest lower and upper bound, each with its exclusiveness.
	var lo, hi *big.Int
	loEx, hiEx := false, false
	if minB != nil {
		lo = minB.Num()
	}
	if exMin != nil && (lo == nil || exMin.Num().Cmp(lo) >= 0) {
		lo, loEx = exMin.Num(), true
	}
	if maxB != nil {
		hi = maxB.Num()
	}
	if exMax != nil && (hi == nil || exMax.Num().Cmp(hi) <= 0) {
		hi, hiEx = exMax.Num(), true
	}
	limit := big.NewInt(gbnfIntCap)
	if lo != nil && lo.Cmp(new(big.Int).Neg(limit)) < 0 {
		lo, loEx = nil, false
	}
	if hi != nil && hi.Cmp(limit) > 0 {
		hi, hiEx = nil, false
	}
	if lo != nil && lo.Cmp(limit) > 0 || hi != nil && hi.Cmp(new(big.Int).Neg(limit)) < 0 {
		return "", empty
	}
	r := numberRange(lo, loEx, hi, hiEx)
	if r == "" {
		return "", empty
	}
	return c.addRule(ruleName, "("+r+") space"), nil
}

// numberRange is the GBNF of the decimals -?I(.F)? (I of at most 16
// digits, F of 1 to 16, no exponent) in the range from lo to hi (nil:
// unbounded; ex: the bound excluded), "" if there is none. Non-negative
// values are written without a sign, negative ones with "-" and a
// non-zero magnitude; each sign's magnitudes are magnitudeRange.
func numberRange(lo *big.Int, loEx bool, hi *big.Int, hiEx bool) string {
	var alts []string
	if hi == nil || hi.Sign() > 0 || hi.Sign() == 0 && !hiEx {
		a, aEx := int64(0), false
		if lo != nil && lo.Sign() >= 0 {
			a, aEx = lo.Int64(), loEx
		}
		var b *int64
		if hi != nil {
			v := hi.Int64()
			b = &v
		}
		if m := magnitudeRange(a, aEx, b, hiEx); m != "" {
			alts = append(alts, m)
		}
	}
	if lo == nil || lo.Sign() < 0 {
		// x = -m, m > 0: x <= hi is m >= -hi, x >= lo is m <= -lo.
		a, aEx := int64(0), true
		if hi != nil && hi.Sign() < 0 {
			a, aEx = -hi.Int64(), hiEx
		}
		var b *int64
		if lo != nil {
			v := -lo.Int64()
			b = &v
		}
		if m := magnitudeRange(a, aEx, b, loEx); m != "" {
			alts = append(alts, `"-" (`+m+`)`)
		}
	}
	return strings.Join(alts, " | ")
}

// magnitudeRange is the GBNF of the unsigned decimals I(.F)? from a to b
// (b nil: any; aEx, bEx: excluded), "" if none: the integer parts
// strictly inside with any fraction, b itself with a zero fraction when
// included, a itself with a non-zero fraction when excluded.
func magnitudeRange(a int64, aEx bool, b *int64, bEx bool) string {
	const frac, zero, nonZero = `("." [0-9]{1,16})?`, `("." [0]{1,16})?`, `"." [0]{0,15} [1-9] [0-9]{0,15}`
	full, top := a, int64(gbnfIntCap)
	if aEx {
		full = a + 1
	}
	if b != nil {
		top = *b - 1
	}
	var alts []string
	if full <= top {
		var out strings.Builder
		buildMinMaxInt(full, top, &out)
		alts = append(alts, "("+out.String()+") "+frac)
	}
	if b != nil && !bEx && *b >= full {
		alts = append(alts, fmt.Sprintf(`"%d" %s`, *b, zero))
	}
	if aEx && (b == nil || a < *b) {
		alts = append(alts, fmt.Sprintf(`"%d" %s`, a, nonZero))
	}
	return strings.Join(alts, " | ")
}

// buildMinMaxInt writes the GBNF of the integers from lo to hi (lo <= hi)
// to out: llama.cpp's _build_min_max_int for two bounds (a sign, then per
// digit count a uniform range of equal-length digit strings).
func buildMinMaxInt(lo, hi int64, out *strings.Builder) {
	if lo < 0 && hi < 0 {
		out.WriteString(`"-" (`)
		buildMinMaxInt(-hi, -lo, out)
		out.WriteString(")")
		return
	}
	if lo < 0 {
		out.WriteString(`"-" (`)
		buildMinMaxInt(0, -lo, out)
		out.WriteString(") | ")
		lo = 0
	}
	digitRange := func(from, to byte) {
		if from == to {
			fmt.Fprintf(out, "[%c]", from)
		} else {
			fmt.Fprintf(out, "[%c-%c]", from, to)
		}
	}
	moreDigits := func(n int) {
		out.WriteString("[0-9]")
		if n != 1 {
			fmt.Fprintf(out, "{%d}", n)
		}
	}
	var uniform func(from, to string)
	uniform = func(from, to string) {
		i := 0
		for i < len(from) && i < len(to) && from[i] == to[i] {
			i++
		}
		if i > 0 {
			out.WriteString(`"` + from[:i] + `"`)
		}
		if i >= len(from) || i >= len(to) {
			return
		}
		if i > 0 {
			out.WriteString(" ")
		}
		subLen := len(from) - i - 1
		if subLen == 0 {
			digitRange(from[i], to[i])
			return
		}
		fromSub, toSub := from[i+1:], to[i+1:]
		zeros, nines := strings.Repeat("0", subLen), strings.Repeat("9", subLen)
		out.WriteString("(")
		toReached := false
		switch {
		case fromSub == zeros && toSub == nines:
			// Every string of the length (not in llama.cpp, which writes
			// the last digit's range as a nested uniform range).
			digitRange(from[i], to[i])
			out.WriteString(" ")
			moreDigits(subLen)
			toReached = true
		case fromSub == zeros:
			digitRange(from[i], to[i]-1)
			out.WriteString(" ")
			moreDigits(subLen)
		default:
			fmt.Fprintf(out, "[%c] (", from[i])
			uniform(fromSub, nines)
			out.WriteString(")")
			if from[i] < to[i]-1 {
				out.WriteString(" | ")
				if toSub == nines {
					digitRange(from[i]+1, to[i])
					toReached = true
				} else {
					digitRange(from[i]+1, to[i]-1)
				}
				out.WriteString(" ")
				moreDigits(subLen)
			}
		}
		if !toReached {
			out.WriteString(" | ")
			digitRange(to[i], to[i])
			out.WriteString(" ")
			uniform(zeros, toSub)
		}
		out.WriteString(")")
	}
	minS, maxS := strconv.FormatInt(lo, 10), strconv.FormatInt(hi, 10)
	for digits := len(minS); digits < len(maxS); digits++ {
		uniform(minS, strings.Repeat("9", digits))
		minS = "1" + strings.Repeat("0", digits)
		out.WriteString(" | ")
	}
	uniform(minS, maxS)
}
