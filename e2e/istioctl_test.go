package e2e

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// istioctl runs the istioctl built from the pinned Istio module
// (bin/e2e/istioctl) against the cluster and returns its stdout.
func istioctl(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(cl.repo, "bin", "e2e", "istioctl"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+os.Getenv("GOZT_E2E_KUBECONFIG"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("istioctl %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// row is a matcher for one line of an istioctl table: each non-empty
// element must equal the field at its index, or, ending in "*", start with
// the rest.
type row []string

func (r row) matches(fields []string) bool {
	if len(fields) < len(r) {
		return false
	}
	for i, want := range r {
		if p, ok := strings.CutSuffix(want, "*"); ok {
			if !strings.HasPrefix(fields[i], p) {
				return false
			}
		} else if want != "" && fields[i] != want {
			return false
		}
	}
	return true
}

// missingRows returns the rows of want no line of table matches.
func missingRows(table string, want []row) []row {
	var missing []row
	for _, r := range want {
		found := false
		for l := range strings.Lines(table) {
			if r.matches(strings.Fields(l)) {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, r)
		}
	}
	return missing
}

// waitIstioctlRows runs `istioctl args...` until its table has a line for
// every row of want, for at most timeout, and returns the table.
func waitIstioctlRows(ctx context.Context, t *testing.T, timeout time.Duration, want []row, args ...string) string {
	t.Helper()
	var out string
	var err error
	var missing []row
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		if out, err = istioctl(ctx, args...); err != nil {
			continue
		}
		if missing = missingRows(out, want); len(missing) == 0 {
			return out
		}
	}
	t.Fatalf("istioctl %s: no line for %q after %v (err %v); it printed:\n%s", strings.Join(args, " "), missing, timeout, err, out)
	return ""
}

// TestScenario7 is issue 37's seventh scenario: istioctl's ztunnel-config
// commands, pointed at the gozt pod (through the API server's
// port-forward, as for ztunnel), show the app pods: their workloads, their
// Service, their certificates, their live connections, and gozt's log
// level.
func TestScenario7(t *testing.T) {
	ctx := context.Background()
	const ns = "e2e-s7"
	client, server, svcIP := meshPair(ctx, t, ns)
	gozt := goztPod(ctx, t)
	// `istioctl ztunnel-config CMD POD.NAMESPACE [flags]`
	on := func(cmd string, flags ...string) []string {
		return append([]string{"ztunnel-config", cmd, gozt.Name + "." + gozt.Namespace}, flags...)
	}
	t.Run("Workloads", func(t *testing.T) {
		out := waitIstioctlRows(ctx, t, time.Minute, []row{
			{ns, "client", client.Status.PodIP, "", "", "HBONE"},
			{ns, "server", server.Status.PodIP, "", "", "HBONE"},
		}, on("workloads", "--workload-namespace", ns)...)
		t.Logf("istioctl ztunnel-config workloads:\n%s", out)
	})
	t.Run("Services", func(t *testing.T) {
		out := waitIstioctlRows(ctx, t, time.Minute, []row{{ns, "server", svcIP, "", "1/1"}},
			on("services", "--service-namespace", ns)...)
		t.Logf("istioctl ztunnel-config services:\n%s", out)
	})
	t.Run("Certificates", func(t *testing.T) {
		out := waitIstioctlRows(ctx, t, time.Minute, []row{
			{spiffeID(ns, "client"), "Leaf", "Available", "true"},
			{spiffeID(ns, "client"), "Root", "Available", "true"},
			{spiffeID(ns, "server"), "Leaf", "Available", "true"},
			{spiffeID(ns, "server"), "Root", "Available", "true"},
		}, on("certificates")...)
		t.Logf("istioctl ztunnel-config certificates:\n%s", out)
	})
	t.Run("Connections", func(t *testing.T) {
		// A connection held open for 15 s, listed while it lives.
		done := make(chan echoReply, 1)
		go func() { done <- dialHold(ctx, client, podAddr(server), "hello-held", 15*time.Second) }()
		out := waitIstioctlRows(ctx, t, 14*time.Second, []row{
			{"client." + ns, "Outbound", "client." + ns + ":*", "server." + ns + ":15008", "server." + ns + ":8080", "HBONE"},
			{"server." + ns, "Inbound", "server." + ns + ":8080", "client." + ns + ":*", "", "HBONE"},
		}, on("connections", "--workload-namespace", ns)...)
		t.Logf("istioctl ztunnel-config connections:\n%s", out)
		if r := <-done; !r.OK("hello-held") {
			t.Errorf("the held connection did not echo: %v", r)
		}
	})
	t.Run("Log", func(t *testing.T) {
		out, err := istioctl(ctx, on("log")...)
		if err != nil || !strings.Contains(out, "current log level is info") {
			t.Errorf("istioctl ztunnel-config log: %v:\n%s", err, out)
		}
	})
}

// TestScenario8 is issue 37's eighth scenario: each enrolled pod's
// certificate, as gozt reports it to istioctl, names the pod's service
// account and chains to the root istiod publishes in the namespace
// (istio-ca-root-cert), i.e. istiod's CA signed it.
func TestScenario8(t *testing.T) {
	ctx := context.Background()
	const ns = "e2e-s8"
	meshPair(ctx, t, ns)
	gozt := goztPod(ctx, t)
	roots := x509.NewCertPool()
	var rootPEM string
	for end := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		cm, err := cl.cs.CoreV1().ConfigMaps(ns).Get(ctx, "istio-ca-root-cert", metav1.GetOptions{})
		if err == nil {
			rootPEM = cm.Data["root-cert.pem"]
			break
		}
		if time.Now().After(end) {
			t.Fatalf("istiod's root certificate in %s: %v", ns, err)
		}
	}
	if !roots.AppendCertsFromPEM([]byte(rootPEM)) {
		t.Fatalf("istio-ca-root-cert of %s holds no certificate: %q", ns, rootPEM)
	}
	type certJSON struct {
		PEM string `json:"pem"`
	}
	var dump []struct {
		Identity  string     `json:"identity"`
		State     string     `json:"state"`
		CertChain []certJSON `json:"certChain"`
		RootCerts []certJSON `json:"rootCerts"`
	}
	want := []string{spiffeID(ns, "client"), spiffeID(ns, "server")}
	var out string
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(time.Second) {
		var err error
		if out, err = istioctl(ctx, "ztunnel-config", "certificates", gozt.Name+"."+gozt.Namespace, "-o", "json"); err != nil {
			continue
		}
		if err := json.Unmarshal([]byte(out), &dump); err != nil {
			t.Fatalf("istioctl ztunnel-config certificates -o json: %v:\n%s", err, out)
		}
		n := 0
		for _, c := range dump {
			for _, id := range want {
				if c.Identity == id && c.State == "Available" {
					n++
				}
			}
		}
		if n == len(want) {
			break
		}
	}
	decode := func(t *testing.T, c certJSON) *x509.Certificate {
		t.Helper()
		b, err := base64.StdEncoding.DecodeString(c.PEM)
		if err != nil {
			t.Fatalf("certificate pem field: %v", err)
		}
		blk, _ := pem.Decode(b)
		if blk == nil {
			t.Fatalf("certificate pem field holds no PEM: %q", b)
		}
		crt, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return crt
	}
	for _, id := range want {
		t.Run(id[strings.LastIndex(id, "/")+1:], func(t *testing.T) {
			i := -1
			for j, c := range dump {
				if c.Identity == id {
					i = j
				}
			}
			if i < 0 || dump[i].State != "Available" || len(dump[i].CertChain) == 0 {
				t.Fatalf("gozt holds no available certificate for %s:\n%s", id, out)
			}
			c := dump[i]
			leaf := decode(t, c.CertChain[0])
			inter := x509.NewCertPool()
			for _, ic := range c.CertChain[1:] {
				inter.AddCert(decode(t, ic))
			}
			if len(leaf.URIs) != 1 || leaf.URIs[0].String() != id {
				t.Errorf("certificate for %s names %v", id, leaf.URIs)
			}
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
				t.Errorf("certificate for %s does not chain to istiod's root: %v", id, err)
			}
			for _, rc := range c.RootCerts {
				if r := decode(t, rc); !roots.Equal(poolOf(r)) {
					t.Errorf("gozt's root for %s (%s) is not istiod's", id, r.Subject)
				}
			}
			t.Logf("%s: serial %x, issuer %q, valid %s to %s, chain of %d", id, leaf.SerialNumber, leaf.Issuer,
				leaf.NotBefore.Format(time.RFC3339), leaf.NotAfter.Format(time.RFC3339), len(c.CertChain))
		})
	}
	t.Run("NodeAuthorizer", func(t *testing.T) { testNodeAuthorizer(ctx, t, ns, gozt, roots) })
}

func poolOf(c *x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c)
	return p
}
