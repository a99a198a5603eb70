//go:build !race

package capability

// raceEnabled: the race detector is on (sync.Pool then drops items at random).
const raceEnabled = false
