// The lab's pod sandbox ("pause") process: PID 1 of every pod on a real lab node.
// It holds the pod's namespaces open, reaps orphaned children and exits on SIGINT or SIGTERM,
// like Kubernetes' own pause. Built statically by devheal.lab.toolchain and packed into an
// OCI image by devheal.lab.images: nothing is pulled from a registry.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
