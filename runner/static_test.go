package runner

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datalayer"
)

func TestParseEndpoints(t *testing.T) {
	tests := []struct {
		in      []string
		want    string // endpoints joined by space
		wantErr string
	}{
		{[]string{"127.0.0.1:8001", " 127.0.0.1:8002 "}, "127.0.0.1:8001 127.0.0.1:8002", ""},
		{[]string{"[::1]:8001"}, "[::1]:8001", ""},
		{[]string{"[::ffff:10.0.0.1]:80"}, "10.0.0.1:80", ""},
		{[]string{"", "127.0.0.1:1"}, "127.0.0.1:1", ""},
		{nil, "", "no endpoints given"},
		{[]string{"127.0.0.1"}, "", "want host:port"},
		{[]string{"localhost:80"}, "", "must be an IP address"},
		{[]string{"127.0.0.1:0"}, "", "from 1 to 65535"},
		{[]string{"127.0.0.1:70000"}, "", "from 1 to 65535"},
		{[]string{"127.0.0.1:http"}, "", "from 1 to 65535"},
		{[]string{"[fe80::1%eth0]:80"}, "", "without zone"},
		{[]string{"127.0.0.1:80", "127.0.0.1:80"}, "", "listed twice"},
		{[]string{"bad", "127.0.0.1:0"}, "", "from 1 to 65535"}, // every error is reported
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.in, ","), func(t *testing.T) {
			eps, err := ParseEndpoints(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, ep := range eps {
				got = append(got, ep.String())
			}
			if strings.Join(got, " ") != tt.want {
				t.Fatalf("got %v, want %s", got, tt.want)
			}
		})
	}
}

func TestParseEndpointsFile(t *testing.T) {
	eps, err := ParseEndpointsFile([]byte("# fleet\n127.0.0.1:8001, 127.0.0.1:8002 # fast\n\n  127.0.0.2:8001\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 3 {
		t.Fatalf("got %v", eps)
	}
	if _, err := ParseEndpointsFile([]byte("# only comments\n")); err == nil {
		t.Fatal("an empty file must be an error, not an empty pool")
	}
}

func FuzzParseEndpointsFile(f *testing.F) {
	f.Add([]byte("127.0.0.1:8001\n[::1]:9000,10.0.0.1:1 # c"))
	f.Add([]byte("#"))
	f.Fuzz(func(t *testing.T, content []byte) {
		eps, err := ParseEndpointsFile(content)
		if err != nil {
			return
		}
		seen := map[Endpoint]bool{}
		for _, ep := range eps {
			if ep.Port < 1 || ep.Port > 65535 || !ep.Addr.IsValid() || seen[ep] {
				t.Fatalf("accepted invalid or duplicate endpoint %v", ep)
			}
			seen[ep] = true
			again, err := ParseEndpoints([]string{ep.String()})
			if err != nil || len(again) != 1 || again[0] != ep {
				t.Fatalf("%v does not round-trip: %v %v", ep, again, err)
			}
		}
	})
}

// recordingStore records what static mode asks of the datastore, resyncing
// from the reader on PoolSet as upstream's datastore does.
type recordingStore struct {
	pool *datalayer.EndpointPool
	pods map[string]string // name -> ip
}

func (s *recordingStore) PoolSet(ctx context.Context, reader client.Reader, pool *datalayer.EndpointPool) error {
	s.pool = pool
	var list corev1.PodList
	if err := reader.List(ctx, &list); err != nil {
		return err
	}
	s.pods = map[string]string{}
	for _, p := range list.Items {
		s.pods[p.Name] = p.Status.PodIP
	}
	return nil
}

func (s *recordingStore) PodUpdateOrAddIfNotExist(_ context.Context, pod *corev1.Pod) bool {
	_, existed := s.pods[pod.Name]
	s.pods[pod.Name] = pod.Status.PodIP
	return existed
}

func (s *recordingStore) PodDelete(name string) { delete(s.pods, name) }

func TestStaticPoolApply(t *testing.T) {
	ctx := context.Background()
	store := &recordingStore{}
	sp := &staticPool{namespace: "ns"}
	first, _ := ParseEndpoints([]string{"127.0.0.1:8001", "127.0.0.2:8002"})
	if err := sp.apply(ctx, store, first); err != nil {
		t.Fatal(err)
	}
	if got := store.pool.TargetPorts; len(got) != 2 || got[0] != 8001 || got[1] != 8002 {
		t.Fatalf("target ports = %v", got)
	}
	if len(store.pods) != 2 || store.pods["static-127-0-0-2-8002"] != "127.0.0.2" {
		t.Fatalf("pods = %v", store.pods)
	}
	second, _ := ParseEndpoints([]string{"127.0.0.2:8002"})
	if err := sp.apply(ctx, store, second); err != nil {
		t.Fatal(err)
	}
	if len(store.pods) != 1 || store.pods["static-127-0-0-2-8002"] == "" {
		t.Fatalf("removed endpoint still present: %v", store.pods)
	}
	var pod corev1.Pod
	if err := sp.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "static-127-0-0-2-8002"}, &pod); err != nil {
		t.Fatal(err)
	}
	if pod.Annotations[activePortsAnnotation] != "8002" || pod.Labels[staticLabel] != "true" {
		t.Fatalf("pod = %+v", pod.ObjectMeta)
	}
	if err := sp.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "gone"}, &pod); err == nil {
		t.Fatal("Get of a missing pod must fail")
	}
}
