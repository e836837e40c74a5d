package promserver

import (
	"fmt"
	"os/exec"
)

// InstallHint tells how to get the binaries.
const InstallHint = "install Debian's prometheus package (`make prometheus-tools`)"

// lookPath finds a binary on PATH, naming the package that provides it.
func lookPath(name string) (string, error) {
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("promserver: %w: %s", err, InstallHint)
	}
	return p, nil
}

// LookPath finds prometheus and promtool on PATH.
func LookPath() (prometheus, promtool string, err error) {
	if prometheus, err = lookPath("prometheus"); err != nil {
		return "", "", err
	}
	promtool, err = lookPath("promtool")
	return prometheus, promtool, err
}
