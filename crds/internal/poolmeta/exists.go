package poolmeta

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Exists reports whether the pool of kind gvk named by key exists. Not found is false with no error; any other
// failure is an error naming the pool.
func Exists(ctx context.Context, r client.Reader, gvk schema.GroupVersionKind, key types.NamespacedName) (bool, error) {
	pool := &metav1.PartialObjectMetadata{}
	pool.SetGroupVersionKind(gvk)
	err := r.Get(ctx, key, pool)
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("getting InferencePool %s: %w", key, err)
	}
	return true, nil
}
