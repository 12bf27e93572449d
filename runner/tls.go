package runner

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"path/filepath"
	"time"

	"google.golang.org/grpc/credentials"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/common"
)

// serverCredentials returns the ext_proc server's TLS credentials as upstream
// builds them: the key pair in certPath (tls.crt, tls.key), optionally
// reloaded when it changes, or a fresh self-signed certificate when certPath
// is empty.
func serverCredentials(ctx context.Context, certPath string, reload bool) (credentials.TransportCredentials, error) {
	if certPath == "" {
		cert, err := selfSignedCertificate(time.Now())
		if err != nil {
			return nil, fmt.Errorf("creating self-signed certificate: %w", err)
		}
		return credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}}), nil
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(certPath, "tls.crt"), filepath.Join(certPath, "tls.key"))
	if err != nil {
		return nil, fmt.Errorf("loading certificate from %s: %w", certPath, err)
	}
	if !reload {
		return credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}}), nil
	}
	reloader, err := common.NewCertReloader(ctx, certPath, &cert)
	if err != nil {
		return nil, fmt.Errorf("creating certificate reloader: %w", err)
	}
	return credentials.NewTLS(&tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return reloader.Get(), nil },
		NextProtos:     []string{"h2"},
	}), nil
}

// selfSignedCertificate makes a P-256 certificate valid for ten years from now.
// Envoy's ext_proc cluster in the GIE setup does not verify the EPP's
// certificate, so any valid certificate serves.
func selfSignedCertificate(now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"Sluice EPP"}, CommonName: "sluice-epp"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
