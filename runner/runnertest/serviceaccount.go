package runnertest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

// ServiceAccountToken returns a token for the service account namespace/name
// (TokenRequest, one hour), what a kubelet mounts into the account's pods.
func (s *APIServer) ServiceAccountToken(t *testing.T, namespace, name string) string {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	if err := s.Client.SubResource("token").Create(context.Background(), sa, req); err != nil {
		t.Fatalf("requesting a token for service account %s/%s: %v", namespace, name, err)
	}
	return req.Status.Token
}

// ServiceAccountKubeconfig writes a kubeconfig that authenticates as the
// service account namespace/name, so a process run with it has exactly the
// account's RBAC, as a pod of that account has; the API server enforces
// RBAC for it (the test client is a cluster admin).
func (s *APIServer) ServiceAccountKubeconfig(t *testing.T, namespace, name string) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["envtest"] = &clientcmdapi.Cluster{Server: s.config.Host, CertificateAuthorityData: s.config.CAData}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: s.ServiceAccountToken(t, namespace, name)}
	cfg.Contexts["sa"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: name, Namespace: namespace}
	cfg.CurrentContext = "sa"
	path := filepath.Join(t.TempDir(), "kubeconfig-"+name)
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
