package policies

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadClock is the CPU-time clock of one OS thread: the clockid Linux
// builds for a thread id (MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED) in
// include/linux/posix-timers.h, what glibc's pthread_getcpuclockid
// returns): ((^tid) << 3) | CPUCLOCK_PERTHREAD_MASK (4) | CPUCLOCK_SCHED (2).
// It advances only while the thread runs, so time spent waiting for a CPU
// does not count.
type threadClock int32

// currentThreadClock returns the clock of the calling thread; the caller
// must hold runtime.LockOSThread for the clock to stay its own.
func currentThreadClock() (threadClock, bool) {
	return threadClock((^int32(unix.Gettid()))<<3 | 6), true
}

// now reads the thread's CPU time; false once the thread is gone.
func (c threadClock) now() (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(int32(c), &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
