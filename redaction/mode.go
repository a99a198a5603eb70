package redaction

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode"
)

// Mode is how a Vault replaces the values of one entity type.
type Mode int

const (
	// ModePlaceholder replaces a value by a numbered placeholder such as
	// "[EMAIL_1]" that Restore turns back into the value. The default.
	ModePlaceholder Mode = iota
	// ModeMask replaces a value by its bare type, "[EMAIL]". Irreversible:
	// the answer keeps "[EMAIL]".
	ModeMask
	// ModeHash replaces a value by a keyed HMAC-SHA256 pseudonym,
	// "[EMAIL#1a2b3c4d5e6f7a8b]" (first 64 bits, hex): the same value gets
	// the same pseudonym in every request under one key, so logs and
	// upstreams can correlate without seeing it. Irreversible.
	ModeHash
)

// String returns "placeholder", "mask" or "hash".
func (m Mode) String() string {
	switch m {
	case ModePlaceholder:
		return "placeholder"
	case ModeMask:
		return "mask"
	case ModeHash:
		return "hash"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ParseMode parses "placeholder", "mask" or "hash" (config and Rego data);
// anything else is an error naming it.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "placeholder", "":
		return ModePlaceholder, nil
	case "mask":
		return ModeMask, nil
	case "hash":
		return ModeHash, nil
	}
	return 0, fmt.Errorf("redaction: unknown mode %q (want placeholder, mask or hash)", s)
}

// VaultOption configures a Vault; see NewVault.
type VaultOption func(*Vault)

// WithMode sets the mode for entity type typ (default ModePlaceholder).
func WithMode(typ string, m Mode) VaultOption {
	return func(v *Vault) { v.modes[typ] = m }
}

// WithHMACKey sets the key of ModeHash pseudonyms. The gateway should pass
// one long-lived secret (≥ 32 random bytes) so pseudonyms are stable across
// requests and restarts; without it a random key made once per process is
// used. The key is copied.
func WithHMACKey(key []byte) VaultOption {
	k := append([]byte(nil), key...)
	return func(v *Vault) { v.hmacKey = k }
}

// processKey is the ModeHash key when none is configured.
var processKey = func() []byte {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		panic("redaction: no randomness for the HMAC key: " + err.Error())
	}
	return k
}()

// pseudonym returns the ModeHash replacement of value.
func (v *Vault) pseudonym(typ, value string) string {
	key := v.hmacKey
	if key == nil {
		key = processKey
	}
	h := hmac.New(sha256.New, key)
	h.Write([]byte(typ))
	h.Write([]byte{0})
	h.Write([]byte(canonical(typ, value)))
	return "[" + typeName(typ) + "#" + hex.EncodeToString(h.Sum(nil)[:8]) + "]"
}

// canonical is the form of value a pseudonym is computed from, so that
// one entity written two ways gets one pseudonym: e-mail addresses in
// lower case (mailbox names are case-insensitive in practice, though RFC
// 5321 §2.4 lets the local part differ), and card, IBAN and phone numbers
// without separators and in upper case — after the detectors'
// normalisation (invisible characters dropped, fullwidth and other
// compatibility forms folded, percent and character references decoded),
// so that an evasion does not get a pseudonym of its own.
func canonical(typ, value string) string {
	if v, ok := normalise(value); ok {
		value = strings.Clone(v.text)
	}
	switch typ {
	case TypeEmail:
		return strings.ToLower(value)
	case TypeCreditCard, TypeIBAN, TypePhone:
		return strings.Map(func(r rune) rune {
			if r == ' ' || r == '-' || r == '.' || r == '(' || r == ')' || r == '\u00a0' {
				return -1
			}
			return unicode.ToUpper(r)
		}, value)
	}
	return value
}
