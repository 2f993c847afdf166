//go:build linux

package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"weir/cmd/weir/api"
)

// tlsBackend runs `openssl s_server -WWW` in weir's namespace on port (both
// families), serving the file "id" whose content is name; it ends with the
// test.
func (w *weirProc) tlsBackend(dir, name string, port string) {
	w.t.Helper()
	d := filepath.Join(dir, name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		w.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "id"), []byte(name+"\n"), 0o644); err != nil {
		w.t.Fatal(err)
	}
	cmd := exec.Command("openssl", "s_server", "-accept", port, "-cert", filepath.Join(dir, "cert.pem"),
		"-key", filepath.Join(dir, "key.pem"), "-WWW", "-quiet", "-naccept", "1000")
	cmd.Dir = d
	var logb strings.Builder
	cmd.Stdout, cmd.Stderr = &logb, &logb
	if err := w.ns.Do(cmd.Start); err != nil {
		w.t.Fatalf("openssl s_server: %v", err)
	}
	w.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if w.t.Failed() {
			w.t.Logf("s_server %s:\n%s", name, logb.String())
		}
	})
	// Ready once it accepts a connection.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := w.ns.Dial(context.Background(), "tcp", "198.18.1.1:"+port)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("s_server %s on %s not ready: %v\n%s", name, port, err, logb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// writeCert writes a self-signed ECDSA certificate for the test's names
// and *.b.example into dir (cert.pem, key.pem); a wildcard right under a
// top-level name (*.example) curl refuses, so those names are listed.
func writeCert(t *testing.T, dir string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "weir e2e"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: []string{"a.example", "z.example", "other.example", "held.example", "*.b.example"}}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cert.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "key.pem"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// inNS runs a command in weir's namespace, bounded in time, with stdin.
func (w *weirProc) inNS(stdin string, name string, args ...string) (string, error) {
	var out []byte
	err := w.ns.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Stdin = strings.NewReader(stdin)
		var err error
		out, err = cmd.Output()
		return err
	})
	return string(out), err
}

func sniRefused(st api.Status, reason string) uint64 {
	for _, d := range st.Forwarder.SNIRefused {
		if d.Reason == reason {
			return d.Count
		}
	}
	return 0
}

// TestE2ESNI: TLS passthrough routed by server name, over IPv4 and IPv6,
// with real TLS on both sides: curl --resolve and openssl s_client
// -servername through weir's VIP:443 to openssl s_server backends (weir
// never terminates TLS: the client verifies the backend's certificate
// chain it is given). Each name reaches its backend (exact, case and
// trailing dot ignored, one-label wildcard); no server name and an
// unknown one go to the default, whose enforced maxConnections 1 refuses
// a second client with a RST while one is held (limits apply to the
// routed service); garbage is reset and counted not-tls; on a VIP without
// a default an unknown name is reset and counted no-match. The access log
// writes each served connection's server name.
func TestE2ESNI(t *testing.T) {
	requireE2E(t)
	for _, tool := range []string{"openssl", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipping: %s is not installed; scripts/deps.sh installs it", tool)
		}
	}
	access := filepath.Join(t.TempDir(), "access.log")
	w := startWeir(t, "sni.yaml", "--access-log", access)
	w.addIPv6Targets()
	dir := t.TempDir()
	writeCert(t, dir)
	ca := filepath.Join(dir, "cert.pem")
	w.tlsBackend(dir, "backend-a", "8443")
	w.tlsBackend(dir, "backend-b", "8444")
	w.tlsBackend(dir, "backend-default", "8445")

	served := map[string]string{} // "service" -> server name logged
	for _, ipv := range ipVersions() {
		t.Run(ipv.name, func(t *testing.T) {
			f := ipv.name
			vip := ipv.vip(60, 443)
			host := strings.TrimSuffix(strings.TrimPrefix(vip[:strings.LastIndex(vip, ":")], "["), "]")
			// curl verifies the backend's certificate (CA: the self-signed
			// one), so the handshake is the backend's, end to end.
			curl := func(name string) (string, error) {
				args := []string{"-sS", "--max-time", "15", "--cacert", ca}
				url := "https://" + name + "/id"
				if name == "" {
					// No server name: an IP literal; the certificate names
					// no IP, so only here verification is off.
					args = []string{"-sS", "--max-time", "15", "-k"}
					url = "https://" + vip + "/id"
				} else {
					args = append(args, "--resolve", strings.TrimSuffix(name, ".")+":443:"+host)
				}
				return w.inNS("", "curl", append(args, url)...)
			}
			for _, tc := range []struct{ name, want, service string }{
				{"a.example", "backend-a", "a"},
				{"x.b.example", "backend-b", "b"},
				{"y.b.example", "backend-b", "b"},
				{"z.example", "backend-default", "def"},
				{"", "backend-default", "def"},
			} {
				out, err := curl(tc.name)
				if err != nil || strings.TrimSpace(out) != tc.want {
					t.Errorf("curl %q via %s: %q, %v; want %s", tc.name, vip, out, err, tc.want)
				}
				served[tc.service+"-"+f] = strings.ToLower(tc.name)
			}
			// openssl s_client with an upper-case name and a trailing dot.
			out, err := w.inNS("GET /id HTTP/1.0\r\n\r\n", "openssl", "s_client", "-connect", vip,
				"-servername", "A.EXAMPLE.", "-quiet", "-verify_return_error", "-CAfile", ca, "-verify_hostname", "a.example")
			if err != nil || !strings.Contains(out, "backend-a") {
				t.Errorf("s_client -servername A.EXAMPLE.: %q, %v; want backend-a", out, err)
			}

			// The default's maxConnections 1: one held s_client, the next
			// client refused with a RST before any TLS byte comes back.
			before := refusalCount(w.status(), "virtual server", "maxConnections")
			var held *exec.Cmd
			var heldIn io.WriteCloser
			if err := w.ns.Do(func() error {
				held = exec.Command("openssl", "s_client", "-connect", vip, "-servername", "held.example", "-quiet", "-CAfile", ca)
				var err error
				if heldIn, err = held.StdinPipe(); err != nil {
					return err
				}
				return held.Start()
			}); err != nil {
				t.Fatal(err)
			}
			w.waitStatus(15*time.Second, "the held connection open at the default", func(st api.Status) bool {
				s := statusService(st, "def-"+f)
				return s != nil && len(s.Targets) == 1 && s.Targets[0].Open == 1
			})
			if out, err := curl("other.example"); err == nil {
				t.Errorf("a second client at the default's maxConnections 1 was served: %q", out)
			}
			if n := refusalCount(w.status(), "virtual server", "maxConnections") - before; n != 1 {
				t.Errorf("%d maxConnections refusals counted, want 1", n)
			}
			heldIn.Close()
			done := make(chan error, 1)
			go func() { done <- held.Wait() }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = held.Process.Kill()
				<-done
			}

			// Garbage: reset, counted not-tls, never admitted.
			st0 := w.status()
			c, err := w.ns.Dial(context.Background(), "tcp", vip)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = c.Write([]byte("GET / HTTP/1.1\r\nHost: a.example\r\n\r\n"))
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			n, err := c.Read(make([]byte, 100))
			c.Close()
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("garbage: read %d bytes, %v; want a reset", n, err)
			}
			w.waitStatus(10*time.Second, "the garbage counted not-tls", func(st api.Status) bool {
				return sniRefused(st, "not-tls") == sniRefused(st0, "not-tls")+1
			})

			// A VIP without a default: an unknown name is reset, no-match.
			nm := sniRefused(w.status(), "no-match")
			vip2 := ipv.vip(61, 443)
			if out, err := w.inNS("", "openssl", "s_client", "-connect", vip2, "-servername", "nobody.example", "-quiet"); err == nil && strings.Contains(out, "backend") {
				t.Errorf("no-match: served %q", out)
			}
			w.waitStatus(10*time.Second, "the unknown name counted no-match", func(st api.Status) bool {
				return sniRefused(st, "no-match") == nm+1
			})
			out, err = curl("a.example")
			if err != nil || strings.TrimSpace(out) != "backend-a" {
				t.Errorf("a.example still served after the refusals: %q, %v", out, err)
			}
		})
	}
	st := w.status()
	t.Logf("sni_routed %d, sni_refused %+v", st.Forwarder.SNIRouted, st.Forwarder.SNIRefused)

	w.signal(os.Interrupt) // weir flushes the access log on exit
	if _, err := w.Wait(10 * time.Second); err != nil {
		t.Fatalf("weir did not exit on SIGINT: %v", err)
	}
	logged := map[string]map[string]bool{}
	for _, r := range accessRecords(t, access) {
		svc, _ := r["service"].(string)
		sni, _ := r["sni"].(string)
		if r["outcome"] == "ok" {
			if logged[svc] == nil {
				logged[svc] = map[string]bool{}
			}
			logged[svc][sni] = true
		}
	}
	for svc, name := range served {
		if !logged[svc][name] {
			t.Errorf("access log: no served line of %s with sni %q (logged %v)", svc, name, logged[svc])
		}
	}
}
