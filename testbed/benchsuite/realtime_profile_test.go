package benchsuite

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestProfileEPPsSavesEachReplicasProfile: with EPPCPUProfile, each replica's CPU profile over the scenario's
// duration lands in the run folder, one file per replica when there are several; a replica that cannot profile
// (pprof off: 404) is an error.
func TestProfileEPPsSavesEachReplicasProfile(t *testing.T) {
	for _, tc := range []struct {
		replicas int
		files    []string
	}{
		{1, []string{EPPCPUProfileFile}},
		{2, []string{"epp-0.cpu.pprof", "epp-1.cpu.pprof"}},
	} {
		var urls []string
		for k := range tc.replicas {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/debug/pprof/profile" || r.URL.Query().Get("seconds") != "3" {
					http.NotFound(w, r)
					return
				}
				w.Write([]byte{'p', byte('0' + k)})
			}))
			defer srv.Close()
			urls = append(urls, srv.URL+"/metrics")
		}
		dir := t.TempDir()
		r := &realRun{e: &RealTime{EPPCPUProfile: true}, sc: &Scenario{Duration: 3 * time.Second}, dir: dir, eppMetrics: urls}
		if err := r.profileEPPs(context.Background()); err != nil {
			t.Fatalf("%d replicas: %v", tc.replicas, err)
		}
		for k, f := range tc.files {
			got, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil || string(got) != string([]byte{'p', byte('0' + k)}) {
				t.Errorf("%d replicas: %s holds %q (%v), want replica %d's profile", tc.replicas, f, got, err, k)
			}
		}
	}
	off := httptest.NewServer(http.NotFoundHandler())
	defer off.Close()
	r := &realRun{e: &RealTime{EPPCPUProfile: true}, sc: &Scenario{Duration: time.Second}, dir: t.TempDir(), eppMetrics: []string{off.URL + "/metrics"}}
	if err := r.profileEPPs(context.Background()); err == nil {
		t.Error("a replica answering 404: no error")
	}
}
