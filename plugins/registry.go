package plugins

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"sync"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
)

// Registry collects plugin factories by type name. Unlike upstream's package
// map it is locked and rejects a second registration of the same type, so two
// plugins can never shadow one another by accident.
type Registry struct {
	mu        sync.Mutex
	factories map[string]fwkplugin.FactoryFunc
}

// NewRegistry returns an empty Registry.
func NewRegistry() *Registry {
	return &Registry{factories: map[string]fwkplugin.FactoryFunc{}}
}

// Register adds factory under pluginType. It fails when the type is empty,
// the factory is nil or the type is already registered.
func (r *Registry) Register(pluginType string, factory fwkplugin.FactoryFunc) error {
	if pluginType == "" {
		return fmt.Errorf("plugin type must not be empty")
	}
	if factory == nil {
		return fmt.Errorf("plugin type %q: factory must not be nil", pluginType)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.factories[pluginType]; dup {
		return fmt.Errorf("plugin type %q is already registered", pluginType)
	}
	r.factories[pluginType] = factory
	return nil
}

// Types returns the registered type names in lexical order.
func (r *Registry) Types() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	types := make([]string, 0, len(r.factories))
	for t := range r.factories {
		types = append(types, t)
	}
	sort.Strings(types)
	return types
}

// Install copies every registered factory into upstream's global plugin
// registry, which the upstream configuration loader reads. It fails, without
// installing anything, when a type is already present there with another
// origin, so Sluice never silently replaces a plugin it did not register.
func (r *Registry) Install() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for t := range r.factories {
		if _, taken := fwkplugin.Registry[t]; taken {
			return fmt.Errorf("plugin type %q is already installed in the upstream registry", t)
		}
	}
	for t, f := range r.factories {
		fwkplugin.Register(t, f)
	}
	return nil
}

// InstallMissing copies into upstream's global plugin registry every factory
// it does not hold yet and keeps those it holds. It is for a process that
// loads configurations without being an EPP (the virtual-time benchmark
// engine), which may share the process with an EPP that installed them.
func (r *Registry) InstallMissing() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for t, f := range r.factories {
		if _, taken := fwkplugin.Registry[t]; !taken {
			fwkplugin.Register(t, f)
		}
	}
}

// decodeParams decodes a plugin's JSON parameters into v, rejecting unknown fields so a typo is an error rather than
// a silent default. Empty or null parameters leave v as it is.
func decodeParams(raw json.RawMessage, v any) error {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
