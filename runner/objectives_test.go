package runner

import (
	"strings"
	"testing"
)

func TestParseObjectives(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    map[string]int // name -> priority (-100 for unset)
		wantErr string
	}{
		{"two documents", `apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: critical}
spec: {priority: 10, poolRef: {name: static}}
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: batch}
spec: {priority: -1, poolRef: {name: static}}
`, map[string]int{"critical": 10, "batch": -1}, ""},
		{"unset priority", "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\nmetadata: {name: std}\nspec: {poolRef: {name: static}}\n", map[string]int{"std": -100}, ""},
		{"empty", "---\n", map[string]int{}, ""},
		{"wrong kind", "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n", nil, "want apiVersion inference.networking.x-k8s.io/v1alpha2"},
		{"unknown field", "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\nmetadata: {name: x}\nspec: {priorty: 1}\n", nil, "unknown field"},
		{"no name", "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\nspec: {priority: 1}\n", nil, "metadata.name is required"},
		{"duplicate", "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\nmetadata: {name: x}\n---\napiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\nmetadata: {name: x}\n", nil, "defined twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := ParseObjectives([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]int{}
			for _, o := range objs {
				p := -100
				if o.Spec.Priority != nil {
					p = *o.Spec.Priority
				}
				got[o.Name] = p
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Fatalf("got %v, want %v", got, tt.want)
				}
			}
		})
	}
}

func FuzzParseObjectives(f *testing.F) {
	f.Add([]byte("apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\nmetadata: {name: a}\nspec: {priority: 1}\n---\n"))
	f.Fuzz(func(t *testing.T, content []byte) {
		objs, err := ParseObjectives(content)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, o := range objs {
			if o.Name == "" || seen[o.Name] || o.Kind != "InferenceObjective" {
				t.Fatalf("accepted invalid objective %+v", o.ObjectMeta)
			}
			seen[o.Name] = true
		}
	})
}
