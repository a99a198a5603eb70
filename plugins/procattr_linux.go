package plugins

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal asks Linux to SIGKILL the plugin when the host dies
// (prctl PR_SET_PDEATHSIG, man 2 prctl). The signal fires when the thread
// that forked exits; Go keeps its threads for the life of the process, and
// the plugin's own parent watchdog (watchParent) covers the rest.
func setParentDeathSignal(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
