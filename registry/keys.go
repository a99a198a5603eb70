package registry

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// KeyPrefix starts every API key Molly issues, so that a key found in a
// file or a log is recognisable (as GitHub's secret scanning expects).
const KeyPrefix = "sk-molly-"

// Key shapes: KeyPrefix followed by keyLen base62 characters (~256 bits of
// crypto/rand entropy); the display prefix is KeyPrefix plus the first
// prefixLen of them (~48 bits, not enough to guess the rest).
const (
	keyLen    = 43
	prefixLen = 8
)

const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// Key is an API key's public record: never the key itself, which is shown
// once by CreateKey and then only its SHA-256 is kept.
type Key struct {
	// Prefix is the key's first characters, e.g. "sk-molly-3fZq9LbA": enough
	// to tell keys apart in lists and to revoke one, not to use it.
	Prefix string `json:"prefix"`
	// Member owns the key.
	Member string `json:"member"`
	// Name is a free label, e.g. "laptop".
	Name string `json:"name,omitempty"`
	// Created is when the key was issued; Revoked when it was revoked (zero: live).
	Created time.Time `json:"created"`
	Revoked time.Time `json:"revoked,omitzero"`
}

// newSecret returns a fresh key: KeyPrefix + keyLen base62 characters from
// crypto/rand, by rejection sampling so every character is uniform.
func newSecret() (string, error) {
	var b strings.Builder
	b.WriteString(KeyPrefix)
	buf := make([]byte, 64)
	for b.Len() < len(KeyPrefix)+keyLen {
		if _, err := rand.Read(buf); err != nil {
			return "", err
		}
		for _, c := range buf {
			if c < 62*4 && b.Len() < len(KeyPrefix)+keyLen { // 248 = 4·62: no modulo bias
				b.WriteByte(base62[c%62])
			}
		}
	}
	return b.String(), nil
}

func hashKey(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// CreateKey issues a key for member and returns it in full (the only time
// it is available) with its record. Errors: ErrNotFound for an unknown member.
func (r *Registry) CreateKey(ctx context.Context, member, name string) (secret string, k Key, err error) {
	if strings.ContainsAny(name, "\r\n") || len(name) > 128 {
		return "", Key{}, fmt.Errorf("key name must be one line of at most 128 characters: %w", ErrInvalid)
	}
	if _, err := r.Member(ctx, member); err != nil {
		return "", Key{}, err
	}
	now := r.now().UTC().Truncate(time.Millisecond)
	for range 5 { // a prefix collision (1 in 2^47 per pair) just draws again
		if secret, err = newSecret(); err != nil {
			return "", Key{}, fmt.Errorf("registry: drawing a key: %w", err)
		}
		k = Key{Prefix: secret[:len(KeyPrefix)+prefixLen], Member: member, Name: name, Created: now}
		_, err = r.db.ExecContext(ctx, `INSERT INTO keys (hash, prefix, member, name, created) VALUES (?, ?, ?, ?, ?)`,
			hashKey(secret), k.Prefix, member, name, ms(now))
		if err == nil {
			return secret, k, nil
		}
		if !strings.Contains(strings.ToUpper(err.Error()), "UNIQUE") { // SQLite's "UNIQUE constraint", PostgreSQL's "unique constraint"
			break
		}
	}
	return "", Key{}, fmt.Errorf("registry: storing a key for %s: %w", member, err)
}

// Keys returns the keys of member (every member's when member is ""),
// oldest first, revoked ones included.
func (r *Registry) Keys(ctx context.Context, member string) ([]Key, error) {
	rows, err := r.db.QueryContext(ctx, `SELECT prefix, member, name, created, revoked FROM keys
		WHERE ? = '' OR member = ? ORDER BY created, prefix`, member, member)
	if err != nil {
		return nil, fmt.Errorf("registry: listing keys: %w", err)
	}
	defer rows.Close()
	out := []Key{}
	for rows.Next() {
		var k Key
		var created, revoked int64
		if err := rows.Scan(&k.Prefix, &k.Member, &k.Name, &created, &revoked); err != nil {
			return nil, fmt.Errorf("registry: listing keys: %w", err)
		}
		k.Created, k.Revoked = fromMS(created), fromMS(revoked)
		out = append(out, k)
	}
	return out, rows.Err()
}

// RevokeKey revokes the key with this display prefix (or the whole key,
// cut to its DisplayPrefix); requests with it get 401 from then on.
// Revoking a revoked key is a no-op. Errors: ErrNotFound, naming the
// prefix only.
func (r *Registry) RevokeKey(ctx context.Context, prefix string) error {
	// A whole key revokes by its prefix, and no error below holds more
	// than the prefix (an error of the admin API is logged).
	prefix = DisplayPrefix(prefix)
	res, err := r.db.ExecContext(ctx, `UPDATE keys SET revoked = CASE revoked WHEN 0 THEN ? ELSE revoked END WHERE prefix = ?`,
		ms(r.now()), prefix)
	if err != nil {
		return fmt.Errorf("registry: revoking %s: %w", prefix, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("key %q: %w", prefix, ErrNotFound)
	}
	return nil
}

const lookupQuery = `SELECT ` + memberCols + `, k.prefix, k.name, k.created, k.revoked
	FROM keys k JOIN members m ON m.name = k.member WHERE k.hash = ?`

// Lookup finds the member holding secret. Errors: ErrUnknownKey (also for
// anything not shaped like a Molly key), ErrRevokedKey. The errors never
// contain the key.
func (r *Registry) Lookup(ctx context.Context, secret string) (Member, Key, error) {
	if !strings.HasPrefix(secret, KeyPrefix) || len(secret) != len(KeyPrefix)+keyLen {
		return Member{}, Key{}, ErrUnknownKey
	}
	var k Key
	var created, revoked int64
	m, err := scanMember(r.row(ctx, lookupQuery, hashKey(secret)), &k.Prefix, &k.Name, &created, &revoked)
	if errors.Is(err, sql.ErrNoRows) {
		return Member{}, Key{}, ErrUnknownKey
	}
	if err != nil {
		return Member{}, Key{}, fmt.Errorf("registry: looking up a key: %w", err)
	}
	k.Member, k.Created, k.Revoked = m.Name, fromMS(created), fromMS(revoked)
	if revoked != 0 {
		return Member{}, k, ErrRevokedKey
	}
	return m, k, nil
}

// DisplayPrefix returns the display prefix of a whole key (KeyPrefix plus
// the first characters), or s unchanged when s is not longer than a prefix.
func DisplayPrefix(s string) string {
	if n := len(KeyPrefix) + prefixLen; strings.HasPrefix(s, KeyPrefix) && len(s) > n {
		return s[:n]
	}
	return s
}
