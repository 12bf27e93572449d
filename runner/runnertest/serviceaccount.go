package runnertest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ServiceAccountToken returns a token for the service account namespace/name
// (TokenRequest, one hour), what a kubelet mounts into the account's pods,
// creating the account if it does not exist. nonResourceURLs, when given, are
// the paths (for example /metrics) a ClusterRole bound to it may GET, as for a
// Prometheus scraper in the cluster.
func (s *APIServer) ServiceAccountToken(t *testing.T, namespace, name string, nonResourceURLs ...string) string {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if err := s.Client.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating service account %s/%s: %v", namespace, name, err)
	}
	if len(nonResourceURLs) > 0 {
		role := &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: namespace + "-" + name},
			Rules:      []rbacv1.PolicyRule{{NonResourceURLs: nonResourceURLs, Verbs: []string{"get"}}},
		}
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: namespace + "-" + name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: name}},
		}
		for _, obj := range []client.Object{role, binding} {
			if err := s.Client.Create(ctx, obj); err != nil {
				t.Fatal(err)
			}
		}
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	if err := s.Client.SubResource("token").Create(ctx, sa, req); err != nil {
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
