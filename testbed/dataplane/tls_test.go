package dataplane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// selfSignedCert makes a certificate like the one the upstream EPP generates
// for itself when no certificate is configured.
func selfSignedCert(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{Organization: []string{"test EPP"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestEPPOverTLSWithSelfSignedCertificate(t *testing.T) {
	b := startBackend(t, "b", nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeEPP{addr: l.Addr().String(), b: eppBehaviour{decide: routeTo(b.addr(), nil)}}
	srv := grpc.NewServer(grpc.Creds(credentials.NewServerTLSFromCert(ptr(selfSignedCert(t)))))
	extprocv3.RegisterExternalProcessorServer(srv, f)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Stop(); <-done })

	t.Run("tls", func(t *testing.T) {
		proxy, _ := startProxy(t, Config{EPPAddress: f.addr, EPPTLS: true})
		if code, _, body := post(t, proxy.URL+"/v1/completions", `{}`); code != 200 || !strings.Contains(body, `"backend":"b"`) {
			t.Fatalf("status %d body %q", code, body)
		}
	})
	t.Run("plaintext to a TLS EPP fails closed", func(t *testing.T) {
		proxy, _ := startProxy(t, Config{EPPAddress: f.addr})
		if code, _, body := post(t, proxy.URL+"/v1/completions", `{}`); code != 500 {
			t.Fatalf("status %d body %q, want 500", code, body)
		}
	})
}

func ptr[T any](v T) *T { return &v }
