package plugins

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
)

func nopFactory(string, json.RawMessage, fwkplugin.Handle) (fwkplugin.Plugin, error) { return nil, nil }

func TestRegistryRejects(t *testing.T) {
	tests := []struct {
		name    string
		typ     string
		factory fwkplugin.FactoryFunc
		want    string
	}{
		{"empty type", "", nopFactory, "must not be empty"},
		{"nil factory", "sluice-x", nil, "must not be nil"},
		{"duplicate", "sluice-dup", nopFactory, "already registered"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewRegistry()
			if err := r.Register("sluice-dup", nopFactory); err != nil {
				t.Fatal(err)
			}
			err := r.Register(tt.typ, tt.factory)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestSluicePluginsUseSluiceNames(t *testing.T) {
	for typ := range sluicePlugins {
		if !strings.HasPrefix(typ, "sluice-") {
			t.Errorf("Sluice plugin type %q must start with sluice-", typ)
		}
		if _, clash := upstreamInTree[typ]; clash {
			t.Errorf("Sluice plugin type %q collides with an upstream type", typ)
		}
	}
}

// TestDefaultHasEveryUpstreamPlugin reads upstream's runner source and checks
// that each plugin type it registers is registered here too, so that any
// upstream EndpointPickerConfig keeps loading after a version bump.
func TestDefaultHasEveryUpstreamPlugin(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api-inference-extension").Output()
	if err != nil {
		t.Fatalf("locating the GIE module: %v", err)
	}
	src := filepath.Join(strings.TrimSpace(string(out)), "cmd", "epp", "runner", "runner.go")
	upstreamTypes := registeredConstants(t, src)
	if len(upstreamTypes) < 30 {
		t.Fatalf("found only %d registrations in %s; the source reader is broken", len(upstreamTypes), src)
	}
	ours := registeredConstants(t, "upstream.go")
	for key := range upstreamTypes {
		if !ours[key] {
			t.Errorf("upstream registers %s, Sluice does not", key)
		}
	}
	reg, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(reg.Types()), len(upstreamInTree)+len(sluicePlugins); got != want {
		t.Fatalf("Default registered %d types, want %d", got, want)
	}
}

// registeredConstants returns "importpath.Const" for each plugin type
// constant registered in a Go file, whether through fwkplugin.Register(T, f)
// calls (upstream) or as keys of a map literal (ours).
func registeredConstants(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	imports := map[string]string{}
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		name := p[strings.LastIndex(p, "/")+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		imports[name] = p
	}
	found := map[string]bool{}
	record := func(e ast.Expr) {
		if sel, ok := e.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && imports[id.Name] != "" {
				found[imports[id.Name]+"."+sel.Sel.Name] = true
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Register" && len(n.Args) == 2 {
				record(n.Args[0])
			}
		case *ast.KeyValueExpr:
			record(n.Key)
		}
		return true
	})
	return found
}
