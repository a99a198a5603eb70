package openai

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"sync"
	"sync/atomic"
)

// Correlation headers.
const (
	// HeaderRequestID is the request's id, sent on every response (OpenAI's
	// SDKs expose it as the response's request id) and forwarded upstream.
	HeaderRequestID = "X-Request-Id"
	// HeaderShouldRetry tells OpenAI's SDKs whether to retry ("true",
	// "false"), overriding their status-based rules.
	HeaderShouldRetry = "X-Should-Retry"
)

// MaxRequestID is the longest client request id kept, in bytes; a longer
// one, or one with bytes outside printable ASCII, is replaced by Molly's.
const MaxRequestID = 128

// RequestID returns the request's id and makes sure both the response and
// the request carry it in HeaderRequestID: the id already on the response
// (an earlier handler set it), else the client's (when printable ASCII of
// at most MaxRequestID bytes), else a new "req_" + 32 hex digits. Setting
// it on the request is what forwards Molly's id upstream.
func RequestID(w http.ResponseWriter, r *http.Request) string {
	id := w.Header().Get(HeaderRequestID)
	if id == "" {
		id = r.Header.Get(HeaderRequestID)
		if !printable(id) {
			id = NewRequestID()
		}
		w.Header().Set(HeaderRequestID, id)
	}
	if r.Header.Get(HeaderRequestID) != id {
		r.Header.Set(HeaderRequestID, id)
	}
	return id
}

func printable(s string) bool {
	if s == "" || len(s) > MaxRequestID {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// NewRequestID returns a new request id of Molly's: "req_" + 32 lower-case
// hex digits, the AES-128 encryption, under a key this process drew at
// random, of 8 zero bytes and a 64-bit counter that starts at a random
// value (so ids are unique within the process and unpredictable without
// the key). Minted recognises them.
func NewRequestID() string {
	m := minter()
	var b [aes.BlockSize]byte
	binary.BigEndian.PutUint64(b[8:], m.next.Add(1))
	m.block.Encrypt(b[:], b[:])
	var out [4 + 2*aes.BlockSize]byte
	copy(out[:], "req_")
	hex.Encode(out[4:], b[:])
	return string(out[:])
}

// Minted reports whether id is a request id this process made with
// NewRequestID, as it made it: "req_" and 32 lower-case hex digits that
// decrypt to a block whose first 8 bytes are zero. Any other value passes
// with probability 2⁻⁶⁴ (upper-case digits never: they would let a client
// set bits of an id it was given), so the egress forwards an id that
// passes without running the detectors over it: what a client can choose
// there is only which of the ids Molly gave it to send back. Ids of other
// processes do not pass.
func Minted(id string) bool {
	if len(id) != 4+2*aes.BlockSize || id[:4] != "req_" {
		return false
	}
	var b [aes.BlockSize]byte
	for i := range b {
		hi, ok1 := lowerHex(id[4+2*i])
		lo, ok2 := lowerHex(id[5+2*i])
		if !ok1 || !ok2 {
			return false
		}
		b[i] = hi<<4 | lo
	}
	minter().block.Decrypt(b[:], b[:])
	return binary.BigEndian.Uint64(b[:8]) == 0
}

// lowerHex is the value of the lower-case hex digit c.
func lowerHex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// idMinter is NewRequestID's key and counter.
type idMinter struct {
	block cipher.Block
	next  atomic.Uint64
}

var minter = sync.OnceValue(func() *idMinter {
	var key [16 + 8]byte
	_, _ = rand.Read(key[:]) // crypto/rand.Read never fails (Go 1.24+)
	block, err := aes.NewCipher(key[:16])
	if err != nil {
		panic(err) // a 16-byte key is always valid
	}
	m := &idMinter{block: block}
	m.next.Store(binary.BigEndian.Uint64(key[16:]))
	return m
})
