package plugins

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	errcommon "sigs.k8s.io/gateway-api-inference-extension/pkg/common/error"

	"github.com/sluice-gw/sluice/modelrewrite"
)

// FuzzFlowControlPolicyFile loads arbitrary --flow-control-config files (YAML or JSON) and, when one is accepted, runs
// requests through admission under it: a file is either refused with an error that names the flag, or yields a
// configuration that validates and under which every request gets an answer upstream maps to an HTTP status (not a
// wrapped error) whatever its priority and tenant header. Seeds are in testdata/fuzz/FuzzFlowControlPolicyFile.
func FuzzFlowControlPolicyFile(f *testing.F) {
	path := filepath.Join(f.TempDir(), "policy.yaml")
	codes := map[string]bool{errcommon.ResourceExhausted: true, errcommon.ServiceUnavailable: true, errcommon.BadRequest: true, errcommon.Forbidden: true}
	f.Fuzz(func(t *testing.T, content []byte, tenant string, priority int) {
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := LoadFlowControlConfig(path)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "--flow-control-config") {
				t.Fatalf("error %q does not name the flag", err)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("accepted a configuration that does not validate: %v", err)
		}
		pool := &fakePool{}
		fc, clk := newTestFlowControl(t, cfg, pool)
		pool.set(upstreamEndpoint("10.0.0.1", 0, 0, clk.Now()))
		if err := fc.SyncEndpoints(); err != nil {
			t.Fatal(err)
		}
		rc := requestContext("fuzz", tenant, 100, nil)
		rc.Request.Headers[cfg.TenantHeader] = tenant
		// One idle, freshly scraped endpoint: every band has headroom, so nothing waits.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err = fc.Admit(ctx, rc, priority)
		if err != nil && !codes[errcommon.CanonicalCode(err)] {
			t.Fatalf("Admit = %v, which upstream cannot answer with a status", err)
		}
		fc.ShapeImmediateResponse(ctx, "fuzz", &extprocv3.ImmediateResponse{})
	})
}

// FuzzModelRewritesFile loads arbitrary --model-rewrites-file contents as the static-mode watcher does and, when the
// file is accepted, chooses the model of a request for model with session key session: the file is applied entirely
// or refused, and a rewritten request is sent with a non-empty model that the body then carries, everything else kept.
// Seeds are in testdata/fuzz/FuzzModelRewritesFile.
func FuzzModelRewritesFile(f *testing.F) {
	path := filepath.Join(f.TempDir(), "rewrites.yaml")
	f.Fuzz(func(t *testing.T, content []byte, model, session string) {
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		mr, err := NewModelRewrite(ModelRewriteConfig{Pool: modelrewrite.PoolKey{Namespace: "default", Name: "static"}})
		if err != nil {
			t.Fatal(err)
		}
		w := &rewritesFileWatcher{path: path, target: mr, logger: logr.Discard()}
		if err := w.load(); err != nil {
			if mr.table.Load() != nil {
				t.Fatalf("a refused file (%v) put rules in force", err)
			}
			return
		}
		body, err := json.Marshal(map[string]any{"model": model, "messages": []any{}, "metadata": map[string]string{"model": "nested"}})
		if err != nil {
			return
		}
		d, rewritten := mr.Choose(map[string]string{"x-session-id": session}, body)
		if !rewritten {
			return
		}
		if d.Model == "" {
			t.Fatalf("model %q rewritten to an empty model (%+v)", model, d)
		}
		out, err := ReplaceModel(body, d.Model)
		if err != nil {
			t.Fatalf("ReplaceModel: %v", err)
		}
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil || got["model"] != d.Model || got["metadata"].(map[string]any)["model"] != "nested" {
			t.Fatalf("rewritten body %s, want model %q and the rest unchanged (%v)", out, d.Model, err)
		}
	})
}
