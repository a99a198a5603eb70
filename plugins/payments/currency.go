package main

// exponents maps ISO 4217 alphabetic codes to their minor-unit exponent:
// an amount of 1234 with exponent 2 is 12.34 (ISO 4217 "minor unit" column,
// https://www.six-group.com/en/products-services/financial-information/data-standards.html).
// A deliberately short list of circulating currencies; add as needed.
var exponents = map[string]int{
	"AUD": 2, "BGN": 2, "BHD": 3, "BRL": 2, "CAD": 2, "CHF": 2, "CLP": 0, "CNY": 2,
	"CZK": 2, "DKK": 2, "EUR": 2, "GBP": 2, "HKD": 2, "HUF": 2, "IDR": 2, "ILS": 2,
	"INR": 2, "ISK": 0, "JOD": 3, "JPY": 0, "KRW": 0, "KWD": 3, "MXN": 2, "NOK": 2,
	"NZD": 2, "OMR": 3, "PLN": 2, "RON": 2, "SEK": 2, "SGD": 2, "THB": 2, "TND": 3,
	"TRY": 2, "TWD": 2, "UAH": 2, "USD": 2, "VND": 0, "ZAR": 2,
}

// maxAmount is the largest amount in minor units the tool accepts: 2^53-1,
// so every amount survives a JSON number in any client.
const maxAmount = 1<<53 - 1
