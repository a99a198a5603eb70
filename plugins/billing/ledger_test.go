package main

import "testing"

func TestNanoUSDIsWrittenWithNineFractionalDigits(t *testing.T) {
	cases := []struct {
		name string
		nano int64
		want string
	}{
		{"zero is zero dollars", 0, "0.000000000"},
		{"one nano-dollar is the last digit", 1, "0.000000001"},
		{"a cent is the second digit", 10_000_000, "0.010000000"},
		{"whole dollars keep their fraction", 12_000_000_000, "12.000000000"},
		{"the largest cost the tool takes is exact", 1<<53 - 1, "9007199.254740991"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := formatUSD(c.nano); got != c.want {
				t.Errorf("formatUSD(%d) = %q, want %q", c.nano, got, c.want)
			}
		})
	}
}
