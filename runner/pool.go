package runner

import (
	"errors"
	"fmt"
	"os"
	"regexp"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/common"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datalayer"
	runserver "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/server"
)

// poolGKNN names the pool (or, with an endpoint selector, the EPP deployment)
// as upstream does; static mode names its synthetic pool.
func poolGKNN(opts *Options) (*common.GKNN, error) {
	ns := poolNamespace(opts.PoolNamespace)
	switch {
	case opts.StaticMode():
		return &common.GKNN{
			NamespacedName: types.NamespacedName{Namespace: ns, Name: staticPoolName},
			GroupKind:      schema.GroupKind{Group: opts.PoolGroup, Kind: "InferencePool"},
		}, nil
	case opts.PoolName != "":
		return &common.GKNN{
			NamespacedName: types.NamespacedName{Namespace: ns, Name: opts.PoolName},
			GroupKind:      schema.GroupKind{Group: opts.PoolGroup, Kind: "InferencePool"},
		}, nil
	case opts.EndpointSelector != "":
		podName := os.Getenv("POD_NAME")
		if podName == "" {
			return nil, errors.New("failed to get environment variable POD_NAME")
		}
		name, err := deploymentName(podName)
		if err != nil {
			return nil, err
		}
		return &common.GKNN{
			NamespacedName: types.NamespacedName{Namespace: ns, Name: name},
			GroupKind:      schema.GroupKind{Group: "apps", Kind: "Deployment"},
		}, nil
	}
	return nil, errors.New("can't construct gknn as both pool-name and endpoint-selector are missing")
}

var deploymentPodName = regexp.MustCompile(`^(.+)-[a-z0-9]+-[a-z0-9]+$`)

// deploymentName derives a Deployment's name from one of its pods' names.
func deploymentName(podName string) (string, error) {
	if m := deploymentPodName.FindStringSubmatch(podName); len(m) == 2 {
		return m[1], nil
	}
	return "", fmt.Errorf("failed to parse deployment name from pod name %s", podName)
}

// poolNamespace resolves the pool namespace: the flag, else NAMESPACE, else
// "default".
func poolNamespace(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if ns := os.Getenv("NAMESPACE"); ns != "" {
		return ns
	}
	return runserver.DefaultPoolNamespace
}

// endpointPoolFromSelector builds the pool for upstream's endpoint-selector
// (standalone) mode. It is named after the EPP's deployment and namespace:
// upstream v1.5.0 passes the (necessarily empty) --pool-name here and so
// refuses to start in this mode.
func endpointPoolFromSelector(namespace, name, selector string, ports []int) (*datalayer.EndpointPool, error) {
	if len(ports) == 0 {
		return nil, errors.New("endpoint target ports must not be empty")
	}
	sel, err := labels.ConvertSelectorToLabelsMap(selector)
	if err != nil {
		return nil, fmt.Errorf("failed to parse endpoint selector %q: %w", selector, err)
	}
	pool := datalayer.NewEndpointPool(namespace, name)
	pool.Selector = sel
	pool.TargetPorts = append(pool.TargetPorts, ports...)
	return pool, nil
}
