package runner

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"

	"sigs.k8s.io/yaml"

	"sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"
)

// documentSeparator splits a multi-document YAML stream.
var documentSeparator = regexp.MustCompile(`(?m)^---\s*$`)

// ParseObjectives parses InferenceObjective objects (inference.networking.x-k8s.io/v1alpha2)
// from a YAML stream of one or more documents, as `kubectl apply -f` accepts
// them. Static mode has no API server to watch, so a file gives requests the
// priorities their x-gateway-inference-objective header names.
func ParseObjectives(content []byte) ([]*v1alpha2.InferenceObjective, error) {
	var (
		objs []*v1alpha2.InferenceObjective
		errs []error
		seen = map[string]bool{}
	)
	for i, doc := range documentSeparator.Split(string(content), -1) {
		if len(bytes.TrimSpace([]byte(doc))) == 0 {
			continue
		}
		obj := &v1alpha2.InferenceObjective{}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			errs = append(errs, fmt.Errorf("document %d: %w", i+1, err))
			continue
		}
		switch {
		case obj.APIVersion != v1alpha2.GroupVersion.String() || obj.Kind != "InferenceObjective":
			errs = append(errs, fmt.Errorf("document %d: want apiVersion %s, kind InferenceObjective; got %s, %s",
				i+1, v1alpha2.GroupVersion, obj.APIVersion, obj.Kind))
		case obj.Name == "":
			errs = append(errs, fmt.Errorf("document %d: metadata.name is required (requests name it in x-gateway-inference-objective)", i+1))
		case seen[obj.Name]:
			errs = append(errs, fmt.Errorf("document %d: InferenceObjective %q is defined twice", i+1, obj.Name))
		default:
			seen[obj.Name] = true
			objs = append(objs, obj)
		}
	}
	return objs, errors.Join(errs...)
}

// objectiveStore is the part of the datastore objectives are loaded into.
type objectiveStore interface {
	ObjectiveSet(*v1alpha2.InferenceObjective)
}

// loadObjectivesFile loads the objectives in path into store.
func loadObjectivesFile(path, namespace string, store objectiveStore) (int, error) {
	content, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("inference objectives file: %w", err)
	}
	objs, err := ParseObjectives(content)
	if err != nil {
		return 0, fmt.Errorf("inference objectives file %s: %w", path, err)
	}
	for _, o := range objs {
		if o.Namespace == "" {
			o.Namespace = namespace
		}
		store.ObjectiveSet(o)
	}
	return len(objs), nil
}
