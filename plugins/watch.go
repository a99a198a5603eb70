package plugins

import (
	"os"
	"time"
)

// watchParent exits the plugin process once its parent is gone. go-plugin
// hands the host's stdin to the plugin and never reads it, so a host killed
// with SIGKILL would leave its plugins running; when the parent dies the
// kernel re-parents the child (to init or a subreaper) and getppid changes.
// The host also asks Linux for a parent-death signal (procattr_linux.go);
// this poll is the portable backstop. Poll period: 200 ms.
func watchParent() {
	parent := os.Getppid()
	for range time.Tick(200 * time.Millisecond) {
		if os.Getppid() != parent {
			os.Exit(2)
		}
	}
}
