package plugins_test

import (
	"syscall"
	"time"
)

// becomeSubreaper makes the test process the reaper of orphaned
// descendants (prctl PR_SET_CHILD_SUBREAPER, man 2 prctl), so the plugins
// of a host the tests kill are re-parented here and can be reaped, instead
// of lingering as zombies under an init that may not reap.
func becomeSubreaper() {
	const prSetChildSubreaper = 36
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
}

// reapOrphan collects the exit status of pid if it is an orphan re-parented
// to this process (never one an exec.Cmd here still waits for). It retries
// for up to 2 s: a plugin can die while its killed parent is still being
// torn down, and is re-parented here only after that.
func reapOrphan(pid int) {
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var ws syscall.WaitStatus
		if got, _ := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); got == pid {
			return
		}
	}
}
