//go:build !linux

package policies

import "time"

// threadClock is unavailable outside Linux: evaluations are then bounded by
// wall-clock time, which also counts time spent waiting for a CPU.
type threadClock int32

func currentThreadClock() (threadClock, bool) { return 0, false }

func (threadClock) now() (time.Duration, bool) { return 0, false }
