//go:build !linux

package plugins

import "os/exec"

// setParentDeathSignal is Linux-only; elsewhere the plugin's parent watchdog
// (watchParent) alone ends a plugin whose host died.
func setParentDeathSignal(*exec.Cmd) {}
