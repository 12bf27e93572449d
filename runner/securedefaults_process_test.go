package runner_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

// TestSecureDefaultsMatchUpstream runs Sluice's EPP and upstream's v1.5.0 EPP side by side against one API server,
// both with nothing but --pool-name, and probes each the same way: its ext_proc port in plaintext and over TLS, its
// certificate against the system roots, and its metrics port (/metrics and a pprof profile) without a token, with the
// token of a ServiceAccount that has no RBAC for them, and with one that may GET them. Sluice must answer every probe
// as upstream does: ext_proc only over TLS with a self-signed certificate (--secure-serving defaults to true), and
// metrics only for callers that authenticate and are authorised through the API server (--metrics-endpoint-auth
// defaults to true) — 401, 403, 200. pprof handlers sit behind the same check, including the CPU profile Sluice adds.
// With --cert-path, both serve the given certificate.
func TestSecureDefaultsMatchUpstream(t *testing.T) {
	api := runnertest.StartAPIServer(t, nil)
	port := runnertest.FreePort(t)
	pod := runnertest.StartModelServer(t, fmt.Sprintf("127.0.0.2:%d", port)).Addr
	api.CreatePool(t, port)
	api.CreateReadyPod(t, "vllm-a", "127.0.0.2")
	tokens := map[string]string{
		"no token":           "",
		"unauthorised token": api.ServiceAccountToken(t, "default", "stranger"),
		"metrics reader":     api.ServiceAccountToken(t, "default", "prometheus", "/metrics", "/debug/pprof/*"),
	}
	env := []string{"KUBECONFIG=" + api.Kubeconfig, "NAMESPACE=default"}
	epps := map[string]*runnertest.Process{
		"sluice":   runnertest.StartEPP(t, env, "--pool-name=vllm"),
		"upstream": runnertest.StartUpstreamEPP(t, env, "--pool-name=vllm"),
	}

	wantProbes := probes{
		Plaintext:      "refused",
		TLSDestination: pod,
		VerifiedCert:   false,
		Metrics: map[string]int{
			"no token /metrics": 401, "no token /debug/pprof/heap": 401,
			"unauthorised token /metrics": 403, "unauthorised token /debug/pprof/heap": 403,
			"metrics reader /metrics": 200, "metrics reader /debug/pprof/heap": 200,
		},
	}
	got := map[string]probes{}
	for name, epp := range epps {
		var p probes
		runnertest.Eventually(t, name+" routes over TLS", func() string {
			if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", epp.GRPCPort)); err != nil {
				return "ext_proc port not listening yet: " + err.Error()
			} else {
				_ = c.Close()
			}
			p.TLSDestination = runnertest.Route(t, epp.GRPCPort, true, nil, completion("secure"), nil).Destination
			if p.TLSDestination != pod {
				return fmt.Sprintf("routed to %q, want %s", p.TLSDestination, pod)
			}
			return ""
		})
		p.Plaintext = plaintextExtProc(epp.GRPCPort)
		p.VerifiedCert = verifiesAgainstSystemRoots(epp.GRPCPort)
		p.Metrics = map[string]int{}
		for who, token := range tokens {
			for _, path := range []string{"/metrics", "/debug/pprof/heap"} {
				p.Metrics[who+" "+path] = metricsStatus(t, epp.MetricsPort, path, token)
			}
		}
		got[name] = p
	}
	if !reflect.DeepEqual(got["sluice"], got["upstream"]) {
		t.Errorf("Sluice answers differently from upstream:\n sluice   %+v\n upstream %+v", got["sluice"], got["upstream"])
	}
	if !reflect.DeepEqual(got["sluice"], wantProbes) {
		t.Errorf("Sluice's secure defaults:\n got  %+v\n want %+v", got["sluice"], wantProbes)
	}
	// The CPU profile is Sluice's addition to upstream's pprof handlers: behind the same check.
	if code := metricsStatus(t, epps["sluice"].MetricsPort, "/debug/pprof/profile?seconds=1", ""); code != http.StatusUnauthorized {
		t.Errorf("Sluice's CPU profile without a token: %d, want 401", code)
	}

	// With --cert-path both serve the operator's certificate instead of a self-signed one.
	certDir := t.TempDir()
	want := writeCertificate(t, certDir)
	for name, start := range map[string]func(*testing.T, []string, ...string) *runnertest.Process{
		"sluice": runnertest.StartEPP, "upstream": runnertest.StartUpstreamEPP,
	} {
		epp := start(t, env, "--pool-name=vllm", "--cert-path="+certDir, "--metrics-endpoint-auth=false")
		var served []byte
		runnertest.Eventually(t, name+" serves TLS", func() string {
			conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", epp.GRPCPort), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
			if err != nil {
				return err.Error()
			}
			defer conn.Close()
			served = conn.ConnectionState().PeerCertificates[0].Raw
			return ""
		})
		if !bytes.Equal(served, want) {
			t.Errorf("%s with --cert-path serves another certificate", name)
		}
	}
}

// writeCertificate writes a self-signed key pair as tls.crt and tls.key into dir, the layout --cert-path reads (a
// Kubernetes TLS Secret mounted as a volume), and returns the certificate's DER bytes.
func writeCertificate(t *testing.T, dir string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(42), Subject: pkix.Name{CommonName: "epp.example"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"epp.example"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for file, block := range map[string]*pem.Block{"tls.crt": {Type: "CERTIFICATE", Bytes: der}, "tls.key": {Type: "EC PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(filepath.Join(dir, file), pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return der
}

// probes is what one EPP answered.
type probes struct {
	Plaintext      string // "refused", or "served" if a plaintext ext_proc stream got an answer
	TLSDestination string
	VerifiedCert   bool           // whether its certificate verifies against the system roots
	Metrics        map[string]int // HTTP status by caller and path
}

// plaintextExtProc opens an ext_proc stream without TLS and sends request headers, as a proxy configured without
// TLS would.
func plaintextExtProc(port int) string {
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", port), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "refused"
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		return "refused"
	}
	headers := &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("GET")}}}, EndOfStream: true}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers}}); err != nil {
		return "refused"
	}
	if _, err := stream.Recv(); err != nil {
		return "refused"
	}
	return "served"
}

func verifiesAgainstSystemRoots(port int) bool {
	conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port), &tls.Config{ServerName: "localhost", NextProtos: []string{"h2"}})
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// metricsStatus GETs path from the metrics port, with token as bearer token when not empty, and returns the status.
func metricsStatus(t *testing.T, port int, path, token string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", port, path), nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}
