package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// components in the order Up starts them; Down stops them in reverse.
var components = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
	"node", "dns", "kube-proxy"}

// Down tears the cluster down, whatever state Up left it in: it stops the
// components, kills everything left in the cluster's cgroups (pods,
// containerd's shims), and removes mounts, network namespaces, iptables
// chains, the bridge, the sysctls it changed and the state directories. It
// keeps going past errors and returns them all.
func (c *Config) Down(ctx context.Context) error {
	var errs []error
	note := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	// The node (the kubelet and containerd, and with them every container)
	// before the control plane.
	for _, name := range slices.Backward(components) {
		note(stop(name, 10*time.Second))
	}
	note(killCgroups())
	umountErr := unmountUnder(StateDir, RunDir, "/var/run/netns/cni-", "/run/netns/cni-")
	note(umountErr)
	note(removeNetns())
	note(cleanIptables(ctx))
	note(destroyIpsets(ctx))
	if linkExists(BridgeName) {
		note(run(ctx, "ip", "link", "del", BridgeName))
	}
	restoreSysctls()
	if umountErr != nil {
		// Removing files through a mount still in place could reach
		// outside the cluster's directories.
		return errors.Join(append(errs, fmt.Errorf("left %s and %s in place", StateDir, RunDir))...)
	}
	for _, d := range []string{StateDir, RunDir, "/var/run/ztunnel", "/var/run/istio-cni"} {
		note(os.RemoveAll(d))
	}
	return errors.Join(errs...)
}

// unmountUnder unmounts every mount point under the given prefixes,
// deepest first, detaching those still busy.
func unmountUnder(prefixes ...string) error {
	var errs []error
	for round := 0; round < 5; round++ {
		points, err := mountPoints(prefixes)
		if err != nil {
			return err
		}
		if len(points) == 0 {
			return nil
		}
		errs = errs[:0]
		for _, p := range points {
			if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
			}
		}
	}
	return errors.Join(errs...)
}

// mountPoints lists the mount points under prefixes, longest path first.
func mountPoints(prefixes []string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		p := unescapeMount(fields[4])
		for _, pre := range prefixes {
			if p == strings.TrimSuffix(pre, "/") || strings.HasPrefix(p, strings.TrimSuffix(pre, "/")+"/") ||
				(strings.HasSuffix(pre, "-") && strings.HasPrefix(p, pre)) {
				points = append(points, p)
				break
			}
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	return slices.Compact(points), sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	return regexp.MustCompile(`\\([0-7]{3})`).ReplaceAllStringFunc(s, func(m string) string {
		var b byte
		fmt.Sscanf(m[1:], "%o", &b)
		return string([]byte{b})
	})
}

// netnsName matches the network namespaces containerd's CRI makes for pod
// sandboxes (cni-<uuid>); nothing else is touched.
var netnsName = regexp.MustCompile(`^cni-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// removeNetns removes the pod sandboxes' namespace files left unmounted
// above.
func removeNetns() error {
	var errs []error
	for _, dir := range []string{"/var/run/netns", "/run/netns"} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if netnsName.MatchString(e.Name()) {
				if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// ourChain reports whether an iptables chain is one the cluster's parts
// make: kube-proxy's and the kubelet's KUBE-*, istio-cni's ISTIO*, the CNI
// plugins' CNI-*, and the guard.
func ourChain(name string) bool {
	for _, p := range []string{"KUBE-", "ISTIO", "CNI-", "GOZT-E2E"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// cleanIptables removes the cluster's chains, and the rules that jump to
// them, from every table of every iptables backend that has them.
func cleanIptables(ctx context.Context) error {
	var errs []error
	for _, tool := range []string{"iptables", "ip6tables", "iptables-legacy", "ip6tables-legacy"} {
		if _, err := exec.LookPath(tool); err != nil {
			continue
		}
		if strings.HasSuffix(tool, "-legacy") && !legacyTablesLoaded(tool) {
			continue // listing them would load them, and then every iptables warns
		}
		for _, table := range []string{"filter", "nat", "mangle", "raw"} {
			if err := cleanTable(ctx, tool, table); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// legacyTablesLoaded reports whether the kernel has any legacy (x_tables)
// table for tool's family.
func legacyTablesLoaded(tool string) bool {
	f := "/proc/net/ip_tables_names"
	if strings.HasPrefix(tool, "ip6") {
		f = "/proc/net/ip6_tables_names"
	}
	b, err := os.ReadFile(f)
	return err == nil && len(strings.TrimSpace(string(b))) > 0
}

func cleanTable(ctx context.Context, tool, table string) error {
	out, err := exec.CommandContext(ctx, tool, "-w", "-t", table, "-S").Output()
	if err != nil {
		return nil // a table this backend or kernel lacks
	}
	var chains []string
	var jumps [][]string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "-N" && ourChain(f[1]):
			chains = append(chains, f[1])
		case len(f) > 2 && f[0] == "-A" && !ourChain(f[1]) && jumpsToOurs(f):
			jumps = append(jumps, f)
		}
	}
	var errs []error
	for _, j := range jumps {
		args := append([]string{"-w", "-t", table, "-D"}, unquote(j[1:])...)
		if err := run(ctx, tool, args...); err != nil {
			errs = append(errs, err)
		}
	}
	for _, ch := range chains {
		if err := run(ctx, tool, "-w", "-t", table, "-F", ch); err != nil {
			errs = append(errs, err)
		}
	}
	for _, ch := range chains {
		if err := run(ctx, tool, "-w", "-t", table, "-X", ch); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func jumpsToOurs(f []string) bool {
	for i := 0; i+1 < len(f); i++ {
		if (f[i] == "-j" || f[i] == "-g") && ourChain(f[i+1]) {
			return true
		}
	}
	return false
}

// unquote strips the quotes iptables -S puts around comments; the
// arguments go to exec, not to a shell.
func unquote(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if strings.HasPrefix(a, `"`) {
			s := a
			for !strings.HasSuffix(s, `"`) || len(s) == 1 {
				i++
				if i >= len(args) {
					break
				}
				s += " " + args[i]
			}
			a = strings.TrimSuffix(strings.TrimPrefix(s, `"`), `"`)
		}
		out = append(out, a)
	}
	return out
}

// iptablesSave returns tool's rules in every table.
func iptablesSave(tool string) (string, error) {
	out, err := exec.Command(tool + "-save").Output()
	return string(out), err
}

func containsLine(text, sub string) bool {
	return strings.Contains(text, sub)
}

// istioIpsets are the sets istio-cni's node agent makes in the host's
// network namespace for ambient pods' health probes.
var istioIpsets = []string{"istio-inpod-probes-v4", "istio-inpod-probes-v6"}

// destroyIpsets removes istioIpsets from the host's network namespace
// (after the iptables rules that name them).
func destroyIpsets(ctx context.Context) error {
	if _, err := exec.LookPath("ipset"); err != nil {
		return nil
	}
	var errs []error
	for _, name := range istioIpsets {
		if exec.CommandContext(ctx, "ipset", "list", "-n", name).Run() != nil {
			continue // not there
		}
		errs = append(errs, run(ctx, "ipset", "destroy", name))
	}
	return errors.Join(errs...)
}
