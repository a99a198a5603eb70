package classify

import (
	"hash/maphash"
	"slices"
	"sync"

	"github.com/molly-gateway/molly/redaction"
)

// The scan cache keeps the detectors' findings of long texts that come
// back request after request. A conversation sends its earlier messages
// again on every turn (chat clients; agents, with their tool results; RAG
// prompts, with the same retrieved passages), and the detectors cost about
// 5 ns a byte each time they read them: at turn n of a conversation of
// long messages, a classification would otherwise read n messages to find
// what the one new message holds.
//
// A field of at least scanCacheMin bytes outside the request's last user
// message (that one is new by nature, and never looked up) is looked up by
// its hash/maphash hash, 64 bits under a seed drawn for each Classifier,
// so keys say nothing of the texts and cannot be aimed at one another; a
// hit returns the findings the same scanner gave the same text. Only
// complete scans are kept: not one the scan budget cut short, and not one
// that failed. At most scanCacheEntries texts are kept, the oldest
// replaced first; of a text, only its findings' types and offsets are.
type scanCache struct {
	seed maphash.Seed

	mu    sync.Mutex
	found map[uint64][]redaction.Finding
	order []uint64 // keys by age, a ring from next
	next  int
}

// scanCacheMin is the size of the shortest text kept, in bytes: below it
// the detectors cost a few microseconds, what the look-up saves is less.
const scanCacheMin = 1024

// scanCacheEntries bounds the texts kept (their findings, a few dozen bytes
// each, are all the cache holds).
const scanCacheEntries = 4096

func newScanCache() *scanCache {
	return &scanCache{seed: maphash.MakeSeed(), found: make(map[uint64][]redaction.Finding)}
}

// key is text's key.
func (sc *scanCache) key(text string) uint64 { return maphash.String(sc.seed, text) }

// get returns the findings kept under k and whether there are any.
func (sc *scanCache) get(k uint64) ([]redaction.Finding, bool) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	fs, ok := sc.found[k]
	return fs, ok
}

// put keeps fs, a complete scan's findings, under k: a copy with no room
// to append in place, so a caller that extends what get returned copies
// it.
func (sc *scanCache) put(k uint64, fs []redaction.Finding) {
	fs = slices.Clip(slices.Clone(fs))
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if _, ok := sc.found[k]; ok {
		return
	}
	if len(sc.order) < scanCacheEntries {
		sc.order = append(sc.order, k)
	} else {
		delete(sc.found, sc.order[sc.next])
		sc.order[sc.next] = k
		sc.next = (sc.next + 1) % scanCacheEntries
	}
	sc.found[k] = fs
}
